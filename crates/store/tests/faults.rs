//! The Redis store under faults (issue 14): a reservation whose caller goes away mid-call is
//! cancelled by its id, settlements made while Redis was unreachable are replayed when it
//! answers, a reservation that timed out but that Redis applied later is cancelled, the
//! concurrency slots of a replica that died lapse within one lease, and the store reports
//! whether Redis persists. Every test runs against a real `redis-server`.

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use switchyard_core::quota::Dimension;
use switchyard_store::{Persistence, QuotaStore, StoreMode};
use switchyard_testkit::RedisServer;

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what}: not within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_whose_caller_left_mid_call_is_cancelled_by_id() {
    let server = RedisServer::start().unwrap();
    let p = prefix("dropped");
    let store = redis_store(&server, &p).await;
    let observer = redis_store(&server, &p).await;
    let reqs = spec(
        "t1/req/day",
        tenant("t1"),
        Dimension::Requests,
        daily(1_000),
    );
    let itok = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        daily(1_000_000),
    );
    let slots = conc("t1/conc", 8);
    let all = [reqs.clone(), itok.clone(), slots.clone()];
    // 40 callers give up while their reservation is in Redis: the server is frozen, so each
    // script is sent and then waits; the future is dropped at 0 to 20 ms.
    server.freeze().unwrap();
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let store = store.clone();
        let all = all.clone();
        tasks.push(tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_millis(i % 21),
                store.reserve(&all, input(500), TTL),
            )
            .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    server.resume().unwrap();
    // The cancels run on tasks and the reservations still queued in the batcher are sent
    // after the resume, in either order (a cancel that overtakes its reservation leaves a
    // tombstone): the figures converge, they are not final the moment the slots are free.
    wait_until(
        "every slot, request and estimate credited back",
        async || {
            remaining(&observer, &slots).await == 8
                && remaining(&observer, &reqs).await == 1_000
                && remaining(&observer, &itok).await == 1_000_000
        },
    )
    .await;
    assert_eq!(
        remaining(&observer, &reqs).await,
        1_000,
        "requests credited back"
    );
    assert_eq!(
        remaining(&observer, &itok).await,
        1_000_000,
        "estimates credited back"
    );
    assert_eq!(store.in_flight(), 0);
    assert_eq!(store.leased(), 0);
    assert_eq!(store.mode(), StoreMode::Redis);
    // Only one batch is out at a time, and it cannot answer while the server is frozen: the
    // reservations queued behind it lost their callers before they could be sent.
    let sent = store.redis_batches().map_or(0, |[(_, items), _]| items);
    assert!(
        store.redis_reservations_skipped() > 0 && sent < 40,
        "{} skipped, {sent} sent",
        store.redis_reservations_skipped()
    );
    // A caller whose timeout fired before its job was queued sent nothing at all.
    assert!(sent + store.redis_reservations_skipped() <= 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_during_a_freeze_are_replayed_when_redis_answers() {
    let server = RedisServer::start().unwrap();
    let p = prefix("replay");
    let mut o = opts(&server, &p);
    o.op_timeout = Duration::from_millis(150);
    let store = QuotaStore::redis(o).await.unwrap();
    let observer = redis_store(&server, &p).await;
    let itok = spec(
        "t1/itok/day",
        tenant("t1"),
        Dimension::InputTokens,
        daily(100_000),
    );
    let slots = conc("t1/conc", 2);
    let all = [itok.clone(), slots.clone()];
    let a = store.reserve(&all, input(1_000), TTL).await.unwrap();
    let b = store.reserve(&all, input(1_000), TTL).await.unwrap();
    assert_eq!(a.issued_by(), Some(StoreMode::Redis));
    assert_eq!(remaining(&observer, &slots).await, 0);

    server.freeze().unwrap();
    store.reconcile(a, used_input(300)).await;
    store.release(b, None).await;
    assert_eq!(store.mode(), StoreMode::LocalFallback);
    assert_eq!(store.replay_pending(), 2, "both settlements wait for Redis");
    server.resume().unwrap();

    wait_until("back on redis", async || store.mode() == StoreMode::Redis).await;
    assert_eq!(store.replay_pending(), 0);
    assert_eq!(remaining(&observer, &slots).await, 2, "both slots freed");
    assert_eq!(
        remaining(&observer, &itok).await,
        100_000 - 300 - 1_000,
        "reconciled to 300, the released one keeps its estimate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservation_that_timed_out_but_landed_is_cancelled_on_return() {
    let server = RedisServer::start().unwrap();
    let p = prefix("timedout");
    let mut o = opts(&server, &p);
    o.op_timeout = Duration::from_millis(100);
    let store = QuotaStore::redis(o).await.unwrap();
    let observer = redis_store(&server, &p).await;
    let reqs = spec("t1/req/day", tenant("t1"), Dimension::Requests, daily(10));
    let slots = conc("t1/conc", 1);
    let all = [reqs.clone(), slots.clone()];

    server.freeze().unwrap();
    // The script waits in the frozen server's socket; the router side gives up and serves
    // from its local share.
    let t = store.reserve(&all, one_request(), TTL).await.unwrap();
    assert_eq!(t.issued_by(), Some(StoreMode::LocalFallback));
    assert_eq!(
        store.replay_pending(),
        1,
        "a cancel of the timed-out id is queued"
    );
    server.resume().unwrap();
    wait_until("back on redis", async || store.mode() == StoreMode::Redis).await;
    // Redis ran the reservation on resume; the replayed cancel undid it.
    assert_eq!(
        remaining(&observer, &slots).await,
        1,
        "the landed slot is freed"
    );
    assert_eq!(
        remaining(&observer, &reqs).await,
        10,
        "and its request credited back"
    );
    store.reconcile(t, used_input(0)).await;
    assert_eq!(store.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_of_a_dead_replica_lapse_within_one_lease_and_live_ones_are_renewed() {
    let server = RedisServer::start().unwrap();
    let p = prefix("lease");
    let lease = Duration::from_millis(800);
    let slots = conc("t1/conc", 2);
    let all = [slots.clone()];
    let mut o = opts(&server, &p);
    o.slot_lease = lease;
    // The dead replica: its own runtime, shut down with a slot held and never settled (the
    // process is gone: no settle, no renewal). Its reservation's TTL is a long 60 s.
    let dead_opts = o.clone();
    let dead_all = all.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = QuotaStore::redis(dead_opts).await.unwrap();
            let t = store
                .reserve(&dead_all, one_request(), Duration::from_secs(60))
                .await
                .unwrap();
            std::mem::forget(t);
        });
        drop(rt);
    })
    .join()
    .unwrap();
    let alive = QuotaStore::redis(o).await.unwrap();
    let held = alive
        .reserve(&all, one_request(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(alive.leased(), 1);
    assert_eq!(remaining(&alive, &slots).await, 0, "both slots taken");
    // Three leases later the dead replica's slot is back, the live one is still held.
    tokio::time::sleep(lease * 3).await;
    assert_eq!(
        remaining(&alive, &slots).await,
        1,
        "dead slot lapsed, live slot renewed"
    );
    alive.reconcile(held, used_input(0)).await;
    assert_eq!(alive.leased(), 0);
    assert_eq!(remaining(&alive, &slots).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_is_read_from_the_server() {
    let server = RedisServer::start().unwrap();
    let store = redis_store(&server, &prefix("persist")).await;
    assert_eq!(
        store.persistence().await,
        Some(Persistence {
            snapshots: false,
            append_only: false
        }),
        "the test server runs with --save \"\" --appendonly no"
    );
    let durable = RedisServer::start_persistent().unwrap();
    let p = redis_store(&durable, &prefix("persist"))
        .await
        .persistence()
        .await
        .unwrap();
    assert!(p.append_only && p.persists());
    assert_eq!(QuotaStore::in_process().persistence().await, None);
}

/// Reads a bucket's figures once the store is back on Redis after a restart.
async fn remaining_on_redis(store: &QuotaStore, b: &switchyard_core::quota::BucketSpec) -> u64 {
    for _ in 0..200 {
        let f = store.figures(b).await;
        if store.mode() == StoreMode::Redis
            && let Some(f) = f
        {
            return f.remaining;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("store not back on redis within 5 s");
}

async fn daily_cap_across_restart(mut server: RedisServer) -> u64 {
    let p = prefix("restart");
    let store = redis_store(&server, &p).await;
    let reqs = spec("t1/req/day", tenant("t1"), Dimension::Requests, daily(5));
    for _ in 0..3 {
        let t = store
            .reserve(std::slice::from_ref(&reqs), one_request(), TTL)
            .await
            .unwrap();
        store.reconcile(t, used_input(0)).await;
    }
    assert_eq!(remaining(&store, &reqs).await, 2);
    server.restart().unwrap();
    remaining_on_redis(&store, &reqs).await
}

/// What docs/broker.md "Redis persistence" says a daily limit needs: without persistence a
/// restart reopens the day's cap in full; with an append-only file it keeps what was used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_cap_survives_a_restart_only_when_redis_persists() {
    let volatile = RedisServer::start().unwrap();
    assert_eq!(
        daily_cap_across_restart(volatile).await,
        5,
        "reset: the cap reopened"
    );
    let durable = RedisServer::start_persistent().unwrap();
    let store = redis_store(&durable, &prefix("probe")).await;
    assert!(store.persistence().await.unwrap().append_only);
    drop(store);
    assert_eq!(
        daily_cap_across_restart(durable).await,
        2,
        "kept across the restart"
    );
}
