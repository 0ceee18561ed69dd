//! The same settlement rules, tested on both backends: reconcile credits back and charges
//! overruns, release keeps the estimate without usage, cancel credits everything, a dropped
//! ticket frees its concurrency slot, abandoned reservations expire (field cases 11, 13, 15,
//! 17).

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use switchyard_core::quota::{Demand, Dimension, Usage, Wait};
use switchyard_store::{QuotaStore, StoreMode};
use switchyard_testkit::RedisServer;

async fn settlement_rules(store: &QuotaStore) {
    let itok = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        daily(10_000),
    );
    let reqs = spec(
        "t1/req/day",
        tenant("t1"),
        Dimension::Requests,
        daily(1_000),
    );
    let slots = conc("t1/conc", 1);
    let all = [itok.clone(), reqs.clone(), slots.clone()];

    let t = store.reserve(&all, input(1_000), TTL).await.unwrap();
    // Headers of the success: input 9,000/10,000 is tighter than requests 999/1,000, and
    // the concurrency bucket is not reported.
    let (pos, fig) = t.tightest().unwrap();
    assert_eq!((pos, fig.limit, fig.remaining), (0, 10_000, 9_000));
    assert_eq!(remaining(store, &itok).await, 9_000);
    assert_eq!(remaining(store, &slots).await, 0);
    store.reconcile(t, used_input(400)).await;
    assert_eq!(
        remaining(store, &itok).await,
        9_600,
        "unused estimate credited back"
    );
    assert_eq!(
        remaining(store, &reqs).await,
        999,
        "the request stays charged"
    );
    assert_eq!(remaining(store, &slots).await, 1, "slot freed by reconcile");

    let t = store.reserve(&all, input(1_000), TTL).await.unwrap();
    store.reconcile(t, used_input(1_500)).await;
    assert_eq!(remaining(store, &itok).await, 8_100, "overrun charged");

    let t = store.reserve(&all, input(1_000), TTL).await.unwrap();
    store.release(t, None).await;
    assert_eq!(
        remaining(store, &itok).await,
        7_100,
        "release without usage keeps the estimate"
    );
    assert_eq!(remaining(store, &slots).await, 1);

    let t = store.reserve(&all, input(1_000), TTL).await.unwrap();
    store.release(t, Some(used_input(200))).await;
    assert_eq!(
        remaining(store, &itok).await,
        6_900,
        "release charges what was used"
    );

    let t = store.reserve(&all, input(1_000), TTL).await.unwrap();
    assert_eq!(remaining(store, &reqs).await, 995);
    store.cancel(t).await;
    assert_eq!(
        remaining(store, &itok).await,
        6_900,
        "cancel credits everything"
    );
    assert_eq!(
        remaining(store, &reqs).await,
        996,
        "the unsent request is credited too"
    );

    // A dropped ticket frees its slot (field case 13), also after an abort loop.
    for _ in 0..100 {
        let t = store.reserve(&all, input(10), TTL).await.unwrap();
        let refused = store.reserve(&all, input(10), TTL).await.unwrap_err();
        assert_eq!(refused.wait, Wait::OnRelease);
        assert_eq!(refused.reason, "tenant_concurrency");
        drop(t);
        settle_down(store).await;
    }
    assert_eq!(remaining(store, &slots).await, 1);
    assert_eq!(
        remaining(store, &itok).await,
        6_900 - 100 * 10,
        "dropped tickets keep their estimate"
    );
    assert_eq!(store.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_settlement_rules_hold() {
    let store = QuotaStore::in_process();
    assert_eq!(store.mode(), StoreMode::InProcess);
    settlement_rules(&store).await;
    assert_eq!(store.local_live(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_settlement_rules_hold() {
    let server = RedisServer::start().unwrap();
    let store = redis_store(&server, &prefix("rules")).await;
    settlement_rules(&store).await;
    assert_eq!(store.mode(), StoreMode::Redis);
}

/// Field case 11: $0.05 of spend left, ten concurrent $0.04 reservations, exactly one
/// admitted; after reconciling at $0.03 the spend is $0.98 and a $0.02 request fits.
async fn spend_cap(stores: &[QuotaStore]) {
    let cap = spec(
        "t1/spend/day",
        tenant("t1"),
        Dimension::SpendMicroUsd,
        daily(1_000_000),
    );
    let spend = |usd: u64| Demand {
        requests: 1,
        spend_micro_usd: usd,
        ..Demand::default()
    };
    let first = &stores[0];
    let t = first
        .reserve(std::slice::from_ref(&cap), spend(950_000), TTL)
        .await
        .unwrap();
    first
        .reconcile(
            t,
            Usage {
                spend_micro_usd: 950_000,
                ..Usage::default()
            },
        )
        .await;
    assert_eq!(remaining(first, &cap).await, 50_000);

    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(10));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let store = stores[i % stores.len()].clone();
        let cap = cap.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .reserve(&[cap], spend(40_000), TTL)
                .await
                .map(|t| (store, t))
        }));
    }
    let mut admitted = Vec::new();
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(x) => admitted.push(x),
            Err(r) => {
                assert_eq!(r.reason, "tenant_spend");
                assert_eq!(r.figures.remaining, 10_000);
                refused += 1;
            }
        }
    }
    assert_eq!((admitted.len(), refused), (1, 9));
    let (store, ticket) = admitted.pop().unwrap();
    store
        .reconcile(
            ticket,
            Usage {
                spend_micro_usd: 30_000,
                ..Usage::default()
            },
        )
        .await;
    assert_eq!(remaining(first, &cap).await, 20_000, "spend is $0.98");
    let t = first
        .reserve(std::slice::from_ref(&cap), spend(20_000), TTL)
        .await
        .unwrap();
    first.cancel(t).await;
    for s in stores {
        settle_down(s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_spend_cap_ten_concurrent_admits_one() {
    spend_cap(&[QuotaStore::in_process()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_spend_cap_ten_concurrent_across_replicas_admits_one() {
    let server = RedisServer::start().unwrap();
    let p = prefix("spend");
    let stores = vec![
        redis_store(&server, &p).await,
        redis_store(&server, &p).await,
        redis_store(&server, &p).await,
    ];
    spend_cap(&stores).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_abandoned_reservation_expires_and_frees_slot() {
    let store = QuotaStore::in_process();
    let itok = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        daily(10_000),
    );
    let slots = conc("t1/conc", 1);
    let all = [itok.clone(), slots.clone()];
    let t = store
        .reserve(&all, input(1_000), Duration::from_millis(100))
        .await
        .unwrap();
    std::mem::forget(t); // a caller that never settles
    assert!(store.reserve(&all, input(1), TTL).await.is_err());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t = store.reserve(&all, input(1), TTL).await.unwrap();
    assert_eq!(
        remaining(&store, &itok).await,
        8_999,
        "expired estimate stays charged"
    );
    store.cancel(t).await;
    assert_eq!(store.local_live(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_reservation_expires_and_frees_slot() {
    let server = RedisServer::start().unwrap();
    let p = prefix("abandon");
    let crashed = redis_store(&server, &p).await;
    let other = redis_store(&server, &p).await;
    let itok = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        daily(10_000),
    );
    let slots = conc("t1/conc", 1);
    let all = [itok.clone(), slots.clone()];
    let t = crashed
        .reserve(&all, input(1_000), Duration::from_millis(300))
        .await
        .unwrap();
    std::mem::forget(t); // the replica died holding it
    let refused = other.reserve(&all, input(1), TTL).await.unwrap_err();
    assert_eq!(refused.wait, Wait::OnRelease);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t = other.reserve(&all, input(1), TTL).await.unwrap();
    assert_eq!(
        remaining(&other, &itok).await,
        8_999,
        "expired estimate stays charged"
    );
    other.reconcile(t, used_input(1)).await;
    assert_eq!(remaining(&other, &slots).await, 1);
    assert_eq!(other.in_flight(), 0);
}
