//! 1,000 concurrent reservations against a cap of N admit exactly N (issue 5; field case 10):
//! in process, and with three separate Redis stores (three router replicas, three
//! connections) sharing one redis-server. Run once per rule: fixed window, token bucket and
//! concurrency (tickets held until every attempt has answered).

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use switchyard_core::quota::{BucketSpec, Dimension, Rule, Scope};
use switchyard_store::{QuotaStore, StoreMode};
use switchyard_testkit::RedisServer;
use tokio::sync::Barrier;

const ATTEMPTS: usize = 1_000;

fn cases() -> Vec<(&'static str, u64, Vec<Arc<BucketSpec>>)> {
    let roomy = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        daily(1_000_000),
    );
    vec![
        (
            "window",
            137,
            vec![
                roomy.clone(),
                spec("t1/req/day", tenant("t1"), Dimension::Requests, daily(137)),
            ],
        ),
        (
            "token",
            250,
            vec![
                roomy.clone(),
                // 250 per day refills one request every 5.8 minutes: none during the test.
                spec(
                    "pa/req/day",
                    Scope::Provider("P-A".into()),
                    Dimension::Requests,
                    Rule::TokenBucket {
                        capacity: 250,
                        period: Duration::from_secs(86_400),
                    },
                ),
            ],
        ),
        ("concurrency", 64, vec![roomy, conc("t1/conc", 64)]),
    ]
}

/// Fires `ATTEMPTS` reservations at once across `stores` (round robin) and returns how many
/// were admitted; the tickets are held until all have answered, then settled.
async fn admitted(stores: &[QuotaStore], buckets: &[Arc<BucketSpec>]) -> usize {
    let barrier = Arc::new(Barrier::new(ATTEMPTS));
    let mut tasks = Vec::with_capacity(ATTEMPTS);
    for i in 0..ATTEMPTS {
        let store = stores[i % stores.len()].clone();
        let buckets = buckets.to_vec();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.reserve(&buckets, input(100), TTL).await.ok()
        }));
    }
    let mut tickets = Vec::new();
    for t in tasks {
        if let Some(ticket) = t.await.unwrap() {
            tickets.push(ticket);
        }
    }
    let n = tickets.len();
    for (i, t) in tickets.into_iter().enumerate() {
        stores[i % stores.len()].reconcile(t, used_input(100)).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_thousand_concurrent_reservations_admit_exactly_cap() {
    for (name, cap, buckets) in cases() {
        let store = QuotaStore::in_process();
        let n = admitted(std::slice::from_ref(&store), &buckets).await;
        assert_eq!(n as u64, cap, "{name}");
        assert_eq!(store.in_flight(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_three_replicas_thousand_concurrent_reservations_admit_exactly_cap() {
    let server = RedisServer::start().unwrap();
    for (name, cap, buckets) in cases() {
        let p = prefix(name);
        let stores = vec![
            redis_store(&server, &p).await,
            redis_store(&server, &p).await,
            redis_store(&server, &p).await,
        ];
        let n = admitted(&stores, &buckets).await;
        assert_eq!(n as u64, cap, "{name}");
        for s in &stores {
            assert_eq!(
                s.mode(),
                StoreMode::Redis,
                "{name}: no fallback during the run"
            );
            settle_down(s).await;
        }
    }
}
