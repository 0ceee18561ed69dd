//! Bounded fuzzing on stable (issue 12 "Must show"): property tests with a fixed budget over
//! the request parsers, the SSE parser, translation in both directions and the estimator.
//! Each property runs `FUZZ_CASES` cases (default 256; CI can raise it with the
//! `PROPTEST_CASES` environment variable, which proptest reads). The inputs are arbitrary bytes
//! and JSON built from arbitrary members around the fields the code looks at, so both garbage
//! and near-valid requests are covered. What is checked: nothing panics, every accepted input
//! gives a bounded, consistent answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use serde_json::{Value, json};
use switchyard_router::estimate::{
    EXACT_BUDGET_BYTES, EstimateParams, count_tokens, estimate_anthropic_messages,
    estimate_openai_chat,
};
use switchyard_router::wire::sse::SseParser;
use switchyard_router::wire::translate::{
    RequestOptions, anthropic_to_openai_request, openai_to_anthropic_request,
};
use switchyard_router::wire::{anthropic, openai};

const FUZZ_CASES: u32 = 256;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(FUZZ_CASES),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Arbitrary JSON of bounded depth and size.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("role".to_owned()),
                    Just("content".to_owned()),
                    Just("type".to_owned()),
                    Just("text".to_owned()),
                    Just("tool_calls".to_owned()),
                    Just("name".to_owned()),
                    Just("input".to_owned()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A near-valid chat request: known top-level fields with arbitrary messages and extras.
fn chat_like() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(
            (
                prop_oneof![
                    Just("system"),
                    Just("user"),
                    Just("assistant"),
                    Just("tool"),
                    Just("developer")
                ],
                json_value(),
            ),
            1..5,
        ),
        prop::option::of(json_value()),
        prop::option::of(1u64..100_000),
    )
        .prop_map(|(messages, extra, max_tokens)| {
            let messages: Vec<Value> = messages
                .into_iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect();
            let mut body = json!({"model": "m", "messages": messages, "max_tokens": max_tokens});
            if let Some(extra) = extra {
                body["response_format"] = extra;
            }
            body
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_parsers_never_panic_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = serde_json::from_slice::<openai::ChatRequest>(&bytes);
        let _ = serde_json::from_slice::<anthropic::MessagesRequest>(&bytes);
        let _ = serde_json::from_slice::<openai::EmbeddingsRequest>(&bytes);
    }

    #[test]
    fn near_valid_requests_parse_translate_and_estimate_without_panic(body in chat_like()) {
        if let Ok(req) = serde_json::from_value::<openai::ChatRequest>(body.clone()) {
            let _ = estimate_openai_chat(&req, &EstimateParams::default());
            let opts = RequestOptions { default_max_tokens: 256 };
            if let Ok(t) = openai_to_anthropic_request(req, opts) {
                // What comes out serialises and parses back as an Anthropic request.
                let json = serde_json::to_vec(&t.value).unwrap();
                let back: anthropic::MessagesRequest = serde_json::from_slice(&json).unwrap();
                let _ = estimate_anthropic_messages(&back, &EstimateParams::default());
                let _ = anthropic_to_openai_request(back);
            }
        }
        if let Ok(req) = serde_json::from_value::<anthropic::MessagesRequest>(body) {
            let _ = estimate_anthropic_messages(&req, &EstimateParams::default());
            if let Ok(t) = anthropic_to_openai_request(req) {
                let json = serde_json::to_vec(&t.value).unwrap();
                let _: openai::ChatRequest = serde_json::from_slice(&json).unwrap();
            }
        }
    }

    #[test]
    fn sse_parser_never_panics_and_is_split_independent(
        bytes in prop::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '), any::<u8>()], 0..512),
        cut in 0usize..512,
    ) {
        let mut whole = SseParser::new();
        let mut a = whole.push(&bytes);
        a.extend(whole.finish());
        let cut = cut.min(bytes.len());
        let mut split = SseParser::new();
        let mut b = split.push(&bytes[..cut]);
        b.extend(split.push(&bytes[cut..]));
        b.extend(split.finish());
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn token_count_never_exceeds_bytes(text in "\\PC{0,300}") {
        // Every token covers at least one byte: the bound the estimator uses past its budget.
        prop_assert!(count_tokens(&text) <= text.len() as u64);
    }
}

#[test]
fn budget_constant_is_what_the_docs_say() {
    assert_eq!(EXACT_BUDGET_BYTES, 1 << 20);
}
