//! Usage normalisation and cost across vendors and modes (field cases 15 and 16).

// Test helpers outside #[test] fns are not covered by clippy.toml allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};
use switchyard_router::wire::classify::{StreamClass, classify};
use switchyard_router::wire::sse::{SseEvent, SseItem, SseParser};
use switchyard_router::wire::translate::StreamTranslator;
use switchyard_router::wire::usage::{
    GeminiUsageMetadata, NormalizedUsage, Pricing, StreamUsage, UsageSource, cost_micro_usd,
};
use switchyard_router::wire::{Dialect, anthropic, openai};

/// $3 input, $15 output, $0.30 cache read, $3.75 cache write per million tokens.
const PRICING: Pricing = Pricing {
    input: 3_000_000,
    output: 15_000_000,
    cache_read: 300_000,
    cache_write: 3_750_000,
};

/// Parses an SSE byte stream delivered in 7-byte network chunks (so lines and events are split).
fn parse_chunked(wire: &str) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut items = Vec::new();
    for chunk in wire.as_bytes().chunks(7) {
        items.extend(p.push(chunk));
    }
    assert_eq!(p.finish(), None);
    items
        .into_iter()
        .filter_map(|i| match i {
            SseItem::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn anthropic_row(stream: bool) -> NormalizedUsage {
    if !stream {
        let resp: anthropic::MessagesResponse = serde_json::from_value(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2455, "output_tokens": 23}
        }))
        .unwrap();
        return NormalizedUsage::from_anthropic(&resp.usage);
    }
    let wire = concat!(
        "event: message_start\r\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2455,\"output_tokens\":1}}}\r\n\r\n",
        "event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\n",
        "event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n",
        "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\r\n\r\n",
        "event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":0}\r\n\r\n",
        "event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":23}}\r\n\r\n",
        "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n",
    );
    let mut usage = StreamUsage::new();
    for ev in parse_chunked(wire) {
        usage.observe_anthropic(&serde_json::from_str(&ev.data).unwrap());
    }
    usage.finish(9_999)
}

fn openai_row(stream: bool) -> NormalizedUsage {
    let usage = json!({"prompt_tokens": 2459, "completion_tokens": 23, "total_tokens": 2482,
        "prompt_tokens_details": {"cached_tokens": 2455, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0}});
    if !stream {
        let resp: openai::ChatResponse = serde_json::from_value(json!({
            "id": "c", "object": "chat.completion", "created": 1, "model": "gpt",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": usage
        }))
        .unwrap();
        return NormalizedUsage::from_openai(resp.usage.as_ref().unwrap());
    }
    let head = r#""id":"c","object":"chat.completion.chunk","created":1,"model":"gpt""#;
    let wire = format!(
        "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}},\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n\
         data: {{{head},\"choices\":[],\"usage\":{usage}}}\n\n\
         data: [DONE]\n\n"
    );
    let mut usage = StreamUsage::new();
    for ev in parse_chunked(&wire) {
        if ev.data != "[DONE]" {
            usage.observe_openai(&serde_json::from_str(&ev.data).unwrap());
        }
    }
    usage.finish(9_999)
}

fn gemini_row(stream: bool) -> NormalizedUsage {
    let final_meta = json!({"promptTokenCount": 2459, "cachedContentTokenCount": 2455,
        "candidatesTokenCount": 23, "totalTokenCount": 2482});
    if !stream {
        let resp = json!({"candidates": [{"content": {"parts": [{"text": "ok"}], "role": "model"}, "finishReason": "STOP"}],
            "usageMetadata": final_meta, "modelVersion": "gemini-x"});
        let meta: GeminiUsageMetadata =
            serde_json::from_value(resp["usageMetadata"].clone()).unwrap();
        return NormalizedUsage::from_gemini(&meta);
    }
    // Gemini streams repeat usageMetadata on chunks; the last report is final.
    let chunks = [
        json!({"candidates": [{"content": {"parts": [{"text": "o"}], "role": "model"}}],
            "usageMetadata": {"promptTokenCount": 2459, "cachedContentTokenCount": 2455, "candidatesTokenCount": 1, "totalTokenCount": 2460}}),
        json!({"candidates": [{"content": {"parts": [{"text": "k"}], "role": "model"}, "finishReason": "STOP"}],
            "usageMetadata": final_meta}),
    ];
    let wire: String = chunks
        .iter()
        .map(|c| format!("data: {c}\r\n\r\n"))
        .collect();
    let mut usage = StreamUsage::new();
    for ev in parse_chunked(&wire) {
        let v: Value = serde_json::from_str(&ev.data).unwrap();
        usage.observe_gemini(&serde_json::from_value(v["usageMetadata"].clone()).unwrap());
    }
    usage.finish(9_999)
}

#[test]
fn case16_cached_prefix_all_vendors_and_modes_give_identical_rows_and_cost() {
    let expected = NormalizedUsage {
        input_uncached: 4,
        cache_read: 2455,
        cache_write: 0,
        output: 23,
        source: UsageSource::Reported,
    };
    let rows = [
        ("anthropic", false, anthropic_row(false)),
        ("anthropic", true, anthropic_row(true)),
        ("openai", false, openai_row(false)),
        ("openai", true, openai_row(true)),
        ("gemini", false, gemini_row(false)),
        ("gemini", true, gemini_row(true)),
    ];
    // 4 × $3 + 2,455 × $0.30 + 23 × $15 per MTok = 12 + 736.5 + 345 = 1,093.5 µ$ → 1,094.
    let expected_cost = 1_094;
    for (vendor, stream, row) in rows {
        assert_eq!(row, expected, "{vendor} stream={stream}");
        assert_eq!(
            cost_micro_usd(&row, &PRICING),
            expected_cost,
            "{vendor} stream={stream}"
        );
    }
    // The bug this guards against: charging all 2,459 at the full input rate.
    let wrong = NormalizedUsage::estimated(2459, 23);
    assert!(cost_micro_usd(&wrong, &PRICING) > 7_000);
}

fn upstream_openai_stream(with_usage: bool) -> Vec<SseItem> {
    let head = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"});
    let chunk = |choices: Value, usage: Value| {
        let mut v = head.clone();
        v["choices"] = choices;
        v["usage"] = usage;
        SseItem::Event(SseEvent::data(v.to_string()))
    };
    let mut items = vec![
        chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {"content": "Hello there"}, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        ),
    ];
    if with_usage {
        items.push(chunk(
            json!([]),
            json!({"prompt_tokens": 812, "completion_tokens": 140, "total_tokens": 952}),
        ));
    }
    items.push(SseItem::Event(SseEvent::data("[DONE]")));
    items
}

fn forwarded_usage_chunks(out: &[SseItem]) -> usize {
    out.iter()
        .filter(|i| match i {
            SseItem::Event(e) if e.data != "[DONE]" => {
                serde_json::from_str::<openai::ChatChunk>(&e.data)
                    .unwrap()
                    .is_usage_only()
            }
            _ => false,
        })
        .count()
}

#[test]
fn case15_client_without_stream_options_upstream_gets_include_usage_and_chunk_is_withheld() {
    let mut req: openai::ChatRequest = serde_json::from_value(json!({
        "model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
    .unwrap();
    let client_asked = req.force_include_usage();
    assert!(!client_asked);
    let upstream_body = serde_json::to_value(&req).unwrap();
    assert_eq!(upstream_body["stream_options"]["include_usage"], true);

    let mut t = StreamTranslator::openai_passthrough(client_asked);
    let items = upstream_openai_stream(true);
    let out: Vec<SseItem> = items.iter().flat_map(|i| t.push(i).unwrap()).collect();
    assert_eq!(
        out.len(),
        items.len() - 1,
        "only the usage-only chunk is withheld"
    );
    assert_eq!(forwarded_usage_chunks(&out), 0);
    assert!(t.is_finished());
    let u = t.usage().finish(500);
    assert_eq!(
        (u.input_uncached, u.output, u.source),
        (812, 140, UsageSource::Reported)
    );
    // The withheld chunk is classified so the dispatcher could make the same decision.
    assert_eq!(classify(Dialect::OpenAi, &items[3]), StreamClass::UsageOnly);
}

#[test]
fn case15_client_with_stream_options_gets_usage_chunk_and_same_charge() {
    let mut req: openai::ChatRequest = serde_json::from_value(json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hi"}]}))
    .unwrap();
    let client_asked = req.force_include_usage();
    assert!(client_asked);
    let mut t = StreamTranslator::openai_passthrough(client_asked);
    let items = upstream_openai_stream(true);
    let out: Vec<SseItem> = items.iter().flat_map(|i| t.push(i).unwrap()).collect();
    assert_eq!(out, items);
    assert_eq!(forwarded_usage_chunks(&out), 1);
    let u = t.usage().finish(500);
    assert_eq!(
        (u.input_uncached, u.output, u.source),
        (812, 140, UsageSource::Reported)
    );
}

#[test]
fn case15_upstream_without_usage_is_estimated_and_nonzero() {
    // As the dispatcher builds it: delivered output counted with the router's tokenizer.
    let mut t = StreamTranslator::openai_passthrough(false)
        .count_output_with(switchyard_router::estimate::count_tokens);
    for i in &upstream_openai_stream(false) {
        t.push(i).unwrap();
    }
    let u = t.usage().finish(812);
    assert_eq!(u.source, UsageSource::Estimated);
    assert_eq!(u.input_uncached, 812);
    // The delivered delta "Hello there" counted with the o200k tokenizer: "Hello", " there".
    assert_eq!(u.output, 2);
    assert_eq!(
        u.output,
        switchyard_router::estimate::count_tokens("Hello there")
    );
    assert!(cost_micro_usd(&u, &PRICING) > 0);
}

#[test]
fn anthropic_message_delta_with_full_usage_replaces_start_counts() {
    let mut s = StreamUsage::new();
    s.observe_anthropic(
        &serde_json::from_value(json!({"type": "message_start", "message": {
        "id": "m", "type": "message", "role": "assistant", "model": "x", "content": [],
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 100, "output_tokens": 1}}}))
        .unwrap(),
    );
    s.observe_anthropic(&serde_json::from_value(json!({"type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 0, "output_tokens": 40}})).unwrap());
    let u = s.reported().unwrap();
    assert_eq!(
        (u.input_uncached, u.cache_write, u.cache_read, u.output),
        (12, 100, 0, 40)
    );
    // 12 × 3 + 100 × 3.75 + 40 × 15 = 36 + 375 + 600 = 1,011 µ$.
    assert_eq!(cost_micro_usd(&u, &PRICING), 1_011);
}
