//! The string formats CRD schemas may use (upstream `apiserver/validation/formats.go`: the
//! formats kube-openapi's `strfmt.Default` registry checks and Kubernetes v1.33 supports in
//! CRDs), and Go (RE2) regular expressions for `pattern`.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::LazyLock;

use regex::{Regex, RegexBuilder};

/// strfmt's name normalization: dashes are ignored (`date-time` is `datetime`).
pub(crate) fn normalize(format: &str) -> String {
    format.replace('-', "")
}

/// The formats of strfmt's default registry (normalized names).
const REGISTRY: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// Whether kube-openapi's format validator knows (and so checks) this format.
pub(crate) fn in_registry(format: &str) -> bool {
    REGISTRY.contains(&normalize(format).as_str())
}

/// Upstream `StripUnsupportedFormatsPostProcessor` at v1.33: the format a CRD schema node
/// keeps for validation, given its single type (`""` for none or several): string formats of
/// the registry on strings (and untyped nodes), `int32`/`int64` on integers,
/// `float`/`double` on numbers; anything else is dropped (and so ignored).
pub(crate) fn crd_format<'a>(single_type: &str, format: &'a str) -> &'a str {
    let keep = match single_type {
        "" | "string" => in_registry(format),
        "integer" => matches!(format, "int32" | "int64"),
        "number" => matches!(format, "float" | "double"),
        _ => false,
    };
    if keep { format } else { "" }
}

/// Whether `s` is valid for the (registry) format, as strfmt's validators decide.
pub(crate) fn check(format: &str, s: &str) -> bool {
    match normalize(format).as_str() {
        "bsonobjectid" => s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => is_request_uri(s),
        "email" => is_email(s),
        "hostname" => is_hostname(s),
        "ipv4" => parse_ip_sloppy(s).is_some() && s.contains('.'),
        "ipv6" => s.parse::<Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        "mac" => is_mac(s),
        "uuid" => UUID.is_match(s),
        "uuid3" => UUID3.is_match(s),
        "uuid4" => UUID4.is_match(s),
        "uuid5" => UUID5.is_match(s),
        "isbn" => is_isbn10(s) || is_isbn13(s),
        "isbn10" => is_isbn10(s),
        "isbn13" => is_isbn13(s),
        "creditcard" => is_credit_card(s),
        "ssn" => is_ssn(s),
        "hexcolor" => is_hex_color(s),
        "rgbcolor" => RGB_COLOR.is_match(s),
        "byte" => is_base64(s),
        "date" => is_date(s),
        "duration" => is_duration(s),
        "datetime" => is_date_time(s),
        // password and anything unknown
        _ => true,
    }
}

fn fixed(re: &str) -> Regex {
    // The patterns below are constants of this file; a failure is a bug caught by the tests.
    RegexBuilder::new(re).size_limit(1 << 26).build().unwrap_or_else(|e| panic!("{re}: {e}"))
}

static UUID: LazyLock<Regex> = LazyLock::new(|| {
    fixed("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID3: LazyLock<Regex> = LazyLock::new(|| {
    fixed("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID4: LazyLock<Regex> = LazyLock::new(|| {
    fixed("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static UUID5: LazyLock<Regex> = LazyLock::new(|| {
    fixed("(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
/// RFC 1034 host names, with Unicode letters and symbols allowed as strfmt does.
static HOSTNAME: LazyLock<Regex> = LazyLock::new(|| {
    let a = r"[a-zA-Z0-9\p{S}\p{L}]";
    let b = r"[-a-zA-Z0-9\p{S}\p{L}]";
    fixed(&format!(
        r"^({a}((-?{a}{{0,62}})?)|({a}(({b}{{0,61}}{a})?)(\.)){{1,}}([a-zA-Z\p{{L}}]){{2,63}})$"
    ))
});
static RGB_COLOR: LazyLock<Regex> = LazyLock::new(|| {
    let n = "(0|[1-9][0-9]?|1[0-9][0-9]?|2[0-4][0-9]|25[0-5])";
    let sp = r"[\t\n\x0C\r ]*";
    fixed(&format!(r"^rgb\({sp}{n}{sp},{sp}{n}{sp},{sp}{n}{sp}\)$"))
});
static CREDIT_CARD: LazyLock<Regex> = LazyLock::new(|| {
    fixed(concat!(
        "^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}",
        "|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35[0-9]{3})[0-9]{11})$"
    ))
});
static DATE_TIME_TAIL: LazyLock<Regex> = LazyLock::new(|| {
    fixed(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
});
static DURATION_WORDS: LazyLock<Regex> =
    LazyLock::new(|| fixed("([0-9]+)[\t\n\x0C\r ]*([A-Za-zµ]+)"));

fn is_hostname(s: &str) -> bool {
    HOSTNAME.is_match(s) && s.len() <= 255 && s.split('.').all(|p| p.len() <= 63)
}

fn is_hex_color(s: &str) -> bool {
    let h = s.strip_prefix('#').unwrap_or(s);
    (h.len() == 3 || h.len() == 6) && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// govalidator's base64: groups of four of `[A-Za-z0-9+/]`, the last one possibly padded.
fn is_base64(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return false;
    }
    let alpha = |c: u8| c.is_ascii_alphanumeric() || c == b'+' || c == b'/';
    let pad = b.iter().rev().take_while(|&&c| c == b'=').count();
    pad <= 2 && b[..b.len() - pad].iter().all(|&c| alpha(c))
}

fn is_ssn(s: &str) -> bool {
    let b = s.as_bytes();
    let sep = |c: u8| c == b'-' || c == b' ';
    // With the length fixed at 11, both optional separators of `^\d{3}[- ]?\d{2}[- ]?\d{4}$`
    // must be present.
    b.len() == 11
        && sep(b[3])
        && sep(b[6])
        && b.iter().enumerate().all(|(i, c)| i == 3 || i == 6 || c.is_ascii_digit())
}

/// `[\s-]+` removed, as govalidator sanitizes ISBNs.
fn isbn_digits(s: &str) -> Vec<u8> {
    s.bytes().filter(|&c| !matches!(c, b'\t' | b'\n' | b'\x0C' | b'\r' | b' ' | b'-')).collect()
}

fn is_isbn10(s: &str) -> bool {
    let d = isbn_digits(s);
    if d.len() != 10
        || !d[..9].iter().all(u8::is_ascii_digit)
        || !(d[9].is_ascii_digit() || d[9] == b'X')
    {
        return false;
    }
    let mut sum: u32 = (0..9).map(|i| (i as u32 + 1) * u32::from(d[i] - b'0')).sum();
    sum += 10 * if d[9] == b'X' { 10 } else { u32::from(d[9] - b'0') };
    sum.is_multiple_of(11)
}

fn is_isbn13(s: &str) -> bool {
    let d = isbn_digits(s);
    if d.len() != 13 || !d.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = (0..12).map(|i| if i % 2 == 0 { 1 } else { 3 } * u32::from(d[i] - b'0')).sum();
    u32::from(d[12] - b'0') == (10 - sum % 10) % 10
}

fn is_credit_card(s: &str) -> bool {
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    if !CREDIT_CARD.is_match(&digits) {
        return false;
    }
    let mut sum = 0;
    for (i, c) in digits.bytes().rev().enumerate() {
        let mut n = u32::from(c - b'0');
        if i % 2 == 1 {
            n *= 2;
            if n >= 10 {
                n = n % 10 + 1;
            }
        }
        sum += n;
    }
    sum % 10 == 0
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        _ => 31,
    }
}

/// Go's `time.Parse("2006-01-02", s)`.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = &b[r];
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0u32, |n, &c| n * 10 + u32::from(c - b'0')))
    };
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    (1..=12).contains(&m) && d >= 1 && d <= days_in_month(y, m)
}

/// strfmt's `IsDateTime`: a date, `t` (any case), then `hh:mm:ss[.frac](z|±hh:mm)`.
fn is_date_time(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let lower = s.to_lowercase();
    let mut parts = lower.split('t');
    let (Some(date), Some(time)) = (parts.next(), parts.next()) else {
        return false;
    };
    if !is_date(date) {
        return false;
    }
    let Some(c) = DATE_TIME_TAIL.captures(time) else {
        return false;
    };
    let field = |i: usize| c.get(i).map_or("", |m| m.as_str());
    field(1) <= "23" && field(2) <= "59" && field(3) <= "59"
}

/// strfmt's `ParseDuration`: Go's `time.ParseDuration`, else words like `3 days`.
fn is_duration(s: &str) -> bool {
    if go_parse_duration(s) {
        return true;
    }
    const UNITS: &[&[&str]] = &[
        &["ns", "nano"],
        &["us", "µs", "micro"],
        &["ms", "milli"],
        &["s", "sec"],
        &["m", "min"],
        &["h", "hr", "hour"],
        &["d", "day"],
        &["w", "wk", "week"],
    ];
    let mut ok = false;
    for c in DURATION_WORDS.captures_iter(s) {
        let (Some(factor), Some(unit)) = (c.get(1), c.get(2)) else { continue };
        if factor.as_str().parse::<i64>().is_err() {
            return false;
        }
        let unit = unit.as_str().trim().to_lowercase();
        for variants in UNITS {
            let last = variants.len() - 1;
            for (i, v) in variants.iter().enumerate() {
                if (i == last && unit.starts_with(v)) || unit.eq_ignore_ascii_case(v) {
                    ok = true;
                }
            }
        }
    }
    ok
}

/// Go's `time.ParseDuration` grammar and range: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or `0`.
fn go_parse_duration(s: &str) -> bool {
    let mut rest = s;
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-') {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return true;
    }
    if rest.is_empty() {
        return false;
    }
    // Nanoseconds, in a wider type to see overflow.
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let b = rest.as_bytes();
        if !(b[0] == b'.' || b[0].is_ascii_digit()) {
            return false;
        }
        let int_len = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &r[..n];
            rest = &r[n..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return false;
        }
        let unit_len = rest.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(rest.len());
        if unit_len == 0 {
            return false;
        }
        let unit: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            _ => return false,
        };
        rest = &rest[unit_len..];
        let v: u128 = if int_part.is_empty() {
            0
        } else {
            match int_part.parse() {
                Ok(v) => v,
                Err(_) => return false,
            }
        };
        if v > (1u128 << 63) {
            return false;
        }
        let mut ns = v * unit;
        if !frac_part.is_empty() {
            // Only the leading digits matter for the range; more than 30 cannot add a
            // nanosecond-scale unit's worth.
            let digits = &frac_part[..frac_part.len().min(30)];
            let f: u128 = digits.parse().unwrap_or(0);
            ns += f * unit / 10u128.pow(digits.len() as u32);
        }
        total += ns;
        if total > (1u128 << 63) {
            return false;
        }
    }
    neg || total < (1u128 << 63)
}

/// Go's `ParseIPSloppy` (k8s.io/utils/net): IPv4 octets may have leading zeros.
pub(crate) fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        return s.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let n = p.bytes().try_fold(0u32, |n, c| {
            let n = n * 10 + u32::from(c - b'0');
            (n <= 255).then_some(n)
        })?;
        *o = n as u8;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::from(octets))
}

fn is_cidr(s: &str) -> bool {
    let Some((addr, prefix)) = s.split_once('/') else { return false };
    let Some(ip) = parse_ip_sloppy(addr) else { return false };
    if prefix.is_empty() || !prefix.bytes().all(|c| c.is_ascii_digit()) {
        return false;
    }
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    prefix.parse::<u32>().is_ok_and(|p| p <= bits)
}

/// Go's `net.ParseMAC`: 6, 8 or 20 octets as `xx:xx:…`, `xx-xx-…` or `xxxx.xxxx.…`.
fn is_mac(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 14 {
        return false;
    }
    let hex = |c: u8| c.is_ascii_hexdigit();
    let octets = if b[2] == b':' || b[2] == b'-' {
        if !(b.len() + 1).is_multiple_of(3) {
            return false;
        }
        let sep = b[2];
        let groups_ok =
            b.chunks(3).all(|g| hex(g[0]) && hex(g[1]) && (g.len() == 2 || g[2] == sep));
        if !groups_ok {
            return false;
        }
        (b.len() + 1) / 3
    } else if b[4] == b'.' {
        if !(b.len() + 1).is_multiple_of(5) {
            return false;
        }
        let groups_ok =
            b.chunks(5).all(|g| g[..4].iter().all(|&c| hex(c)) && (g.len() == 4 || g[4] == b'.'));
        if !groups_ok {
            return false;
        }
        2 * (b.len() + 1) / 5
    } else {
        return false;
    };
    matches!(octets, 6 | 8 | 20)
}

/// Go's `url.ParseRequestURI` accepting `s`: an absolute URI or an absolute path, no
/// control characters, a well-formed authority (host characters, bracketed IPv6, numeric
/// port) and well-formed percent escapes.
fn is_request_uri(s: &str) -> bool {
    if s.is_empty() || s.bytes().any(|c| c < 0x20 || c == 0x7f) {
        return false;
    }
    if s == "*" {
        return true;
    }
    // Scheme: a letter, then letters, digits, `+`, `-`, `.`, up to the first `:`.
    let mut scheme = "";
    let mut rest = s;
    for (i, c) in s.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return false,
            ':' => {
                scheme = &s[..i];
                rest = &s[i + 1..];
                break;
            }
            _ => break,
        }
    }
    if let Some((before, _query)) = rest.split_once('?') {
        rest = before;
    }
    if !rest.starts_with('/') {
        // An opaque URI ("mailto:x") needs a scheme; a request URI without one must be a path.
        return !scheme.is_empty();
    }
    if !scheme.is_empty()
        && let Some(after) = rest.strip_prefix("//")
    {
        let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
        if !valid_authority(authority) {
            return false;
        }
        rest = path;
    }
    valid_escapes(rest)
}

fn valid_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
            {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

fn valid_authority(authority: &str) -> bool {
    let (userinfo, host) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    if let Some(u) = userinfo {
        let ok = u.chars().all(|c| {
            c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c) || !c.is_ascii()
        });
        if !ok || !valid_escapes(u) {
            return false;
        }
    }
    let (host, port) = if host.starts_with('[') {
        let Some(end) = host.find(']') else { return false };
        (&host[..=end], &host[end + 1..])
    } else {
        match host.rfind(':') {
            Some(i) => (&host[..i], &host[i..]),
            None => (host, ""),
        }
    };
    if !port.is_empty() {
        let Some(digits) = port.strip_prefix(':') else { return false };
        if !digits.bytes().all(|c| c.is_ascii_digit()) {
            return false;
        }
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').unwrap_or(inner);
        let addr = inner.split_once("%25").map_or(inner, |(a, _zone)| a);
        return addr.parse::<Ipv6Addr>().is_ok();
    }
    host.chars().all(|c| {
        !c.is_ascii() || c.is_ascii_alphanumeric() || "!$&'()*+,;=:[]<>\"-_.~%".contains(c)
    }) && valid_escapes(host)
}

/// RFC 5322 `atext`, with non-ASCII allowed as Go's `net/mail` does.
fn is_atext(c: char) -> bool {
    !c.is_ascii() || (c.is_ascii_graphic() && !"()<>[]:;@\\,.\"".contains(c))
}

fn is_dot_atom(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(|a| !a.is_empty() && a.chars().all(is_atext))
}

/// A quoted string at the start of `s`; returns the rest after the closing quote.
fn quoted_prefix(s: &str) -> Option<&str> {
    let mut chars = s.char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut escaped = false;
    for (i, c) in chars {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            return Some(&s[i + 1..]);
        } else if c.is_ascii_control() && c != '\t' {
            return None;
        }
    }
    None
}

fn is_addr_spec(s: &str) -> bool {
    let (local_ok, rest) = if s.starts_with('"') {
        match quoted_prefix(s) {
            Some(rest) => (true, rest),
            None => return false,
        }
    } else {
        match s.find('@') {
            Some(i) => (is_dot_atom(&s[..i]), &s[i..]),
            None => return false,
        }
    };
    let Some(domain) = rest.strip_prefix('@') else { return false };
    if let Some(lit) = domain.strip_prefix('[') {
        let Some(inner) = lit.strip_suffix(']') else { return false };
        return local_ok
            && inner
                .chars()
                .all(|c| !c.is_ascii() || (c.is_ascii_graphic() && !"[]\\".contains(c)));
    }
    local_ok && is_dot_atom(domain)
}

/// Go's `mail.ParseAddress` accepting `s` with a non-empty address: `addr@domain` or
/// `Display Name <addr@domain>` (comments and groups are not supported here).
fn is_email(s: &str) -> bool {
    let s = s.trim_matches(|c| c == ' ' || c == '\t');
    if let Some(inner) = s.strip_suffix('>') {
        let Some(open) = inner.rfind('<') else { return false };
        let display = inner[..open].trim_matches(|c| c == ' ' || c == '\t');
        let mut words = display;
        while !words.is_empty() {
            if words.starts_with('"') {
                match quoted_prefix(words) {
                    Some(r) => words = r.trim_start_matches([' ', '\t']),
                    None => return false,
                }
            } else {
                let end = words.find([' ', '\t', '"']).unwrap_or(words.len());
                let word = &words[..end];
                if word.is_empty() || !word.chars().all(|c| is_atext(c) || c == '.') {
                    return false;
                }
                words = words[end..].trim_start_matches([' ', '\t']);
            }
        }
        return is_addr_spec(inner[open + 1..].trim_matches(|c| c == ' ' || c == '\t'));
    }
    is_addr_spec(s)
}

/// Compiles a CRD `pattern` with Go's (RE2) semantics: `\d`, `\w`, `\s` and `\b` are ASCII
/// as in Go, `\Q…\E` quotes, octal escapes work, a `{` that does not start a repeat and
/// characters Rust's syntax would read as nested classes or class set operations inside a
/// class are literal, repeat counts are at most 1000 and only Go's flags (`imsU`) exist.
/// Errors use Go's wording (`missing closing )`, `missing argument to repetition operator`,
/// ...) and name the offending part of the expression as Go does.
pub(crate) fn compile_go_regex(pattern: &str) -> Result<Regex, String> {
    let go_error = |code: &str, expr: &str| format!("error parsing regexp: {code}: `{expr}`");
    let translated = translate_go_regex(pattern).map_err(|(code, expr)| go_error(code, &expr))?;
    // Go's program counts a character class as one instruction, Rust's automaton as many:
    // `[\p{L}\p{N}]{1,1000}` needs about 64 MiB here, which is the limit.
    match RegexBuilder::new(&translated).octal(true).size_limit(1 << 26).build() {
        Ok(re) => Ok(re),
        Err(regex::Error::CompiledTooBig(_)) => Err(go_error("expression too large", pattern)),
        Err(other) => Err(match syntax_error(pattern, &translated) {
            Some((code, expr)) => go_error(code, &expr),
            None => format!("error parsing regexp: {other}"),
        }),
    }
}

/// Go's error code text and offending expression for a pattern Rust's parser refuses.
fn syntax_error(pattern: &str, translated: &str) -> Option<(&'static str, String)> {
    use regex_syntax::ast::ErrorKind as A;
    use regex_syntax::hir::ErrorKind as H;
    let err = regex_syntax::ParserBuilder::new().octal(true).build().parse(translated).err()?;
    let text =
        |start: usize, end: usize| translated.get(start..end).unwrap_or(translated).to_string();
    Some(match err {
        regex_syntax::Error::Parse(e) => {
            let (start, end) = (e.span().start.offset, e.span().end.offset);
            let span = text(start, end);
            match e.kind() {
                A::RepetitionMissing => {
                    // The span is empty; Go names the operator (with a lazy `?`).
                    let rest = translated.get(start..).unwrap_or_default();
                    let op_len = if rest.starts_with('{') {
                        rest.find('}').map_or(rest.len(), |e| e + 1)
                    } else {
                        rest.chars().next().map_or(0, char::len_utf8)
                    };
                    let lazy = usize::from(rest[op_len..].starts_with('?'));
                    ("missing argument to repetition operator", text(start, start + op_len + lazy))
                }
                A::RepetitionCountInvalid
                | A::RepetitionCountUnclosed
                | A::RepetitionCountDecimalEmpty => ("invalid repeat count", span),
                A::GroupUnclosed => ("missing closing )", pattern.to_string()),
                A::GroupUnopened => ("unexpected )", pattern.to_string()),
                A::ClassUnclosed => ("missing closing ]", text(start, translated.len())),
                A::ClassRangeInvalid | A::ClassRangeLiteral => {
                    ("invalid character class range", span)
                }
                A::EscapeUnexpectedEof => {
                    ("trailing backslash at end of expression", String::new())
                }
                A::EscapeUnrecognized
                | A::EscapeHexEmpty
                | A::EscapeHexInvalid
                | A::EscapeHexInvalidDigit
                | A::ClassEscapeInvalid
                | A::UnsupportedBackreference => ("invalid escape sequence", span),
                A::GroupNameDuplicate { .. } => ("duplicate capture group name", span),
                A::GroupNameEmpty | A::GroupNameInvalid | A::GroupNameUnexpectedEof => {
                    ("invalid named capture", span)
                }
                A::UnicodeClassInvalid => ("invalid character class range", span),
                _ => ("invalid or unsupported Perl syntax", span),
            }
        }
        regex_syntax::Error::Translate(e) => {
            let span = text(e.span().start.offset, e.span().end.offset);
            match e.kind() {
                H::UnicodePropertyNotFound | H::UnicodePropertyValueNotFound => {
                    ("invalid character class range", span)
                }
                _ => ("invalid UTF-8", span),
            }
        }
        _ => return None,
    })
}

fn ascii_class(c: char, in_class: bool) -> Option<&'static str> {
    Some(match (c, in_class) {
        ('d', false) => "[0-9]",
        ('d', true) => "0-9",
        ('D', _) => "[^0-9]",
        ('w', false) => "[0-9A-Za-z_]",
        ('w', true) => "0-9A-Za-z_",
        ('W', _) => "[^0-9A-Za-z_]",
        ('s', false) => r"[\t\n\x0C\r ]",
        ('s', true) => r"\t\n\x0C\r ",
        ('S', _) => r"[^\t\n\x0C\r ]",
        _ => return None,
    })
}

/// A repeat `{n}`, `{n,}` or `{n,m}` at `chars[i]` (a `{`): its length and bounds.
fn repeat_at(chars: &[char], i: usize) -> Option<(usize, u64, Option<u64>)> {
    let mut j = i + 1;
    let digits = |j: &mut usize| -> Option<u64> {
        let start = *j;
        while chars.get(*j).is_some_and(char::is_ascii_digit) {
            *j += 1;
        }
        (*j > start).then(|| {
            chars[start..*j].iter().fold(0u64, |n, c| {
                n.saturating_mul(10).saturating_add(u64::from(c.to_digit(10).unwrap_or(0)))
            })
        })
    };
    let min = digits(&mut j)?;
    let max = if chars.get(j) == Some(&',') {
        j += 1;
        digits(&mut j)
    } else {
        Some(min)
    };
    (chars.get(j) == Some(&'}')).then_some((j + 1 - i, min, max))
}

fn translate_go_regex(p: &str) -> Result<String, (&'static str, String)> {
    let chars: Vec<char> = p.chars().collect();
    let text = |a: usize, b: usize| -> String { chars[a..b.min(chars.len())].iter().collect() };
    let mut out = String::with_capacity(p.len() + 8);
    let mut i = 0;
    let mut in_class = false;
    // Position right after `[` or `[^`, where `]` is a literal.
    let mut class_start = false;
    // Where the repetition operator just before the current position started: Go refuses
    // stacked operators (`a**`, `a{2}{3}`).
    let mut last_repeat: Option<usize> = None;
    while i < chars.len() {
        let c = chars[i];
        let at_start = class_start;
        class_start = false;
        if c == '\\' {
            last_repeat = None;
            let Some(&n) = chars.get(i + 1) else {
                out.push('\\');
                break;
            };
            i += 2;
            if let Some(cls) = ascii_class(n, in_class) {
                out.push_str(cls);
            } else if !in_class && (n == 'b' || n == 'B') {
                out.push_str(if n == 'b' { r"(?-u:\b)" } else { r"(?-u:\B)" });
            } else if !in_class && n == 'Q' {
                let mut lit = String::new();
                while i < chars.len() {
                    if chars[i] == '\\' && chars.get(i + 1) == Some(&'E') {
                        i += 2;
                        break;
                    }
                    lit.push(chars[i]);
                    i += 1;
                }
                out.push_str(&regex::escape(&lit));
            } else if ('1'..='7').contains(&n)
                && !chars.get(i).is_some_and(|d| ('0'..='7').contains(d))
            {
                // A lone `\1`..`\7` is a backreference to Go, which it does not support.
                return Err(("invalid escape sequence", text(i - 2, i)));
            } else {
                out.push('\\');
                out.push(n);
                // `\p{Greek}`, `\x{10FFFF}`: the braces belong to the escape.
                if matches!(n, 'p' | 'P' | 'x') && chars.get(i) == Some(&'{') {
                    let end = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .map_or(chars.len(), |e| i + e + 1);
                    out.push_str(&text(i, end));
                    i = end;
                }
            }
            continue;
        }
        if in_class {
            match c {
                ']' if !at_start => {
                    in_class = false;
                    out.push(']');
                }
                ']' => out.push_str(r"\]"),
                '[' if chars.get(i + 1) == Some(&':') => {
                    // A POSIX class `[:alpha:]`, copied through its `:]`.
                    let mut j = i + 2;
                    while j + 1 < chars.len() && !(chars[j] == ':' && chars[j + 1] == ']') {
                        j += 1;
                    }
                    let end = (j + 2).min(chars.len());
                    out.extend(&chars[i..end]);
                    i = end;
                    continue;
                }
                '[' | '&' | '~' => {
                    out.push('\\');
                    out.push(c);
                }
                _ => out.push(c),
            }
            i += 1;
            continue;
        }
        let repeat_len = match c {
            '*' | '+' | '?' => Some(1),
            '{' => match repeat_at(&chars, i) {
                Some((len, min, max)) => {
                    if min > 1000 || max.is_some_and(|m| m > 1000 || m < min) {
                        return Err(("invalid repeat count", text(i, i + len)));
                    }
                    Some(len)
                }
                None => None,
            },
            _ => None,
        };
        if let Some(len) = repeat_len {
            // A `?` right after an operator makes it lazy.
            let end = if chars.get(i + len) == Some(&'?') { i + len + 1 } else { i + len };
            if let Some(start) = last_repeat {
                return Err(("invalid nested repetition operator", text(start, end)));
            }
            out.push_str(&text(i, end));
            last_repeat = Some(i);
            i = end;
            continue;
        }
        last_repeat = None;
        if c == '{' {
            // Not a repeat: a literal, as in Go.
            out.push_str(r"\{");
            i += 1;
            continue;
        }
        if c == '(' && chars.get(i + 1) == Some(&'?') {
            // Go knows the flags i, m, s and U (named groups read alike in Rust; other
            // `(?` forms fail to compile with Go's message below).
            if chars.get(i + 2).is_some_and(|f| (f.is_ascii_alphabetic() && *f != 'P') || *f == '-')
            {
                let mut j = i + 2;
                while let Some(&f) = chars.get(j) {
                    if f == ':' || f == ')' {
                        break;
                    }
                    if !"imsU-".contains(f) {
                        return Err(("invalid or unsupported Perl syntax", text(i, j + 1)));
                    }
                    j += 1;
                }
            }
            out.push_str("(?");
            i += 2;
            continue;
        }
        if c == '[' {
            in_class = true;
            class_start = true;
            out.push('[');
            if chars.get(i + 1) == Some(&'^') {
                out.push('^');
                i += 1;
            }
            i += 1;
            continue;
        }
        out.push(c);
        i += 1;
    }
    Ok(out)
}
