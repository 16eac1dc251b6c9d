//! Saturating time arithmetic. Times and durations read from objects are the user's to
//! choose (a condition at year 9999, `activeDeadlineSeconds: 300000000000`): adding them
//! must clamp at the ends of the representable range, never panic, so one object cannot
//! stop the component that reads it.

use jiff::{SignedDuration, Timestamp};

/// `t + d`, clamped to jiff's range.
pub fn add(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_add(d).unwrap_or(if d.is_negative() { Timestamp::MIN } else { Timestamp::MAX })
}

/// `t + secs` seconds, clamped.
pub fn add_secs(t: Timestamp, secs: i64) -> Timestamp {
    add(t, SignedDuration::from_secs(secs))
}

/// `t - secs` seconds, clamped.
pub fn sub_secs(t: Timestamp, secs: i64) -> Timestamp {
    add(t, SignedDuration::from_secs(secs.saturating_neg()))
}

/// `t + d` for a std duration, clamped.
pub fn add_std(t: Timestamp, d: std::time::Duration) -> Timestamp {
    add(t, SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX))
}

/// `now + secs` seconds on the chrono clock the apiserver writes timestamps with, clamped
/// to the last second RFC 3339 can write (9999-12-31T23:59:59Z) and the first (year 0).
pub fn chrono_add_secs(
    now: chrono::DateTime<chrono::Utc>,
    secs: i64,
) -> chrono::DateTime<chrono::Utc> {
    use chrono::TimeZone;
    let last = chrono::Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).single();
    let first = chrono::Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).single();
    let bound = if secs < 0 { first } else { last };
    let added = chrono::TimeDelta::try_seconds(secs).and_then(|d| now.checked_add_signed(d));
    match (added, bound) {
        (Some(t), Some(last)) if secs >= 0 => t.min(last),
        (Some(t), Some(first)) => t.max(first),
        (Some(t), None) => t,
        (None, Some(b)) => b,
        (None, None) => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_instead_of_panicking() {
        let late: Timestamp = "9999-12-30T00:00:00Z".parse().expect("time");
        assert_eq!(add_secs(late, 300_000_000_000), Timestamp::MAX);
        assert_eq!(add_secs(late, i64::MAX), Timestamp::MAX);
        assert_eq!(sub_secs(Timestamp::MIN, i64::MAX), Timestamp::MIN);
        assert_eq!(sub_secs(Timestamp::MIN, i64::MIN), Timestamp::MAX);
        assert_eq!(add_std(late, std::time::Duration::MAX), Timestamp::MAX);
        let now = chrono::Utc::now();
        assert_eq!(chrono_add_secs(now, i64::MAX).to_rfc3339(), "9999-12-31T23:59:59+00:00");
        assert_eq!(chrono_add_secs(now, 10_i64.pow(13)).to_rfc3339(), "9999-12-31T23:59:59+00:00");
        assert_eq!(chrono_add_secs(now, 30), now + chrono::TimeDelta::seconds(30));
    }
}
