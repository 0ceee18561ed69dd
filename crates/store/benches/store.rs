//! Criterion benchmarks of the in-process quota store: what a request pays for reserve and
//! settle through [`QuotaStore`] (mutex, key lookups, ticket) on top of core's ledger, which
//! alone does reserve + reconcile over five buckets in 163 ns (crates/core/benches/quota.rs).
//! Issue 5's target: ≥ 1,000,000 reserve + reconcile pairs per second on one core (≤ 1 µs).
//! Run: `cargo bench -p switchyard-store --bench store`. Measured 2026-11-30 on the shared
//! 2-core build machine: reserve + reconcile 699 ns (≈ 1.4 million pairs per second; core
//! alone 171 ns in the same run conditions), reserve + drop 569 ns, refusal 248 ns, the
//! `block_on` harness 4 ns. More in docs/broker.md, "Store".

// A failed setup must abort the benchmark rather than time an error path.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use criterion::{Criterion, criterion_group, criterion_main};
use futures::executor::block_on;
use switchyard_core::quota::{BucketSpec, Demand, Dimension, Rule, Scope, Usage};
use switchyard_store::QuotaStore;

fn five_buckets() -> Vec<Arc<BucketSpec>> {
    let minute = Duration::from_secs(60);
    let big = u64::MAX / 4;
    let spec = |key: &str, scope: Scope, dimension, rule| {
        Arc::new(BucketSpec {
            key: key.into(),
            scope,
            dimension,
            rule,
            count_cached_input: false,
        })
    };
    let t1 = || Scope::Tenant("t1".into());
    vec![
        spec(
            "tenant/t1/itpm",
            t1(),
            Dimension::InputTokens,
            Rule::TokenBucket {
                capacity: big,
                period: minute,
            },
        ),
        spec(
            "tenant/t1/otpm",
            t1(),
            Dimension::OutputTokens,
            Rule::TokenBucket {
                capacity: big,
                period: minute,
            },
        ),
        spec(
            "tenant/t1/rpm",
            t1(),
            Dimension::Requests,
            Rule::FixedWindow {
                capacity: big,
                period: minute,
                reset_at: None,
                tz: Tz::UTC,
            },
        ),
        spec(
            "tenant/t1/concurrency",
            t1(),
            Dimension::Concurrency,
            Rule::Concurrency { limit: 1_000 },
        ),
        spec(
            "provider/pa/itpm",
            Scope::Provider("P-A".into()),
            Dimension::InputTokens,
            Rule::TokenBucket {
                capacity: big,
                period: minute,
            },
        ),
    ]
}

const DEMAND: Demand = Demand {
    requests: 1,
    input_tokens: 1_200,
    cached_input_tokens: 0,
    output_tokens: 300,
    spend_micro_usd: 900,
};
const USAGE: Usage = Usage {
    input_uncached: 1_100,
    cache_read: 0,
    cache_write: 0,
    output: 120,
    spend_micro_usd: 500,
};
const TTL: Duration = Duration::from_secs(120);

fn bench(c: &mut Criterion) {
    // The store reads tokio's clock; enter a runtime so it has one.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let store = QuotaStore::in_process();
    let buckets = five_buckets();

    // What the harness itself costs: one `block_on` of a ready future per iteration.
    c.bench_function("store_block_on_baseline", |b| {
        b.iter(|| block_on(async { black_box(1) }))
    });

    c.bench_function("store_in_process_reserve_reconcile_5_buckets", |b| {
        b.iter(|| {
            block_on(async {
                let t = store
                    .reserve(black_box(&buckets), DEMAND, TTL)
                    .await
                    .unwrap();
                store.reconcile(t, black_box(USAGE)).await;
            })
        })
    });

    c.bench_function("store_in_process_reserve_drop_5_buckets", |b| {
        b.iter(|| {
            block_on(async {
                let t = store
                    .reserve(black_box(&buckets), DEMAND, TTL)
                    .await
                    .unwrap();
                drop(black_box(t));
            })
        })
    });

    let full = vec![Arc::new(BucketSpec {
        key: "tenant/t2/concurrency".into(),
        scope: Scope::Tenant("t2".into()),
        dimension: Dimension::Concurrency,
        rule: Rule::Concurrency { limit: 0 },
        count_cached_input: false,
    })];
    c.bench_function("store_in_process_refusal", |b| {
        b.iter(|| block_on(async { store.reserve(black_box(&full), DEMAND, TTL).await.is_err() }))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
