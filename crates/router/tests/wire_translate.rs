//! Translation between the OpenAI and Anthropic dialects: requests, responses and streams.
//! Translated streams are re-encoded to bytes, re-parsed, and checked against the target
//! dialect's event grammar.

// Test helpers outside #[test] fns are not covered by clippy.toml allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::BytesMut;
use serde_json::{Value, json};
use switchyard_router::wire::sse::{SseEvent, SseItem, SseParser, write_event};
use switchyard_router::wire::translate::{
    RequestOptions, StreamTranslator, TranslateError, anthropic_to_openai_request,
    anthropic_to_openai_response, openai_to_anthropic_request, openai_to_anthropic_response,
};
use switchyard_router::wire::usage::{NormalizedUsage, UsageSource};
use switchyard_router::wire::{anthropic, openai};

const OPTS: RequestOptions = RequestOptions {
    default_max_tokens: 4096,
};

fn oa_req(v: Value) -> openai::ChatRequest {
    serde_json::from_value(v).unwrap()
}

fn an_req(v: Value) -> anthropic::MessagesRequest {
    serde_json::from_value(v).unwrap()
}

#[test]
fn openai_to_anthropic_request_with_tools_maps_every_member() {
    let req = oa_req(json!({
        "model": "claude-via-openai",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Metric units."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Weather?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "4 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
            {"role": "user", "content": "And tomorrow?"}
        ],
        "max_completion_tokens": 300,
        "temperature": 1.6,
        "top_p": 0.5,
        "stop": "END",
        "stream": true,
        "stream_options": {"include_usage": true},
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "get_time"}}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "user": "u-1",
        "seed": 7
    }));
    let t = openai_to_anthropic_request(req, OPTS).unwrap();
    assert_eq!(t.dropped, vec!["seed".to_owned()]);
    let got = serde_json::to_value(&t.value).unwrap();
    assert_eq!(
        got,
        json!({
            "model": "claude-via-openai",
            "max_tokens": 300,
            "system": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Metric units."}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}},
                    {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "4 C"},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "10:00"},
                    {"type": "text", "text": "And tomorrow?"}
                ]}
            ],
            "stop_sequences": ["END"],
            "stream": true,
            "temperature": 1.0,
            "top_p": 0.5,
            "tools": [
                {"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "u-1"}
        })
    );
}

#[test]
fn openai_to_anthropic_request_without_cap_uses_route_default() {
    let req = oa_req(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
    let t = openai_to_anthropic_request(req, OPTS).unwrap();
    assert_eq!(t.value.max_tokens, 4096);
    assert_eq!(t.value.system, None);
    let req = oa_req(
        json!({"model": "m", "max_tokens": 77, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        openai_to_anthropic_request(req, OPTS)
            .unwrap()
            .value
            .max_tokens,
        77
    );
}

#[test]
fn openai_to_anthropic_request_named_tool_choice_maps_to_tool() {
    let req = oa_req(
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    );
    let t = openai_to_anthropic_request(req, OPTS).unwrap();
    let choice = t.value.tool_choice.unwrap();
    assert_eq!(
        (choice.kind.as_str(), choice.name.as_deref()),
        ("tool", Some("f"))
    );
}

#[test]
fn openai_to_anthropic_request_unsupported_features_are_errors() {
    let n2 = oa_req(json!({"model": "m", "n": 2, "messages": [{"role": "user", "content": "x"}]}));
    assert!(matches!(
        openai_to_anthropic_request(n2, OPTS),
        Err(TranslateError::Unsupported(_))
    ));
    let audio = oa_req(
        json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]}]}),
    );
    match openai_to_anthropic_request(audio, OPTS) {
        Err(TranslateError::Unsupported(m)) => assert!(m.contains("input_audio"), "{m}"),
        other => panic!("expected unsupported, got {other:?}"),
    }
    let bad_args = oa_req(
        json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
    );
    assert!(matches!(
        openai_to_anthropic_request(bad_args, OPTS),
        Err(TranslateError::InvalidRequest(_))
    ));
}

#[test]
fn anthropic_to_openai_response_with_tool_use_and_cache_usage() {
    let resp: anthropic::MessagesResponse = serde_json::from_value(json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 4, "cache_read_input_tokens": 2455, "cache_creation_input_tokens": 0, "output_tokens": 23}
    }))
    .unwrap();
    let out = serde_json::to_value(anthropic_to_openai_response(resp, 1_700_000_000)).unwrap();
    assert_eq!(
        out,
        json!({
            "id": "msg_1", "object": "chat.completion", "created": 1_700_000_000u64, "model": "claude-x",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Checking.",
                "tool_calls": [{"id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
            "usage": {"prompt_tokens": 2459, "completion_tokens": 23, "total_tokens": 2482,
                "prompt_tokens_details": {"cached_tokens": 2455}}
        })
    );
}

#[test]
fn anthropic_to_openai_request_with_tools_maps_every_member() {
    let req = an_req(json!({
        "model": "m", "max_tokens": 512,
        "system": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "4 C"}]},
                {"type": "text", "text": "Thanks"},
                {"type": "image", "source": {"type": "url", "url": "https://img.invalid/a.png"}}]}
        ],
        "stop_sequences": ["X"], "temperature": 0.3, "top_k": 5, "stream": true,
        "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1024}
    }));
    let t = anthropic_to_openai_request(req).unwrap();
    let mut dropped = t.dropped.clone();
    dropped.sort();
    assert_eq!(dropped, vec!["thinking".to_owned(), "top_k".to_owned()]);
    assert_eq!(
        serde_json::to_value(&t.value).unwrap(),
        json!({
            "model": "m", "max_tokens": 512, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "A.\n\nB."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "4 C"},
                {"role": "user", "content": [
                    {"type": "text", "text": "Thanks"},
                    {"type": "image_url", "image_url": {"url": "https://img.invalid/a.png"}}]}
            ],
            "temperature": 0.3, "stop": ["X"],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false,
            "user": "u"
        })
    );
}

#[test]
fn anthropic_to_openai_request_server_tool_is_unsupported() {
    let req = an_req(
        json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    );
    assert!(matches!(
        anthropic_to_openai_request(req),
        Err(TranslateError::Unsupported(_))
    ));
}

#[test]
fn openai_to_anthropic_response_maps_tool_calls_and_cached_usage() {
    let resp: openai::ChatResponse = serde_json::from_value(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}],
        "usage": {"prompt_tokens": 2459, "completion_tokens": 23, "total_tokens": 2482,
            "prompt_tokens_details": {"cached_tokens": 2455}}
    }))
    .unwrap();
    let out = serde_json::to_value(openai_to_anthropic_response(resp).unwrap()).unwrap();
    assert_eq!(
        out,
        json!({"id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-x",
            "content": [{"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 4, "output_tokens": 23, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2455}})
    );
}

#[test]
fn openai_to_anthropic_response_without_choices_is_upstream_error() {
    let resp: openai::ChatResponse = serde_json::from_value(json!({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": []}))
    .unwrap();
    assert!(matches!(
        openai_to_anthropic_response(resp),
        Err(TranslateError::InvalidUpstream(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Streams

fn anthropic_upstream() -> Vec<SseItem> {
    let ev = |name: &str, v: Value| SseItem::Event(SseEvent::new(Some(name), v.to_string()));
    vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_9", "type": "message",
            "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 4, "cache_read_input_tokens": 2455, "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ev("ping", json!({"type": "ping"})),
        SseItem::Comment(" keep-alive".into()),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"Oslo\"}"}}),
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 23}}),
        ),
        ev("message_stop", json!({"type": "message_stop"})),
    ]
}

fn openai_upstream(with_usage: bool) -> Vec<SseItem> {
    let chunk = |choices: Value| {
        SseItem::Event(SseEvent::data(
            json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 5, "model": "gpt-x", "choices": choices})
                .to_string(),
        ))
    };
    let mut v = vec![
        SseItem::Comment(" keep-alive".into()),
        chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
        ),
        chunk(json!([{"index": 0, "delta": {"content": "Let me "}, "finish_reason": null}])),
        chunk(json!([{"index": 0, "delta": {"content": "check."}, "finish_reason": null}])),
        chunk(
            json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}, "finish_reason": null}]),
        ),
        chunk(
            json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}, "finish_reason": null}]),
        ),
        chunk(
            json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Oslo\"}"}}]}, "finish_reason": null}]),
        ),
        chunk(
            json!([{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}, "finish_reason": null}]),
        ),
        chunk(json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])),
    ];
    if with_usage {
        v.push(SseItem::Event(SseEvent::data(
            json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 5, "model": "gpt-x", "choices": [],
                "usage": {"prompt_tokens": 2459, "completion_tokens": 23, "total_tokens": 2482,
                    "prompt_tokens_details": {"cached_tokens": 2455}}})
            .to_string(),
        )));
    }
    v.push(SseItem::Event(SseEvent::data("[DONE]")));
    v
}

/// Runs `items` through `t` (plus `finish`), encodes the output to bytes, and re-parses it:
/// returns the events a client would see.
fn run(t: &mut StreamTranslator, items: &[SseItem]) -> Vec<SseEvent> {
    let mut out = Vec::new();
    for item in items {
        out.extend(t.push(item).unwrap());
    }
    out.extend(t.finish());
    let mut bytes = BytesMut::new();
    for item in &out {
        match item {
            SseItem::Event(e) => write_event(&mut bytes, e),
            SseItem::Comment(c) => bytes.extend_from_slice(format!(":{c}\n\n").as_bytes()),
            SseItem::Incomplete(_) => panic!("translator forwarded an incomplete event"),
        }
    }
    let mut p = SseParser::new();
    let items = p.push(&bytes);
    assert_eq!(p.finish(), None, "translated stream ends mid-event");
    items
        .into_iter()
        .filter_map(|i| match i {
            SseItem::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

/// Checks the Anthropic event grammar and returns (text, tool inputs, stop reason, usage).
fn check_anthropic(events: &[SseEvent]) -> (String, Vec<(String, Value)>, String, Value) {
    let parsed: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    for (e, v) in events.iter().zip(&parsed) {
        assert_eq!(
            e.event.as_deref(),
            v["type"].as_str(),
            "event name matches data type"
        );
        let _: anthropic::StreamEvent = serde_json::from_value(v.clone()).unwrap();
    }
    let starts = parsed
        .iter()
        .filter(|v| v["type"] == "message_start")
        .count();
    assert_eq!(starts, 1, "exactly one message_start");
    assert_eq!(parsed[0]["type"], "message_start");
    assert_eq!(parsed.last().unwrap()["type"], "message_stop");
    assert_eq!(parsed[parsed.len() - 2]["type"], "message_delta");
    let mut open: Option<u64> = None;
    let mut next = 0u64;
    let mut text = String::new();
    let mut tools: Vec<(String, String)> = Vec::new();
    for v in &parsed {
        match v["type"].as_str().unwrap() {
            "content_block_start" => {
                assert_eq!(open, None, "block started while another is open");
                assert_eq!(v["index"].as_u64(), Some(next), "indices consecutive");
                open = Some(next);
                next += 1;
                if v["content_block"]["type"] == "tool_use" {
                    tools.push((
                        v["content_block"]["name"].as_str().unwrap().to_owned(),
                        String::new(),
                    ));
                }
            }
            "content_block_delta" => {
                assert_eq!(v["index"].as_u64(), open, "delta to the open block");
                match v["delta"]["type"].as_str().unwrap() {
                    "text_delta" => text.push_str(v["delta"]["text"].as_str().unwrap()),
                    "input_json_delta" => tools
                        .last_mut()
                        .unwrap()
                        .1
                        .push_str(v["delta"]["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(v["index"].as_u64(), open);
                open = None;
            }
            "message_delta" => assert_eq!(open, None, "all blocks closed before message_delta"),
            _ => {}
        }
    }
    let tools = tools
        .into_iter()
        .map(|(n, args)| (n, serde_json::from_str(&args).unwrap()))
        .collect();
    let md = &parsed[parsed.len() - 2];
    (
        text,
        tools,
        md["delta"]["stop_reason"].as_str().unwrap().to_owned(),
        md["usage"].clone(),
    )
}

/// Checks the OpenAI chunk grammar; returns (text, tool calls, finish reason, usage chunks).
fn check_openai(
    events: &[SseEvent],
) -> (String, Vec<(String, String)>, String, Vec<openai::Usage>) {
    assert_eq!(events.last().unwrap().data, "[DONE]", "ends with [DONE]");
    assert_eq!(events.iter().filter(|e| e.data == "[DONE]").count(), 1);
    let chunks: Vec<openai::ChatChunk> = events[..events.len() - 1]
        .iter()
        .map(|e| {
            assert_eq!(e.event, None, "OpenAI events are unnamed");
            serde_json::from_str(&e.data).unwrap()
        })
        .collect();
    let id = &chunks[0].id;
    assert!(
        chunks
            .iter()
            .all(|c| &c.id == id && c.object == "chat.completion.chunk")
    );
    assert_eq!(
        chunks[0].choices[0].delta.role,
        Some(openai::Role::Assistant)
    );
    let mut text = String::new();
    let mut tools: Vec<(String, String)> = Vec::new();
    let mut finish = Vec::new();
    let mut usage = Vec::new();
    for c in &chunks {
        if let Some(u) = &c.usage {
            assert!(c.choices.is_empty());
            usage.push(u.clone());
        }
        for ch in &c.choices {
            text.push_str(ch.delta.content.as_deref().unwrap_or(""));
            for tc in ch.delta.tool_calls.iter().flatten() {
                let f = tc.function.clone().unwrap_or_default();
                if tc.id.is_some() {
                    assert_eq!(tc.index as usize, tools.len(), "tool indices consecutive");
                    tools.push((f.name.unwrap(), String::new()));
                }
                tools[tc.index as usize]
                    .1
                    .push_str(f.arguments.as_deref().unwrap_or(""));
            }
            finish.extend(ch.finish_reason.clone());
        }
    }
    assert_eq!(finish.len(), 1, "exactly one finish_reason");
    (text, tools, finish.remove(0), usage)
}

#[test]
fn stream_anthropic_to_openai_with_tool_call_is_valid_openai_stream() {
    let mut t = StreamTranslator::anthropic_to_openai(1_700_000_000, true);
    let events = run(&mut t, &anthropic_upstream());
    assert!(t.is_finished());
    let (text, tools, finish, usage) = check_openai(&events);
    assert_eq!(text, "Let me check.");
    assert_eq!(
        tools,
        vec![("get_weather".to_owned(), "{\"city\": \"Oslo\"}".to_owned())]
    );
    assert_eq!(finish, "tool_calls");
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].prompt_tokens, 2459);
    assert_eq!(usage[0].completion_tokens, 23);
    assert_eq!(
        usage[0]
            .prompt_tokens_details
            .as_ref()
            .unwrap()
            .cached_tokens,
        Some(2455)
    );
}

#[test]
fn stream_anthropic_to_openai_client_without_usage_gets_no_usage_chunk() {
    let mut t = StreamTranslator::anthropic_to_openai(1, false);
    let events = run(&mut t, &anthropic_upstream());
    let (_, _, _, usage) = check_openai(&events);
    assert!(usage.is_empty());
    // ...but the router still knows the usage for billing.
    let u = t.usage().finish(100);
    assert_eq!(
        (u.input_uncached, u.cache_read, u.output, u.source),
        (4, 2455, 23, UsageSource::Reported)
    );
}

#[test]
fn stream_openai_to_anthropic_with_two_tool_calls_is_valid_anthropic_stream() {
    let mut t = StreamTranslator::openai_to_anthropic();
    let events = run(&mut t, &openai_upstream(true));
    assert!(t.is_finished());
    let (text, tools, stop, usage) = check_anthropic(&events);
    assert_eq!(text, "Let me check.");
    assert_eq!(
        tools,
        vec![
            ("get_weather".to_owned(), json!({"city": "Oslo"})),
            ("get_time".to_owned(), json!({}))
        ]
    );
    assert_eq!(stop, "tool_use");
    assert_eq!(usage["input_tokens"], 4);
    assert_eq!(usage["cache_read_input_tokens"], 2455);
    assert_eq!(usage["output_tokens"], 23);
}

#[test]
fn stream_openai_to_anthropic_without_done_closes_after_finish_reason() {
    let mut items = openai_upstream(true);
    items.pop(); // no [DONE]
    let mut t = StreamTranslator::openai_to_anthropic();
    let events = run(&mut t, &items);
    assert!(t.is_finished());
    check_anthropic(&events);
}

#[test]
fn stream_openai_to_anthropic_truncated_is_not_finished() {
    let items = openai_upstream(true);
    let mut t = StreamTranslator::openai_to_anthropic();
    for item in &items[..4] {
        t.push(item).unwrap();
    }
    assert!(t.finish().is_empty());
    assert!(!t.is_finished());
}

#[test]
fn stream_openai_to_anthropic_error_payload_becomes_error_event() {
    let mut t = StreamTranslator::openai_to_anthropic();
    let items = [
        openai_upstream(false)[1].clone(),
        SseItem::Event(SseEvent::data(
            json!({"error": {"message": "busy", "type": "server_error", "code": "server_is_overloaded"}}).to_string(),
        )),
    ];
    let out: Vec<SseItem> = items.iter().flat_map(|i| t.push(i).unwrap()).collect();
    assert!(t.is_errored());
    let SseItem::Event(last) = out.last().unwrap() else {
        panic!()
    };
    assert_eq!(last.event.as_deref(), Some("error"));
    let v: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(
        v,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    );
    assert!(
        !out.iter()
            .any(|i| matches!(i, SseItem::Event(e) if e.event.as_deref() == Some("message_stop")))
    );
}

#[test]
fn stream_anthropic_to_openai_error_event_ends_without_done() {
    let mut t = StreamTranslator::anthropic_to_openai(1, true);
    let mut items = anthropic_upstream()[..5].to_vec();
    items.push(SseItem::Event(SseEvent::new(
        Some("error"),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            .to_string(),
    )));
    let out: Vec<SseItem> = items.iter().flat_map(|i| t.push(i).unwrap()).collect();
    assert!(t.is_errored());
    assert!(t.finish().is_empty());
    let SseItem::Event(last) = out.last().unwrap() else {
        panic!()
    };
    let v: Value = serde_json::from_str(&last.data).unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert!(
        !out.iter()
            .any(|i| matches!(i, SseItem::Event(e) if e.data == "[DONE]"))
    );
}

#[test]
fn stream_incomplete_trailing_event_is_never_forwarded() {
    for mut t in [
        StreamTranslator::openai_passthrough(true),
        StreamTranslator::anthropic_passthrough(),
        StreamTranslator::openai_to_anthropic(),
        StreamTranslator::anthropic_to_openai(1, true),
    ] {
        let out = t
            .push(&SseItem::Incomplete(SseEvent::data("{\"choices\":[{\"del")))
            .unwrap();
        assert!(out.is_empty());
    }
}

#[test]
fn stream_anthropic_passthrough_forwards_verbatim_and_counts_usage() {
    let items = anthropic_upstream();
    let mut t = StreamTranslator::anthropic_passthrough();
    let out: Vec<SseItem> = items.iter().flat_map(|i| t.push(i).unwrap()).collect();
    assert_eq!(out, items);
    assert!(t.is_finished());
    assert_eq!(
        t.usage().reported(),
        Some(NormalizedUsage {
            input_uncached: 4,
            cache_read: 2455,
            cache_write: 0,
            output: 23,
            source: UsageSource::Reported
        })
    );
}

#[test]
fn stream_finish_after_stop_marker_without_terminator_completes_every_mode() {
    // OpenAI upstream that ends after the finish chunk (no usage chunk, no [DONE]).
    let mut openai_items = openai_upstream(false);
    openai_items.pop();
    let mut t = StreamTranslator::openai_passthrough(false);
    let mut out: Vec<SseItem> = openai_items
        .iter()
        .flat_map(|i| t.push(i).unwrap())
        .collect();
    out.extend(t.finish());
    assert!(t.is_finished());
    assert_eq!(out.last(), Some(&SseItem::Event(SseEvent::data("[DONE]"))));

    // Anthropic upstream that ends after message_delta (no message_stop).
    let mut anthropic_items = anthropic_upstream();
    anthropic_items.pop();
    let mut t = StreamTranslator::anthropic_to_openai(1, false);
    let events = run(&mut t, &anthropic_items);
    assert!(t.is_finished());
    check_openai(&events);

    let mut t = StreamTranslator::anthropic_passthrough();
    let mut out: Vec<SseItem> = anthropic_items
        .iter()
        .flat_map(|i| t.push(i).unwrap())
        .collect();
    out.extend(t.finish());
    assert!(t.is_finished());
    let SseItem::Event(last) = out.last().unwrap() else {
        panic!()
    };
    assert_eq!(last.event.as_deref(), Some("message_stop"));
}

#[test]
fn stream_finish_without_stop_marker_is_truncated_every_mode() {
    let openai_items = &openai_upstream(false)[..3];
    let anthropic_items = &anthropic_upstream()[..6];
    let cases: Vec<(StreamTranslator, &[SseItem])> = vec![
        (StreamTranslator::openai_passthrough(true), openai_items),
        (StreamTranslator::openai_to_anthropic(), openai_items),
        (StreamTranslator::anthropic_passthrough(), anthropic_items),
        (
            StreamTranslator::anthropic_to_openai(1, true),
            anthropic_items,
        ),
    ];
    for (mut t, items) in cases {
        for i in items {
            t.push(i).unwrap();
        }
        assert!(t.finish().is_empty());
        assert!(!t.is_finished() && !t.is_errored());
    }
}

#[test]
fn openai_to_anthropic_request_empty_text_is_left_out() {
    let req = oa_req(json!({"model": "m", "messages": [
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "hi"}]},
        {"role": "user", "content": ""}
    ]}));
    let t = openai_to_anthropic_request(req, OPTS).unwrap();
    assert_eq!(t.value.system, None);
    assert_eq!(
        serde_json::to_value(&t.value.messages).unwrap(),
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
}

#[test]
fn anthropic_to_openai_request_image_in_tool_result_is_unsupported() {
    let req = an_req(json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}]}]}));
    match anthropic_to_openai_request(req) {
        Err(TranslateError::Unsupported(m)) => assert!(m.contains("image"), "{m}"),
        other => panic!("expected unsupported, got {other:?}"),
    }
}

#[test]
fn stream_openai_to_anthropic_azure_filter_chunk_and_sparse_fields_are_tolerated() {
    let items = vec![
        // Azure opens with a chunk that has no choices and empty header fields.
        SseItem::Event(SseEvent::data(
            json!({"choices": [], "created": 0, "id": "", "model": "", "object": "",
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}]})
            .to_string(),
        )),
        // A lenient server: no `object`, no `created`, no choice or tool-call `index`.
        SseItem::Event(SseEvent::data(
            json!({"id": "x1", "model": "local", "choices": [{"delta": {"role": "assistant", "content": "Hi"}}]}).to_string(),
        )),
        SseItem::Event(SseEvent::data(
            json!({"id": "x1", "model": "local", "choices": [{"delta": {"tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{\"k\":2}"}}]}}]})
            .to_string(),
        )),
        SseItem::Event(SseEvent::data(
            json!({"id": "x1", "model": "local", "choices": [{"delta": {}, "finish_reason": "tool_calls"}]}).to_string(),
        )),
        SseItem::Event(SseEvent::data("[DONE]")),
    ];
    let mut t = StreamTranslator::openai_to_anthropic();
    let events = run(&mut t, &items);
    let (text, tools, stop, _) = check_anthropic(&events);
    assert_eq!(text, "Hi");
    assert_eq!(tools, vec![("f".to_owned(), json!({"k": 2}))]);
    assert_eq!(stop, "tool_use");
    let start: Value = serde_json::from_str(&events[0].data).unwrap();
    assert_eq!(start["message"]["id"], "x1");
    assert_eq!(start["message"]["model"], "local");
}

/// Issue 12 item 6: `response_format` is translated where Anthropic has an equivalent
/// (`json_schema` → structured outputs' `output_format`; `text` is the default) and reported
/// as dropped where it has none (`json_object`), as are `seed` and `logit_bias`.
#[test]
fn openai_response_format_maps_to_output_format_or_is_reported() {
    let opts = RequestOptions {
        default_max_tokens: 256,
    };
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}},
        "required": ["answer"], "additionalProperties": false});
    let t = openai_to_anthropic_request(
        oa_req(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "answer", "strict": true, "schema": schema}}}),
        ),
        opts,
    )
    .unwrap();
    assert!(t.dropped.is_empty(), "{:?}", t.dropped);
    let body = serde_json::to_value(&t.value).unwrap();
    assert_eq!(
        body["output_format"],
        json!({"type": "json_schema", "schema": schema})
    );

    let t = openai_to_anthropic_request(
        oa_req(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "text"}}),
        ),
        opts,
    )
    .unwrap();
    assert!(t.dropped.is_empty(), "{:?}", t.dropped);
    assert!(
        serde_json::to_value(&t.value)
            .unwrap()
            .get("output_format")
            .is_none()
    );

    let t = openai_to_anthropic_request(
        oa_req(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"}, "seed": 7, "logit_bias": {"50256": -100}}),
        ),
        opts,
    )
    .unwrap();
    assert_eq!(
        t.dropped,
        vec![
            "logit_bias".to_owned(),
            "response_format".to_owned(),
            "seed".to_owned()
        ]
    );
}
