//! Reconcile and control-tick tests against a mocked API server at the HTTP level: every
//! request the operator makes is recorded and asserted (method, path, query, body).
//!
//! The operator's caches are filled by the test (as its watches would be), the clock is fixed,
//! and the routers are fake `/outcomes` endpoints, so each tick is deterministic.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::sync::Arc;

use chrono::{DateTime, Duration as ChronoDuration, TimeZone, Utc};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use support::*;
use switchyard_api::{LLMProvider, RoutingPolicy, TenantQuota};
use switchyard_core::availability::{AvailabilityController, ControllerConfig, WindowCounts};
use switchyard_core::weights::cascade_weights;
use switchyard_operator::operator::Clock;
use switchyard_operator::status::round;
use switchyard_operator::{Leadership, Operator, Settings, Stores, Synced, Targets};
use tokio::sync::watch;

struct Harness {
    fake: FakeApi,
    op: Operator,
    providers: Writer<LLMProvider>,
    policies: Writer<RoutingPolicy>,
    tenants: Writer<TenantQuota>,
    paths: Vec<String>,
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

fn fixed_clock(at: Arc<std::sync::Mutex<DateTime<Utc>>>) -> Clock {
    Arc::new(move || *at.lock().unwrap())
}

impl Harness {
    async fn new(
        targets: Targets,
        leadership: Leadership,
    ) -> (Harness, Arc<std::sync::Mutex<DateTime<Utc>>>) {
        let fake = FakeApi::start().await;
        let (ps, providers) = reflector::store::<LLMProvider>();
        let (rs, policies) = reflector::store::<RoutingPolicy>();
        let (ts, tenants) = reflector::store::<TenantQuota>();
        let now = Arc::new(std::sync::Mutex::new(t0()));
        let op = Operator::new(
            fake.client(),
            Stores {
                providers: ps,
                policies: rs,
                tenants: ts,
            },
            Settings {
                targets,
                leadership,
                identity: "operator-0".into(),
                clock: fixed_clock(now.clone()),
            },
        );
        // The Secret cache has listed (nothing yet): `add` fills it as Secrets are put.
        op.update_secrets(|s| s.set_access(switchyard_operator::validate::SecretAccess::Synced));
        (
            Harness {
                fake,
                op,
                providers,
                policies,
                tenants,
                paths: Vec::new(),
            },
            now,
        )
    }

    /// Puts an object into the fake API server and the operator's cache.
    fn add(&mut self, value: Value) {
        let path = object_path(&value);
        let kind = value["kind"].as_str().unwrap().to_owned();
        self.fake.put(value);
        if kind == "Secret" {
            let v = self.fake.get(&path).unwrap();
            let keys: Vec<String> = v["data"].as_object().unwrap().keys().cloned().collect();
            let name = v["metadata"]["name"].as_str().unwrap().to_owned();
            self.op.update_secrets(|s| {
                s.set_access(switchyard_operator::validate::SecretAccess::Synced);
                s.insert(NS, &name, keys.into_iter().map(|k| (k, true)))
            });
            return;
        }
        if !self.paths.contains(&path) {
            self.paths.push(path.clone());
        }
        self.echo_one(&path);
    }

    fn echo_one(&mut self, path: &str) {
        let v = self.fake.get(path).unwrap();
        match v["kind"].as_str().unwrap() {
            "LLMProvider" => self
                .providers
                .apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(v).unwrap())),
            "RoutingPolicy" => self
                .policies
                .apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(v).unwrap())),
            "TenantQuota" => self
                .tenants
                .apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(v).unwrap())),
            other => panic!("unexpected kind {other}"),
        }
    }

    /// Feeds the stored objects (with the statuses the operator wrote) back into the caches,
    /// as the watches would.
    fn echo(&mut self) {
        for path in self.paths.clone() {
            self.echo_one(&path);
        }
    }
}

fn provider_path(name: &str) -> String {
    format!("/apis/switchyard.dev/v1alpha1/namespaces/{NS}/llmproviders/{name}")
}

fn policy_path(name: &str) -> String {
    format!("/apis/switchyard.dev/v1alpha1/namespaces/{NS}/routingpolicies/{name}")
}

fn tenant_path(name: &str) -> String {
    format!("/apis/switchyard.dev/v1alpha1/namespaces/{NS}/tenantquotas/{name}")
}

fn last_status(fake: &FakeApi, path: &str) -> Value {
    let patches = fake.status_patches(path);
    let last = patches
        .last()
        .unwrap_or_else(|| panic!("no status patch for {path}"));
    last.body.clone().unwrap()["status"].clone()
}

fn cond<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

async fn two_provider_setup(targets: Targets) -> (Harness, Arc<std::sync::Mutex<DateTime<Utc>>>) {
    let (mut h, now) = Harness::new(targets, Leadership::fixed(true)).await;
    h.add(secret("creds-a", &["api-key"]));
    h.add(secret("creds-b", &["api-key"]));
    h.add(provider("p-a", "chat-model", Some("creds-a")));
    h.add(provider("p-b", "chat-model", Some("creds-b")));
    h.add(policy("chat", "chat-model", &["p-a", "p-b"]));
    (h, now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tick_with_outcomes_patches_availability_weights_conditions_and_generation() {
    let router = FakeRouter::start("router-0", "2026-11-30T11:00:00Z").await;
    let (mut h, now) = two_provider_setup(Targets::Static(vec![router.url()])).await;

    // Tick 1: a replica no checkpoint covers was never counted: everything it served since
    // its start goes into the first window (nothing is lost before the first scrape).
    router.set("team-a/p-a", 500, &[]);
    router.set("team-a/p-b", 500, &[]);
    let report = h.op.tick().await;
    assert!(report.ran);
    assert_eq!(report.collected.scraped.len(), 1);
    assert_eq!(report.collected.providers["team-a/p-a"].successes, 500);
    assert_eq!(report.collected.providers["team-a/p-b"].successes, 500);
    let writes = h.fake.writes();
    assert_eq!(writes.len(), 3, "one status patch per object: {writes:?}");
    for w in &writes {
        assert_eq!(w.method, "PATCH");
        assert!(w.path.ends_with("/status"), "{}", w.path);
        assert!(
            w.query.contains("fieldManager=switchyard-operator"),
            "{}",
            w.query
        );
        assert!(w.query.contains("force=true"), "{}", w.query);
        let body = w.body.as_ref().unwrap();
        assert_eq!(body["apiVersion"], "switchyard.dev/v1alpha1");
    }
    let mut expected_a = AvailabilityController::new(ControllerConfig::default());
    let first = expected_a.step(WindowCounts {
        successes: 500,
        provider_errors: 0,
    });
    let pa = last_status(&h.fake, &provider_path("p-a"));
    assert_eq!(pa["availability"], json!(round(first.availability)));
    assert_eq!(
        pa["lastWindow"],
        json!({"successes": 500, "errors": 0, "score": round(first.score)})
    );
    // How far router-0 was counted, written with the window it fed.
    assert_eq!(
        pa["counted"],
        json!([{"replica": "router-0", "startedAt": "2026-11-30T11:00:00Z",
            "successes": 500, "cancelled": 0}])
    );
    assert_eq!(pa["observedGeneration"], 1);
    assert_eq!(cond(&pa, "Ready")["status"], "True");
    assert_eq!(cond(&pa, "Ready")["reason"], "Reconciled");
    assert_eq!(cond(&pa, "Ready")["observedGeneration"], 1);
    assert_eq!(cond(&pa, "Degraded")["status"], "False");
    assert_eq!(pa["lastUpdateTime"], json!("2026-11-30T12:00:00Z"));
    let chat = last_status(&h.fake, &policy_path("chat"));
    assert_eq!(
        chat["providers"],
        json!([
            {"name": "p-a", "availability": 1.0, "weight": 1.0, "eligible": true},
            {"name": "p-b", "availability": 1.0, "weight": 0.0, "eligible": true},
        ])
    );
    assert_eq!(cond(&chat, "Ready")["message"], "2 of 2 providers eligible");
    h.echo();
    h.fake.clear_log();

    // Tick 2: p-a failed every attempt with 429s in the window, p-b served everything.
    *now.lock().unwrap() = t0() + ChronoDuration::seconds(30);
    router.set("team-a/p-a", 500, &[("capacity", 100), ("request", 7)]);
    router.set("team-a/p-b", 600, &[]);
    let report = h.op.tick().await;
    let window = &report.collected.providers["team-a/p-a"];
    assert_eq!(
        (window.successes, window.provider_errors),
        (0, 100),
        "request errors do not count"
    );
    assert_eq!(report.collected.providers["team-a/p-b"].successes, 100);

    let step = expected_a.step(WindowCounts {
        successes: 0,
        provider_errors: 100,
    });
    let a = round(step.availability);
    assert!(a < 1.0);
    let pa = last_status(&h.fake, &provider_path("p-a"));
    assert_eq!(pa["availability"], json!(a));
    assert_eq!(
        pa["lastWindow"],
        json!({"successes": 0, "errors": 100, "score": round(step.score)})
    );
    assert_eq!(pa["lastUpdateTime"], json!("2026-11-30T12:00:30Z"));
    let weights = cascade_weights(&[a, 1.0]);
    let chat = last_status(&h.fake, &policy_path("chat"));
    assert_eq!(chat["providers"][0]["availability"], json!(a));
    assert_eq!(chat["providers"][0]["weight"], json!(round(weights[0])));
    assert_eq!(chat["providers"][1]["weight"], json!(round(weights[1])));
    assert_eq!(chat["observedGeneration"], 1);
    // Ready did not flip, so its transition time stays at the first write.
    assert_eq!(
        cond(&pa, "Ready")["lastTransitionTime"],
        "2026-11-30T12:00:00Z"
    );
    h.echo();
    h.fake.clear_log();

    // Tick 3: p-a keeps failing, falls below the Degraded threshold: condition + Warning Event.
    *now.lock().unwrap() = t0() + ChronoDuration::seconds(60);
    router.set("team-a/p-a", 500, &[("capacity", 200), ("request", 7)]);
    h.op.tick().await;
    let low = expected_a.step(WindowCounts {
        successes: 0,
        provider_errors: 100,
    });
    assert!(low.availability < 0.5, "test premise: {low:?}");
    let pa = last_status(&h.fake, &provider_path("p-a"));
    assert_eq!(pa["availability"], json!(round(low.availability)));
    let degraded = cond(&pa, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "LowAvailability");
    assert_eq!(degraded["lastTransitionTime"], "2026-11-30T12:01:00Z");
    let events: Vec<_> = h
        .fake
        .writes()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(events.len(), 1, "one Event for the flip: {events:?}");
    assert_eq!(
        events[0].path,
        format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")
    );
    let event = events[0].body.as_ref().unwrap();
    assert_eq!(event["reason"], "LowAvailability");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["name"], "p-a");
    assert_eq!(event["reportingController"], "switchyard-operator");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tick_without_changes_writes_nothing() {
    let router = FakeRouter::start("router-0", "2026-11-30T11:00:00Z").await;
    let (mut h, now) = two_provider_setup(Targets::Static(vec![router.url()])).await;
    h.op.tick().await;
    assert_eq!(h.fake.writes().len(), 3);
    h.echo();
    h.fake.clear_log();
    // Another idle interval: only lastUpdateTime would move.
    *now.lock().unwrap() = t0() + ChronoDuration::seconds(30);
    let report = h.op.tick().await;
    assert!(report.ran);
    assert_eq!(report.written, 0);
    assert!(
        h.fake.log().is_empty(),
        "no request at all: {:?}",
        h.fake.log()
    );
    // A direct sync of each object agrees.
    for p in h.op.stores().providers.state() {
        assert_eq!(h.op.sync_provider(&p).await.unwrap(), Synced::Unchanged);
    }
    for p in h.op.stores().policies.state() {
        assert_eq!(h.op.sync_policy(&p).await.unwrap(), Synced::Unchanged);
    }
    assert!(h.fake.log().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_leader_sends_no_request() {
    let router = FakeRouter::start("router-0", "2026-11-30T11:00:00Z").await;
    let (mut h, _) = Harness::new(
        Targets::Static(vec![router.url()]),
        Leadership::fixed(false),
    )
    .await;
    h.add(secret("creds-a", &["api-key"]));
    h.add(provider("p-a", "chat-model", Some("creds-a")));
    h.add(policy("chat", "chat-model", &["p-a"]));
    let report = h.op.tick().await;
    assert!(!report.ran);
    for p in h.op.stores().providers.state() {
        assert_eq!(h.op.sync_provider(&p).await.unwrap(), Synced::NotLeader);
    }
    for p in h.op.stores().policies.state() {
        assert_eq!(h.op.sync_policy(&p).await.unwrap(), Synced::NotLeader);
    }
    assert!(h.fake.log().is_empty(), "{:?}", h.fake.log());
    assert!(h.op.metrics.encode().contains("skipped_not_leader"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_gained_then_tick_writes() {
    let router = FakeRouter::start("router-0", "2026-11-30T11:00:00Z").await;
    let (tx, rx) = watch::channel(false);
    let (mut h, _) = Harness::new(
        Targets::Static(vec![router.url()]),
        Leadership::from_channel(rx),
    )
    .await;
    h.add(provider("p-a", "chat-model", None));
    h.add(policy("chat", "chat-model", &["p-a"]));
    assert!(!h.op.tick().await.ran);
    assert!(h.fake.log().is_empty());
    tx.send(true).unwrap();
    let report = h.op.tick().await;
    assert!(report.ran);
    assert_eq!(report.written, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_references_give_specific_reasons_naming_the_missing_object() {
    let (mut h, _) = Harness::new(Targets::Static(vec![]), Leadership::fixed(true)).await;
    h.add(secret("creds-a", &["other-key"]));
    h.add(provider("p-a", "chat-model", Some("creds-a")));
    h.add(provider("p-b", "chat-model", Some("nowhere")));
    h.add(policy("dangling", "m-1", &["p-ghost"]));
    h.add(policy("wrong-model", "m-2", &["p-a"]));
    h.add(json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "TenantQuota",
        "metadata": {"name": "orphan", "namespace": NS},
        "spec": {"parent": "no-such-parent", "allowedRoutes": ["no-such-route"]},
    }));
    h.add(json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "TenantQuota",
        "metadata": {"name": "loop-a", "namespace": NS},
        "spec": {"parent": "loop-b"},
    }));
    h.add(json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "TenantQuota",
        "metadata": {"name": "loop-b", "namespace": NS},
        "spec": {"parent": "loop-a"},
    }));
    for p in h.op.stores().providers.state() {
        h.op.sync_provider(&p).await.unwrap();
    }
    for p in h.op.stores().policies.state() {
        h.op.sync_policy(&p).await.unwrap();
    }
    for t in h.op.stores().tenants.state() {
        h.op.sync_tenant(&t).await.unwrap();
    }

    let pa = last_status(&h.fake, &provider_path("p-a"));
    let ready = cond(&pa, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "SecretNotFound");
    assert!(ready["message"].as_str().unwrap().contains("\"creds-a\""));
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("no key \"api-key\"")
    );
    let pb = last_status(&h.fake, &provider_path("p-b"));
    assert_eq!(cond(&pb, "Ready")["reason"], "SecretNotFound");
    assert!(
        cond(&pb, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("Secret \"nowhere\" not found")
    );

    let dangling = last_status(&h.fake, &policy_path("dangling"));
    assert_eq!(cond(&dangling, "Ready")["reason"], "DanglingReference");
    assert!(
        cond(&dangling, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("\"p-ghost\"")
    );
    assert_eq!(dangling["providers"][0]["eligible"], false);
    assert_eq!(dangling["providers"][0]["weight"], json!(0.0));

    let wrong = last_status(&h.fake, &policy_path("wrong-model"));
    assert_eq!(cond(&wrong, "Ready")["status"], "False");
    assert!(
        cond(&wrong, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("does not serve model \"m-2\"")
    );

    let orphan = last_status(&h.fake, &tenant_path("orphan"));
    assert_eq!(cond(&orphan, "Ready")["reason"], "DanglingReference");
    let msg = cond(&orphan, "Ready")["message"].as_str().unwrap();
    assert!(
        msg.contains("no-such-parent") && msg.contains("no-such-route"),
        "{msg}"
    );
    // The tenant patch carries what the operator owns: conditions and the fleet's counts
    // (zero here: no router reported anything; no usage, no checkpoints).
    let body = h
        .fake
        .status_patches(&tenant_path("orphan"))
        .pop()
        .unwrap()
        .body
        .unwrap();
    let keys: Vec<&String> = body["status"].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["conditions", "observedGeneration", "rejected", "throttled"]
    );
    let loop_a = last_status(&h.fake, &tenant_path("loop-a"));
    assert_eq!(cond(&loop_a, "Ready")["reason"], "InvalidSpec");
    assert!(
        cond(&loop_a, "Ready")["message"]
            .as_str()
            .unwrap()
            .contains("parent cycle")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_targets_are_found_through_endpoint_slices_and_dead_replicas_reported() {
    let live = FakeRouter::start("router-live", "2026-11-30T11:00:00Z").await;
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let (mut h, _) = Harness::new(
        Targets::Service {
            namespace: NS.into(),
            name: "switchyard-router".into(),
            port_name: Some("http".into()),
        },
        Leadership::fixed(true),
    )
    .await;
    h.add(provider("p-a", "chat-model", None));
    // One slice per port: the live replica, and one that accepts no connections.
    h.fake.put(endpoint_slice(
        "switchyard-router",
        &["127.0.0.1"],
        live.addr.port(),
    ));
    let mut dead_slice = endpoint_slice("switchyard-router", &["127.0.0.1"], dead_port);
    dead_slice["metadata"]["name"] = json!("switchyard-router-dead");
    h.fake.put(dead_slice);
    h.fake.put({
        let mut other = endpoint_slice("another-service", &["127.0.0.9"], 80);
        other["metadata"]["name"] = json!("another");
        other
    });
    let report = h.op.tick().await;
    let lists: Vec<_> = h
        .fake
        .log()
        .into_iter()
        .filter(|r| r.path.ends_with("/endpointslices"))
        .collect();
    assert_eq!(lists.len(), 1);
    assert_eq!(
        lists[0].path,
        format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices")
    );
    assert!(
        lists[0]
            .query
            .contains("labelSelector=kubernetes.io%2Fservice-name%3Dswitchyard-router"),
        "{}",
        lists[0].query
    );
    assert_eq!(
        report.collected.scraped.keys().cloned().collect::<Vec<_>>(),
        [live.url()]
    );
    assert_eq!(
        report
            .collected
            .unreachable
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        [format!("http://127.0.0.1:{dead_port}")]
    );
    let metrics = h.op.metrics.encode();
    assert!(metrics.contains(&format!("switchyard_operator_scrape_failures_total{{replica=\"http://127.0.0.1:{dead_port}\"}} 1")), "{metrics}");
    assert!(
        metrics.contains("switchyard_operator_router_replicas{state=\"unreachable\"} 1"),
        "{metrics}"
    );
    // The provider's status is still written: one dead replica blocks nothing.
    assert_eq!(h.fake.status_patches(&provider_path("p-a")).len(), 1);
}
