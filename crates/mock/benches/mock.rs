//! Criterion benchmarks: cost of one mock round trip over loopback, so load runs can tell
//! whether the mock or the router is the bottleneck. Run:
//! `cargo bench -p switchyard-mock --bench mock`.

// Bench setup failures should abort loudly; this is not library code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use switchyard_mock::{MockConfig, MockProvider};

fn round_trips(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mock = rt
        .block_on(MockProvider::start(MockConfig {
            output_tokens: 64,
            ..MockConfig::default()
        }))
        .unwrap();
    let client = reqwest::Client::new();
    let chat = format!("{}/chat/completions", mock.openai_base_url());
    let messages = json!([{"role": "user", "content": vec!["word"; 500].join(" ")}]);
    let plain = json!({"model": "m", "messages": messages});
    let streamed = json!({"model": "m", "messages": messages, "stream": true,
        "stream_options": {"include_usage": true}});
    let mut group = c.benchmark_group("mock");
    group.bench_function("chat_non_stream_64_tokens", |b| {
        b.iter(|| {
            rt.block_on(async {
                client
                    .post(&chat)
                    .json(&plain)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    group.bench_function("chat_stream_64_tokens", |b| {
        b.iter(|| {
            rt.block_on(async {
                client
                    .post(&chat)
                    .json(&streamed)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    let anthropic = format!("{}/v1/messages", mock.base_url());
    let an = json!({"model": "c", "max_tokens": 64, "stream": true, "messages": messages});
    group.bench_function("messages_stream_64_tokens", |b| {
        b.iter(|| {
            rt.block_on(async {
                client
                    .post(&anthropic)
                    .json(&an)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    let emb = format!("{}/embeddings", mock.openai_base_url());
    let inputs = vec!["alpha beta gamma"; 16];
    let eb = json!({"model": "e", "input": inputs, "dimensions": 256});
    group.bench_function("embeddings_16x256", |b| {
        b.iter(|| {
            rt.block_on(async {
                client
                    .post(&emb)
                    .json(&eb)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap()
            })
        })
    });
    group.finish();
    // Memory stays bounded only as long as calls are recorded; show how many a bench made.
    let n = mock.call_count();
    assert!(n > 0, "bench made calls");
    rt.block_on(mock.shutdown());
}

criterion_group!(benches, round_trips);
criterion_main!(benches);
