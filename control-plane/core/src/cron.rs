//! CronJob schedules as upstream reads them (`cron.ParseStandard` of robfig/cron v3): five
//! fields (minute, hour, day of month, month, day of week) of lists of `*`/`?`, values and
//! ranges with optional `/step`, month and weekday names, or a descriptor (`@hourly`,
//! `@daily`/`@midnight`, `@weekly`, `@monthly`, `@yearly`/`@annually`, `@every <duration>`).
//! Times are found on the wall clock of a time zone (jiff, the system's tz database).

use jiff::civil::{Date, DateTime, Time};
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
        if spec.is_empty() {
            return Err("empty spec string".into());
        }
        if spec.starts_with('@') {
            return descriptor_schedule(spec);
        }
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: [{}]",
                fields.len(),
                fields.join(" ")
            ));
        }
        let mut sets = [(0u64, false); 5];
        for (i, field) in fields.iter().enumerate() {
            sets[i] = parse_field(field, FIELDS[i])?;
        }
        Ok(Schedule::Fields {
            minute: sets[0].0,
            hour: sets[1].0,
            dom: sets[2].0,
            month: sets[3].0,
            dow: sets[4].0,
            dom_any: sets[2].1,
            dow_any: sets[4].1,
        })
    }

    /// The first time after `after` (strictly) the schedule fires, on `tz`'s wall clock;
    /// `None` when it never does within five years (`0 0 30 2 *`). A port of robfig's
    /// `SpecSchedule.Next`: months and days step on the calendar, hours and minutes in
    /// absolute time, so a time in a spring-forward gap is skipped and one in the repeated
    /// autumn hour fires in both.
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
            // Either field unrestricted: both must match; both restricted: either.
            if dom_any || dow_any { by_dom && by_dow } else { by_dom || by_dow }
        };
        let at = |d: DateTime| d.to_zoned(tz.clone()).ok();
        // The next whole second (the seconds field is always 0).
        let mut t =
            Timestamp::from_second(after.as_second().checked_add(1)?).ok()?.to_zoned(tz.clone());
        let mut added = false;
        let limit = t.year().saturating_add(HORIZON_YEARS);
        'wrap: loop {
            if t.year() > limit {
                return None;
            }
            while !bit(month, t.month()) {
                if !added {
                    added = true;
                    t = at(t.date().first_of_month().to_datetime(Time::midnight()))?;
                }
                t = t.checked_add(1.month()).ok()?;
                if t.month() == 1 {
                    continue 'wrap;
                }
            }
            while !day_matches(t.date()) {
                if !added {
                    added = true;
                    t = at(t.date().to_datetime(Time::midnight()))?;
                }
                t = t.checked_add(1.day()).ok()?;
                // Back to midnight when a DST change moved the hour.
                let h = i64::from(t.hour());
                if h != 0 {
                    let shift = if h > 12 { 24 - h } else { -h };
                    t = t.checked_add(shift.hours()).ok()?;
                }
                if t.day() == 1 {
                    continue 'wrap;
                }
            }
            while !bit(hour, t.hour()) {
                if !added {
                    added = true;
                    t = at(t
                        .datetime()
                        .with()
                        .minute(0)
                        .second(0)
                        .subsec_nanosecond(0)
                        .build()
                        .ok()?)?;
                }
                t = t.checked_add(1.hour()).ok()?;
                if t.hour() == 0 {
                    continue 'wrap;
                }
            }
            while !bit(minute, t.minute()) {
                if !added {
                    added = true;
                    t = at(t.datetime().with().second(0).subsec_nanosecond(0).build().ok()?)?;
                }
                t = t.checked_add(1.minute()).ok()?;
                if t.minute() == 0 {
                    continue 'wrap;
                }
            }
            if t.second() != 0 {
                // On to the next minute, which everything above must match again.
                added = true;
                t = t.checked_add((60 - i64::from(t.second())).seconds()).ok()?;
                continue 'wrap;
            }
            return Some(t.timestamp());
        }
    }
}

fn descriptor_schedule(spec: &str) -> Result<Schedule, String> {
    let fields = match spec {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => {
            if let Some(duration) = spec.strip_prefix("@every ") {
                let nanos = go_duration_nanos(duration).ok_or_else(|| {
                    format!("failed to parse duration {spec}: time: invalid duration {duration:?}")
                })?;
                // robfig: whole seconds, at least one.
                let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(0);
                return Ok(Schedule::Every(secs.max(1)));
            }
            return Err(format!("unrecognized descriptor: {spec}"));
        }
    };
    Schedule::parse(fields)
}

/// Go's `time.ParseDuration` (`1h30m`, `1.5h`, `-2s`, `0`), in nanoseconds.
pub fn go_duration_nanos(s: &str) -> Option<i128> {
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let int: i128 = if int_len == 0 { 0 } else { rest[..int_len].parse().ok()? };
        rest = &rest[int_len..];
        let (frac, frac_len) = match rest.strip_prefix('.') {
            Some(after) => {
                let n = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
                rest = &after[n..];
                (after[..n].to_string(), n)
            }
            None => (String::new(), 0),
        };
        if int_len == 0 && frac_len == 0 {
            return None;
        }
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit: i128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += int * unit;
        if frac_len > 0 {
            let digits = frac.len().min(18);
            let f: i128 = frac[..digits].parse().ok()?;
            total += f * unit / 10i128.pow(digits as u32);
        }
    }
    Some(if negative { -total } else { total })
}

/// One field: a comma-separated list of `*`, `?`, `a`, `a-b`, each with an optional
/// `/step`, as robfig's `getField`. Returns the set, and whether an element is a `*` or
/// `?` without a step above one (robfig's star bit: an unrestricted day field).
fn parse_field(field: &str, (min, max, names): (u32, u32, &[&str])) -> Result<(u64, bool), String> {
    let mut set = 0u64;
    let mut any = false;
    for expr in field.split(',') {
        let parts: Vec<&str> = expr.split('/').collect();
        let bounds: Vec<&str> = parts[0].split('-').collect();
        let single = bounds.len() == 1;
        let value = |v: &str| -> Result<u64, String> {
            if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
                return Ok(u64::from(min) + i as u64);
            }
            parse_int(v)
        };
        let (mut star, lo, mut hi) = if bounds[0] == "*" || bounds[0] == "?" {
            (true, u64::from(min), u64::from(max))
        } else {
            let lo = value(bounds[0])?;
            let hi = match bounds.len() {
                1 => lo,
                2 => value(bounds[1])?,
                _ => return Err(format!("too many hyphens: {expr}")),
            };
            (false, lo, hi)
        };
        let step = match parts.len() {
            1 => 1,
            2 => {
                let step = parse_int(parts[1])?;
                // `a/step` runs from `a` to the end of the field.
                if single {
                    hi = u64::from(max);
                }
                if step > 1 {
                    star = false;
                }
                step
            }
            _ => return Err(format!("too many slashes: {expr}")),
        };
        if lo < u64::from(min) {
            return Err(format!("beginning of range ({lo}) below minimum ({min}): {expr}"));
        }
        if hi > u64::from(max) {
            return Err(format!("end of range ({hi}) above maximum ({max}): {expr}"));
        }
        if lo > hi {
            return Err(format!("beginning of range ({lo}) beyond end of range ({hi}): {expr}"));
        }
        if step == 0 {
            return Err(format!("step of range should be a positive number: {expr}"));
        }
        let mut v = lo;
        while v <= hi {
            set |= 1u64 << v;
            v += step;
        }
        any |= star;
    }
    Ok((set, any))
}

/// robfig's `mustParseInt`: a non-negative decimal, worded as Go's `strconv.Atoi` fails.
fn parse_int(s: &str) -> Result<u64, String> {
    let n: i64 = s.parse().map_err(|_| {
        let why = if !s.is_empty()
            && s.trim_start_matches(['-', '+']).bytes().all(|b| b.is_ascii_digit())
        {
            "value out of range"
        } else {
            "invalid syntax"
        };
        format!("failed to parse int from {s}: strconv.Atoi: parsing {s:?}: {why}")
    })?;
    u64::try_from(n).map_err(|_| format!("negative number ({n}) not allowed: {s}"))
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
        assert_eq!(next("@every 4.1m", "2026-03-01T10:00:00Z", "UTC"), "2026-03-01T10:04:06Z");
        assert_eq!(next("@every -1s", "2026-03-01T10:00:00Z", "UTC"), "2026-03-01T10:00:01Z");
        assert_eq!(next("0 0 30 2 *", "2026-03-01T00:00:00Z", "UTC"), "", "never");
    }

    #[test]
    fn restricted_day_fields_combine_with_or() {
        // The 13th or any Friday; with a `*` day of month only Fridays.
        assert_eq!(next("0 0 13 * 5", "2026-03-01T00:00:00Z", "UTC"), "2026-03-06T00:00:00Z");
        assert_eq!(next("0 0 13 * 5", "2026-03-12T00:00:00Z", "UTC"), "2026-03-13T00:00:00Z");
        assert_eq!(next("0 0 * * 5", "2026-03-12T00:00:00Z", "UTC"), "2026-03-13T00:00:00Z");
        assert_eq!(next("0 0 ? * 1", "2026-03-12T00:00:00Z", "UTC"), "2026-03-16T00:00:00Z");
        // `*/1` is as unrestricted as `*` (robfig's star bit); `*/2` is a restriction.
        assert_eq!(next("0 0 */1 * 1", "2026-03-12T00:00:00Z", "UTC"), "2026-03-16T00:00:00Z");
        assert_eq!(next("0 0 */2 * 1", "2026-03-12T00:00:00Z", "UTC"), "2026-03-13T00:00:00Z");
    }

    #[test]
    fn wall_clock_of_the_time_zone_across_dst() {
        // As robfig: 02:30 does not exist in Berlin on 2026-03-29, so that day is skipped;
        // 01:30 happens twice in New York on 2026-11-01, and fires twice.
        assert_eq!(
            next("30 2 * * *", "2026-03-28T12:00:00Z", "Europe/Berlin"),
            "2026-03-30T00:30:00Z"
        );
        assert_eq!(
            next("30 1 * * *", "2026-11-01T05:30:00Z", "America/New_York"),
            "2026-11-01T06:30:00Z"
        );
        assert_eq!(
            next("*/15 * * * *", "2026-11-01T05:45:00Z", "America/New_York"),
            "2026-11-01T06:00:00Z"
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
        assert_eq!(
            err("x * * * *"),
            "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax"
        );
        assert_eq!(
            Schedule::parse("1/4294967295 * * * *"),
            Schedule::parse("1 * * * *"),
            "a huge step keeps the start alone"
        );
        assert_eq!(err("*/0 * * * *"), "step of range should be a positive number: */0");
        assert_eq!(err("@fortnightly"), "unrecognized descriptor: @fortnightly");
        assert_eq!(err(""), "empty spec string");
        assert!(Schedule::parse("* * * * 7").is_err(), "robfig's weekdays are 0-6");
        assert_eq!(err(" @daily"), "expected exactly 5 fields, found 1: [@daily]");
        assert_eq!(err("*/5/2 * * * *"), "too many slashes: */5/2");
    }
}
