//! Wall-clock reads, kept in one place: HTTP-date `Retry-After`, RFC 3339 reset headers,
//! `created` timestamps and the auth checks (SigV4 `x-amz-date` skew, JWT and token expiry)
//! need real time, everything else uses `tokio::time::Instant`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Current wall-clock time.
#[allow(clippy::disallowed_methods)] // process edge: vendor headers carry absolute wall-clock instants
pub(crate) fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Unix seconds now.
pub(crate) fn unix_secs() -> u64 {
    wall_now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// RFC 3339 (second precision, `Z`) of now + `ahead`.
pub(crate) fn rfc3339_in(ahead: Duration) -> String {
    let at: chrono::DateTime<chrono::Utc> = (wall_now() + ahead).into();
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// HTTP-date (IMF-fixdate) of now + `ahead`.
pub(crate) fn http_date_in(ahead: Duration) -> String {
    httpdate::fmt_http_date(wall_now() + ahead)
}

/// Go `time.Duration` text as OpenAI sends it in `x-ratelimit-reset-*`: `20ms`, `1.5s`,
/// `6m0s`, `1h2m3s` (millisecond precision).
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1000, rest % 1000);
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{frac:03}");
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

/// Parses a Go duration (`1m30s`, `40s`, `250ms`, `1h`) as sent in `x-ratelimit-reset-*`.
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0_f64;
    let mut num = String::new();
    let mut chars = text.trim().chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let value: f64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += value * unit;
        any = true;
    }
    if !num.is_empty() || !any {
        return None;
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_duration_formats_like_openai_headers() {
        assert_eq!(go_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(go_duration(Duration::from_secs(40)), "40s");
    }

    #[test]
    fn parse_go_duration_reads_compound_values() {
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("40s"), Some(Duration::from_secs(40)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("abc"), None);
    }
}
