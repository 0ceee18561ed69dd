//! Duration strings as they appear in specs (`500ms`, `30s`, `5m`, `1h30m`).

use std::time::Duration;

/// Parses a spec duration: one or more `<integer><unit>` groups, units `ms`, `s`, `m`, `h`
/// (the pattern [`crate::common::DURATION_PATTERN`] enforces).
///
/// Returns `None` for anything else, including an empty string or an overflow.
pub fn parse(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return None;
        };
        rest = &rest[len..];
        total = total.checked_add(unit.checked_mul(u32::try_from(value).ok()?)?)?;
    }
    Some(total)
}

/// Parses an optional spec duration, falling back to `default` when absent or malformed.
///
/// Malformed values cannot reach here through the loader or the API server (the schema pattern
/// rejects them), so the fallback only guards hand-built objects.
pub fn or(text: Option<&str>, default: Duration) -> Duration {
    text.and_then(parse).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_forms_give_expected_durations() {
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse(""), None);
        assert_eq!(parse("30"), None);
        assert_eq!(parse("1.5s"), None);
        assert_eq!(parse("s"), None);
    }
}
