//! What the Redis scripts leave in Redis: exact integers (no 14-digit rounding of
//! microsecond times or large levels), reservation records that disappear on settlement, and
//! a changed limit that keeps what was consumed (as core's `Ledger::register`).

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use switchyard_core::quota::{Dimension, Rule};
use switchyard_store::QuotaStore;
use switchyard_testkit::RedisServer;

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A stored number as an exact integer (Redis may write `8.6398272e+15` for a round value).
fn integer(s: &str) -> i128 {
    let v: f64 = s.parse().unwrap();
    assert_eq!(v.fract(), 0.0, "{s} is not an integer");
    assert!(
        v.abs() < 9.007_199_254_740_992e15,
        "{s} is beyond exact doubles"
    );
    v as i128
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_token_state_after_settlement_is_exact_integers() {
    let server = RedisServer::start().unwrap();
    let p = prefix("exact");
    let store = redis_store(&server, &p).await;
    // 99,999 a day: capacity × period in µs = 8.64 × 10^15, just below 2^53 (1 µs ticks).
    let b = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        Rule::TokenBucket {
            capacity: 99_999,
            period: Duration::from_secs(86_400),
        },
    );
    let all = [b.clone()];
    let t = store.reserve(&all, input(12_345), TTL).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    store.reconcile(t, used_input(1)).await;

    let mut conn = raw(&server).await;
    let state: String = redis::cmd("HGET")
        .arg(format!("{{{p}}}:buckets"))
        .arg(format!("{{{p}}}:b:t1/itok/day"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // 'T,capacity,period,tick,level,time'
    let f: Vec<&str> = state.split(',').collect();
    assert_eq!(f[..4], ["T", "99999", "86400000000", "1"], "{state}");
    assert!(
        integer(f[5]) > 1_000_000_000_000_000,
        "time in whole µs: {state}"
    );
    let level = integer(f[4]);
    let per: i128 = 86_400_000_000;
    // Full minus the 1 unit charged, plus at most a few seconds of refill (99,999 / day).
    let floor = 99_998 * per;
    assert!(
        level >= floor && level < floor + 5 * 99_999 * 1_000_000,
        "{level}"
    );

    let records: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{p}}}:r:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        records.is_empty(),
        "settled records are deleted: {records:?}"
    );
}

async fn limit_change_keeps_consumption(store: &QuotaStore) {
    let old = spec(
        "t1/req/day",
        tenant("t1"),
        Dimension::Requests,
        daily(1_000),
    );
    for _ in 0..3 {
        let t = store
            .reserve(std::slice::from_ref(&old), input(0), TTL)
            .await
            .unwrap();
        store.reconcile(t, used_input(0)).await;
    }
    assert_eq!(remaining(store, &old).await, 997);
    let mut changed = (*old).clone();
    changed.rule = daily(10);
    let changed = std::sync::Arc::new(changed);
    assert_eq!(
        remaining(store, &changed).await,
        7,
        "3 used carry over to the new limit"
    );
    let t = store
        .reserve(std::slice::from_ref(&changed), input(0), TTL)
        .await
        .unwrap();
    store.cancel(t).await;
    assert_eq!(remaining(store, &changed).await, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_limit_change_keeps_consumption() {
    limit_change_keeps_consumption(&QuotaStore::in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_limit_change_keeps_consumption() {
    let server = RedisServer::start().unwrap();
    limit_change_keeps_consumption(&redis_store(&server, &prefix("change")).await).await;
}
