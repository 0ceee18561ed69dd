//! Redis outages (issue 5 "Stores"; field case 10): a killed or frozen server switches every
//! store to local buckets holding its share of each limit, a mode change is observed, and
//! the store goes back to Redis when the server answers again.

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use switchyard_core::quota::Dimension;
use switchyard_store::{QuotaStore, StoreMode};
use switchyard_testkit::RedisServer;
use tokio::sync::watch;

async fn wait_for(modes: &mut watch::Receiver<StoreMode>, want: StoreMode) {
    tokio::time::timeout(Duration::from_secs(10), modes.wait_for(|m| *m == want))
        .await
        .unwrap_or_else(|_| panic!("mode {want:?} not reached in 10 s"))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_falls_back_to_replica_share_and_recovers() {
    let mut server = RedisServer::start().unwrap();
    let mut o = opts(&server, &prefix("outage"));
    o.local_share = 3;
    o.op_timeout = Duration::from_millis(300);
    let store = QuotaStore::redis(o).await.unwrap();
    let mut modes = store.watch_mode();
    let reqs = spec("t1/req/day", tenant("t1"), Dimension::Requests, daily(30));
    let b = [reqs.clone()];

    for _ in 0..5 {
        let t = store.reserve(&b, one_request(), TTL).await.unwrap();
        assert_eq!(t.issued_by(), Some(StoreMode::Redis));
        store.reconcile(t, used_input(0)).await;
    }
    assert_eq!(remaining(&store, &reqs).await, 25);

    server.stop();
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..30 {
        match store.reserve(&b, one_request(), TTL).await {
            Ok(t) => {
                assert_eq!(t.issued_by(), Some(StoreMode::LocalFallback));
                held.push(t);
            }
            Err(r) => refused = Some(r),
        }
    }
    assert_eq!(
        held.len(),
        10,
        "⌈30 / 3⌉ local admissions during the outage"
    );
    let refused = refused.unwrap();
    assert_eq!(refused.reason, "tenant_requests_per_day");
    assert_eq!(refused.figures.limit, 10);
    wait_for(&mut modes, StoreMode::LocalFallback).await;
    assert_eq!(store.mode(), StoreMode::LocalFallback);
    assert_eq!(store.figures(&reqs).await.unwrap().limit, 10);
    for t in held {
        store.release(t, None).await;
    }
    assert_eq!(store.in_flight(), 0);

    server.restart().unwrap();
    wait_for(&mut modes, StoreMode::Redis).await;
    let t = store.reserve(&b, one_request(), TTL).await.unwrap();
    assert_eq!(t.issued_by(), Some(StoreMode::Redis));
    store.cancel(t).await;
    settle_down(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_times_out_to_fallback_and_recovers() {
    let server = RedisServer::start().unwrap();
    let mut o = opts(&server, &prefix("frozen"));
    o.local_share = 2;
    o.op_timeout = Duration::from_millis(100);
    let store = QuotaStore::redis(o).await.unwrap();
    let mut modes = store.watch_mode();
    let slots = [conc("t1/conc", 4)];

    server.freeze().unwrap();
    let a = store.reserve(&slots, one_request(), TTL).await.unwrap();
    let b = store.reserve(&slots, one_request(), TTL).await.unwrap();
    let refused = store.reserve(&slots, one_request(), TTL).await.unwrap_err();
    assert_eq!(refused.figures.limit, 2, "⌈4 / 2⌉ slots locally");
    assert_eq!(a.issued_by(), Some(StoreMode::LocalFallback));
    wait_for(&mut modes, StoreMode::LocalFallback).await;
    drop(a);
    drop(b);
    assert_eq!(store.in_flight(), 0);

    server.resume().unwrap();
    wait_for(&mut modes, StoreMode::Redis).await;
    let t = store.reserve(&slots, one_request(), TTL).await.unwrap();
    assert_eq!(t.issued_by(), Some(StoreMode::Redis));
    drop(t);
    settle_down(&store).await;
}
