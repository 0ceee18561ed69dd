//! Outcome collection against fake router replicas serving `GET /outcomes` on loopback:
//! deltas between scrapes, resets (changed `startedAt`, counters going down), replicas that
//! start mid-window, unreachable replicas, and EndpointSlice address extraction.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use chrono::{DateTime, Duration, TimeZone, Utc};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use support::FakeRouter;
use switchyard_operator::outcomes::{Collector, ReplicaState, endpoint_urls};

fn t(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap() + Duration::seconds(seconds)
}

const EARLY: &str = "2026-11-30T11:00:00Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_two_replicas_sums_deltas_between_scrapes() {
    let a = FakeRouter::start("router-a", EARLY).await;
    let b = FakeRouter::start("router-b", EARLY).await;
    a.set("ns/p", 100, &[("capacity", 5)]);
    b.set("ns/p", 40, &[("server", 1)]);
    let targets = vec![a.url(), b.url()];
    let mut c = Collector::new();

    let first = c.collect(&targets, t(0)).await;
    assert!(first.providers.is_empty(), "first sight is a baseline");
    assert_eq!(first.scraped[&a.url()], ReplicaState::Baseline);

    a.set("ns/p", 130, &[("capacity", 9), ("request", 3)]);
    b.set("ns/p", 50, &[("server", 1), ("timeout", 2)]);
    let second = c.collect(&targets, t(30)).await;
    let p = &second.providers["ns/p"];
    assert_eq!(p.successes, 30 + 10);
    assert_eq!(p.errors["capacity"], 4);
    assert_eq!(p.errors["timeout"], 2);
    assert_eq!(p.errors["request"], 3);
    assert_eq!(
        p.provider_errors,
        4 + 2,
        "request errors are not the provider's"
    );
    assert_eq!(second.scraped[&b.url()], ReplicaState::Continued);

    // Nothing happened: an all-zero window.
    let third = c.collect(&targets, t(60)).await;
    assert_eq!(third.providers["ns/p"].successes, 0);
    assert_eq!(third.providers["ns/p"].provider_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_changed_started_at_counts_new_counters_as_the_delta() {
    let a = FakeRouter::start("router-a", EARLY).await;
    a.set("ns/p", 1000, &[("overload", 50)]);
    let targets = vec![a.url()];
    let mut c = Collector::new();
    c.collect(&targets, t(0)).await;

    // The pod restarted during the window and has served 7 since.
    a.restart("2026-11-30T12:00:10Z");
    a.set("ns/p", 7, &[("overload", 1)]);
    let after = c.collect(&targets, t(30)).await;
    assert_eq!(after.scraped[&a.url()], ReplicaState::Reset);
    assert_eq!(after.providers["ns/p"].successes, 7);
    assert_eq!(after.providers["ns/p"].provider_errors, 1);

    // And counting continues from the new baseline.
    a.set("ns/p", 10, &[("overload", 1)]);
    let next = c.collect(&targets, t(60)).await;
    assert_eq!(next.scraped[&a.url()], ReplicaState::Continued);
    assert_eq!(next.providers["ns/p"].successes, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_counter_going_down_is_a_reset_even_with_the_same_start() {
    let a = FakeRouter::start("router-a", EARLY).await;
    a.set("ns/p", 500, &[]);
    let targets = vec![a.url()];
    let mut c = Collector::new();
    c.collect(&targets, t(0)).await;
    a.set("ns/p", 20, &[]);
    let after = c.collect(&targets, t(30)).await;
    assert_eq!(after.scraped[&a.url()], ReplicaState::Reset);
    assert_eq!(after.providers["ns/p"].successes, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_replica_started_within_the_window_counts_everything() {
    let a = FakeRouter::start("router-a", EARLY).await;
    let mut c = Collector::new();
    c.collect(&[a.url()], t(0)).await;
    // A scale-up: a new pod that started after the previous tick.
    let b = FakeRouter::start("router-b", "2026-11-30T12:00:05Z").await;
    b.set("ns/p", 12, &[("capacity", 2)]);
    // And a pod first seen now that has been running since before the previous tick.
    let old = FakeRouter::start("router-old", EARLY).await;
    old.set("ns/p", 9999, &[]);
    let after = c.collect(&[a.url(), b.url(), old.url()], t(30)).await;
    assert_eq!(after.scraped[&b.url()], ReplicaState::Started);
    assert_eq!(after.scraped[&old.url()], ReplicaState::Baseline);
    assert_eq!(after.providers["ns/p"].successes, 12);
    assert_eq!(after.providers["ns/p"].provider_errors, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_unreachable_replica_is_skipped_reported_and_caught_up_later() {
    let a = FakeRouter::start("router-a", EARLY).await;
    let b = FakeRouter::start("router-b", EARLY).await;
    let (a_url, b_url) = (a.url(), b.url());
    a.set("ns/p", 100, &[]);
    b.set("ns/p", 100, &[]);
    let targets = vec![a_url.clone(), b_url.clone()];
    let mut c = Collector::new();
    c.collect(&targets, t(0)).await;

    // b stops answering for one interval.
    b.set_down(true);
    a.set("ns/p", 110, &[]);
    b.set("ns/p", 130, &[]);
    let during = c.collect(&targets, t(30)).await;
    assert!(during.unreachable.contains_key(&b_url), "{during:?}");
    assert!(!during.scraped.contains_key(&b_url));
    assert_eq!(during.providers["ns/p"].successes, 10, "a alone");

    // b is back with the same process: its delta covers both windows, nothing is lost.
    b.set_down(false);
    b.set("ns/p", 160, &[]);
    let after = c.collect(&targets, t(60)).await;
    assert_eq!(after.scraped[&b_url], ReplicaState::Continued);
    assert!(after.unreachable.is_empty());
    assert_eq!(
        after.providers["ns/p"].successes, 60,
        "b's 60 since its last good scrape"
    );

    // A replica that accepts no connections at all is skipped the same way.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let with_closed = vec![a_url.clone(), closed_url.clone()];
    let last = c.collect(&with_closed, t(90)).await;
    assert!(last.unreachable.contains_key(&closed_url));
    assert!(last.scraped.contains_key(&a_url));
}

#[test]
fn endpoint_urls_keep_ready_endpoints_of_the_named_port() {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "router-x"},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
            {"addresses": ["10.0.0.1"]},
            {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
        ],
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8080}],
    }))
    .unwrap();
    let v6: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "router-y"},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["fd00::5"]}],
        "ports": [{"name": "http", "port": 8080}],
    }))
    .unwrap();
    assert_eq!(
        endpoint_urls(&[slice.clone(), v6], Some("http")),
        [
            "http://10.0.0.1:8080",
            "http://10.0.0.2:8080",
            "http://[fd00::5]:8080"
        ]
    );
    assert_eq!(
        endpoint_urls(&[slice], None),
        ["http://10.0.0.1:9090", "http://10.0.0.2:9090"],
        "without a port name, the slice's first port"
    );
}
