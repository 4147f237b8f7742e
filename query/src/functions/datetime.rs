//! Date and time functions.
//!
//! Cosmos DB keeps dates and times as ISO 8601 UTC strings, `YYYY-MM-DDThh:mm:ss.fffffffZ`
//! (seven fractional digits, trailing `Z`), and as numbers: *ticks* (100-nanosecond
//! intervals) and *timestamps* (milliseconds), both counted from the Unix epoch
//! 1970-01-01T00:00:00Z — the reference's examples fix the epoch (`DateTimeToTicks` of
//! 2015-05-19T12:00:00 is 14320368000000000, `TicksToDateTime(0)` is 1970-01-01).
//!
//! Internally an instant is an `i64` count of ticks since the Unix epoch, limited to the
//! range of .NET's `DateTime`, 0001-01-01T00:00:00.0000000Z through
//! 9999-12-31T23:59:59.9999999Z; any result outside it is `undefined`, as are malformed
//! strings, unknown part names and arguments of the wrong type. No function reads the system
//! clock: the `GetCurrent*` functions (and their `*Static` forms, the same here), `Now` and
//! `Ago` return the query's one clock reading, [`Context::now_ms`].
//!
//! `DateTimeFormat(dateTime, format)` writes a date and time with the custom format
//! specifiers of .NET's date and time formatting (culture-invariant names), as far as the
//! reference's examples show them: `y`/`yy` (the year's last two digits), `yyy`.. (the year,
//! padded with zeros to the letters' count), `M`/`MM` (month), `MMM`/`MMMM` (its abbreviated
//! or full English name), `d`/`dd` (day), `ddd`/`dddd` (weekday name), `h`/`hh` (12-hour
//! clock), `H`/`HH`, `m`/`mm`, `s`/`ss`, `f`.. to seven `f`s (second fraction digits), `F`..
//! to seven (the same, trailing zeros dropped; nothing when zero — the `.` before them stays,
//! as in the reference's example), `t`/`tt` (`A`/`AM` or `P`/`PM`) and `K` (`Z`). A `\`
//! makes the next character literal, text in `'...'` or `"..."` is copied, and any other
//! character is copied as it is. More than seven `f`/`F`s, or a malformed date, give
//! `undefined`; a single letter is a custom specifier too (.NET's one-letter standard
//! formats are not supported).

use chrono::{Datelike, Months, NaiveDate};
use serde_json::Value;

use super::math::{int_arg, int_result};
use super::{Context, Function, FunctionError, function};
use crate::value::{Val, string};

pub(super) const FUNCTIONS: &[Function] = &[
    function("GetCurrentDateTime", 0, 0, |c, _| {
        Ok(now_ticks(c).and_then(format))
    }),
    function("GetCurrentTimestamp", 0, 0, |c, _| {
        Ok(int_result(Some(c.now_ms)))
    }),
    function("GetCurrentTicks", 0, 0, |c, _| Ok(int_result(now_ticks(c)))),
    function("GetCurrentDateTimeStatic", 0, 0, |c, _| {
        Ok(now_ticks(c).and_then(format))
    }),
    function("GetCurrentTimestampStatic", 0, 0, |c, _| {
        Ok(int_result(Some(c.now_ms)))
    }),
    function("GetCurrentTicksStatic", 0, 0, |c, _| {
        Ok(int_result(now_ticks(c)))
    }),
    function("Now", 0, 2, |c, a| Ok(now_plus(c, a, false))),
    function("Ago", 2, 2, |c, a| Ok(now_plus(c, a, true))),
    function("DateTimeFormat", 2, 2, date_time_format),
    function("DAY", 1, 1, |_, a| Ok(part_of(Part::Day, &a[0]))),
    function("MONTH", 1, 1, |_, a| Ok(part_of(Part::Month, &a[0]))),
    function("YEAR", 1, 1, |_, a| Ok(part_of(Part::Year, &a[0]))),
    function("DateTimeAdd", 3, 3, date_time_add),
    function("DateTimeDiff", 3, 3, date_time_diff),
    function("DateTimePart", 2, 2, date_time_part),
    function("DateTimeFromParts", 3, 7, date_time_from_parts),
    function("DateTimeBin", 2, 4, date_time_bin),
    function("DateTimeToTicks", 1, 1, |_, a| {
        Ok(int_result(date_arg(&a[0])))
    }),
    function("DateTimeToTimestamp", 1, 1, |_, a| {
        // Whole milliseconds, rounded down (toward the past), as .NET's
        // `ToUnixTimeMilliseconds` does.
        Ok(int_result(
            date_arg(&a[0]).map(|t| t.div_euclid(TICKS_PER_MS)),
        ))
    }),
    function("TicksToDateTime", 1, 1, |_, a| {
        Ok(int_arg(&a[0]).and_then(format))
    }),
    function("TimestampToDateTime", 1, 1, |_, a| {
        Ok(int_arg(&a[0])
            .and_then(|ms| ms.checked_mul(TICKS_PER_MS))
            .and_then(format))
    }),
];

const TICKS_PER_US: i64 = 10;
const TICKS_PER_MS: i64 = 10_000;
const TICKS_PER_SECOND: i64 = 10_000_000;
const TICKS_PER_MINUTE: i64 = 60 * TICKS_PER_SECOND;
const TICKS_PER_HOUR: i64 = 60 * TICKS_PER_MINUTE;
const TICKS_PER_DAY: i64 = 24 * TICKS_PER_HOUR;
/// Days from 0001-01-01 (day 1 of the common era) to 1970-01-01.
const UNIX_EPOCH_DAYS_FROM_CE: i64 = 719_163;
/// 0001-01-01T00:00:00Z in ticks since the Unix epoch.
const MIN_TICKS: i64 = -62_135_596_800 * TICKS_PER_SECOND;
/// 9999-12-31T23:59:59.9999999Z in ticks since the Unix epoch.
const MAX_TICKS: i64 = 253_402_300_800 * TICKS_PER_SECOND - 1;
/// 1601-01-01T00:00:00Z (the Windows epoch), the earliest `DateTimeBin` origin.
const WINDOWS_EPOCH_TICKS: i64 = -11_644_473_600 * TICKS_PER_SECOND;

/// A date and time part, as `DateTimeAdd`, `DateTimeDiff`, `DateTimePart` and `DateTimeBin`
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    Millisecond,
    Microsecond,
    Nanosecond,
}

impl Part {
    /// The part a string names (the reference's names and abbreviations, in any letter case).
    fn parse(v: &Val) -> Option<Part> {
        let Val::Json(Value::String(s)) = v else {
            return None;
        };
        Some(match s.to_ascii_lowercase().as_str() {
            "year" | "yyyy" | "yy" => Part::Year,
            "month" | "mm" | "m" => Part::Month,
            "day" | "dd" | "d" => Part::Day,
            "hour" | "hh" => Part::Hour,
            "minute" | "mi" | "n" => Part::Minute,
            "second" | "ss" | "s" => Part::Second,
            "millisecond" | "ms" => Part::Millisecond,
            "microsecond" | "mcs" => Part::Microsecond,
            "nanosecond" | "ns" => Part::Nanosecond,
            _ => return None,
        })
    }

    /// The part's length in nanoseconds, for the parts of fixed length (day and finer).
    fn fixed_nanos(self) -> Option<i128> {
        Some(match self {
            Part::Year | Part::Month => return None,
            Part::Day => 86_400_000_000_000,
            Part::Hour => 3_600_000_000_000,
            Part::Minute => 60_000_000_000,
            Part::Second => 1_000_000_000,
            Part::Millisecond => 1_000_000,
            Part::Microsecond => 1_000,
            Part::Nanosecond => 1,
        })
    }
}

/// The query's clock reading in ticks.
fn now_ticks(ctx: &Context) -> Option<i64> {
    ctx.now_ms.checked_mul(TICKS_PER_MS)
}

/// A date and time argument: a string [`parse`] accepts, else `None`.
fn date_arg(v: &Val) -> Option<i64> {
    match v {
        Val::Json(Value::String(s)) => parse(s),
        _ => None,
    }
}

/// Ticks since the Unix epoch of a Cosmos DB date and time string, `None` if it is not one.
///
/// The accepted forms are those `IS_DATETIME`'s reference lists: `YYYY-MM-DD`, optionally
/// followed by `Z`, or by `T` (or a space) and `hh:mm:ss`, an optional fraction of one to
/// seven digits after a `.`, and an optional `Z`. Nothing else may follow; the fields must
/// make a real date and time from year 1 to 9999.
pub(crate) fn parse(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let year = digits(b, 0, 4)?;
    expect(b, 4, b'-')?;
    let month = digits(b, 5, 2)?;
    expect(b, 7, b'-')?;
    let day = digits(b, 8, 2)?;
    let (mut hour, mut minute, mut second, mut fraction) = (0, 0, 0, 0);
    let mut pos = 10;
    if pos < b.len() && b[pos] != b'Z' {
        if b[pos] != b'T' && b[pos] != b' ' {
            return None;
        }
        hour = digits(b, 11, 2)?;
        expect(b, 13, b':')?;
        minute = digits(b, 14, 2)?;
        expect(b, 16, b':')?;
        second = digits(b, 17, 2)?;
        pos = 19;
        if b.get(pos) == Some(&b'.') {
            pos += 1;
            let count = b[pos..].iter().take_while(|c| c.is_ascii_digit()).count();
            if !(1..=7).contains(&count) {
                return None;
            }
            fraction = digits(b, pos, count)? * 10i64.pow(7 - u32::try_from(count).ok()?);
            pos += count;
        }
    }
    if b.get(pos) == Some(&b'Z') {
        pos += 1;
    }
    if pos != b.len() || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(
        i32::try_from(year).ok()?,
        u32::try_from(month).ok()?,
        u32::try_from(day).ok()?,
    )?;
    if year < 1 {
        return None;
    }
    let time = (hour * 3600 + minute * 60 + second) * TICKS_PER_SECOND + fraction;
    Some(date_ticks(date) + time)
}

/// `len` ASCII digits at `at`, as a number.
fn digits(b: &[u8], at: usize, len: usize) -> Option<i64> {
    let field = b.get(at..at + len)?;
    field.iter().try_fold(0i64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
    })
}

fn expect(b: &[u8], at: usize, c: u8) -> Option<()> {
    (b.get(at) == Some(&c)).then_some(())
}

/// Midnight of `date` in ticks since the Unix epoch.
fn date_ticks(date: NaiveDate) -> i64 {
    (i64::from(date.num_days_from_ce()) - UNIX_EPOCH_DAYS_FROM_CE) * TICKS_PER_DAY
}

/// An instant split into its calendar date and the ticks since that date's midnight.
fn split(ticks: i64) -> Option<(NaiveDate, i64)> {
    if !(MIN_TICKS..=MAX_TICKS).contains(&ticks) {
        return None;
    }
    let days = ticks.div_euclid(TICKS_PER_DAY) + UNIX_EPOCH_DAYS_FROM_CE;
    let date = NaiveDate::from_num_days_from_ce_opt(i32::try_from(days).ok()?)?;
    Some((date, ticks.rem_euclid(TICKS_PER_DAY)))
}

/// The Cosmos DB string of an instant, `YYYY-MM-DDThh:mm:ss.fffffffZ`; `None` outside years
/// 1 to 9999.
fn format(ticks: i64) -> Option<Value> {
    let (date, time) = split(ticks)?;
    let seconds = time / TICKS_PER_SECOND;
    string(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:07}Z",
        date.year(),
        date.month(),
        date.day(),
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        time % TICKS_PER_SECOND
    ))
}

/// `DateTimeAdd(part, n, dateTime)`: `n` (a whole number) of `part` added. Adding months or
/// years keeps the day of the month, clamped to the new month's last day (2020-01-31 plus one
/// month is 2020-02-29), as .NET's `AddMonths` does; nanoseconds count in whole ticks,
/// truncated toward zero.
fn date_time_add(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(part), Some(n), Some(ticks)) =
        (Part::parse(&args[0]), int_arg(&args[1]), date_arg(&args[2]))
    else {
        return Ok(None);
    };
    Ok(add_part(part, n, ticks).and_then(format))
}

/// `Now()`, `Now(part, n)` (the query's clock plus `n` of `part`, as `DateTimeAdd` adds) and
/// `Ago(part, n)` (`ago`: minus). `Now` with one argument is `undefined`.
fn now_plus(ctx: &Context, args: &[Val], ago: bool) -> Option<Value> {
    let now = now_ticks(ctx)?;
    if args.is_empty() {
        return format(now);
    }
    let (part, n) = (Part::parse(args.first()?)?, int_arg(args.get(1)?)?);
    let n = if ago { n.checked_neg()? } else { n };
    add_part(part, n, now).and_then(format)
}

/// `DAY`, `MONTH` and `YEAR`: `DateTimePart` of one part.
fn part_of(part: Part, v: &Val) -> Option<Value> {
    int_result(date_arg(v).and_then(|ticks| part_value(part, ticks)))
}

/// `n` of `part` added to `ticks`, if the result is in range.
fn add_part(part: Part, n: i64, ticks: i64) -> Option<i64> {
    match part {
        Part::Year => n
            .checked_mul(12)
            .and_then(|months| add_months(ticks, months)),
        Part::Month => add_months(ticks, n),
        Part::Day => add_ticks(ticks, n, TICKS_PER_DAY),
        Part::Hour => add_ticks(ticks, n, TICKS_PER_HOUR),
        Part::Minute => add_ticks(ticks, n, TICKS_PER_MINUTE),
        Part::Second => add_ticks(ticks, n, TICKS_PER_SECOND),
        Part::Millisecond => add_ticks(ticks, n, TICKS_PER_MS),
        Part::Microsecond => add_ticks(ticks, n, TICKS_PER_US),
        Part::Nanosecond => add_ticks(ticks, n / 100, 1),
    }
}

const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAY_NAMES: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `DateTimeFormat(dateTime, format)` (see the module's documentation).
fn date_time_format(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(ticks), Val::Json(Value::String(spec))) = (date_arg(&args[0]), &args[1]) else {
        return Ok(None);
    };
    let Some((date, time)) = split(ticks) else {
        return Ok(None);
    };
    let seconds = time / TICKS_PER_SECOND;
    let fraction = time % TICKS_PER_SECOND;
    let (hour, minute, second) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let chars: Vec<char> = spec.chars().collect();
    let mut out = String::with_capacity(spec.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let run = chars[i..].iter().take_while(|&&x| x == c).count();
        let mut used = run;
        match c {
            'y' => {
                let year = i64::from(date.year());
                if run <= 2 {
                    out.push_str(&format!("{:0run$}", year % 100));
                } else {
                    out.push_str(&format!("{year:0run$}"));
                }
            }
            'M' => match run {
                1 | 2 => out.push_str(&format!("{:0run$}", date.month())),
                _ => {
                    let name = MONTH_NAMES[date.month0() as usize];
                    out.push_str(if run == 3 { &name[..3] } else { name });
                }
            },
            'd' => match run {
                1 | 2 => out.push_str(&format!("{:0run$}", date.day())),
                _ => {
                    let name = DAY_NAMES[date.weekday().num_days_from_monday() as usize];
                    out.push_str(if run == 3 { &name[..3] } else { name });
                }
            },
            'h' | 'H' | 'm' | 's' => {
                let width = run.min(2);
                let n = match c {
                    'h' => (hour + 11) % 12 + 1,
                    'H' => hour,
                    'm' => minute,
                    _ => second,
                };
                out.push_str(&format!("{n:0width$}"));
            }
            'f' | 'F' => {
                if run > 7 {
                    return Ok(None);
                }
                let digits = format!("{fraction:07}");
                let digits = &digits[..run];
                if c == 'f' {
                    out.push_str(digits);
                } else {
                    out.push_str(digits.trim_end_matches('0'));
                }
            }
            't' => {
                let ampm = if hour < 12 { "AM" } else { "PM" };
                out.push_str(&ampm[..run.min(2)]);
            }
            'K' => {
                used = 1;
                out.push('Z');
            }
            '\\' => {
                used = 1;
                if let Some(&next) = chars.get(i + 1) {
                    out.push(next);
                    used = 2;
                }
            }
            '\'' | '"' => {
                // Copied to the closing quote (or the end).
                let text: String = chars[i + 1..].iter().take_while(|&&x| x != c).collect();
                used = text.chars().count() + 2;
                out.push_str(&text);
            }
            _ => {
                used = 1;
                out.push(c);
            }
        }
        i += used;
    }
    Ok(string(out))
}

fn add_ticks(ticks: i64, n: i64, unit: i64) -> Option<i64> {
    n.checked_mul(unit)?.checked_add(ticks)
}

fn add_months(ticks: i64, months: i64) -> Option<i64> {
    let (date, time) = split(ticks)?;
    // The whole range is under 120,000 months; larger counts are out of range anyway.
    let count = Months::new(
        u32::try_from(months.unsigned_abs())
            .ok()
            .filter(|&m| m <= 120_000)?,
    );
    let date = if months >= 0 {
        date.checked_add_months(count)?
    } else {
        date.checked_sub_months(count)?
    };
    if !(1..=9999).contains(&date.year()) {
        return None;
    }
    Some(date_ticks(date) + time)
}

/// `DateTimeDiff(part, start, end)`: how many `part` boundaries lie between `start` and
/// `end` (negative when `end` is earlier) — a count of boundaries crossed, not of whole
/// elapsed units: from 23:59 to 00:01 the next day is one day and one hour.
fn date_time_diff(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(part), Some(start), Some(end)) = (
        Part::parse(&args[0]),
        date_arg(&args[1]),
        date_arg(&args[2]),
    ) else {
        return Ok(None);
    };
    let (Some((start_date, _)), Some((end_date, _))) = (split(start), split(end)) else {
        return Ok(None);
    };
    let (start, end) = (i128::from(start), i128::from(end));
    let diff = match part {
        Part::Year => i128::from(end_date.year() - start_date.year()),
        Part::Month => {
            let months = |d: NaiveDate| i128::from(d.year()) * 12 + i128::from(d.month());
            months(end_date) - months(start_date)
        }
        Part::Nanosecond => (end - start) * 100,
        _ => {
            // Fixed-length parts of a whole number of ticks: count unit boundaries.
            let unit = part.fixed_nanos().map_or(1, |ns| ns / 100);
            end.div_euclid(unit) - start.div_euclid(unit)
        }
    };
    // Every difference fits in an i64 (nanoseconds to within about ±292 years).
    Ok(i64::try_from(diff)
        .ok()
        .and_then(|d| int_result(Some(d)))
        .or_else(|| {
            #[allow(clippy::cast_precision_loss, reason = "a nanosecond count past i64")]
            crate::value::json_number(diff as f64)
        }))
}

/// `DateTimePart(part, dateTime)`: the part's value. Milliseconds, microseconds and
/// nanoseconds each give the whole fraction of the second in that unit (.1301617 s is 130
/// ms, 130161 µs, 130161700 ns).
fn date_time_part(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(part), Some(ticks)) = (Part::parse(&args[0]), date_arg(&args[1])) else {
        return Ok(None);
    };
    Ok(int_result(part_value(part, ticks)))
}

/// The value of `part` in the instant `ticks`.
fn part_value(part: Part, ticks: i64) -> Option<i64> {
    let (date, time) = split(ticks)?;
    let seconds = time / TICKS_PER_SECOND;
    let fraction = time % TICKS_PER_SECOND;
    Some(match part {
        Part::Year => i64::from(date.year()),
        Part::Month => i64::from(date.month()),
        Part::Day => i64::from(date.day()),
        Part::Hour => seconds / 3600,
        Part::Minute => seconds / 60 % 60,
        Part::Second => seconds % 60,
        Part::Millisecond => fraction / TICKS_PER_MS,
        Part::Microsecond => fraction / TICKS_PER_US,
        Part::Nanosecond => fraction * 100,
    })
}

/// `DateTimeFromParts(year, month, day [, hour [, minute [, second [, fraction]]]])`: the
/// fraction counts ticks (seven digits, 0 to 9999999). Every argument must be a whole number
/// and the whole a real date and time from year 1 to 9999, else undefined.
fn date_time_from_parts(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let mut parts = [0i64; 7];
    for (slot, arg) in parts.iter_mut().zip(args) {
        let Some(v) = int_arg(arg) else {
            return Ok(None);
        };
        *slot = v;
    }
    let [year, month, day, hour, minute, second, fraction] = parts;
    if !(1..=9999).contains(&year)
        || !(0..=23).contains(&hour)
        || !(0..=59).contains(&minute)
        || !(0..=59).contains(&second)
        || !(0..TICKS_PER_SECOND).contains(&fraction)
    {
        return Ok(None);
    }
    let (Ok(year), Ok(month), Ok(day)) = (
        i32::try_from(year),
        u32::try_from(month),
        u32::try_from(day),
    ) else {
        return Ok(None);
    };
    let Some(date) = NaiveDate::from_ymd_opt(year, month, day) else {
        return Ok(None);
    };
    let time = (hour * 3600 + minute * 60 + second) * TICKS_PER_SECOND + fraction;
    Ok(format(date_ticks(date) + time))
}

/// `DateTimeBin(dateTime, part [, binSize [, origin]])`: the start of the bin of `binSize`
/// (a positive whole number, default 1) `part`s, counted from `origin` (default the Unix
/// epoch), that holds `dateTime`. Parts are day and finer (years and months have no fixed
/// length: undefined); an origin before 1601-01-01 gives undefined, as the reference says.
fn date_time_bin(_: &Context, args: &[Val]) -> Result<Option<Value>, FunctionError> {
    let (Some(ticks), Some(unit)) = (
        date_arg(&args[0]),
        Part::parse(&args[1]).and_then(Part::fixed_nanos),
    ) else {
        return Ok(None);
    };
    let size = match args.get(2) {
        None => 1,
        Some(v) => match int_arg(v) {
            Some(n) if n > 0 => n,
            _ => return Ok(None),
        },
    };
    let origin = match args.get(3) {
        None => 0,
        Some(v) => match date_arg(v) {
            Some(t) if t >= WINDOWS_EPOCH_TICKS => t,
            _ => return Ok(None),
        },
    };
    // In nanoseconds: a bin of nanoseconds may be finer than a tick. |size × unit| < 2^63 ×
    // 2^47 and every instant is under 2^62 ns from the epoch, so i128 holds it all.
    let bin = i128::from(size) * unit;
    let (t, o) = (i128::from(ticks) * 100, i128::from(origin) * 100);
    let start = o + (t - o).div_euclid(bin) * bin;
    Ok(i64::try_from(start.div_euclid(100)).ok().and_then(format))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::lookup;
    use super::*;

    fn call_at(now_ms: i64, name: &str, args: &[Option<Value>]) -> Option<Value> {
        let f = lookup(name).expect("known function");
        assert!(
            (f.min_args..=f.max_args).contains(&args.len()),
            "{name} arity"
        );
        super::super::call_json(f, &Context::new(now_ms, 1), args).expect("no error")
    }

    fn call(name: &str, args: &[Option<Value>]) -> Option<Value> {
        call_at(0, name, args)
    }

    fn s(v: &str) -> Option<Value> {
        Some(json!(v))
    }

    fn i(v: i64) -> Option<Value> {
        Some(json!(v))
    }

    #[test]
    fn every_function_is_registered() {
        for name in [
            "GetCurrentDateTime",
            "GetCurrentTimestamp",
            "GetCurrentTicks",
            "DateTimeAdd",
            "DateTimeDiff",
            "DateTimePart",
            "DateTimeFromParts",
            "DateTimeBin",
            "DateTimeToTicks",
            "DateTimeToTimestamp",
            "TicksToDateTime",
            "TimestampToDateTime",
        ] {
            assert_eq!(lookup(name).map(|f| f.name), Some(name));
        }
        assert_eq!(lookup("DATETIMEADD").map(|f| f.name), Some("DateTimeAdd"));
    }

    #[test]
    fn current_time_is_the_query_clock() {
        // 1597360794300 ms is the reference's TimestampToDateTime example instant.
        let now = 1_597_360_794_300;
        assert_eq!(
            call_at(now, "GetCurrentDateTime", &[]),
            s("2020-08-13T23:19:54.3000000Z")
        );
        assert_eq!(call_at(now, "GetCurrentTimestamp", &[]), i(now));
        assert_eq!(
            call_at(now, "GetCurrentTicks", &[]),
            i(15_973_607_943_000_000)
        );
        assert_eq!(
            call_at(0, "GetCurrentDateTime", &[]),
            s("1970-01-01T00:00:00.0000000Z")
        );
        // A clock reading no DateTime can show.
        assert_eq!(call_at(i64::MAX, "GetCurrentDateTime", &[]), None);
        assert_eq!(call_at(i64::MAX, "GetCurrentTicks", &[]), None);
    }

    #[test]
    fn date_time_add_reference_example() {
        let d = s("2020-07-03T00:00:00.0000000");
        let add = |part: &str, n: i64| call("DateTimeAdd", &[s(part), i(n), d.clone()]);
        assert_eq!(add("yyyy", 1), s("2021-07-03T00:00:00.0000000Z"));
        assert_eq!(add("mm", 1), s("2020-08-03T00:00:00.0000000Z"));
        assert_eq!(add("dd", 1), s("2020-07-04T00:00:00.0000000Z"));
        assert_eq!(add("hh", 1), s("2020-07-03T01:00:00.0000000Z"));
        assert_eq!(add("yyyy", -1), s("2019-07-03T00:00:00.0000000Z"));
        assert_eq!(add("mm", -1), s("2020-06-03T00:00:00.0000000Z"));
        assert_eq!(add("dd", -1), s("2020-07-02T00:00:00.0000000Z"));
        assert_eq!(add("hh", -1), s("2020-07-02T23:00:00.0000000Z"));
        assert_eq!(add("ss", 5 * -5), s("2020-07-02T23:59:35.0000000Z"));
    }

    #[test]
    fn date_time_add_parts_and_edges() {
        let d = s("2020-01-31T10:20:30.1234567Z");
        let add = |part: &str, n: Option<Value>| call("DateTimeAdd", &[s(part), n, d.clone()]);
        assert_eq!(add("month", i(1)), s("2020-02-29T10:20:30.1234567Z"));
        assert_eq!(add("m", i(13)), s("2021-02-28T10:20:30.1234567Z"));
        assert_eq!(add("year", i(-2020)), None);
        assert_eq!(add("yy", i(-2019)), s("0001-01-31T10:20:30.1234567Z"));
        assert_eq!(add("yy", i(7979)), s("9999-01-31T10:20:30.1234567Z"));
        assert_eq!(add("yy", i(7980)), None);
        assert_eq!(add("d", i(1)), s("2020-02-01T10:20:30.1234567Z"));
        assert_eq!(add("minute", i(40)), s("2020-01-31T11:00:30.1234567Z"));
        assert_eq!(add("mi", i(1)), s("2020-01-31T10:21:30.1234567Z"));
        assert_eq!(add("n", i(-21)), s("2020-01-31T09:59:30.1234567Z"));
        assert_eq!(add("s", i(30)), s("2020-01-31T10:21:00.1234567Z"));
        assert_eq!(add("ms", i(877)), s("2020-01-31T10:20:31.0004567Z"));
        assert_eq!(add("mcs", i(1)), s("2020-01-31T10:20:30.1234577Z"));
        assert_eq!(add("ns", i(250)), s("2020-01-31T10:20:30.1234569Z"));
        assert_eq!(add("ns", i(-99)), s("2020-01-31T10:20:30.1234567Z"));
        assert_eq!(add("HOUR", i(1)), s("2020-01-31T11:20:30.1234567Z"));
        // Huge, fractional or non-numeric counts, bad parts and bad dates.
        assert_eq!(add("year", Some(json!(1e18))), None);
        assert_eq!(add("year", i(i64::MIN)), None);
        assert_eq!(add("month", i(i64::MAX)), None);
        assert_eq!(add("day", i(i64::MAX)), None);
        assert_eq!(add("ms", i(i64::MAX)), None);
        assert_eq!(add("mcs", i(i64::MIN)), None);
        // i64::MAX nanoseconds is only about 292 years.
        let base = date_arg(&d.clone().into()).expect("valid");
        for n in [i64::MAX, i64::MIN] {
            let ticks = call("DateTimeToTicks", &[add("ns", i(n))]);
            assert_eq!(ticks, i(base + n / 100));
        }
        assert_eq!(add("ns", i(i64::MAX)), s("2312-05-12T10:07:46.9782325Z"));
        assert_eq!(add("day", Some(json!(1.5))), None);
        assert_eq!(add("day", s("1")), None);
        assert_eq!(add("day", None), None);
        assert_eq!(add("week", i(1)), None);
        assert_eq!(call("DateTimeAdd", &[i(1), i(1), d.clone()]), None);
        assert_eq!(call("DateTimeAdd", &[s("dd"), i(1), s("2020-13-01")]), None);
        assert_eq!(call("DateTimeAdd", &[s("dd"), i(1), i(0)]), None);
        assert_eq!(
            call(
                "DateTimeAdd",
                &[s("ms"), i(1), s("9999-12-31T23:59:59.9999999Z")]
            ),
            None
        );
    }

    #[test]
    fn date_time_diff_reference_example() {
        let (a, b) = (
            s("2019-02-04T16:00:00.0000000"),
            s("2018-03-05T05:00:00.0000000"),
        );
        let diff = |part: &str, x: &Option<Value>, y: &Option<Value>| {
            call("DateTimeDiff", &[s(part), x.clone(), y.clone()])
        };
        assert_eq!(diff("yyyy", &a, &b), i(-1));
        assert_eq!(diff("mm", &a, &b), i(-11));
        // "diffDays" is no part name: the example's result leaves that field out.
        assert_eq!(diff("diffDays", &a, &b), None);
        assert_eq!(diff("hh", &a, &b), i(-8075));
        assert_eq!(diff("ss", &a, &b), i(-29_070_000));
        assert_eq!(diff("yyyy", &b, &a), i(1));
        assert_eq!(diff("mm", &b, &a), i(11));
        assert_eq!(diff("diffDays", &b, &a), None);
        assert_eq!(diff("hh", &b, &a), i(8075));
        assert_eq!(diff("ss", &b, &a), i(29_070_000));
    }

    #[test]
    fn date_time_diff_counts_boundaries() {
        let diff = |part: &str, x: &str, y: &str| call("DateTimeDiff", &[s(part), s(x), s(y)]);
        let (x, y) = (
            "2020-12-31T23:59:59.9999999Z",
            "2021-01-01T00:00:00.0000000Z",
        );
        for part in [
            "year", "month", "day", "hour", "minute", "second", "ms", "mcs",
        ] {
            assert_eq!(diff(part, x, y), i(1), "{part}");
            assert_eq!(diff(part, y, x), i(-1), "{part}");
        }
        assert_eq!(diff("ns", x, y), i(100));
        assert_eq!(
            diff("d", "2020-01-01T00:00:00", "2020-01-01T23:59:59"),
            i(0)
        );
        assert_eq!(diff("dd", "2020-01-01", "2020-03-01"), i(60));
        // Across the whole range.
        let (lo, hi) = ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.9999999Z");
        assert_eq!(diff("yyyy", lo, hi), i(9998));
        assert_eq!(diff("mm", lo, hi), i(9998 * 12 + 11));
        assert_eq!(diff("ms", lo, hi), i(315_537_897_599_999));
        assert_eq!(diff("mcs", lo, hi), i(315_537_897_599_999_999));
        // Past i64: a (rounded) double.
        #[allow(clippy::cast_precision_loss, reason = "the expected double")]
        let ns = (i128::from(MAX_TICKS - MIN_TICKS) * 100) as f64;
        assert!(ns > 3.155e20);
        assert_eq!(diff("ns", lo, hi), crate::value::json_number(ns));
        // Bad arguments.
        assert_eq!(diff("fortnight", x, y), None);
        assert_eq!(diff("dd", "2020-01-01", "not a date"), None);
        assert_eq!(call("DateTimeDiff", &[s("dd"), None, s(y)]), None);
    }

    #[test]
    fn date_time_part_reference_example() {
        let d = s("2016-05-29T08:30:00.1301617");
        let part = |p: &str| call("DateTimePart", &[s(p), d.clone()]);
        assert_eq!(part("yyyy"), i(2016));
        assert_eq!(part("mm"), i(5));
        assert_eq!(part("dd"), i(29));
        assert_eq!(part("hh"), i(8));
        assert_eq!(part("mi"), i(30));
        assert_eq!(part("ss"), i(0));
        assert_eq!(part("ms"), i(130));
        assert_eq!(part("mcs"), i(130_161));
        assert_eq!(part("ns"), i(130_161_700));
        assert_eq!(part("quarter"), None);
        assert_eq!(call("DateTimePart", &[s("yyyy"), s("2016-02-30")]), None);
        assert_eq!(call("DateTimePart", &[s("yyyy"), Some(json!(null))]), None);
    }

    #[test]
    fn date_time_from_parts_reference_example() {
        let from = |args: &[i64]| {
            let args: Vec<Option<Value>> = args.iter().map(|&a| i(a)).collect();
            call("DateTimeFromParts", &args)
        };
        assert_eq!(from(&[2017, 4, 20]), s("2017-04-20T00:00:00.0000000Z"));
        assert_eq!(
            from(&[2017, 4, 20, 0, 0, 0, 0]),
            s("2017-04-20T00:00:00.0000000Z")
        );
        assert_eq!(
            from(&[2017, 4, 20, 13, 15, 20, 3_456_789]),
            s("2017-04-20T13:15:20.3456789Z")
        );
        assert_eq!(
            from(&[2017, 4, 20, 13, 15]),
            s("2017-04-20T13:15:00.0000000Z")
        );
        // The example's invalid construction is left out of its result: undefined.
        assert_eq!(from(&[-2000, -1, -1]), None);
        // Other invalid fields.
        assert_eq!(from(&[2017, 2, 29]), None);
        assert_eq!(from(&[2016, 2, 29]), s("2016-02-29T00:00:00.0000000Z"));
        assert_eq!(from(&[0, 1, 1]), None);
        assert_eq!(from(&[10_000, 1, 1]), None);
        assert_eq!(from(&[2017, 4, 20, 24]), None);
        assert_eq!(from(&[2017, 4, 20, 1, 60]), None);
        assert_eq!(from(&[2017, 4, 20, 1, 1, 60]), None);
        assert_eq!(from(&[2017, 4, 20, 1, 1, 1, 10_000_000]), None);
        assert_eq!(from(&[i64::MAX, i64::MAX, i64::MAX]), None);
        assert_eq!(
            call("DateTimeFromParts", &[i(2017), Some(json!(4.5)), i(20)]),
            None
        );
        assert_eq!(call("DateTimeFromParts", &[i(2017), s("4"), i(20)]), None);
        assert_eq!(
            call("DateTimeFromParts", &[i(2017), i(4), i(20), None]),
            None
        );
    }

    #[test]
    fn date_time_bin_reference_example() {
        let d = s("2021-01-08T18:35:00.0000000");
        assert_eq!(
            call("DateTimeBin", &[d.clone(), s("dd")]),
            s("2021-01-08T00:00:00.0000000Z")
        );
        assert_eq!(
            call("DateTimeBin", &[d.clone(), s("hh")]),
            s("2021-01-08T18:00:00.0000000Z")
        );
        assert_eq!(
            call("DateTimeBin", &[d.clone(), s("ss")]),
            s("2021-01-08T18:35:00.0000000Z")
        );
        assert_eq!(
            call("DateTimeBin", &[d.clone(), s("hh"), i(5)]),
            s("2021-01-08T15:00:00.0000000Z")
        );
        assert_eq!(
            call("DateTimeBin", &[d.clone(), s("dd"), i(7)]),
            s("2021-01-07T00:00:00.0000000Z")
        );
        assert_eq!(
            call(
                "DateTimeBin",
                &[d.clone(), s("dd"), i(7), s("1601-01-01T00:00:00.0000000")]
            ),
            s("2021-01-04T00:00:00.0000000Z")
        );
    }

    #[test]
    fn date_time_bin_edges() {
        let d = s("2021-01-08T18:35:12.3456789Z");
        let bin = |args: &[Option<Value>]| {
            let mut all = vec![d.clone()];
            all.extend_from_slice(args);
            call("DateTimeBin", &all)
        };
        assert_eq!(bin(&[s("mi"), i(15)]), s("2021-01-08T18:30:00.0000000Z"));
        assert_eq!(bin(&[s("ms"), i(100)]), s("2021-01-08T18:35:12.3000000Z"));
        assert_eq!(bin(&[s("mcs")]), s("2021-01-08T18:35:12.3456780Z"));
        assert_eq!(bin(&[s("ns"), i(1000)]), s("2021-01-08T18:35:12.3456780Z"));
        assert_eq!(bin(&[s("ns")]), s("2021-01-08T18:35:12.3456789Z"));
        assert_eq!(
            bin(&[s("hh"), i(1), s("2021-01-01T00:30:00Z")]),
            s("2021-01-08T18:30:00.0000000Z")
        );
        // An origin after the instant bins backwards.
        assert_eq!(
            bin(&[s("dd"), i(10), s("2021-01-10T00:00:00Z")]),
            s("2020-12-31T00:00:00.0000000Z")
        );
        // Years and months have no fixed length; bad sizes, origins and dates.
        assert_eq!(bin(&[s("yyyy")]), None);
        assert_eq!(bin(&[s("mm")]), None);
        assert_eq!(bin(&[s("dd"), i(0)]), None);
        assert_eq!(bin(&[s("dd"), i(-7)]), None);
        assert_eq!(bin(&[s("dd"), Some(json!(1.5))]), None);
        assert_eq!(
            bin(&[s("dd"), i(i64::MAX)]),
            s("1970-01-01T00:00:00.0000000Z")
        );
        assert_eq!(bin(&[s("dd"), i(1), s("1600-12-31T23:59:59Z")]), None);
        assert_eq!(bin(&[s("dd"), i(1), s("garbage")]), None);
        assert_eq!(
            bin(&[s("dd"), i(i64::MAX), s("9999-12-31T00:00:00Z")]),
            None
        );
        assert_eq!(call("DateTimeBin", &[s("nope"), s("dd")]), None);
    }

    #[test]
    fn ticks_and_timestamps_reference_examples() {
        let d = s("2015-05-19T12:00:00.0000000");
        // DateTimeToTicks example.
        assert_eq!(
            call("DateTimeToTicks", std::slice::from_ref(&d)),
            i(14_320_368_000_000_000)
        );
        // DateTimeToTimestamp example.
        assert_eq!(call("DateTimeToTimestamp", &[d]), i(1_432_036_800_000));
        // TicksToDateTime example.
        assert_eq!(
            call("TicksToDateTime", &[i(15_973_607_943_002_652)]),
            s("2020-08-13T23:19:54.3002652Z")
        );
        assert_eq!(
            call("TicksToDateTime", &[i(0)]),
            s("1970-01-01T00:00:00.0000000Z")
        );
        assert_eq!(
            call("TicksToDateTime", &[i(-116_444_736_000_000_000)]),
            s("1601-01-01T00:00:00.0000000Z")
        );
        // TimestampToDateTime example.
        assert_eq!(
            call("TimestampToDateTime", &[i(1_597_360_794_300)]),
            s("2020-08-13T23:19:54.3000000Z")
        );
        assert_eq!(
            call("TimestampToDateTime", &[i(0)]),
            s("1970-01-01T00:00:00.0000000Z")
        );
        assert_eq!(
            call("TimestampToDateTime", &[i(-11_644_473_600_000)]),
            s("1601-01-01T00:00:00.0000000Z")
        );
    }

    #[test]
    fn ticks_and_timestamps_edges() {
        assert_eq!(
            call("TicksToDateTime", &[i(MIN_TICKS)]),
            s("0001-01-01T00:00:00.0000000Z")
        );
        assert_eq!(
            call("TicksToDateTime", &[i(MAX_TICKS)]),
            s("9999-12-31T23:59:59.9999999Z")
        );
        assert_eq!(call("TicksToDateTime", &[i(MIN_TICKS - 1)]), None);
        assert_eq!(call("TicksToDateTime", &[i(MAX_TICKS + 1)]), None);
        assert_eq!(call("TicksToDateTime", &[i(i64::MIN)]), None);
        assert_eq!(call("TicksToDateTime", &[Some(json!(1.5))]), None);
        assert_eq!(call("TicksToDateTime", &[Some(json!(1e300))]), None);
        assert_eq!(call("TicksToDateTime", &[s("0")]), None);
        assert_eq!(call("TimestampToDateTime", &[i(i64::MAX)]), None);
        assert_eq!(call("TimestampToDateTime", &[i(253_402_300_800_000)]), None);
        assert_eq!(call("TimestampToDateTime", &[None]), None);
        assert_eq!(call("DateTimeToTicks", &[s("0001-01-01")]), i(MIN_TICKS));
        assert_eq!(
            call("DateTimeToTimestamp", &[s("1969-12-31T23:59:59.9995Z")]),
            i(-1)
        );
        assert_eq!(call("DateTimeToTicks", &[s("")]), None);
        assert_eq!(call("DateTimeToTimestamp", &[i(0)]), None);
        // Round trips.
        for text in [
            "2020-02-29T12:34:56.7890123Z",
            "1601-01-01T00:00:00.0000000Z",
            "1969-12-31T23:59:59.9999999Z",
        ] {
            let ticks = call("DateTimeToTicks", &[s(text)]);
            assert_eq!(call("TicksToDateTime", &[ticks]), s(text));
        }
    }

    #[test]
    fn parsing_follows_the_is_datetime_rules() {
        for (text, expected) in [
            ("2023-03-06", Some("2023-03-06T00:00:00.0000000Z")),
            ("2023-03-06Z", Some("2023-03-06T00:00:00.0000000Z")),
            ("2023-03-06T15:29:59", Some("2023-03-06T15:29:59.0000000Z")),
            ("2023-03-06T15:29:59Z", Some("2023-03-06T15:29:59.0000000Z")),
            ("2023-03-06 15:29:00Z", Some("2023-03-06T15:29:00.0000000Z")),
            (
                "2023-03-06T15:29:59.9",
                Some("2023-03-06T15:29:59.9000000Z"),
            ),
            (
                "2023-03-06T15:29:59.9Z",
                Some("2023-03-06T15:29:59.9000000Z"),
            ),
            (
                "2023-03-06T15:29:59.1234567",
                Some("2023-03-06T15:29:59.1234567Z"),
            ),
            (
                "2023-03-06T15:29:59.1234567Z",
                Some("2023-03-06T15:29:59.1234567Z"),
            ),
            ("2023-03-06T15:29:59.12345678Z", None),
            ("2023-03-06T15:29:59.Z", None),
            ("2023-03-06T15:29:59.", None),
            ("2023-03-06T15:29Z", None),
            ("2023-03-06X15:29:59Z", None),
            ("2023-03-06T15:29:59+01:00", None),
            ("2023-03-06T15:29:59ZZ", None),
            ("2023-03-06T", None),
            ("2023-3-06", None),
            ("23-03-06", None),
            ("2023/03/06", None),
            ("2023-02-29", None),
            ("2023-00-10", None),
            ("2023-01-32", None),
            ("2023-03-06T24:00:00", None),
            ("2023-03-06T23:60:00", None),
            ("2023-03-06T23:59:60", None),
            ("0000-01-01", None),
            ("+2023-03-06", None),
            (" 2023-03-06", None),
            ("2023-03-06 ", None),
            ("２０２３-03-06", None),
            ("", None),
        ] {
            assert_eq!(
                call("DateTimeAdd", &[s("ms"), i(0), s(text)]),
                expected.and_then(s),
                "{text:?}"
            );
        }
    }

    #[test]
    fn date_time_format_edges() {
        let fmt = |f: &str| {
            call(
                "DateTimeFormat",
                &[string("2024-10-10T14:40:20.1230000Z"), string(f)],
            )
        };
        assert_eq!(
            fmt("yyyy-MM-dd HH:mm:ss.fffffff"),
            string("2024-10-10 14:40:20.1230000")
        );
        assert_eq!(fmt("FFFFFFF|y|yy|yyyyy"), string("123|24|24|02024"));
        assert_eq!(fmt("hh tt HHH"), string("02 PM 14"));
        // Odd formats never panic: a trailing escape, an unclosed quote, non-ASCII text.
        assert_eq!(fmt("yyyy\\"), string("2024"));
        assert_eq!(fmt("'open"), string("open"));
        assert_eq!(fmt("é日 \\d d"), string("é日 d 10"));
        assert_eq!(fmt("ffffffff"), None);
        assert_eq!(fmt(""), string(""));
        assert_eq!(
            call(
                "DateTimeFormat",
                &[string("0001-01-01"), string("yy yyyy ddd")]
            ),
            string("01 0001 Mon")
        );
    }

    #[test]
    fn now_and_ago() {
        // 2023-11-14T22:13:20Z.
        let now = 1_700_000_000_000;
        let at = |name: &str, args: &[Option<Value>]| call_at(now, name, args);
        assert_eq!(at("Now", &[]), string("2023-11-14T22:13:20.0000000Z"));
        assert_eq!(
            at("Ago", &[string("dd"), i(1)]),
            string("2023-11-13T22:13:20.0000000Z")
        );
        assert_eq!(
            at("Now", &[string("mm"), i(-2)]),
            string("2023-09-14T22:13:20.0000000Z")
        );
        assert_eq!(at("Now", &[string("dd")]), None);
        assert_eq!(at("Ago", &[string("dd"), i(i64::MIN)]), None);
        assert_eq!(at("GetCurrentDateTimeStatic", &[]), at("Now", &[]));
    }
}
