//! Cost of the health filter on the request path: `HealthBoard::admits_all` for a provider
//! with probed modalities (one shared-lock read and two hash lookups), for one that is not
//! probed, and `prefer_admitted` over a route of eight candidates, on a board holding 200
//! providers × 4 modalities.

// criterion_main! generates an undocumented `main`; the bench is test code.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_api::provider::Modality;
use switchyard_core::health::{HealthConfig, ProbeOutcome};
use switchyard_core::time::Instant;
use switchyard_router::health::HealthBoard;

fn board() -> (HealthBoard, Vec<String>) {
    let board = HealthBoard::new();
    let cfg = HealthConfig::for_interval(Duration::from_secs(60), 3, Duration::from_secs(5));
    let wall = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    let keys: Vec<String> = (0..200)
        .map(|i| format!("ai-platform/provider-{i}"))
        .collect();
    let ok = ProbeOutcome::Success {
        latency: Duration::from_millis(200),
    };
    let fail = ProbeOutcome::Failure {
        detail: "HTTP 500".into(),
    };
    for (i, k) in keys.iter().enumerate() {
        for m in [
            Modality::Text,
            Modality::Embedding,
            Modality::Transcription,
            Modality::Speech,
        ] {
            let outcome = if i % 3 == 0 && m == Modality::Transcription {
                &fail
            } else {
                &ok
            };
            for _ in 0..3 {
                board.record(k, m, &cfg, outcome, Instant::from_millis(1_000), wall);
            }
        }
    }
    (board, keys)
}

fn bench(c: &mut Criterion) {
    let (board, keys) = board();
    let now = Instant::from_millis(2_000);
    let needs = [Modality::Text, Modality::Image];
    c.bench_function("health_admits_all_probed_provider", |b| {
        b.iter(|| board.admits_all(black_box(&keys[17]), black_box(&needs), now))
    });
    c.bench_function("health_admits_all_unprobed_provider", |b| {
        b.iter(|| board.admits_all(black_box("other/provider"), black_box(&needs), now))
    });
    let route: Vec<&str> = keys[..8].iter().map(String::as_str).collect();
    c.bench_function("health_prefer_admitted_8_candidates", |b| {
        b.iter(|| {
            board.prefer_admitted(
                black_box(route.clone()),
                |k| k,
                &[Modality::Transcription],
                now,
            )
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
