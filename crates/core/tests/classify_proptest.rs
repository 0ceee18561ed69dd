//! Malformed input never panics, and the classifier's output invariants hold for any input.

// Test helpers fail loudly on bad fixtures; clippy exempts only `#[test]` fns themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;
use serde_json::Value;
use switchyard_core::classify::{
    ErrorClass, MAX_MESSAGE_BYTES, POLICY_MAX_PAUSE, POLICY_MIN_PAUSE, classify_response,
    classify_stream_error, classify_stream_error_at,
};
use switchyard_core::retry_after::{
    MAX_RETRY_HINT, parse_go_duration, parse_reset_value, parse_retry_after_value,
    reset_date_in_message, retry_after, retry_hint_from_body, retry_hint_from_message,
};

const HEADER_NAMES: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "x-amzn-errortype",
];

/// Fragments that steer random text towards the parsers' interesting paths.
const FRAGMENTS: &[&str] = &[
    "{\"error\":{",
    "\"type\":",
    "\"code\":",
    "\"message\":",
    "\"status\":",
    "\"details\":[",
    "\"retryDelay\":",
    "\"@type\":\"type.googleapis.com/google.rpc.RetryInfo\"",
    "}",
    "]",
    ",",
    "\"insufficient_quota\"",
    "\"overloaded_error\"",
    "\"RESOURCE_EXHAUSTED\"",
    "429",
    "1.5s",
    "1m30s",
    "try again in ",
    "until 2026-12-14",
    "T00:00:00Z",
    " at 25:99",
    "µs",
    "-",
    ".",
    "9",
    "99999999999999999999",
    "é",
    "\u{0}",
    "null",
    "[",
    "\"",
];

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap()
}

fn fragment_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(FRAGMENTS).prop_map(str::to_owned),
            "[ -~]{0,6}",
            any::<String>().prop_map(|s| s.chars().take(4).collect()),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

fn header_map() -> impl Strategy<Value = HeaderMap> {
    prop::collection::vec(
        (
            prop::sample::select(HEADER_NAMES),
            prop_oneof![fragment_text(), "[ -~]{0,30}"],
        ),
        0..6,
    )
    .prop_map(|pairs| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            // Keep only what a real HeaderValue may hold; invalid ones never reach us.
            if let Ok(v) = HeaderValue::from_str(&value) {
                map.append(HeaderName::from_static(name), v);
            }
        }
        map
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        fragment_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(
                        &[
                            "error",
                            "type",
                            "code",
                            "message",
                            "status",
                            "details",
                            "@type",
                            "retryDelay",
                            "violations",
                            "quotaId",
                            "response",
                            "Message",
                            "__type",
                            "metadata",
                            "seconds",
                            "nanos",
                        ][..]
                    ),
                    inner
                ),
                0..5
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn classify_response_random_bytes_never_panics(
        status in 100u16..1000,
        headers in header_map(),
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let c = classify_response(StatusCode::from_u16(status).unwrap(), &headers, &body, now());
        check_invariants(&c);
    }

    #[test]
    fn classify_response_json_like_bodies_hold_invariants(
        status in 400u16..600,
        headers in header_map(),
        body in prop_oneof![fragment_text(), json_value().prop_map(|v| v.to_string())],
    ) {
        let c = classify_response(StatusCode::from_u16(status).unwrap(), &headers, body.as_bytes(), now());
        check_invariants(&c);
    }

    #[test]
    fn classify_stream_error_random_json_never_panics(payload in json_value()) {
        check_invariants(&classify_stream_error(&payload));
        check_invariants(&classify_stream_error_at(&payload, now()));
        if let Some(d) = retry_hint_from_body(&payload) {
            prop_assert!(d <= MAX_RETRY_HINT);
        }
    }

    #[test]
    fn retry_after_random_headers_bounded(headers in header_map()) {
        if let Some(d) = retry_after(&headers, now()) {
            prop_assert!(d <= MAX_RETRY_HINT);
        }
    }

    #[test]
    fn parsers_random_text_never_panic(text in prop_oneof![fragment_text(), any::<String>()]) {
        let _ = parse_go_duration(&text);
        let _ = parse_retry_after_value(&text, now());
        let _ = parse_reset_value(&text, now());
        let _ = retry_hint_from_message(&text);
        if let Some(d) = reset_date_in_message(&text, now()) {
            prop_assert!(d > Duration::ZERO && d <= MAX_RETRY_HINT);
        }
    }

    #[test]
    fn go_duration_round_trips_seconds_and_millis(s in 0u64..10_000_000, ms in 0u64..1000) {
        let text = format!("{s}s{ms}ms");
        prop_assert_eq!(parse_go_duration(&text), Some(Duration::from_secs(s) + Duration::from_millis(ms)));
        let h = s / 3600;
        let m = (s % 3600) / 60;
        let sec = s % 60;
        prop_assert_eq!(parse_go_duration(&format!("{h}h{m}m{sec}s")), Some(Duration::from_secs(s)));
    }
}

fn check_invariants(c: &switchyard_core::classify::Classification) {
    if let Some(d) = c.retry_after {
        assert!(d <= MAX_RETRY_HINT, "{c:?}");
    }
    if let Some(m) = &c.message {
        assert!(m.len() <= MAX_MESSAGE_BYTES);
    }
    match c.class {
        ErrorClass::Policy => {
            let p = c.pause.unwrap();
            assert!(p >= POLICY_MIN_PAUSE && p <= POLICY_MAX_PAUSE, "{c:?}");
        }
        ErrorClass::Capacity | ErrorClass::Overload => {
            assert_eq!(c.pause, c.retry_after);
            assert!(
                c.retry_after.is_none_or(|d| d < Duration::from_secs(3600)),
                "{c:?}"
            );
        }
        ErrorClass::Request => assert_eq!((c.retry_after, c.pause), (None, None), "{c:?}"),
        _ => assert_eq!(c.pause, None, "{c:?}"),
    }
}
