//! Resource quantities (`resource.Quantity`): parsing upstream's serialized form into an
//! exact value in nano-units so requests, limits and QoS can be compared, and printing it
//! back in upstream's canonical form (what a stored object shows: `0.5` becomes `500m`).

/// Upstream's decode error for a malformed quantity.
pub const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// How upstream formats a quantity, decided by the suffix it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    DecimalSi,
    BinarySi,
    DecimalExponent,
}

const NANO: i128 = 1_000_000_000;

/// Upstream `Quantity.String()` of a serialized quantity: `None` when it does not parse
/// (validation reports it) or is out of the exactly representable range.
pub fn canonical(s: &str) -> Option<String> {
    let q = Quantity::parse(s)?;
    if q.0 == i128::MAX || q.0 == -i128::MAX {
        return None;
    }
    let rest = s.trim().trim_start_matches(['+', '-']);
    let suffix = rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    let mut format = if suffix.ends_with('i') {
        Format::BinarySi
    } else if suffix.starts_with(['e', 'E']) {
        Format::DecimalExponent
    } else {
        Format::DecimalSi
    };
    if q.0 == 0 {
        return Some("0".to_string());
    }
    if format == Format::BinarySi && (q.0.abs() < 1024 * NANO || q.0 % NANO != 0) {
        format = Format::DecimalSi;
    }
    let sign = if q.0 < 0 { "-" } else { "" };
    let v = q.0.abs();
    if format == Format::BinarySi {
        let mut n = v / NANO;
        let mut exp = 0;
        while exp < 6 && n % 1024 == 0 {
            n /= 1024;
            exp += 1;
        }
        let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
        return Some(format!("{sign}{n}{suffix}"));
    }
    // Decimal: strip factors of ten, then bring the exponent down to a multiple of three.
    let mut m = v;
    let mut exp: i32 = -9;
    while m % 10 == 0 {
        m /= 10;
        exp += 1;
    }
    while exp.rem_euclid(3) != 0 {
        m *= 10;
        exp -= 1;
    }
    let suffix = match (format, exp) {
        (Format::DecimalExponent, 0) => String::new(),
        (Format::DecimalExponent, e) => format!("e{e}"),
        (_, -9) => "n".into(),
        (_, -6) => "u".into(),
        (_, -3) => "m".into(),
        (_, 0) => String::new(),
        (_, 3) => "k".into(),
        (_, 6) => "M".into(),
        (_, 9) => "G".into(),
        (_, 12) => "T".into(),
        (_, 15) => "P".into(),
        (_, 18) => "E".into(),
        (_, e) => format!("e{e}"),
    };
    Some(format!("{sign}{m}{suffix}"))
}

/// Rewrites every quantity of a resource list (`{"cpu": "0.5"}`) in canonical form, as a
/// decode and re-encode does upstream; malformed values are left for validation.
pub fn canonicalize_list(list: Option<&mut serde_json::Value>) {
    let Some(list) = list.and_then(serde_json::Value::as_object_mut) else {
        return;
    };
    for v in list.values_mut() {
        canonicalize(Some(v));
    }
}

/// Rewrites one quantity value in canonical form (numbers become strings, as upstream
/// accepts `cpu: 1` and serializes `"1"`).
pub fn canonicalize(v: Option<&mut serde_json::Value>) {
    let Some(v) = v else { return };
    let text = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return,
    };
    if let Some(c) = canonical(&text) {
        *v = serde_json::Value::String(c);
    }
}

/// A parsed quantity in units of 10^-9, saturating at the i128 range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(pub i128);

impl Quantity {
    pub const ZERO: Quantity = Quantity(0);

    pub fn parse(s: &str) -> Option<Quantity> {
        let s = s.trim();
        let (negative, rest) = match s.as_bytes().first()? {
            b'+' => (false, &s[1..]),
            b'-' => (true, &s[1..]),
            _ => (false, s),
        };
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, suffix) = rest.split_at(num_end);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return None;
        }
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        // Exponent of ten, binary multiplier.
        let (exp10, bin): (i32, u32) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            s if s.starts_with(['e', 'E']) => {
                let e = &s[1..];
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                (e.parse::<i32>().ok()?, 0)
            }
            _ => return None,
        };
        // value = 0.int_frac digits * 10^(exp10 + 9 - frac_len) * 2^bin, in nano units.
        let mut mantissa: i128 = 0;
        let mut saturated = false;
        for c in int_part.bytes().chain(frac_part.bytes()) {
            match mantissa.checked_mul(10).and_then(|m| m.checked_add(i128::from(c - b'0'))) {
                Some(m) => mantissa = m,
                None => {
                    saturated = true;
                    break;
                }
            }
        }
        let scale = exp10 + 9 - frac_part.len() as i32;
        let mut v = mantissa;
        if !saturated {
            if scale >= 0 {
                for _ in 0..scale {
                    match v.checked_mul(10) {
                        Some(x) => v = x,
                        None => {
                            saturated = true;
                            break;
                        }
                    }
                }
            } else {
                for _ in 0..(-scale) {
                    // Sub-nano precision rounds up, as upstream rounds to its scale.
                    let rounded_up = v % 10 != 0;
                    v = v / 10 + i128::from(rounded_up);
                    if v == 0 {
                        break;
                    }
                }
            }
        }
        if !saturated && bin > 0 {
            match v.checked_mul(1i128 << bin) {
                Some(x) => v = x,
                None => saturated = true,
            }
        }
        if saturated {
            v = i128::MAX;
        }
        // Magnitudes are kept below 2^100 so sums and canonical forms cannot overflow.
        if v > (1i128 << 100) {
            v = i128::MAX;
        }
        Some(Quantity(if negative { -v } else { v }))
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// A quantity as the API types carry it (`k8s_openapi`'s string form).
    pub fn of(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<Quantity> {
        Quantity::parse(&q.0)
    }

    /// Milli-units, rounded up (towards +inf), as upstream's `ScaledValue(Milli)`.
    pub fn milli(self) -> i128 {
        ceil_div(self.0, 1_000_000)
    }

    /// Upstream's `MilliValue()`: [`Quantity::milli`] in an `i64` (saturating).
    pub fn milli_value(self) -> i64 {
        saturate(self.milli())
    }

    /// Upstream's `Value()`: whole units rounded up, in an `i64` (saturating).
    pub fn value(self) -> i64 {
        saturate(ceil_div(self.0, NANO))
    }

    pub fn saturating_add(self, o: Quantity) -> Quantity {
        Quantity(self.0.saturating_add(o.0))
    }
}

fn ceil_div(n: i128, d: i128) -> i128 {
    n.div_euclid(d) + i128::from(n.rem_euclid(d) != 0)
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// CPU in nanocores as upstream's canonical quantity (`12345n`, `5m`, `2`).
pub fn from_nanocores(nanocores: u64) -> String {
    canonical(&format!("{nanocores}n")).unwrap_or_else(|| format!("{nanocores}n"))
}

/// Bytes as upstream's canonical quantity: binary suffixes when whole KiB (`10240Ki` is
/// `10Mi`), else plain bytes.
pub fn from_bytes(bytes: u64) -> String {
    if bytes.is_multiple_of(1024) {
        canonical(&format!("{}Ki", bytes / 1024)).unwrap_or_else(|| bytes.to_string())
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::{Quantity, canonical};

    #[test]
    fn scaled_values_round_up_as_upstream() {
        let mv = |s| Quantity::parse(s).map(Quantity::milli_value);
        let v = |s| Quantity::parse(s).map(Quantity::value);
        assert_eq!(mv("2.007"), Some(2007));
        assert_eq!(mv("100m"), Some(100));
        assert_eq!(mv("0.1m"), Some(1), "rounds up");
        assert_eq!(mv("1.0001"), Some(1001), "rounds up");
        assert_eq!(mv("-1.0001"), Some(-1000), "towards +inf");
        assert_eq!(v("1.5"), Some(2));
        assert_eq!(v("128Mi"), Some(128 << 20));
        assert_eq!(v("1e3"), Some(1000));
        assert_eq!(v("12E"), Some(i64::MAX), "12e18 saturates");
        assert_eq!(mv("9Ei"), Some(i64::MAX), "saturates");
    }

    #[test]
    fn canonical_forms_match_upstream() {
        for (input, want) in [
            ("0.5", "500m"),
            ("1000m", "1"),
            ("1024Mi", "1Gi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Gi", "512Mi"),
            ("100", "100"),
            ("2000", "2k"),
            ("1500", "1500"),
            ("0", "0"),
            ("0Mi", "0"),
            ("1Ki", "1Ki"),
            ("1023Ki", "1023Ki"),
            ("100Mi", "100Mi"),
            ("1.1", "1100m"),
            ("0.0001", "100u"),
            ("1e3", "1e3"),
            ("12e6", "12e6"),
            ("1.5e3", "1500"),
            ("500", "500"),
            ("-0.5", "-500m"),
            ("128974848", "128974848"),
            ("129e6", "129e6"),
            ("129M", "129M"),
            ("123Mi", "123Mi"),
            ("0.1Ki", "102400m"),
        ] {
            assert_eq!(canonical(input).as_deref(), Some(want), "{input}");
        }
        assert_eq!(canonical("lots"), None);
    }

    #[test]
    fn parses_upstream_forms() {
        let q = |s| Quantity::parse(s).map(|q| q.0);
        assert_eq!(q("1"), Some(1_000_000_000));
        assert_eq!(q("100m"), Some(100_000_000));
        assert_eq!(q("0.1"), Some(100_000_000));
        assert_eq!(q("1Ki"), Some(1_024_000_000_000));
        assert_eq!(q("1e3"), Some(1_000_000_000_000));
        assert_eq!(q("-2"), Some(-2_000_000_000));
        assert_eq!(q("1.5Gi"), Some(1_610_612_736_000_000_000));
        assert_eq!(q("1n"), Some(1));
        assert_eq!(q("abc"), None);
        assert_eq!(q("1Qi"), None);
        assert_eq!(q(""), None);
        assert!(Quantity::parse("2").unwrap() > Quantity::parse("1500m").unwrap());
    }
}
