//! Resource quantities (`resource.Quantity`): parsing upstream's serialized form into an
//! exact value in nano-units so requests, limits and QoS can be compared.

/// Upstream's decode error for a malformed quantity.
pub const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

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
        Some(Quantity(if negative { -v } else { v }))
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    pub fn saturating_add(self, o: Quantity) -> Quantity {
        Quantity(self.0.saturating_add(o.0))
    }
}

#[cfg(test)]
mod tests {
    use super::Quantity;

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
