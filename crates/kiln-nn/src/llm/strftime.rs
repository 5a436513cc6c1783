//! `strftime_now(format)`, the function transformers gives chat templates (Python's
//! `datetime.now().strftime(format)`): LLaMA 3.1's and 3.2's templates write today's date into
//! the system turn with it (`strftime_now("%d %b %Y")`), and fall back to a fixed date of 2024
//! where it is missing, so a template rendered without it differs from transformers'.
//!
//! The date is UTC's (a training run's data does not change with the machine's time zone);
//! C's common directives are supported, and any other is refused by name.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
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
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` with today's UTC date and time.
///
/// # Errors
/// A directive this function does not know, named.
pub(super) fn strftime_now(format: &str) -> Result<String, String> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(secs, format)
}

/// `format` at `secs` seconds after 1970-01-01 00:00 UTC.
fn strftime(secs: u64, format: &str) -> Result<String, String> {
    let days = secs / 86_400;
    let (year, month, day) = civil(days);
    let second_of_day = secs % 86_400;
    let (hour, minute, second) = (
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
    );
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = ((days + 3) % 7) as usize;
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: u64 = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
    ]
    .iter()
    .take(month as usize - 1)
    .sum();
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month_name = MONTHS[month as usize - 1];
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year % 100),
            Some('m') => out += &format!("{month:02}"),
            Some('d') => out += &format!("{day:02}"),
            Some('e') => out += &format!("{day:>2}"),
            Some('j') => out += &format!("{:03}", before + day),
            Some('b') => out += &month_name[..3],
            Some('B') => out += month_name,
            Some('a') => out += &DAYS[weekday][..3],
            Some('A') => out += DAYS[weekday],
            Some('H') => out += &format!("{hour:02}"),
            Some('I') => out += &format!("{:02}", (hour + 11) % 12 + 1),
            Some('p') => out += if hour < 12 { "AM" } else { "PM" },
            Some('M') => out += &format!("{minute:02}"),
            Some('S') => out += &format!("{second:02}"),
            Some('%') => out.push('%'),
            Some(other) => return Err(format!("strftime_now: %{other} is not supported")),
            None => return Err("strftime_now: the format ends in a lone %".into()),
        }
    }
    Ok(out)
}

/// The proleptic Gregorian `(year, month, day)` of `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_as_python_s_strftime_does() {
        // datetime.fromtimestamp(s, timezone.utc).strftime(...) in Python.
        assert_eq!(strftime(0, "%d %b %Y").unwrap(), "01 Jan 1970");
        assert_eq!(
            strftime(951_782_400, "%A %d %B %Y, day %j").unwrap(),
            "Tuesday 29 February 2000, day 060"
        );
        assert_eq!(
            strftime(
                1_721_952_000 + 13 * 3600 + 5 * 60 + 9,
                "%d %b %Y %H:%M:%S %I%p %a %y %m %e%%"
            )
            .unwrap(),
            "26 Jul 2024 13:05:09 01PM Fri 24 07 26%"
        );
        assert_eq!(strftime(4_102_444_800, "%Y-%m-%d").unwrap(), "2100-01-01");
        assert!(strftime(0, "%Q").unwrap_err().contains("%Q"));
        assert!(strftime(0, "x%").is_err());
        assert!(strftime_now("%Y").unwrap().parse::<u32>().unwrap() >= 2026);
    }
}
