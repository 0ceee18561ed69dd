//! The running operator (kube-runtime controllers, watches, triggers) against the fake API
//! server: field case 29 (one broken reference blocks nobody and says why), leadership gained
//! at run time, and the health/metrics listener.

// Test code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use switchyard_operator::operator::system_clock;
use switchyard_operator::{Leadership, Options, Settings, Targets};
use tokio::sync::watch;

const MODELS: [&str; 5] = ["m1", "m2", "m3", "m4", "m5"];

fn provider_all_models(name: &str, secret: &str) -> Value {
    let mut p = provider(name, "m1", Some(secret));
    p["spec"]["models"] = json!(
        MODELS
            .iter()
            .map(|m| json!({"name": m}))
            .collect::<Vec<_>>()
    );
    p
}

fn policy_path(name: &str) -> String {
    format!("/apis/switchyard.dev/v1alpha1/namespaces/{NS}/routingpolicies/{name}")
}

struct Running {
    health: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

async fn start(fake: &FakeApi, leadership: Leadership) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = listener.local_addr().unwrap();
    let options = Options {
        namespace: Some(NS.into()),
        targets: Targets::Static(vec![]),
        lease: None,
        identity: "operator-test".into(),
        listen: health,
        // No control ticks during these tests: only the controllers write.
        interval: Some(Duration::from_secs(3600)),
        probes: false,
    };
    let settings = Settings {
        targets: options.targets.clone(),
        leadership,
        identity: options.identity.clone(),
        clock: system_clock(),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let client = fake.client();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop_rx.await;
        };
        switchyard_operator::run_with(client, options, settings, listener, shutdown)
            .await
            .unwrap();
    });
    Running {
        health,
        stop: Some(stop_tx),
        task,
    }
}

fn ready_at(obj: &Value, generation: i64) -> bool {
    condition(obj, "Ready")
        .is_some_and(|c| c["status"] == "True" && c["observedGeneration"] == generation)
        && obj["status"]["observedGeneration"] == generation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case29_one_missing_secret_marks_only_its_policy_and_later_edits_still_apply() {
    let fake = FakeApi::start().await;
    for i in 1..=5 {
        fake.put(secret(&format!("creds-{i}"), &["api-key"]));
        fake.put(provider_all_models(&format!("p{i}"), &format!("creds-{i}")));
        fake.put(policy(&format!("r{i}"), MODELS[i - 1], &[&format!("p{i}")]));
    }
    // A provider whose Secret does not exist; nothing uses it yet.
    fake.put(provider_all_models("p-x", "missing-creds"));
    let _op = start(&fake, Leadership::fixed(true)).await;

    for i in 1..=5 {
        fake.wait_for(
            &policy_path(&format!("r{i}")),
            Duration::from_secs(10),
            |o| ready_at(o, 1),
        )
        .await;
    }

    // r1 now references the provider with the missing Secret.
    fake.put(policy("r1", "m1", &["p-x"]));
    let r1 = fake
        .wait_for(&policy_path("r1"), Duration::from_secs(5), |o| {
            o["status"]["observedGeneration"] == 2
        })
        .await;
    let ready = condition(&r1, "Ready").unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "SecretNotFound");
    assert_eq!(ready["observedGeneration"], 2);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("Secret \"missing-creds\" not found"),
        "{message}"
    );
    assert!(message.contains("LLMProvider \"p-x\""), "{message}");
    assert_eq!(r1["status"]["providers"][0]["eligible"], false);

    // Then r3's priority order changes; it is processed although r1 stays broken.
    fake.put(policy("r3", "m3", &["p4", "p3"]));
    let r3 = fake
        .wait_for(&policy_path("r3"), Duration::from_secs(10), |o| {
            ready_at(o, 2)
        })
        .await;
    let names: Vec<&str> = r3["status"]["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p4", "p3"]);
    assert_eq!(r3["status"]["providers"][0]["weight"], json!(1.0));

    for name in ["r2", "r4", "r5"] {
        let obj = fake.get(&policy_path(name)).unwrap();
        assert!(ready_at(&obj, 1), "{name}: {}", obj["status"]);
    }

    // Creating the Secret heals r1 without touching it (the Secret index triggers a resync).
    fake.put(secret("missing-creds", &["api-key"]));
    fake.wait_for(&policy_path("r1"), Duration::from_secs(10), |o| {
        ready_at(o, 2)
    })
    .await;
}

fn provider_path(name: &str) -> String {
    format!("/apis/switchyard.dev/v1alpha1/namespaces/{NS}/llmproviders/{name}")
}

/// Issue 12 item 9: with the Secret list refused by RBAC the operator does not claim the
/// Secrets are missing; it says the Secret API cannot be read and names the permission. Once
/// the permission is granted the same objects turn Ready without being touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_secret_list_is_secrets_forbidden_not_secret_not_found() {
    let fake = FakeApi::start().await;
    fake.forbid(&format!("/api/v1/namespaces/{NS}/secrets"), true);
    fake.put(secret("creds-1", &["api-key"]));
    fake.put(provider_all_models("p1", "creds-1"));
    fake.put(policy("r1", "m1", &["p1"]));
    let _op = start(&fake, Leadership::fixed(true)).await;

    let p1 = fake
        .wait_for(&provider_path("p1"), Duration::from_secs(10), |o| {
            condition(o, "Ready").is_some()
        })
        .await;
    let ready = condition(&p1, "Ready").unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "SecretsForbidden");
    let message = ready["message"].as_str().unwrap();
    assert!(message.contains("get/list/watch on secrets"), "{message}");
    assert!(message.contains("403"), "{message}");
    assert!(!message.contains("not found"), "{message}");
    let r1 = fake
        .wait_for(&policy_path("r1"), Duration::from_secs(10), |o| {
            condition(o, "Ready").is_some()
        })
        .await;
    assert_eq!(
        condition(&r1, "Ready").unwrap()["reason"],
        "SecretsForbidden"
    );

    fake.forbid(&format!("/api/v1/namespaces/{NS}/secrets"), false);
    fake.wait_for(&provider_path("p1"), Duration::from_secs(20), |o| {
        ready_at(o, 1)
    })
    .await;
    fake.wait_for(&policy_path("r1"), Duration::from_secs(20), |o| {
        ready_at(o, 1)
    })
    .await;
}

/// Until the Secret list completes nothing is written: no object is ever reported with a
/// Secret "not found" from an empty cache (the Secret list answers 1.5 s late here; the
/// providers' list at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_status_before_the_secret_cache_has_listed() {
    let fake = FakeApi::start().await;
    fake.slow_list(
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Duration::from_millis(1500),
    );
    fake.put(secret("creds-1", &["api-key"]));
    fake.put(provider_all_models("p1", "creds-1"));
    let _op = start(&fake, Leadership::fixed(true)).await;
    let p1 = fake
        .wait_for(&provider_path("p1"), Duration::from_secs(10), |o| {
            ready_at(o, 1)
        })
        .await;
    assert_eq!(condition(&p1, "Ready").unwrap()["reason"], "Reconciled");
    // Every status patch of p1 says Ready=True: none was written from an unfilled cache.
    for patch in fake.status_patches(&provider_path("p1")) {
        let body = patch.body.unwrap();
        let conditions = body["status"]["conditions"].as_array().unwrap();
        let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "True", "{ready}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_writes_nothing_until_it_becomes_leader() {
    let _ = tracing_subscriber::fmt().with_env_filter("warn").try_init();
    let fake = FakeApi::start().await;
    fake.put(secret("creds-1", &["api-key"]));
    fake.put(provider_all_models("p1", "creds-1"));
    fake.put(policy("r1", "m1", &["p1"]));
    let (tx, rx) = watch::channel(false);
    let op = start(&fake, Leadership::from_channel(rx)).await;

    // Caches sync (readyz) while writing nothing.
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = http
            .get(format!("http://{}/readyz", op.health))
            .send()
            .await;
        if r.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        fake.writes().is_empty(),
        "a follower wrote: {:?}",
        fake.writes()
    );
    let metrics = http
        .get(format!("http://{}/metrics", op.health))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("switchyard_operator_leader 0"),
        "{metrics}"
    );
    assert!(metrics.contains("skipped_not_leader"), "{metrics}");

    tx.send(true).unwrap();
    fake.wait_for(&policy_path("r1"), Duration::from_secs(10), |o| {
        ready_at(o, 1)
    })
    .await;
    let healthz = http
        .get(format!("http://{}/healthz", op.health))
        .send()
        .await
        .unwrap();
    assert!(healthz.status().is_success());
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Elected {
    metrics: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Elected {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A full `run` with leader election on Lease `team-a/switchyard-operator`.
fn start_elected(fake: &FakeApi, identity: &str) -> Elected {
    let metrics = free_addr();
    let options = Options {
        namespace: Some(NS.into()),
        targets: Targets::Static(vec![]),
        lease: Some(switchyard_operator::LeaseOptions {
            namespace: NS.into(),
            name: "switchyard-operator".into(),
        }),
        identity: identity.into(),
        listen: metrics,
        interval: Some(Duration::from_secs(3600)),
        probes: false,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let client = fake.client();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop_rx.await;
        };
        switchyard_operator::run(client, options, shutdown)
            .await
            .unwrap();
    });
    Elected {
        metrics,
        stop: Some(stop_tx),
        task,
    }
}

async fn metrics_of(addr: SocketAddr) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(r) = reqwest::get(format!("http://{addr}/metrics")).await {
            return r.text().await.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no metrics on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn written(metrics: &str) -> bool {
    metrics
        .lines()
        .any(|l| l.contains("result=\"written\"") && !l.trim_end().ends_with(" 0"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_writer_and_the_other_takes_over_after_shutdown() {
    let fake = FakeApi::start().await;
    fake.put(secret("creds-1", &["api-key"]));
    fake.put(provider_all_models("p1", "creds-1"));
    fake.put(policy("r1", "m1", &["p1"]));
    let lease = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/switchyard-operator");

    let mut a = start_elected(&fake, "op-a");
    fake.wait_for(&lease, Duration::from_secs(10), |l| {
        l["spec"]["holderIdentity"] == "op-a"
    })
    .await;
    fake.wait_for(&policy_path("r1"), Duration::from_secs(10), |o| {
        ready_at(o, 1)
    })
    .await;
    let b = start_elected(&fake, "op-b");
    // b syncs its caches, but the Lease is a's: b writes nothing, a keeps it.
    let b_metrics = metrics_of(b.metrics).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b_metrics = format!("{b_metrics}{}", metrics_of(b.metrics).await);
    assert!(
        b_metrics.contains("switchyard_operator_leader 0"),
        "{b_metrics}"
    );
    assert!(!written(&b_metrics), "{b_metrics}");
    assert!(written(&metrics_of(a.metrics).await));
    assert_eq!(fake.get(&lease).unwrap()["spec"]["holderIdentity"], "op-a");

    // a shuts down and releases the Lease; b takes it once the old term would have expired
    // (it sleeps until then) and processes the next change.
    let _ = a.stop.take().unwrap().send(());
    tokio::time::timeout(Duration::from_secs(10), &mut a.task)
        .await
        .expect("a stops on shutdown")
        .unwrap();
    let released = fake.get(&lease).unwrap();
    assert!(
        released["spec"]["holderIdentity"].is_null()
            || released["spec"]["holderIdentity"] == "op-b",
        "a released the Lease on shutdown: {released}"
    );
    let lease_secs = switchyard_operator::leader::LEASE_DURATION_SECS;
    fake.wait_for(&lease, Duration::from_secs(lease_secs + 10), |l| {
        l["spec"]["holderIdentity"] == "op-b"
    })
    .await;
    fake.put(policy("r1", "m1", &["p1", "p-none"]));
    let r1 = fake
        .wait_for(&policy_path("r1"), Duration::from_secs(10), |o| {
            o["status"]["observedGeneration"] == 2
        })
        .await;
    assert_eq!(
        condition(&r1, "Ready").unwrap()["reason"],
        "DanglingReference"
    );
    let b_metrics = metrics_of(b.metrics).await;
    assert!(
        b_metrics.contains("switchyard_operator_leader 1"),
        "{b_metrics}"
    );
    assert!(written(&b_metrics), "{b_metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_main_with_a_kubeconfig_file_writes_status() {
    let fake = FakeApi::start().await;
    fake.put(provider_all_models("p1", "creds-1"));
    fake.put(policy("r1", "m1", &["p1"]));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig.yaml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{}\"}}\nusers:\n- name: nobody\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: nobody, namespace: {NS}}}\ncurrent-context: fake\n",
            fake.addr
        ),
    )
    .unwrap();
    let args = switchyard_operator::cli::OperatorArgs {
        namespace: None,
        all_namespaces: false,
        router_service: "switchyard-router".into(),
        router_namespace: None,
        router_port_name: "http".into(),
        router_addresses: vec!["http://127.0.0.1:9".into()],
        lease_name: "switchyard-operator".into(),
        lease_namespace: None,
        no_leader_election: true,
        identity: "cli-test".into(),
        metrics_listen: free_addr(),
        kubeconfig: Some(kubeconfig),
        interval: Some(Duration::from_secs(3600)),
        no_probes: true,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(switchyard_operator::cli::main(args, async move {
        let _ = stop_rx.await;
    }));
    // The namespace comes from the kubeconfig context; the missing Secret is reported.
    let p1 = fake
        .wait_for(
            &format!("/apis/switchyard.dev/v1alpha1/namespaces/{NS}/llmproviders/p1"),
            Duration::from_secs(10),
            |o| condition(o, "Ready").is_some(),
        )
        .await;
    assert_eq!(condition(&p1, "Ready").unwrap()["reason"], "SecretNotFound");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the operator stops on shutdown")
        .unwrap()
        .unwrap();
}
