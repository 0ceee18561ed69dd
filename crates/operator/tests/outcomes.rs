//! Outcome collection against fake router replicas serving `GET /outcomes` on loopback:
//! deltas between scrapes, resets (changed `startedAt`, counters going down), replicas that
//! start mid-window, unreachable replicas, and EndpointSlice address extraction.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use support::FakeRouter;
use switchyard_api::provider::ReplicaCounted;
use switchyard_operator::outcomes::{Checkpoints, Collector, ReplicaState, endpoint_urls};

fn none() -> Checkpoints {
    Checkpoints::new()
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

    let first = c.collect(&targets, &none()).await;
    assert_eq!(
        first.providers["ns/p"].successes, 140,
        "never counted (no checkpoint): everything since the start"
    );
    assert_eq!(first.scraped[&a.url()], ReplicaState::Started);

    a.set("ns/p", 130, &[("capacity", 9), ("request", 3)]);
    b.set("ns/p", 50, &[("server", 1), ("timeout", 2)]);
    let second = c.collect(&targets, &none()).await;
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
    let third = c.collect(&targets, &none()).await;
    assert_eq!(third.providers["ns/p"].successes, 0);
    assert_eq!(third.providers["ns/p"].provider_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_changed_started_at_counts_new_counters_as_the_delta() {
    let a = FakeRouter::start("router-a", EARLY).await;
    a.set("ns/p", 1000, &[("overload", 50)]);
    let targets = vec![a.url()];
    let mut c = Collector::new();
    c.collect(&targets, &none()).await;

    // The pod restarted during the window and has served 7 since.
    a.restart("2026-11-30T12:00:10Z");
    a.set("ns/p", 7, &[("overload", 1)]);
    let after = c.collect(&targets, &none()).await;
    assert_eq!(after.scraped[&a.url()], ReplicaState::Reset);
    assert_eq!(after.providers["ns/p"].successes, 7);
    assert_eq!(after.providers["ns/p"].provider_errors, 1);

    // And counting continues from the new baseline.
    a.set("ns/p", 10, &[("overload", 1)]);
    let next = c.collect(&targets, &none()).await;
    assert_eq!(next.scraped[&a.url()], ReplicaState::Continued);
    assert_eq!(next.providers["ns/p"].successes, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_counter_going_down_is_a_reset_even_with_the_same_start() {
    let a = FakeRouter::start("router-a", EARLY).await;
    a.set("ns/p", 500, &[]);
    let targets = vec![a.url()];
    let mut c = Collector::new();
    c.collect(&targets, &none()).await;
    a.set("ns/p", 20, &[]);
    let after = c.collect(&targets, &none()).await;
    assert_eq!(after.scraped[&a.url()], ReplicaState::Reset);
    assert_eq!(after.providers["ns/p"].successes, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_first_sight_resumes_from_the_checkpoint_in_status() {
    // What a previous leader (or this operator before a restart) counted, as status holds it.
    let a = FakeRouter::start("router-a", EARLY).await;
    a.set("ns/p", 130, &[("capacity", 9), ("request", 3)]);
    let b = FakeRouter::start("router-b", "2026-11-30T12:00:05Z").await;
    b.set("ns/p", 12, &[("capacity", 2)]);
    let restarted = FakeRouter::start("router-r", "2026-11-30T12:00:07Z").await;
    restarted.set("ns/p", 4, &[]);
    let mut checkpoints = Checkpoints::new();
    let mut entry = |replica: &str, started: &str, successes: u64, errors: &[(&str, u64)]| {
        checkpoints
            .entry("ns/p".to_owned())
            .or_default()
            .entry(replica.to_owned())
            .or_default()
            .push(ReplicaCounted {
                replica: replica.to_owned(),
                started_at: started.to_owned(),
                successes,
                errors: errors.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect(),
                cancelled: 0,
                slow: 0,
            });
    };
    entry("router-a", EARLY, 100, &[("capacity", 5)]);
    // router-r's checkpoint is of its previous process.
    entry("router-r", EARLY, 900, &[]);
    let mut c = Collector::new();
    let got = c
        .collect(&[a.url(), b.url(), restarted.url()], &checkpoints)
        .await;
    assert_eq!(got.scraped[&a.url()], ReplicaState::Resumed);
    assert_eq!(got.scraped[&b.url()], ReplicaState::Started);
    assert_eq!(got.scraped[&restarted.url()], ReplicaState::Reset);
    let p = &got.providers["ns/p"];
    assert_eq!(p.successes, 30 + 12 + 4);
    assert_eq!(p.errors["capacity"], 4 + 2);
    assert_eq!(p.errors["request"], 3);
    assert_eq!(p.provider_errors, 6);

    // The checkpoint to write back: every replica's counters, sorted by name.
    let counted = c.counted("ns/p");
    let names: Vec<_> = counted.iter().map(|c| c.replica.as_str()).collect();
    assert_eq!(names, ["router-a", "router-b", "router-r"]);
    assert_eq!(counted[0].successes, 130);
    assert_eq!(counted[0].errors["capacity"], 9);
    assert_eq!(counted[0].started_at, EARLY);
    assert_eq!(counted[1].started_at, "2026-11-30T12:00:05Z");

    // A second collector resuming from that checkpoint counts nothing twice.
    let again: Checkpoints = [(
        "ns/p".to_owned(),
        counted
            .into_iter()
            .map(|c| (c.replica.clone(), vec![c]))
            .collect(),
    )]
    .into();
    a.set("ns/p", 131, &[("capacity", 9), ("request", 3)]);
    let mut successor = Collector::new();
    let next = successor
        .collect(&[a.url(), b.url(), restarted.url()], &again)
        .await;
    assert_eq!(next.providers["ns/p"].successes, 1);
    assert_eq!(next.providers["ns/p"].provider_errors, 0);
    assert!(next.scraped.values().all(|s| *s == ReplicaState::Resumed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_two_processes_with_one_name_resume_from_their_own_checkpoints() {
    // Routers outside a cluster on one host report the host name: the start time tells them apart.
    let a = FakeRouter::start("host-1", EARLY).await;
    let b = FakeRouter::start("host-1", "2026-11-30T11:30:00Z").await;
    a.set("ns/p", 10, &[]);
    b.set("ns/p", 20, &[]);
    let mut first = Collector::new();
    first.collect(&[a.url(), b.url()], &none()).await;
    let counted = first.counted("ns/p");
    assert_eq!(counted.len(), 2, "{counted:?}");
    let checkpoints: Checkpoints =
        [("ns/p".to_owned(), [("host-1".to_owned(), counted)].into())].into();
    a.set("ns/p", 11, &[]);
    b.set("ns/p", 23, &[]);
    let next = Collector::new()
        .collect(&[a.url(), b.url()], &checkpoints)
        .await;
    assert_eq!(next.providers["ns/p"].successes, 1 + 3);
    assert!(next.scraped.values().all(|s| *s == ReplicaState::Resumed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_checkpoint_above_the_counters_is_a_restart() {
    let a = FakeRouter::start("router-a", EARLY).await;
    a.set("ns/p", 20, &[]);
    let checkpoints: Checkpoints = [(
        "ns/p".to_owned(),
        [(
            "router-a".to_owned(),
            vec![ReplicaCounted {
                replica: "router-a".to_owned(),
                started_at: EARLY.to_owned(),
                successes: 50,
                ..ReplicaCounted::default()
            }],
        )]
        .into(),
    )]
    .into();
    let got = Collector::new().collect(&[a.url()], &checkpoints).await;
    assert_eq!(got.scraped[&a.url()], ReplicaState::Reset);
    assert_eq!(got.providers["ns/p"].successes, 20);
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
    c.collect(&targets, &none()).await;

    // b stops answering for one interval.
    b.set_down(true);
    a.set("ns/p", 110, &[]);
    b.set("ns/p", 130, &[]);
    let during = c.collect(&targets, &none()).await;
    assert!(during.unreachable.contains_key(&b_url), "{during:?}");
    assert!(!during.scraped.contains_key(&b_url));
    assert_eq!(during.providers["ns/p"].successes, 10, "a alone");

    // b is back with the same process: its delta covers both windows, nothing is lost.
    b.set_down(false);
    b.set("ns/p", 160, &[]);
    let after = c.collect(&targets, &none()).await;
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
    let last = c.collect(&with_closed, &none()).await;
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
