//! Duration strings as they appear in specs (`500ms`, `30s`, `5m`, `1h30m`).

use std::time::Duration;

/// Parses a spec duration: one or more `<integer><unit>` groups, units `ms`, `s`, `m`, `h`
/// (the pattern [`crate::common::DURATION_PATTERN`] enforces).
///
/// The parsing itself is core's Go-style duration parser, the one that also reads vendor
/// rate-limit reset headers; it accepts a superset (decimals such as `1.5s`), which the schema
/// pattern keeps out of manifests. Returns `None` for text that is not a duration.
pub fn parse(text: &str) -> Option<Duration> {
    switchyard_core::retry_after::parse_go_duration(text)
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
        assert_eq!(parse("s"), None);
    }
}
