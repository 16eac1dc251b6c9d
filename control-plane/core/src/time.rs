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

/// The last second an API time may name: jiff's (and so k8s-openapi's, which every kube-rs
/// client decodes times with) latest, 9999-12-30T22:00:00Z.
const LAST_API_SECOND: i64 = 253_402_207_200;
/// The first: -9999-01-02T01:59:59Z.
const FIRST_API_SECOND: i64 = -377_705_023_201;

/// `now + secs` seconds, clamped to the range every client can read back
/// ([`LAST_API_SECOND`]); whole seconds once clamped.
pub fn api_add_secs(now: Timestamp, secs: i64) -> Timestamp {
    let t = now.as_second().saturating_add(secs).clamp(FIRST_API_SECOND, LAST_API_SECOND);
    let nanos = if t == now.as_second().saturating_add(secs) { now.subsec_nanosecond() } else { 0 };
    Timestamp::new(t, nanos).unwrap_or(now)
}

/// The time now as the API writes it: RFC 3339 in UTC, whole seconds
/// (`2026-12-02T01:00:00Z`). Formatted once per second, not for every write that stamps a
/// time.
pub fn now_rfc3339() -> String {
    static LAST: std::sync::Mutex<(i64, String)> = std::sync::Mutex::new((i64::MIN, String::new()));
    let t = Timestamp::now();
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.0 != t.as_second() {
        *last = (t.as_second(), rfc3339_seconds(t));
    }
    last.1.clone()
}

/// `t` as the API writes times: RFC 3339 in UTC, whole seconds.
pub fn rfc3339_seconds(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// An RFC 3339 time (as the API writes it) as a `SystemTime`; `None` when it does not parse.
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let t: Timestamp = s.parse().ok()?;
    Some(std::time::SystemTime::from(t))
}

/// A `SystemTime` in RFC 3339, UTC, to the nanosecond when it has them (what kube-proxy's
/// health answers carry).
pub fn rfc3339_precise(t: std::time::SystemTime) -> String {
    Timestamp::try_from(t).map(|t| t.to_string()).unwrap_or_default()
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
        let now = Timestamp::now();
        assert_eq!(api_add_secs(now, i64::MAX).to_string(), "9999-12-30T22:00:00Z");
        assert_eq!(api_add_secs(now, 10_i64.pow(13)).to_string(), "9999-12-30T22:00:00Z");
        assert_eq!(
            api_add_secs(now, 10_i64.pow(13)).as_second(),
            Timestamp::MAX.as_second(),
            "what every client can read back"
        );
        assert_eq!(api_add_secs(now, 30), add_secs(now, 30));
        assert_eq!(api_add_secs(now, i64::MIN).as_second(), FIRST_API_SECOND);
    }

    #[test]
    fn api_times_are_whole_seconds_in_utc() {
        let t: Timestamp = "2026-12-02T01:02:03.456+02:00".parse().expect("time");
        assert_eq!(rfc3339_seconds(t), "2026-12-01T23:02:03Z");
        let now = now_rfc3339();
        assert!(now.ends_with('Z') && now.len() == 20, "{now}");
    }
}
