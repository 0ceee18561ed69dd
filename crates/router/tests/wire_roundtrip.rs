//! Every wire shape parses and re-serialises to the same JSON, unknown members included, so a
//! same-dialect pass-through never drops what a client or provider sent.

// Test helpers outside #[test] fns are not covered by clippy.toml allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use switchyard_router::wire::{anthropic, openai};

fn round_trip<T: DeserializeOwned + Serialize>(v: &Value) -> Value {
    let typed: T = serde_json::from_value(v.clone()).expect("parses");
    serde_json::to_value(&typed).expect("serialises")
}

fn openai_chat_request() -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "system", "content": [{"type": "text", "text": "Use metric units."}]},
            {"role": "user", "name": "ana", "content": [
                {"type": "text", "text": "What is in this image, and the weather in Oslo?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
            ]},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "call_abc", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}
            ], "refusal": null},
            {"role": "tool", "tool_call_id": "call_abc", "content": "{\"temp_c\":4}"}
        ],
        "max_completion_tokens": 256,
        "max_tokens": 200,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0.2,
        "top_p": 0.9,
        "n": 1,
        "stop": ["\n\nUser:"],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "strict": true}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false,
        "user": "tenant-7",
        "seed": 42,
        "logit_bias": {"50256": -100},
        "response_format": {"type": "text"},
        "reasoning_effort": "low",
        "x_vendor_extension": {"nested": [1, 2, 3]}
    })
}

#[test]
fn openai_chat_request_with_unknown_members_round_trips_exactly() {
    let v = openai_chat_request();
    assert_eq!(round_trip::<openai::ChatRequest>(&v), v);
}

#[test]
fn openai_chat_request_null_content_normalises_to_absent() {
    let v = json!({"model": "m", "messages": [
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    ]});
    let mut expected = v.clone();
    expected["messages"][0]
        .as_object_mut()
        .unwrap()
        .remove("content");
    assert_eq!(round_trip::<openai::ChatRequest>(&v), expected);
}

#[test]
fn openai_chat_request_missing_messages_fails_to_parse() {
    let r = serde_json::from_value::<openai::ChatRequest>(json!({"model": "m"}));
    assert!(r.is_err());
}

#[test]
fn openai_chat_response_round_trips_exactly() {
    let v = json!({
        "id": "chatcmpl-9x", "object": "chat.completion", "created": 1_764_000_000u64,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "4 °C and cloudy.",
            "refusal": null, "annotations": []}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2459, "completion_tokens": 23, "total_tokens": 2482,
            "prompt_tokens_details": {"cached_tokens": 2455, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0}},
        "system_fingerprint": "fp_1", "service_tier": "default"
    });
    assert_eq!(round_trip::<openai::ChatResponse>(&v), v);
}

#[test]
fn openai_chat_chunks_round_trip_exactly() {
    let chunks = [
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "system_fingerprint": "fp", "choices": [{"index": 0,
            "delta": {"role": "assistant", "content": "", "refusal": null},
            "logprobs": null, "finish_reason": null}]}),
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1",
            "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
            "finish_reason": null}]}),
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 812, "completion_tokens": 140,
            "total_tokens": 952}}),
    ];
    for c in &chunks {
        assert_eq!(&round_trip::<openai::ChatChunk>(c), c);
    }
    let usage_chunk: openai::ChatChunk = serde_json::from_value(chunks[3].clone()).unwrap();
    assert!(usage_chunk.is_usage_only());
}

#[test]
fn openai_embeddings_round_trip_exactly() {
    let req = json!({"model": "text-embedding-3-small", "input": ["a", "b"],
        "encoding_format": "float", "dimensions": 256, "user": "u", "extra_flag": true});
    assert_eq!(round_trip::<openai::EmbeddingsRequest>(&req), req);
    let resp = json!({"object": "list", "model": "text-embedding-3-small",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]},
                 {"object": "embedding", "index": 1, "embedding": [0.125, 1.0]}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2}});
    assert_eq!(round_trip::<openai::EmbeddingsResponse>(&resp), resp);
}

#[test]
fn openai_error_body_round_trips_exactly() {
    let v = json!({"error": {"message": "You exceeded your current quota",
        "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}});
    assert_eq!(round_trip::<openai::ErrorBody>(&v), v);
}

fn anthropic_request() -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need the tool.", "signature": "sig=="},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "4 C"}], "is_error": false},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}, "title": "n"},
                {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}}
            ]}
        ],
        "stop_sequences": ["\n\nHuman:"],
        "stream": true,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "tools": [
            {"name": "get_weather", "description": "Current weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
        "metadata": {"user_id": "tenant-7"},
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "service_tier": "auto"
    })
}

#[test]
fn anthropic_request_with_unknown_blocks_and_members_round_trips_exactly() {
    let v = anthropic_request();
    assert_eq!(round_trip::<anthropic::MessagesRequest>(&v), v);
}

#[test]
fn anthropic_request_without_max_tokens_fails_to_parse() {
    let r = serde_json::from_value::<anthropic::MessagesRequest>(
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(r.is_err());
}

#[test]
fn anthropic_response_round_trips_exactly() {
    let v = json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2455,
                  "output_tokens": 23, "service_tier": "standard"}
    });
    assert_eq!(round_trip::<anthropic::MessagesResponse>(&v), v);
}

#[test]
fn anthropic_stream_events_round_trip_exactly() {
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 4, "cache_read_input_tokens": 2455, "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_01", "name": "f", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 1"}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 23}}),
        json!({"type": "message_stop"}),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ];
    for e in &events {
        assert_eq!(&round_trip::<anthropic::StreamEvent>(e), e);
    }
}

#[test]
fn anthropic_error_body_round_trips_exactly() {
    let v = json!({"type": "error", "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}});
    assert_eq!(round_trip::<anthropic::ErrorBody>(&v), v);
}
