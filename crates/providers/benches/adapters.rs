//! What the Bedrock adapter adds to a streamed answer: the same Claude answer (N text deltas)
//! read as Anthropic SSE (the `anthropic` API, Claude on Vertex), as InvokeModel event-stream
//! frames (base64 Anthropic events inside `chunk` frames) and as ConverseStream frames, each
//! decoded by its adapter's stream decoder and translated to the OpenAI client dialect, plus an
//! OpenAI SSE pass-through for comparison. Bodies arrive in 1,400-byte network chunks.
//!
//! Figures: docs/benchmarks.md, "Adapters: streaming decode".

// criterion_main! generates an undocumented `main`; the bench is test code.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine as _;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};
use switchyard_providers::adapter::{Adapter, StreamDecoder};
use switchyard_providers::bedrock::Bedrock;
use switchyard_providers::upstream::Operation;
use switchyard_providers::wire::sse::{SseParser, encode_item};
use switchyard_providers::wire::translate::StreamTranslator;

fn anthropic_events(deltas: usize) -> Vec<Value> {
    let mut v = vec![
        json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":4,"cache_read_input_tokens":2455,"output_tokens":1}}}),
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
    ];
    for _ in 0..deltas {
        v.push(json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"some words "}}));
    }
    v.push(json!({"type":"content_block_stop","index":0}));
    v.push(json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3000}}));
    v.push(json!({"type":"message_stop"}));
    v
}

fn sse(events: &[Value]) -> Vec<u8> {
    let mut s = String::new();
    for e in events {
        s.push_str(&format!(
            "event: {}\ndata: {e}\n\n",
            e["type"].as_str().unwrap()
        ));
    }
    s.into_bytes()
}

fn frame(event_type: &str, payload: &str) -> Vec<u8> {
    let m = Message::new(Bytes::from(payload.to_owned()))
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ))
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String(event_type.to_owned().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ));
    let mut out = Vec::new();
    write_message_to(&m, &mut out).unwrap();
    out
}

fn invoke_frames(events: &[Value]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    events
        .iter()
        .flat_map(|e| {
            frame(
                "chunk",
                &json!({"bytes": b64.encode(e.to_string())}).to_string(),
            )
        })
        .collect()
}

fn converse_frames(deltas: usize) -> Vec<u8> {
    let mut out = frame("messageStart", r#"{"role":"assistant"}"#);
    for _ in 0..deltas {
        out.extend(frame(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"some words "}}"#,
        ));
    }
    out.extend(frame("contentBlockStop", r#"{"contentBlockIndex":0}"#));
    out.extend(frame("messageStop", r#"{"stopReason":"end_turn"}"#));
    out.extend(frame(
        "metadata",
        r#"{"usage":{"inputTokens":4,"outputTokens":3000,"cacheReadInputTokens":2455},"metrics":{"latencyMs":9}}"#,
    ));
    out
}

fn openai_sse(deltas: usize) -> Vec<u8> {
    let mut s = String::from(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    );
    for _ in 0..deltas {
        s.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"some words \"},\"finish_reason\":null}]}\n\n");
    }
    s.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    s.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3000,\"total_tokens\":3004}}\n\n");
    s.push_str("data: [DONE]\n\n");
    s.into_bytes()
}

/// Decodes `body` in network chunks with `decoder` and translates every item with `t`,
/// returning the client bytes' length.
fn run(body: &[u8], mut decoder: Box<dyn StreamDecoder>, mut t: StreamTranslator) -> usize {
    let mut out = 0;
    for chunk in body.chunks(1400) {
        for item in decoder.push(chunk) {
            for o in t.push(&item).unwrap() {
                out += encode_item(&o).len();
            }
        }
    }
    for item in decoder.finish() {
        for o in t.push(&item).unwrap() {
            out += encode_item(&o).len();
        }
    }
    out
}

fn bedrock() -> Bedrock {
    let spec = serde_json::from_value(json!({
        "api": "bedrock", "region": "us-east-1",
        "credentials": {"secretRef": {"name": "a", "key": "s"}, "accessKeyIdRef": {"name": "a", "key": "i"}},
        "models": [{"name": "m"}]
    }))
    .unwrap();
    Bedrock::from_spec(&spec, |_| Ok("x".into()), reqwest::Client::new()).unwrap()
}

fn bench(c: &mut Criterion) {
    let b = bedrock();
    let mut g = c.benchmark_group("stream_to_openai_client");
    for deltas in [16_usize, 1000] {
        let events = anthropic_events(deltas);
        let anthropic = sse(&events);
        let invoke = invoke_frames(&events);
        let converse = converse_frames(deltas);
        let openai = openai_sse(deltas);
        g.throughput(Throughput::Elements(deltas as u64));
        g.bench_with_input(
            BenchmarkId::new("openai_sse_passthrough", deltas),
            &openai,
            |bch, body| {
                bch.iter(|| {
                    black_box(run(
                        body,
                        Box::new(SseParser::new()),
                        StreamTranslator::openai_passthrough(true),
                    ))
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("anthropic_sse", deltas),
            &anthropic,
            |bch, body| {
                bch.iter(|| {
                    black_box(run(
                        body,
                        Box::new(SseParser::new()),
                        StreamTranslator::anthropic_to_openai(1, true),
                    ))
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("bedrock_invoke_eventstream", deltas),
            &invoke,
            |bch, body| {
                bch.iter(|| {
                    let d = b.stream_decoder(
                        Operation::Messages,
                        "anthropic.claude-3-5-haiku-20241022-v1:0",
                    );
                    black_box(run(body, d, StreamTranslator::anthropic_to_openai(1, true)))
                });
            },
        );
        g.bench_with_input(
            BenchmarkId::new("bedrock_converse_eventstream", deltas),
            &converse,
            |bch, body| {
                bch.iter(|| {
                    let d = b.stream_decoder(Operation::Messages, "amazon.nova-pro-v1:0");
                    black_box(run(body, d, StreamTranslator::anthropic_to_openai(1, true)))
                });
            },
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
