//! Throughput of the wire layer on one realistic stream: an Anthropic answer of 1,000 text
//! deltas (~150 KB) delivered in 1,400-byte network chunks. Measures the per-event costs the
//! dispatcher pays on every streamed byte: SSE parsing, classification (preamble/content),
//! same-dialect pass-through (with usage accounting) and translation to OpenAI chunks.

// criterion_main! generates an undocumented `main`; the bench is test code.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use switchyard_router::wire::Dialect;
use switchyard_router::wire::classify::{StreamClass, classify};
use switchyard_router::wire::sse::{SseItem, SseParser};
use switchyard_router::wire::translate::StreamTranslator;

fn anthropic_stream(deltas: usize) -> Vec<u8> {
    let mut s = String::new();
    s.push_str("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":4,\"cache_read_input_tokens\":2455,\"output_tokens\":1}}}\n\n");
    s.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    for _ in 0..deltas {
        s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"some words \"}}\n\n");
    }
    s.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":3000}}\n\n");
    s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}

fn bench_stream(c: &mut Criterion) {
    let bytes = anthropic_stream(1_000);
    let items: Vec<SseItem> = {
        let mut p = SseParser::new();
        bytes.chunks(1_400).flat_map(|c| p.push(c)).collect()
    };
    let mut g = c.benchmark_group("anthropic_stream_1000_deltas");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("sse_parse", |b| {
        b.iter(|| {
            let mut p = SseParser::new();
            bytes
                .chunks(1_400)
                .map(|chunk| p.push(black_box(chunk)).len())
                .sum::<usize>()
        })
    });
    g.bench_function("classify", |b| {
        b.iter(|| {
            items
                .iter()
                .filter(|i| classify(Dialect::Anthropic, black_box(i)) == StreamClass::Content)
                .count()
        })
    });
    g.bench_function("passthrough", |b| {
        b.iter(|| {
            let mut t = StreamTranslator::anthropic_passthrough();
            items
                .iter()
                .map(|i| t.push(i).unwrap().len())
                .sum::<usize>()
        })
    });
    g.bench_function("translate_to_openai", |b| {
        b.iter(|| {
            let mut t = StreamTranslator::anthropic_to_openai(1, true);
            items
                .iter()
                .map(|i| t.push(i).unwrap().len())
                .sum::<usize>()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_stream);
criterion_main!(benches);
