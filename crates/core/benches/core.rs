//! Criterion benchmarks for the hot paths of switchyard-core (placeholder).
use criterion::{Criterion, criterion_group, criterion_main};

fn noop(c: &mut Criterion) {
    c.bench_function("noop", |b| b.iter(|| 1 + 1));
}

criterion_group!(benches, noop);
criterion_main!(benches);
