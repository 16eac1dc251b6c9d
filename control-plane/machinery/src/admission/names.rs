//! String formats of upstream `k8s.io/apimachinery/pkg/util/validation` (DNS names, qualified
//! names, label values, port names, config keys, IPs and CIDRs), checked by hand instead of
//! by regex, with upstream's messages.

use std::net::IpAddr;

pub const DNS1123_LABEL_MAX: usize = 63;
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
pub const LABEL_VALUE_MAX: usize = 63;
pub const QUALIFIED_NAME_MAX: usize = 63;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const CONFIG_KEY_MSG: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const PERCENT_MSG: &str =
    "a valid percent string must be a numeric string followed by an ending '%'";
const PERCENT_FMT: &str = "[0-9]+%";

/// Upstream `RegexError`: the message, examples (joined with upstream's odd `,  or `) and
/// the regex.
pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut s = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            s.push_str(" or ");
        }
        s.push('\'');
        s.push_str(e);
        s.push_str("', ");
    }
    s.push_str("regex used for validation is '");
    s.push_str(fmt);
    s.push_str("')");
    s
}

pub fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

pub fn inclusive_range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(matches_dns1123_label)
}

pub fn is_dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    if !matches_dns1123_label(s) {
        if matches_dns1123_subdomain(s) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, &["my-name", "123-abc"]));
        }
    }
    errs
}

pub fn is_dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if !matches_dns1123_subdomain(s) {
        errs.push(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errs
}

pub fn is_dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_error(DNS1123_LABEL_MAX));
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && is_lower_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-');
    if !ok {
        errs.push(regex_error(DNS1035_LABEL_MSG, DNS1035_LABEL_FMT, &["my-name", "abc-123"]));
    }
    errs
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn matches_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

pub fn is_qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let mut parts = s.split('/');
    let first = parts.next().unwrap_or_default();
    let second = parts.next();
    if parts.next().is_some() {
        errs.push(format!(
            "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
        return errs;
    }
    let name = match second {
        None => first,
        Some(name) => {
            if first.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                for m in is_dns1123_subdomain(first) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            name
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX {
        errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX)));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

pub fn is_valid_label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        errs.push(max_len_error(LABEL_VALUE_MAX));
    }
    if !s.is_empty() && !matches_qualified_name_part(s) {
        errs.push(regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, &["MyValue", "my_value", "12345"]));
    }
    errs
}

/// IANA_SVC_NAME (port names).
pub fn is_valid_port_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 15 {
        errs.push(max_len_error(15));
    }
    let b = s.as_bytes();
    if b.is_empty() || !b.iter().all(|&c| is_lower_alnum(c) || c == b'-') {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !b.iter().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if !b.is_empty() && (b[0] == b'-' || b[b.len() - 1] == b'-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

pub fn is_valid_port_num(p: i64) -> Vec<String> {
    if (1..=65535).contains(&p) { Vec::new() } else { vec![inclusive_range_error(1, 65535)] }
}

/// Environment variable names (RelaxedEnvironmentVariableValidation, on by default in 1.33).
pub fn is_relaxed_env_var_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.is_empty() {
        errs.push("environment variable name must be non-empty".to_string());
    }
    if s.chars().any(|c| !(' '..='~').contains(&c) || c == '=') {
        errs.push(
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
                .to_string(),
        );
    }
    errs
}

fn has_chdir_prefix(s: &str) -> Option<String> {
    if s == "." {
        Some("must not be '.'".to_string())
    } else if s == ".." {
        Some("must not be '..'".to_string())
    } else if s.starts_with("..") {
        Some("must not start with '..'".to_string())
    } else {
        None
    }
}

pub fn is_config_map_key(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX));
    }
    if s.is_empty()
        || !s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        errs.push(regex_error(
            CONFIG_KEY_MSG,
            CONFIG_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errs.extend(has_chdir_prefix(s));
    errs
}

pub fn is_valid_percent(s: &str) -> Vec<String> {
    let ok =
        s.strip_suffix('%').is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
    if ok { Vec::new() } else { vec![regex_error(PERCENT_MSG, PERCENT_FMT, &["1%", "93%"])] }
}

/// Path segment names (RBAC objects): not `.`/`..`, no `/` or `%`.
pub fn is_valid_path_segment_name(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    let mut errs = Vec::new();
    for bad in ["/", "%"] {
        if s.contains(bad) {
            errs.push(format!("may not contain '{bad}'"));
        }
    }
    errs
}

/// Go's `ParseIPSloppy`: like std, but IPv4 octets may carry leading zeros.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    // Leading zeros in dotted quads ("010.0.0.1") are accepted by the sloppy parser.
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(&parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::from(octets))
}

pub const IP_ERROR: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";
pub const CIDR_ERROR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

/// A CIDR `addr/prefix` with the prefix in range for the family.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let ip = parse_ip(addr)?;
    if prefix.is_empty() || !prefix.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((ip, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("my-name").is_empty());
        assert_eq!(is_dns1123_label("a.b"), vec!["must not contain dots"]);
        assert_eq!(
            is_dns1123_label("Abc")[0],
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert!(is_dns1123_subdomain("a.b-c.d").is_empty());
        assert_eq!(is_dns1123_subdomain("a..b").len(), 1);
        assert_eq!(is_dns1123_subdomain(&"a".repeat(254))[0], max_len_error(253));
        assert!(is_dns1035_label("abc-1").is_empty());
        assert_eq!(is_dns1035_label("1abc").len(), 1);
    }

    #[test]
    fn qualified_names_and_values() {
        assert!(is_qualified_name("app").is_empty());
        assert!(is_qualified_name("example.com/My_name.x").is_empty());
        assert_eq!(is_qualified_name("/a"), vec!["prefix part must be non-empty"]);
        assert_eq!(is_qualified_name("a/b/c").len(), 1);
        assert_eq!(
            is_qualified_name("-a"),
            vec![
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            ]
        );
        assert!(is_valid_label_value("").is_empty());
        assert_eq!(is_valid_label_value("a b").len(), 1);
        assert_eq!(is_valid_label_value(&"a".repeat(64)), vec![max_len_error(63)]);
    }

    #[test]
    fn ports_keys_ips() {
        assert!(is_valid_port_name("http").is_empty());
        assert_eq!(is_valid_port_name("80").len(), 1);
        assert_eq!(is_valid_port_name("a--b"), vec!["must not contain consecutive hyphens"]);
        assert!(is_config_map_key("a.b_C-1").is_empty());
        assert_eq!(is_config_map_key("..a"), vec!["must not start with '..'"]);
        assert!(is_valid_percent("25%").is_empty());
        assert!(!is_valid_percent("%").is_empty());
        assert!(parse_ip("010.0.0.1").is_some());
        assert!(parse_ip("1.2.3").is_none());
        assert_eq!(parse_cidr("10.0.0.0/8").map(|c| c.1), Some(8));
        assert!(parse_cidr("10.0.0.0/33").is_none());
        assert!(parse_cidr("fd00::/64").is_some());
        assert_eq!(
            is_valid_path_segment_name("a/b%"),
            vec!["may not contain '/'", "may not contain '%'"]
        );
    }
}
