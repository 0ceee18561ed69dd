//! Criterion benchmarks: one hour of each shipped scenario under each strategy.
//! Run: `cargo bench -p switchyard-sim --bench sim`.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_sim::{Scenario, StrategyKind, run_scenario};

fn scenario(file: &str) -> Option<Scenario> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config/scenarios")
        .join(file);
    Scenario::from_file(&path).ok()
}

fn runs(c: &mut Criterion) {
    let mut group = c.benchmark_group("run");
    group.sample_size(10);
    for file in ["primary-60pct.yaml", "embeddings-two-slow.yaml"] {
        let Some(sc) = scenario(file) else {
            continue;
        };
        for kind in [StrategyKind::Switchyard, StrategyKind::Ordered] {
            group.bench_function(format!("{}/{kind}", sc.name), |b| {
                b.iter(|| run_scenario(black_box(&sc), kind).summary.requests)
            });
        }
    }
    group.finish();
}

criterion_group!(benches, runs);
criterion_main!(benches);
