//! Criterion benchmarks for the per-request and per-interval hot paths of switchyard-core.
//!
//! Targets (from the task): chain over 5 providers ≤ 300 ns, p2c pick ≤ 100 ns, controller
//! step ≤ 1 µs. Run: `cargo bench -p switchyard-core --bench core`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_core::availability::{AvailabilityController, ControllerConfig, WindowCounts};
use switchyard_core::chain::{ChainPins, sticky_chain, sticky_chain_into};
use switchyard_core::p2c::{P2c, P2cConfig, ScoringMode};
use switchyard_core::time::Instant;
use switchyard_core::weights::cascade_weights;

const NAMES: [&str; 5] = ["anthropic", "vertex", "bedrock", "openai", "azure"];
const WEIGHTS: [f64; 5] = [0.5, 0.3, 0.15, 0.05, 0.0];

fn chains(c: &mut Criterion) {
    let keys: Vec<String> = (0..1_024).map(|i| format!("project-{i:06}")).collect();
    let mut i = 0usize;
    c.bench_function("chain/sticky_chain_5", |b| {
        b.iter(|| {
            i = (i + 1) & 1_023;
            sticky_chain(black_box(&keys[i]), black_box(&NAMES), black_box(&WEIGHTS))
        })
    });
    let mut out = Vec::with_capacity(8);
    c.bench_function("chain/sticky_chain_into_5", |b| {
        b.iter(|| {
            i = (i + 1) & 1_023;
            sticky_chain_into(black_box(&keys[i]), &NAMES, &WEIGHTS, &mut out);
            black_box(out.first().copied())
        })
    });
    let mut pins = ChainPins::new(10_000, Duration::from_secs(300));
    for k in &keys {
        pins.chain(k, &NAMES, &WEIGHTS, Instant::ZERO);
    }
    let now = Instant::from_millis(1_000);
    c.bench_function("chain/pins_hit_5", |b| {
        b.iter(|| {
            i = (i + 1) & 1_023;
            pins.chain(black_box(&keys[i]), &NAMES, &WEIGHTS, now)
        })
    });
    c.bench_function("weights/cascade_5", |b| {
        b.iter(|| cascade_weights(black_box(&[0.6, 0.7, 1.0, 0.2, 0.0])))
    });
}

fn p2c(c: &mut Criterion) {
    for (name, mode) in [
        ("p2c/pick_5_latency", ScoringMode::Latency),
        ("p2c/pick_5_reliability", ScoringMode::ReliabilityAndLoad),
    ] {
        let mut p = P2c::new(
            5,
            P2cConfig {
                mode,
                ..P2cConfig::default()
            },
        );
        for i in 0..5 {
            p.set_max_concurrency(i, 64);
            p.on_start(i, Instant::ZERO);
            p.on_finish(
                i,
                Instant::from_millis(100),
                Duration::from_millis(80 + 20 * i as u64),
                i != 3,
            );
        }
        let eligible = [0, 1, 2, 3, 4];
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        let now = Instant::from_millis(500);
        c.bench_function(name, |b| {
            b.iter(|| p.pick(black_box(&eligible), now, &mut rng))
        });
    }
}

fn controller(c: &mut Criterion) {
    let mut ctl = AvailabilityController::new(ControllerConfig::default());
    let windows = [
        WindowCounts {
            successes: 1_200,
            provider_errors: 3,
        },
        WindowCounts {
            successes: 1_150,
            provider_errors: 60,
        },
        WindowCounts {
            successes: 0,
            provider_errors: 0,
        },
        WindowCounts {
            successes: 900,
            provider_errors: 0,
        },
    ];
    let mut i = 0usize;
    c.bench_function("availability/step", |b| {
        b.iter(|| {
            i = (i + 1) & 3;
            ctl.step(black_box(windows[i]))
        })
    });
}

criterion_group!(benches, chains, p2c, controller);
criterion_main!(benches);
