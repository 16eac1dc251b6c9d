//! CronJob schedules as upstream reads them (`cron.ParseStandard` of robfig/cron v3): five
//! fields (minute, hour, day of month, month, day of week) of lists of `*`/`?`, values and
//! ranges with optional `/step`, month and weekday names, or a descriptor (`@hourly`,
//! `@daily`/`@midnight`, `@weekly`, `@monthly`, `@yearly`/`@annually`, `@every <duration>`).
//! Times are found on the wall clock of a time zone (jiff, the system's tz database).

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Bit `n` of each set: value `n` matches. A `*`/`?` day field matches any day
    /// (`dom_any`/`dow_any`), which decides how the two day fields combine.
    Fields { minute: u64, hour: u64, dom: u64, month: u64, dow: u64, dom_any: bool, dow_any: bool },
    /// `@every <duration>`: a constant delay, whole seconds, at least one.
    Every(u64),
}

/// Ranges of the five fields, and their names.
const FIELDS: [(u32, u32, &[&str]); 5] = [
    (0, 59, &[]),
    (0, 23, &[]),
    (1, 31, &[]),
    (1, 12, &["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
    (0, 6, &["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
];

/// How far ahead [`Schedule::next_after`] looks (robfig gives up after five years).
const HORIZON_YEARS: i16 = 5;

impl Schedule {
    /// Parses `spec`; the error reads as robfig's.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err("empty spec string".into());
        }
        if let Some(descriptor) = spec.strip_prefix('@') {
            return descriptor_schedule(descriptor, spec);
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: [{}]",
                fields.len(),
                fields.join(" ")
            ));
        }
        let mut sets = [0u64; 5];
        for (i, field) in fields.iter().enumerate() {
            sets[i] = parse_field(field, FIELDS[i])?;
        }
        let any = |f: &str| f == "*" || f == "?";
        Ok(Schedule::Fields {
            minute: sets[0],
            hour: sets[1],
            dom: sets[2],
            month: sets[3],
            dow: sets[4],
            dom_any: any(fields[2]),
            dow_any: any(fields[4]),
        })
    }

    /// The first time after `after` (strictly) the schedule fires, on `tz`'s wall clock;
    /// `None` when it never does within five years (`0 0 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let (minute, hour, dom, month, dow, dom_any, dow_any) = match *self {
            Schedule::Every(secs) => {
                // robfig: the delay from `after` with its fraction of a second dropped.
                let whole = Timestamp::from_second(after.as_second()).ok()?;
                return whole.checked_add(jiff::SignedDuration::from_secs(secs as i64)).ok();
            }
            Schedule::Fields { minute, hour, dom, month, dow, dom_any, dow_any } => {
                (minute, hour, dom, month, dow, dom_any, dow_any)
            }
        };
        let bit = |set: u64, v: i8| set & (1u64 << v) != 0;
        let day_matches = |d: Date| {
            let by_dom = bit(dom, d.day());
            let by_dow = bit(dow, d.weekday().to_sunday_zero_offset());
            // Either field restricted alone: both must match; both restricted: either.
            if dom_any || dow_any { by_dom && by_dow } else { by_dom || by_dow }
        };
        let start = after.to_zoned(tz.clone()).datetime();
        let mut t = start.with().second(0).subsec_nanosecond(0).build().ok()?;
        t = t.checked_add(1.minute()).ok()?;
        let limit = start.year().saturating_add(HORIZON_YEARS);
        while t.year() <= limit {
            if !bit(month, t.month()) {
                let first = t.date().first_of_month().checked_add(1.month()).ok()?;
                t = first.to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if !day_matches(t.date()) {
                t = t.date().tomorrow().ok()?.to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if !bit(hour, t.hour()) {
                t = hour_start(t)?.checked_add(1.hour()).ok()?;
                continue;
            }
            if !bit(minute, t.minute()) {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            // A wall time in a DST gap or fold resolves as Go's time.Date does (later in a
            // gap, earlier in a fold); it must still be after `after`.
            let at = tz.to_ambiguous_zoned(t).compatible().ok()?.timestamp();
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

fn hour_start(t: DateTime) -> Option<DateTime> {
    t.with().minute(0).second(0).subsec_nanosecond(0).build().ok()
}

fn descriptor_schedule(descriptor: &str, spec: &str) -> Result<Schedule, String> {
    let fields = match descriptor {
        "yearly" | "annually" => "0 0 1 1 *",
        "monthly" => "0 0 1 * *",
        "weekly" => "0 0 * * 0",
        "daily" | "midnight" => "0 0 * * *",
        "hourly" => "0 * * * *",
        _ => {
            if let Some(duration) = descriptor.strip_prefix("every ") {
                let secs = go_duration_secs(duration.trim()).ok_or_else(|| {
                    format!(
                        "failed to parse duration {spec}: time: invalid duration {:?}",
                        duration.trim()
                    )
                })?;
                return Ok(Schedule::Every(secs.max(1)));
            }
            return Err(format!("unrecognized descriptor: {spec}"));
        }
    };
    Schedule::parse(fields)
}

/// Whole seconds of a Go duration (`1h30m`, `90s`, `1.5h`), rounded down as robfig does.
fn go_duration_secs(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Some(total as u64)
}

/// One field: a comma-separated list of `*`, `?`, `a`, `a-b`, each with an optional `/step`.
fn parse_field(field: &str, (min, max, names): (u32, u32, &[&str])) -> Result<u64, String> {
    let mut set = 0u64;
    for expr in field.split(',') {
        let (range, step) = match expr.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| format!("failed to parse int from {s}"))?;
                if step == 0 {
                    return Err(format!("step of range should be a positive number: {expr}"));
                }
                (r, Some(step))
            }
            None => (expr, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (min, max)
        } else {
            let value = |v: &str| -> Result<u32, String> {
                if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
                    return Ok(min + i as u32);
                }
                v.parse().map_err(|_| format!("failed to parse int from {v}"))
            };
            match range.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `a/step` runs from `a` to the end of the field.
                None => {
                    let a = value(range)?;
                    (a, if step.is_some() { max } else { a })
                }
            }
        };
        if lo < min {
            return Err(format!("beginning of range ({lo}) below minimum ({min}): {expr}"));
        }
        if hi > max {
            return Err(format!("end of range ({hi}) above maximum ({max}): {expr}"));
        }
        if lo > hi {
            return Err(format!("beginning of range ({lo}) beyond end of range ({hi}): {expr}"));
        }
        let step = step.unwrap_or(1);
        let mut v = lo;
        while v <= hi {
            set |= 1u64 << v;
            v += step;
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn next(spec: &str, after: &str, tz: &str) -> String {
        let tz = TimeZone::get(tz).expect("time zone");
        let s = Schedule::parse(spec).expect("schedule");
        s.next_after(at(after), &tz).map(|t| t.to_string()).unwrap_or_default()
    }

    #[test]
    fn fields_steps_ranges_and_names() {
        assert_eq!(next("*/15 * * * *", "2026-03-01T10:07:00Z", "UTC"), "2026-03-01T10:15:00Z");
        assert_eq!(next("*/15 * * * *", "2026-03-01T10:15:00Z", "UTC"), "2026-03-01T10:30:00Z");
        assert_eq!(next("5 4 * * sun", "2026-03-02T00:00:00Z", "UTC"), "2026-03-08T04:05:00Z");
        assert_eq!(
            next("0 9-17/4 * JAN-mar MON-FRI", "2026-03-06T13:30:00Z", "UTC"),
            "2026-03-06T17:00:00Z"
        );
        assert_eq!(next("0 0 29 2 *", "2026-03-01T00:00:00Z", "UTC"), "2028-02-29T00:00:00Z");
        assert_eq!(next("@hourly", "2026-03-01T10:59:59.5Z", "UTC"), "2026-03-01T11:00:00Z");
        assert_eq!(next("@every 90s", "2026-03-01T10:00:00.7Z", "UTC"), "2026-03-01T10:01:30Z");
        assert_eq!(next("0 0 30 2 *", "2026-03-01T00:00:00Z", "UTC"), "", "never");
    }

    #[test]
    fn restricted_day_fields_combine_with_or() {
        // The 13th or any Friday; with a `*` day of month only Fridays.
        assert_eq!(next("0 0 13 * 5", "2026-03-01T00:00:00Z", "UTC"), "2026-03-06T00:00:00Z");
        assert_eq!(next("0 0 13 * 5", "2026-03-12T00:00:00Z", "UTC"), "2026-03-13T00:00:00Z");
        assert_eq!(next("0 0 * * 5", "2026-03-12T00:00:00Z", "UTC"), "2026-03-13T00:00:00Z");
        assert_eq!(next("0 0 ? * 1", "2026-03-12T00:00:00Z", "UTC"), "2026-03-16T00:00:00Z");
    }

    #[test]
    fn wall_clock_of_the_time_zone_across_dst() {
        // 02:30 does not exist in Berlin on 2026-03-29: it runs at 03:30 CEST (01:30Z).
        assert_eq!(
            next("30 2 * * *", "2026-03-28T12:00:00Z", "Europe/Berlin"),
            "2026-03-29T01:30:00Z"
        );
        assert_eq!(
            next("0 9 * * *", "2026-07-01T00:00:00Z", "America/New_York"),
            "2026-07-01T13:00:00Z"
        );
    }

    #[test]
    fn errors_read_as_upstream() {
        let err = |s: &str| Schedule::parse(s).expect_err(s);
        assert_eq!(err("* * * *"), "expected exactly 5 fields, found 4: [* * * *]");
        assert_eq!(err("60 * * * *"), "end of range (60) above maximum (59): 60");
        assert_eq!(err("* * 0 * *"), "beginning of range (0) below minimum (1): 0");
        assert_eq!(err("5-1 * * * *"), "beginning of range (5) beyond end of range (1): 5-1");
        assert_eq!(err("x * * * *"), "failed to parse int from x");
        assert_eq!(err("*/0 * * * *"), "step of range should be a positive number: */0");
        assert_eq!(err("@fortnightly"), "unrecognized descriptor: @fortnightly");
        assert_eq!(err(""), "empty spec string");
        assert!(Schedule::parse("* * * * 7").is_err(), "robfig's weekdays are 0-6");
    }
}
