//! Table tests for every retry-hint form `switchyard_core::retry_after` reads.

// Test helpers fail loudly on bad fixtures; clippy exempts only `#[test]` fns themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::json;
use switchyard_core::retry_after::{
    MAX_RETRY_HINT, explicit_retry_after, parse_go_duration, parse_reset_timestamp,
    parse_reset_value, parse_retry_after_ms, parse_retry_after_value, rate_limit_reset,
    reset_date_in_message, retry_after, retry_hint_from_body, retry_hint_from_message,
};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

#[test]
fn go_duration_table_parses_exactly() {
    let rows: &[(&str, Option<Duration>)] = &[
        ("0", Some(Duration::ZERO)),
        ("0s", Some(Duration::ZERO)),
        ("20ms", Some(ms(20))),
        ("1.5s", Some(ms(1500))),
        ("30s", Some(secs(30))),
        ("40s", Some(secs(40))),
        ("1m30s", Some(secs(90))),
        ("6m0s", Some(secs(360))),
        ("2h", Some(secs(7200))),
        ("1h2m3.25s", Some(Duration::from_millis(3_723_250))),
        ("2m59.56s", Some(Duration::from_millis(179_560))),
        ("1.000000001s", Some(Duration::new(1, 1))),
        ("500us", Some(Duration::from_micros(500))),
        ("500µs", Some(Duration::from_micros(500))),
        ("7ns", Some(Duration::from_nanos(7))),
        ("+5s", Some(secs(5))),
        (" 5s ", Some(secs(5))),
        ("", None),
        ("5", None),
        ("-5s", None),
        ("5x", None),
        ("s", None),
        ("1..5s", None),
        ("5s5", None),
        ("abc", None),
    ];
    for (input, want) in rows {
        assert_eq!(parse_go_duration(input), *want, "input {input:?}");
    }
}

#[test]
fn go_duration_huge_value_saturates_without_panic() {
    let d = parse_go_duration("99999999999999999999999999999h").unwrap();
    assert!(d > Duration::from_secs(1_000_000_000_000));
}

#[test]
fn retry_after_value_table_delta_seconds_and_dates() {
    let rows: &[(&str, Option<Duration>)] = &[
        ("5", Some(secs(5))),
        ("15", Some(secs(15))),
        ("1.5", Some(ms(1500))),
        (" 40 ", Some(secs(40))),
        ("0", Some(Duration::ZERO)),
        ("1209600", Some(secs(1_209_600))),
        // 15 s after now(): IMF-fixdate.
        ("Mon, 30 Nov 2026 09:00:15 GMT", Some(secs(15))),
        // RFC 850 and asctime forms of the same instant.
        ("Monday, 30-Nov-26 09:00:15 GMT", Some(secs(15))),
        ("Mon Nov 30 09:00:15 2026", Some(secs(15))),
        // In the past: come back now.
        ("Mon, 30 Nov 2026 08:00:00 GMT", Some(Duration::ZERO)),
        ("-5", None),
        ("soon", None),
        ("", None),
    ];
    for (input, want) in rows {
        assert_eq!(
            parse_retry_after_value(input, now()),
            *want,
            "input {input:?}"
        );
    }
}

#[test]
fn retry_after_ms_table_parses_decimal_millis() {
    assert_eq!(parse_retry_after_ms("250"), Some(ms(250)));
    assert_eq!(
        parse_retry_after_ms("12.5"),
        Some(Duration::from_micros(12_500))
    );
    assert_eq!(parse_retry_after_ms("x"), None);
    assert_eq!(parse_retry_after_ms("-1"), None);
}

#[test]
fn reset_timestamp_rfc3339_future_past_and_garbage() {
    assert_eq!(
        parse_reset_timestamp("2026-11-30T09:00:20Z", now()),
        Some(secs(20))
    );
    assert_eq!(
        parse_reset_timestamp("2026-11-30T10:00:20+01:00", now()),
        Some(secs(20))
    );
    assert_eq!(
        parse_reset_timestamp("2026-11-30T08:59:00Z", now()),
        Some(Duration::ZERO)
    );
    assert_eq!(parse_reset_timestamp("tomorrow", now()), None);
}

#[test]
fn reset_value_table_accepts_every_vendor_form() {
    let rows: &[(&str, Option<Duration>)] = &[
        ("6m0s", Some(secs(360))),
        ("12", Some(secs(12))),
        ("2026-11-30T09:01:00Z", Some(secs(60))),
        ("Mon, 30 Nov 2026 09:00:30 GMT", Some(secs(30))),
        // Unix epoch seconds: 2026-11-30T09:00:10Z.
        (&*format!("{}", now().timestamp() + 10), Some(secs(10))),
        // Unix epoch milliseconds: 2026-11-30T09:00:00.500Z.
        (
            &*format!("{}", now().timestamp_millis() + 500),
            Some(Duration::from_millis(500)),
        ),
        ("later", None),
    ];
    for (input, want) in rows {
        assert_eq!(parse_reset_value(input, now()), *want, "input {input:?}");
    }
}

/// One row: headers on a refused response → the hint `retry_after` must return.
struct Row {
    name: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    want: Option<Duration>,
}

#[test]
fn retry_after_headers_table_takes_longest_credible_hint() {
    let rows = vec![
        Row {
            name: "no headers",
            headers: vec![],
            want: None,
        },
        Row {
            name: "delta seconds",
            headers: vec![("retry-after", "5")],
            want: Some(secs(5)),
        },
        Row {
            name: "decimal seconds",
            headers: vec![("retry-after", "1.5")],
            want: Some(ms(1500)),
        },
        Row {
            name: "http-date 15 s ahead",
            headers: vec![("retry-after", "Mon, 30 Nov 2026 09:00:15 GMT")],
            want: Some(secs(15)),
        },
        Row {
            name: "http-date in the past",
            headers: vec![("retry-after", "Sun, 29 Nov 2026 09:00:00 GMT")],
            want: Some(Duration::ZERO),
        },
        Row {
            name: "retry-after-ms",
            headers: vec![("retry-after-ms", "250")],
            want: Some(ms(250)),
        },
        Row {
            name: "ms shorter than seconds: longest wins",
            headers: vec![("retry-after", "2"), ("retry-after-ms", "1500")],
            want: Some(secs(2)),
        },
        Row {
            name: "openai reset requests",
            headers: vec![("x-ratelimit-reset-requests", "40s")],
            want: Some(secs(40)),
        },
        Row {
            name: "openai reset requests 1m30s",
            headers: vec![("x-ratelimit-reset-requests", "1m30s")],
            want: Some(secs(90)),
        },
        Row {
            name: "explicit retry-after wins over an exhausted dimension's reset",
            headers: vec![
                ("retry-after", "1"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ],
            want: Some(secs(1)),
        },
        Row {
            name: "reset of a dimension with room left is ignored",
            headers: vec![
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "20ms"),
                ("x-ratelimit-remaining-tokens", "9000"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ],
            want: Some(Duration::from_millis(20)),
        },
        Row {
            name: "input and output token resets",
            headers: vec![
                ("x-ratelimit-reset-input-tokens", "1.5s"),
                ("x-ratelimit-reset-output-tokens", "2h"),
            ],
            want: Some(secs(7200)),
        },
        Row {
            name: "anthropic reset timestamp",
            headers: vec![
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2026-11-30T09:00:42Z"),
            ],
            want: Some(secs(42)),
        },
        Row {
            name: "anthropic tokens reset with room left ignored",
            headers: vec![
                ("anthropic-ratelimit-input-tokens-remaining", "50000"),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    "2026-11-30T09:05:00Z",
                ),
                (
                    "anthropic-ratelimit-output-tokens-reset",
                    "2026-11-30T09:00:10Z",
                ),
            ],
            want: Some(secs(10)),
        },
        Row {
            name: "anthropic reset in the past",
            headers: vec![("anthropic-ratelimit-tokens-reset", "2026-11-30T08:00:00Z")],
            want: Some(Duration::ZERO),
        },
        Row {
            name: "two weeks kept (case 3d)",
            headers: vec![("retry-after", "1209600")],
            want: Some(secs(1_209_600)),
        },
        Row {
            name: "absurd value capped",
            headers: vec![("retry-after", "999999999999")],
            want: Some(MAX_RETRY_HINT),
        },
        Row {
            name: "retry-after 5 next to a full-window reset stays 5 (case 1)",
            headers: vec![
                ("retry-after", "5"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "59.75s"),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2026-11-30T09:01:00Z"),
            ],
            want: Some(secs(5)),
        },
        Row {
            name: "cerebras day dimension exhausted",
            headers: vec![
                ("x-ratelimit-remaining-requests-day", "0"),
                ("x-ratelimit-reset-requests-day", "33011.38"),
                ("x-ratelimit-remaining-tokens-minute", "50000"),
                ("x-ratelimit-reset-tokens-minute", "11.38"),
            ],
            want: Some(Duration::from_millis(33_011_380)),
        },
        Row {
            name: "openrouter unsuffixed reset in epoch milliseconds",
            headers: vec![
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1796029230000"),
            ],
            want: Some(secs(30)),
        },
        Row {
            name: "ietf draft ratelimit-reset",
            headers: vec![("ratelimit-remaining", "0"), ("ratelimit-reset", "50")],
            want: Some(secs(50)),
        },
        Row {
            name: "unrelated x-ratelimit-resetter header ignored",
            headers: vec![("x-ratelimit-resetter", "50")],
            want: None,
        },
        Row {
            name: "garbage ignored",
            headers: vec![("retry-after", "later please")],
            want: None,
        },
        Row {
            name: "garbage next to a good hint",
            headers: vec![("retry-after", "later"), ("retry-after-ms", "700")],
            want: Some(ms(700)),
        },
    ];
    for row in rows {
        let map = headers(&row.headers);
        assert_eq!(retry_after(&map, now()), row.want, "row {:?}", row.name);
    }
}

#[test]
fn retry_after_non_utf8_header_ignored() {
    let mut map = HeaderMap::new();
    map.insert("retry-after", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
    assert_eq!(retry_after(&map, now()), None);
}

#[test]
fn body_hint_table_gemini_retry_info_and_messages() {
    let rows = vec![
        (
            "gemini retryDelay",
            json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota",
                "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]}}),
            Some(secs(30)),
        ),
        (
            "gemini fractional retryDelay",
            json!({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]}}),
            Some(ms(1500)),
        ),
        (
            "gemini array body",
            json!([{"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}]}}]),
            Some(secs(7)),
        ),
        (
            "gemini message and details: longest",
            json!({"error": {"message": "Please retry in 43.2s.",
                "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "43s"}]}}),
            Some(ms(43_200)),
        ),
        (
            "openai message seconds",
            json!({"error": {"message": "Rate limit reached. Please try again in 20s. Visit https://x", "code": "rate_limit_exceeded"}}),
            Some(secs(20)),
        ),
        (
            "openai message 1m30s",
            json!({"error": {"message": "Please try again in 1m30s."}}),
            Some(secs(90)),
        ),
        (
            "openai message ms",
            json!({"error": {"message": "Please try again in 500ms."}}),
            Some(ms(500)),
        ),
        (
            "bedrock message",
            json!({"message": "Too many requests, please wait before trying again."}),
            None,
        ),
        ("no hint", json!({"error": {"message": "bad"}}), None),
        ("not an object", json!(42), None),
    ];
    for (name, body, want) in rows {
        assert_eq!(retry_hint_from_body(&body), want, "row {name}");
    }
}

#[test]
fn message_hint_table_words_and_units() {
    let rows: &[(&str, Option<Duration>)] = &[
        ("Please try again in 20s.", Some(secs(20))),
        ("please TRY AGAIN IN 2 minutes", Some(secs(120))),
        ("retry after 30 seconds", Some(secs(30))),
        ("Retry in 1 hour", Some(secs(3600))),
        ("try again in 250 milliseconds", Some(ms(250))),
        ("try again in a moment", None),
        ("try again later", None),
        ("", None),
    ];
    for (input, want) in rows {
        assert_eq!(retry_hint_from_message(input), *want, "input {input:?}");
    }
}

#[test]
fn message_date_table_future_dates_only() {
    let two_weeks = secs(14 * 24 * 3600);
    let rows: &[(&str, Option<Duration>)] = &[
        (
            "You will regain access on 2026-12-14 at 09:00 UTC.",
            Some(two_weeks),
        ),
        (
            "usage limit reached until 2026-12-14T09:00:00Z.",
            Some(two_weeks),
        ),
        (
            "limit reached until 2026-12-14",
            Some(two_weeks - secs(9 * 3600)),
        ),
        ("until 2026-12-14 09:00:30", Some(two_weeks + secs(30))),
        ("reached on 2025-01-01", None),
        ("id 12026-12-14", None),
        ("no date", None),
        ("2026-13-45 is not a date", None),
    ];
    for (input, want) in rows {
        assert_eq!(
            reset_date_in_message(input, now()),
            *want,
            "input {input:?}"
        );
    }
}

#[test]
fn retry_after_tiers_explicit_then_resets() {
    let both = headers(&[
        ("retry-after", "2"),
        ("retry-after-ms", "2500"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "40s"),
    ]);
    assert_eq!(explicit_retry_after(&both, now()), Some(ms(2500)));
    assert_eq!(rate_limit_reset(&both, now()), Some(secs(40)));
    assert_eq!(retry_after(&both, now()), Some(ms(2500)));
    let resets_only = headers(&[("x-ratelimit-reset-requests", "40s")]);
    assert_eq!(explicit_retry_after(&resets_only, now()), None);
    assert_eq!(retry_after(&resets_only, now()), Some(secs(40)));
}
