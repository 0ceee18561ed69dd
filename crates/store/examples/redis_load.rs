//! Load program for the Redis quota store: reservations per second at a given concurrency
//! against a local redis-server, reservations and reconciliations batched into
//! script calls (see `remote.rs`) (issue 5 target: ≥ 20,000 reservations/s at concurrency 32).
//!
//! Run: `cargo run --release -p switchyard-store --example redis_load -- [concurrency]
//! [seconds] [replicas] [url]`. Defaults: 32 workers, 10 s, 1 store (one multiplexed
//! connection, like one router replica), a throwaway redis-server on a free port. Each
//! worker loops reserve → reconcile over five buckets (tenant input/output token buckets, a
//! requests window, a concurrency limit, a provider token bucket) sized never to refuse.

// A load program reports on stdout and aborts on a failed setup.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use chrono_tz::Tz;
use switchyard_core::quota::{BucketSpec, Demand, Dimension, Rule, Scope, Usage};
use switchyard_store::{QuotaStore, RedisOptions, StoreMode};
use switchyard_testkit::RedisServer;

fn buckets() -> Vec<Arc<BucketSpec>> {
    let minute = Duration::from_secs(60);
    let big = 1_000_000_000;
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
    let tokens = Rule::TokenBucket {
        capacity: big,
        period: minute,
    };
    vec![
        spec(
            "tenant/t1/itpm",
            t1(),
            Dimension::InputTokens,
            tokens.clone(),
        ),
        spec(
            "tenant/t1/otpm",
            t1(),
            Dimension::OutputTokens,
            tokens.clone(),
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
            Rule::Concurrency { limit: 100_000 },
        ),
        spec(
            "provider/pa/itpm",
            Scope::Provider("P-A".into()),
            Dimension::InputTokens,
            tokens,
        ),
    ]
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let concurrency: usize = args.first().map_or(32, |s| s.parse().expect("concurrency"));
    let seconds: u64 = args.get(1).map_or(10, |s| s.parse().expect("seconds"));
    let replicas: usize = args.get(2).map_or(1, |s| s.parse().expect("replicas"));
    let (_server, url) = match args.get(3) {
        Some(u) => (None, u.clone()),
        None => {
            let s = RedisServer::start().expect("redis-server");
            let u = s.url();
            (Some(s), u)
        }
    };
    let mut stores = Vec::new();
    for _ in 0..replicas {
        let mut o = RedisOptions::new(url.clone());
        o.key_prefix = "load".into();
        o.op_timeout = Duration::from_secs(1);
        stores.push(QuotaStore::redis(o).await.expect("connect"));
    }
    let buckets = buckets();
    let demand = Demand {
        requests: 1,
        input_tokens: 1_200,
        cached_input_tokens: 0,
        output_tokens: 300,
        spend_micro_usd: 900,
    };
    let usage = Usage {
        input_uncached: 1_100,
        output: 120,
        spend_micro_usd: 500,
        ..Usage::default()
    };

    // Warm up: load the scripts, create the keys.
    for s in &stores {
        let t = s
            .reserve(&buckets, demand, Duration::from_secs(30))
            .await
            .unwrap();
        s.reconcile(t, usage).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    let start = tokio::time::Instant::now();
    for w in 0..concurrency {
        let store = stores[w % stores.len()].clone();
        let buckets = buckets.clone();
        let stop = stop.clone();
        let refused = refused.clone();
        workers.push(tokio::spawn(async move {
            let mut reserve_us = Vec::new();
            let mut pairs = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t0 = tokio::time::Instant::now();
                match store
                    .reserve(&buckets, demand, Duration::from_secs(30))
                    .await
                {
                    Ok(t) => {
                        reserve_us.push(t0.elapsed().as_micros() as u64);
                        store.reconcile(t, usage).await;
                        pairs += 1;
                    }
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            (pairs, reserve_us)
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut pairs = 0;
    let mut lat = Vec::new();
    for w in workers {
        let (p, l) = w.await.unwrap();
        pairs += p;
        lat.extend(l);
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    let modes: Vec<StoreMode> = stores.iter().map(QuotaStore::mode).collect();
    println!(
        "concurrency {concurrency}, {replicas} store(s), {seconds} s, 5 buckets per reservation"
    );
    println!(
        "reservations (reserve + reconcile pairs): {pairs} in {elapsed:.2} s = {:.0}/s; script items {:.0}/s",
        pairs as f64 / elapsed,
        2.0 * pairs as f64 / elapsed
    );
    let batches =
        stores
            .iter()
            .filter_map(QuotaStore::redis_batches)
            .fold([(0, 0); 2], |acc, b| {
                [
                    (acc[0].0 + b[0].0, acc[0].1 + b[0].1),
                    (acc[1].0 + b[1].0, acc[1].1 + b[1].1),
                ]
            });
    for (what, (calls, items)) in ["reserve", "settle"].into_iter().zip(batches) {
        println!(
            "{what}: {calls} script calls ({:.0}/s), {:.1} items per call",
            calls as f64 / elapsed,
            items as f64 / calls.max(1) as f64
        );
    }
    println!(
        "reserve latency µs: p50 {} p90 {} p99 {} max {}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.9),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(0)
    );
    println!(
        "refused {}, modes at end {modes:?}, in flight {}",
        refused.load(Ordering::Relaxed),
        stores.iter().map(QuotaStore::in_flight).sum::<usize>()
    );
}
