//! Estimation cost against input size, for hostile and careless inputs (issue 12 item 1): one
//! long run of digits, of letters, of CJK characters, of emoji, and random bytes (lossily
//! decoded, as a client's broken encoder would send them), from 1 KB to 4 MB.
//!
//! Two functions per input:
//! - `count_tokens`: the exact tokenizer with no budget (the ASCII pre-splitter or the crate's
//!   regex, then the BPE per piece) — shows that the tokenizer itself is linear in its input;
//! - `estimate_chat`: the whole estimate of a chat request carrying the text as one user
//!   message, with the segment memo emptied before each run — shows the per-request budget
//!   ([`EXACT_BUDGET_BYTES`]): past 1 MiB the cost stops growing with the tokenizer and grows
//!   only with a hash of the rest.
//!
//! Linear means the time per byte (criterion's throughput) stays flat across sizes.

// criterion_main! generates an undocumented `main`; the bench is test code.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use switchyard_router::estimate::{
    EXACT_BUDGET_BYTES, EstimateParams, clear_memo, count_tokens, estimate_openai_chat, warm_up,
};
use switchyard_router::wire::openai::ChatRequest;

const SIZES: [usize; 5] = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20];

/// `unit` repeated to `bytes` bytes (rounded down to whole units).
fn run_of(unit: &str, bytes: usize) -> String {
    unit.repeat(bytes / unit.len())
}

/// `bytes` pseudo-random bytes (xorshift64, fixed seed) decoded lossily, cut to at most
/// `bytes` bytes at a character boundary.
fn random_text(bytes: usize) -> String {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let raw: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    let mut text = String::from_utf8_lossy(&raw).into_owned();
    let mut cut = bytes.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

fn inputs(bytes: usize) -> [(&'static str, String); 5] {
    [
        ("digits", run_of("7", bytes)),
        ("letters", run_of("a", bytes)),
        ("cjk", run_of("東", bytes)),
        ("emoji", run_of("🎉", bytes)),
        ("random_bytes", random_text(bytes)),
    ]
}

fn bench_sizes(c: &mut Criterion) {
    warm_up();
    let params = EstimateParams::default();
    assert_eq!(
        EXACT_BUDGET_BYTES,
        1 << 20,
        "the docs' table assumes a 1 MiB budget"
    );
    let mut exact = c.benchmark_group("count_tokens");
    exact.sample_size(10);
    exact.warm_up_time(Duration::from_millis(500));
    exact.measurement_time(Duration::from_secs(2));
    for bytes in SIZES {
        for (kind, text) in inputs(bytes) {
            exact.throughput(Throughput::Bytes(text.len() as u64));
            exact.bench_with_input(BenchmarkId::new(kind, bytes), &text, |b, text| {
                b.iter(|| count_tokens(black_box(text)))
            });
        }
    }
    exact.finish();

    let mut whole = c.benchmark_group("estimate_chat");
    whole.sample_size(10);
    whole.warm_up_time(Duration::from_millis(500));
    whole.measurement_time(Duration::from_secs(2));
    for bytes in SIZES {
        for (kind, text) in inputs(bytes) {
            let req: ChatRequest = serde_json::from_value(json!({"model": "m",
                "messages": [{"role": "user", "content": text}]}))
            .unwrap();
            whole.throughput(Throughput::Bytes(text.len() as u64));
            whole.bench_with_input(BenchmarkId::new(kind, bytes), &req, |b, req| {
                b.iter_batched(
                    clear_memo,
                    |()| estimate_openai_chat(black_box(req), &params),
                    BatchSize::PerIteration,
                )
            });
        }
    }
    whole.finish();
}

criterion_group!(benches, bench_sizes);
criterion_main!(benches);
