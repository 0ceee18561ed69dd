//! Shared pauses and breakers (field cases 7 and 8): a pause published by one replica is seen
//! by another through its subscription and loaded by a replica started later; a shorter pause
//! never shortens a longer one.

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use common::*;
use futures::StreamExt;
use switchyard_store::{QuotaStore, Signal, SignalKind};
use switchyard_testkit::RedisServer;

fn in_secs(s: i64) -> DateTime<Utc> {
    #[allow(clippy::disallowed_methods)] // deadlines are wall-clock times
    let now = Utc::now();
    // Signals carry milliseconds.
    DateTime::from_timestamp_millis((now + TimeDelta::seconds(s)).timestamp_millis()).unwrap()
}

async fn next(stream: &mut (impl futures::Stream<Item = Signal> + Unpin)) -> Signal {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("no signal within 5 s")
        .expect("signal stream ended")
}

async fn share_and_never_shorten(publisher: &QuotaStore, listener: &QuotaStore) {
    let mut heard = Box::pin(listener.subscribe());
    let long = in_secs(30);
    assert!(publisher.publish_pause("provider/P-A", long).await);
    assert_eq!(
        next(&mut heard).await,
        Signal {
            kind: SignalKind::Pause,
            subject: "provider/P-A".into(),
            until: long,
        }
    );
    assert!(
        !publisher.publish_pause("provider/P-A", in_secs(5)).await,
        "a shorter pause never shortens a longer one"
    );
    let breaker = in_secs(10);
    assert!(publisher.publish_breaker_open("P-B", breaker).await);
    // The no-op above announced nothing: the next signal heard is the breaker.
    let s = next(&mut heard).await;
    assert_eq!(
        (s.kind, s.subject.as_str(), s.until),
        (SignalKind::BreakerOpen, "P-B", breaker)
    );
    let longer = in_secs(60);
    assert!(
        listener.publish_pause("provider/P-A", longer).await,
        "a longer one extends"
    );
    assert_eq!(next(&mut heard).await.until, longer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_pause_is_announced_and_loaded() {
    let store = QuotaStore::in_process();
    share_and_never_shorten(&store, &store).await;
    let mut loaded = store.load_signals().await;
    loaded.sort_by(|a, b| a.subject.cmp(&b.subject));
    assert_eq!(loaded.len(), 2);
    assert_eq!(loaded[0].subject, "P-B");
    assert_eq!(loaded[1].subject, "provider/P-A");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pause_from_one_replica_seen_by_another_and_loaded_by_a_fresh_one() {
    let server = RedisServer::start().unwrap();
    let p = prefix("signals");
    let r1 = redis_store(&server, &p).await;
    let r2 = redis_store(&server, &p).await;
    share_and_never_shorten(&r1, &r2).await;

    // R3 starts after everything was published (a restarted replica, field case 8).
    let r3 = redis_store(&server, &p).await;
    let mut loaded = r3.load_signals().await;
    loaded.sort_by(|a, b| a.subject.cmp(&b.subject));
    assert_eq!(loaded.len(), 2);
    assert_eq!(loaded[0].kind, SignalKind::BreakerOpen);
    assert_eq!(loaded[1].kind, SignalKind::Pause);
    assert_eq!(
        loaded[1].until,
        r2.load_signals()
            .await
            .iter()
            .find(|s| s.kind == SignalKind::Pause)
            .unwrap()
            .until
    );
    assert!(loaded[1].until > in_secs(50), "the longest deadline wins");

    // A signal that has passed is not loaded.
    assert!(r1.publish_pause("provider/P-C", in_secs(-1)).await);
    assert!(
        r3.load_signals()
            .await
            .iter()
            .all(|s| s.subject != "provider/P-C")
    );
}
