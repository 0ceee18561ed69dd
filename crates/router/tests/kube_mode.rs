//! Kubernetes mode against a fake API server at the HTTP level (`kube_support`): weights from
//! status, hot policy changes, fail-static, three replicas (field case 30), fail-open health
//! by modality, and `/outcomes`.
//!
//! Every test takes [`serial`] first: the machine is small and shared, and several routers
//! with their reflectors in parallel would make the seconds-scale waits about CPU, not logic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kube_support;

use std::time::Duration;

use kube_support::*;
use serde_json::{Value, json};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

const RESYNC: Duration = Duration::from_secs(60);

fn now_minus(secs: i64) -> String {
    (chrono::Utc::now() - chrono::Duration::seconds(secs))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

async fn policy_weights(router: &switchyard_router::kube_source::KubeRouter) -> Vec<(String, f64)> {
    let doc = status(router).await;
    doc["policies"][0]["status"]["providers"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default().to_owned(),
                        p["weight"].as_f64().unwrap_or(-1.0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_no_status_then_status_weights_cascade_then_operator_weights() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let mocks = Mocks::start(&api, &["p-a", "p-b"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    let endpoint = api.endpoint().await;
    let router = router(&endpoint, RESYNC).await;

    // No status: availability 1 everywhere, cascade weights [1, 0].
    assert_eq!(
        policy_weights(&router).await,
        vec![("p-a".to_owned(), 1.0), ("p-b".to_owned(), 0.0)]
    );
    let served = spread(&router, "nostatus", 20).await;
    assert_eq!(served.get("p-a"), Some(&20), "{served:?}");
    assert_eq!(mocks.calls("p-b"), 0);
    let doc = status(&router).await;
    assert!(doc["revision"].as_str().is_some_and(|r| r.len() == 16));
    assert_eq!(doc["providers"][0]["status"]["availability"], json!(1.0));

    // The operator writes availability and weights: the router uses them as they are.
    api.set_status(
        "llmproviders",
        "p-a",
        json!({"availability": 0.3, "observedGeneration": 1}),
    );
    api.set_status(
        "routingpolicies",
        "r1",
        json!({"observedGeneration": 1, "lastUpdateTime": now_minus(0), "providers": [
            {"name": "p-a", "availability": 0.3, "weight": 0.3, "eligible": true},
            {"name": "p-b", "availability": 1.0, "weight": 0.7, "eligible": true}]}),
    );
    eventually(Duration::from_secs(5), "status weights applied", || async {
        policy_weights(&router).await == vec![("p-a".to_owned(), 0.3), ("p-b".to_owned(), 0.7)]
    })
    .await;
    let doc = status(&router).await;
    assert_eq!(doc["providers"][0]["status"]["availability"], json!(0.3));
    let served = spread(&router, "withstatus", 200).await;
    let a = *served.get("p-a").unwrap_or(&0) as f64 / 200.0;
    // Binomial(200, 0.3): sd ≈ 0.032; ±0.12 is beyond 3.5 sd.
    assert!((0.18..=0.42).contains(&a), "p-a share {a} from {served:?}");

    // Status for an older generation of the policy is not trusted: a new order serves at
    // once with cascade weights over the operator's availabilities (p-b 1 → [1, 0]).
    api.apply("routingpolicies", "r1", policy(&["p-b", "p-a"]));
    eventually(
        Duration::from_secs(5),
        "new order with cascade weights",
        || async {
            policy_weights(&router).await == vec![("p-b".to_owned(), 1.0), ("p-a".to_owned(), 0.0)]
        },
    )
    .await;
    router.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_policy_priority_change_applies_without_restart() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let mocks = Mocks::start(&api, &["p-a", "p-b"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    let endpoint = api.endpoint().await;
    let router = router(&endpoint, RESYNC).await;
    assert_eq!(
        chat(&router, "proj-1", false).await,
        (200, Some("p-a".to_owned()))
    );
    let revision = router.revision();

    api.apply("routingpolicies", "r1", policy(&["p-b", "p-a"]));
    eventually(
        Duration::from_secs(3),
        "new first provider serves",
        || async { chat(&router, "proj-1", false).await == (200, Some("p-b".to_owned())) },
    )
    .await;
    assert_ne!(
        router.revision(),
        revision,
        "the revision moves with the spec"
    );
    let before = mocks.calls("p-a");
    let served = spread(&router, "after", 20).await;
    assert_eq!(served.get("p-b"), Some(&20), "{served:?}");
    assert_eq!(mocks.calls("p-a"), before);
    router.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_api_server_away_keeps_last_config_and_reports_staleness() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let _mocks = Mocks::start(&api, &["p-a", "p-b"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    let endpoint = api.endpoint().await;
    let router = router(&endpoint, RESYNC).await;
    assert_eq!(
        metric(&router, "switchyard_config_stale_seconds").await,
        Some(0.0)
    );
    let revision = router.revision();

    api.set_down(true);
    eventually(Duration::from_secs(5), "staleness shows", || async {
        metric(&router, "switchyard_config_stale_seconds")
            .await
            .is_some_and(|s| s >= 1.0)
    })
    .await;
    assert_eq!(
        metric(
            &router,
            "switchyard_kube_watch_healthy{resource=\"RoutingPolicy\"}"
        )
        .await,
        Some(0.0)
    );
    // Fail-static: the last configuration keeps serving, and /status says why.
    for i in 0..5 {
        assert_eq!(
            chat(&router, &format!("down-{i}"), false).await,
            (200, Some("p-a".to_owned()))
        );
    }
    assert_eq!(router.revision(), revision);
    let doc = status(&router).await;
    let messages = doc["messages"].to_string();
    assert!(messages.contains("failing"), "{messages}");
    // A change made while the API server is away reaches the router when it returns.
    api.apply("routingpolicies", "r1", policy(&["p-b", "p-a"]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        chat(&router, "down-x", false).await.1.as_deref(),
        Some("p-a")
    );

    api.set_down(false);
    eventually(Duration::from_secs(10), "changes flow again", || async {
        chat(&router, "back-1", false).await == (200, Some("p-b".to_owned()))
    })
    .await;
    eventually(Duration::from_secs(5), "staleness clears", || async {
        metric(&router, "switchyard_config_stale_seconds").await == Some(0.0)
    })
    .await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    eventually(
        Duration::from_secs(5),
        "a later change flows too",
        || async { chat(&router, "back-2", false).await == (200, Some("p-a".to_owned())) },
    )
    .await;
    router.stop().await.unwrap();
}

/// Field case 30: three replicas; add a provider, remove one, and one replica whose watch
/// events are lost converges by the periodic re-list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_three_replicas_converge_case_30() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let mut mocks = Mocks::start(&api, &["p-o", "p-x"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-o", "p-x"]));
    let endpoints = [
        api.endpoint().await,
        api.endpoint().await,
        api.endpoint().await,
    ];
    let resync = Duration::from_secs(3);
    let mut routers = Vec::new();
    for e in &endpoints {
        routers.push(router(e, resync).await);
    }
    for r in &routers {
        assert_eq!(spread(r, "start", 10).await.get("p-o"), Some(&10));
    }

    // Add P-N; the operator's weights for the new generation give it a share.
    let handle = start_mock("p-n").await;
    declare(&api, "p-n", &handle);
    mocks.handles.insert("p-n".to_owned(), handle);
    api.apply("routingpolicies", "r1", policy(&["p-o", "p-x", "p-n"]));
    api.set_status(
        "routingpolicies",
        "r1",
        json!({"observedGeneration": 2, "providers": [
            {"name": "p-o", "availability": 1.0, "weight": 0.5, "eligible": true},
            {"name": "p-x", "availability": 1.0, "weight": 0.0, "eligible": true},
            {"name": "p-n", "availability": 1.0, "weight": 0.5, "eligible": true}]}),
    );
    let started = tokio::time::Instant::now();
    for (i, r) in routers.iter().enumerate() {
        eventually(Duration::from_secs(10), "replica routes to p-n", || async {
            spread(r, &format!("add-{i}-{}", started.elapsed().as_millis()), 30)
                .await
                .get("p-n")
                .is_some_and(|n| *n > 0)
        })
        .await;
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let revisions: Vec<_> = routers.iter().map(|r| r.revision()).collect();
    assert!(revisions[0].is_some());
    assert!(
        revisions.iter().all(|r| *r == revisions[0]),
        "{revisions:?}"
    );

    // Lose replica 3's notifications, then remove P-O.
    endpoints[2].drop_events(true);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lists_before = endpoints[2].lists();
    api.apply("routingpolicies", "r1", policy(&["p-x", "p-n"]));
    let changed_at = tokio::time::Instant::now();
    for r in &routers[..2] {
        eventually(Duration::from_secs(10), "replica drops p-o", || async {
            r.revision() != revisions[0]
        })
        .await;
    }
    // Replica 3 converges only through a re-list, within one resync period.
    eventually(
        resync + Duration::from_secs(3),
        "replica 3 converges",
        || async { routers[2].revision() == routers[0].revision() },
    )
    .await;
    assert!(changed_at.elapsed() < Duration::from_secs(60));
    assert!(
        endpoints[2].lists() > lists_before,
        "convergence came with a re-list"
    );
    let p_o_before = mocks.calls("p-o");
    for (i, r) in routers.iter().enumerate() {
        let served = spread(r, &format!("removed-{i}"), 30).await;
        assert!(!served.contains_key("p-o"), "{served:?}");
    }
    assert_eq!(mocks.calls("p-o"), p_o_before, "no new request reached P-O");
    for r in routers {
        r.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_health_from_status_fail_open_and_per_modality() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let _mocks = Mocks::start(&api, &["p-a", "p-b"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    let endpoint = api.endpoint().await;
    let router = router(&endpoint, RESYNC).await;
    let audio_goes_to = |p: &'static str| {
        let router = &router;
        move || async move { chat(router, "proj-h", true).await == (200, Some(p.to_owned())) }
    };
    assert_eq!(
        chat(&router, "proj-h", true).await,
        (200, Some("p-a".to_owned()))
    );

    // Unknown, and Unhealthy without a probe time: never block.
    api.set_status(
        "llmproviders",
        "p-a",
        json!({"health": [
            {"modality": "text", "state": "Unknown", "lastProbeTime": now_minus(1)},
            {"modality": "audio", "state": "Unhealthy"}]}),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        chat(&router, "proj-h", true).await.1.as_deref(),
        Some("p-a")
    );
    assert_eq!(
        chat(&router, "proj-h", false).await.1.as_deref(),
        Some("p-a")
    );

    // Stale Unhealthy (older than 3 × 10 s): does not block.
    api.set_status(
        "llmproviders",
        "p-a",
        json!({"health": [{"modality": "audio", "state": "Unhealthy", "lastProbeTime": now_minus(40)}]}),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        chat(&router, "proj-h", true).await.1.as_deref(),
        Some("p-a")
    );

    // Fresh Unhealthy for audio: audio moves to p-b, text stays on p-a.
    api.set_status(
        "llmproviders",
        "p-a",
        json!({"health": [
            {"modality": "text", "state": "Healthy", "lastProbeTime": now_minus(1)},
            {"modality": "audio", "state": "Unhealthy", "lastProbeTime": now_minus(25)}]}),
    );
    eventually(
        Duration::from_secs(3),
        "audio avoids p-a",
        audio_goes_to("p-b"),
    )
    .await;
    for i in 0..5 {
        assert_eq!(
            chat(&router, &format!("text-{i}"), false).await,
            (200, Some("p-a".to_owned()))
        );
    }
    // The verdict goes stale five seconds later without any new event: traffic returns.
    eventually(
        Duration::from_secs(9),
        "stale verdict stops blocking",
        audio_goes_to("p-a"),
    )
    .await;
    router.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_outcomes_counters_match_mock_calls() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let mocks = Mocks::start(&api, &["p-a", "p-b"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    let endpoint = api.endpoint().await;
    let router = router(&endpoint, RESYNC).await;
    for i in 0..7 {
        assert_eq!(chat(&router, &format!("o-{i}"), false).await.0, 200);
    }
    let url = format!("http://{}/outcomes", router.addr);
    let first: switchyard_api::outcomes::OutcomeReport =
        reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert!(!first.replica.is_empty());
    let a = &first.providers["team-a/p-a"];
    assert_eq!(a.successes, mocks.calls("p-a") as u64);
    assert_eq!(a.successes, 7);
    assert_eq!(a.in_flight, 0);
    assert!(a.errors.values().all(|n| *n == 0));
    assert_eq!(first.providers["team-a/p-b"].successes, 0);
    assert_eq!(mocks.calls("p-b"), 0);

    // A second scrape: same start time (no reset), counters only grew.
    assert_eq!(chat(&router, "o-more", false).await.0, 200);
    let second: switchyard_api::outcomes::OutcomeReport =
        reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(second.started_at, first.started_at);
    assert_eq!(second.replica, first.replica);
    assert_eq!(second.providers["team-a/p-a"].successes, 8);
    assert_eq!(mocks.calls("p-a"), 8);
    router.stop().await.unwrap();
}

/// Field case 29 on the router side: an object the loader rejects keeps its last accepted
/// version (or is skipped when it never had one) and says why; other objects keep flowing.
/// Also: Secrets come from the reflector, and a rotated Secret rebuilds the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_invalid_object_keeps_last_good_and_secret_rotation_applies() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let mocks = Mocks::start(&api, &["p-a", "p-b"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a", "p-b"]));
    let endpoint = api.endpoint().await;
    let router = router(&endpoint, RESYNC).await;
    assert_eq!(
        chat(&router, "k-1", false).await,
        (200, Some("p-a".to_owned()))
    );

    // p-a's new spec breaks the schema (a fake API server lets it through; a real one runs
    // the same CEL and schema, but the router must not trust that): generation 1 serves on.
    let mut broken = provider("p-a", &mocks.handles["p-a"].base_url());
    broken["spec"]["endpoint"] = json!("not a url");
    api.apply("llmproviders", "p-a", broken);
    // A provider that never was valid is skipped.
    let mut never = provider("p-c", "http://127.0.0.1:9");
    never["spec"]["models"] = json!([]);
    api.apply("llmproviders", "p-c", never);
    eventually(Duration::from_secs(5), "rejection reported", || async {
        status(&router).await["messages"]
            .to_string()
            .contains("LLMProvider team-a/p-a rejected")
    })
    .await;
    let messages = status(&router).await["messages"].to_string();
    assert!(
        messages.contains("last accepted version (generation 1)"),
        "{messages}"
    );
    assert!(
        messages.contains("LLMProvider team-a/p-c rejected"),
        "{messages}"
    );
    assert!(messages.contains("skipped"), "{messages}");
    assert_eq!(
        chat(&router, "k-2", false).await,
        (200, Some("p-a".to_owned()))
    );

    // Another object's change flows despite the rejected one.
    api.apply("routingpolicies", "r1", policy(&["p-b", "p-a"]));
    eventually(Duration::from_secs(5), "policy change flows", || async {
        chat(&router, "k-3", false).await == (200, Some("p-b".to_owned()))
    })
    .await;

    // Rotate p-b's key to one its upstream refuses: requests fail over to p-a (401 is an
    // auth error, retried elsewhere); rotate back and p-b serves again.
    api.apply("secrets", "p-b-key", secret("apiKey", "sk-wrong"));
    eventually(Duration::from_secs(5), "wrong key fails over", || async {
        chat(&router, "k-4", false).await == (200, Some("p-a".to_owned()))
    })
    .await;
    api.apply("secrets", "p-b-key", secret("apiKey", "sk-p-b"));
    // A fresh project each try: a project that failed over is pinned to where it landed.
    let tries = std::sync::atomic::AtomicUsize::new(0);
    eventually(Duration::from_secs(5), "rotated key serves", || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        chat(&router, &format!("k-5-{n}"), false).await == (200, Some("p-b".to_owned()))
    })
    .await;
    assert!(mocks.calls("p-b") > 0);
    router.stop().await.unwrap();
}

/// TenantQuota API keys come from Secrets through the reflector, and a rotated key replaces
/// the old one. Authentication never depends on whether a TenantQuota exists (issue 12 item
/// 5): with none, before the first and after the last is deleted, a request without a key
/// gets 401; `/status` and the metric say keys are required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_tenant_keys_from_secrets_authenticate() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let _mocks = Mocks::start(&api, &["p-a"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a"]));
    let endpoint = api.endpoint().await;
    let router = router_with(&endpoint, options(RESYNC)).await;
    let send = |key: Option<&'static str>| {
        let addr = router.addr;
        async move {
            let mut request = reqwest::Client::new()
                .post(format!("http://{addr}/v1/chat/completions"))
                .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}));
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            request.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(
        send(None).await,
        401,
        "no TenantQuota: keys are still required"
    );
    assert_eq!(send(Some("sk-anything")).await, 401);
    let status: Value = reqwest::get(format!("http://{}/status", router.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["authentication"]["anonymousAllowed"], json!(false));
    let metrics = reqwest::get(format!("http://{}/metrics", router.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("switchyard_anonymous_access_allowed 0"),
        "{metrics}"
    );

    api.apply("secrets", "t1-keys", secret("main", "sk-tenant-1"));
    api.apply(
        "tenantquotas",
        "t1",
        json!({"spec": {"apiKeys": [{"name": "main", "secretRef": {"name": "t1-keys", "key": "main"}}]}}),
    );
    eventually(Duration::from_secs(5), "tenant key accepted", || async {
        send(Some("sk-tenant-1")).await == 200
    })
    .await;
    assert_eq!(send(None).await, 401);
    assert_eq!(send(Some("sk-other")).await, 401);

    api.apply("secrets", "t1-keys", secret("main", "sk-tenant-2"));
    eventually(Duration::from_secs(5), "rotated key accepted", || async {
        send(Some("sk-tenant-2")).await == 200
    })
    .await;
    assert_eq!(send(Some("sk-tenant-1")).await, 401);

    // Deleting the last TenantQuota must not open the router.
    api.delete("tenantquotas", "t1");
    eventually(
        Duration::from_secs(5),
        "deleted tenant's key refused",
        || async { send(Some("sk-tenant-2")).await == 401 },
    )
    .await;
    assert_eq!(
        send(None).await,
        401,
        "last TenantQuota deleted: still closed"
    );
    router.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_all_namespaces_lists_cluster_wide_paths() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let _mocks = Mocks::start(&api, &["p-a"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a"]));
    let endpoint = api.endpoint().await;
    let mut o = options(RESYNC);
    o.namespace = None;
    o.serve.allow_anonymous = true;
    let router = router_with(&endpoint, o).await;
    assert_eq!(
        chat(&router, "all-1", false).await,
        (200, Some("p-a".to_owned()))
    );
    let requests = api.requests();
    assert!(
        requests
            .iter()
            .any(|r| r == "GET /apis/switchyard.dev/v1alpha1/llmproviders"),
        "{requests:?}"
    );
    assert!(
        requests.iter().any(|r| r == "GET /api/v1/secrets"),
        "{requests:?}"
    );
    assert!(
        !requests.iter().any(|r| r.contains("/namespaces/")),
        "{requests:?}"
    );
    router.stop().await.unwrap();
}

/// Objects as the verdict takes them.
fn decode<K: serde::de::DeserializeOwned>(v: Vec<Value>) -> Vec<std::sync::Arc<K>> {
    v.into_iter()
        .map(|o| std::sync::Arc::new(serde_json::from_value(o).unwrap()))
        .collect()
}

/// One chat request with `Authorization: Bearer <key>`; the HTTP status.
async fn chat_with_key(router: &switchyard_router::kube_source::KubeRouter, key: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", router.addr))
        .header("authorization", format!("Bearer {key}"))
        .json(
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 8}),
        )
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Issue 12 item 9 on the router side: a TenantQuota whose only allowed route is rejected
/// (and never had an accepted version) is left out, so its key gets 401; the router says why,
/// naming the rejected route, and the verdict the operator writes into status (the same
/// function, on the same objects) calls it rejected too, never `Ready=True`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_router_leaves_out_dependents_of_a_rejected_route_as_the_operator_reports() {
    let _guard = serial().await;
    let api = FakeApi::new();
    let _mocks = Mocks::start(&api, &["p-a"]).await;
    api.apply("routingpolicies", "r1", policy(&["p-a"]));
    let mut bad = policy(&["p-a"]);
    bad["spec"]["model"] = json!("other-model");
    bad["spec"]["deadline"] = json!("soon");
    api.apply("routingpolicies", "r-bad", bad);
    api.apply(
        "secrets",
        "tenant-keys",
        json!({"type": "Opaque", "data": {
            "good": base64(b"sk-tenant-good"), "orphan": base64(b"sk-tenant-orphan")}}),
    );
    let tenant = |route: &str, key: &str| {
        json!({"spec": {"allowedRoutes": [route],
            "apiKeys": [{"name": key, "secretRef": {"name": "tenant-keys", "key": key}}]}})
    };
    api.apply("tenantquotas", "t-good", tenant("r1", "good"));
    api.apply("tenantquotas", "t-orphan", tenant("r-bad", "orphan"));
    let endpoint = api.endpoint().await;
    let router = router_with(&endpoint, options(RESYNC)).await;

    assert_eq!(chat_with_key(&router, "sk-tenant-good").await, 200);
    assert_eq!(chat_with_key(&router, "sk-tenant-orphan").await, 401);
    let messages = status(&router).await["messages"].to_string();
    assert!(
        messages.contains(
            "TenantQuota team-a/t-orphan rejected: spec.allowedRoutes[0]: RoutingPolicy \
             team-a/r-bad is rejected and not served: spec.deadline"
        ),
        "{messages}"
    );

    // The operator's verdict on the same objects, read back from the API server.
    let client = endpoint.client();
    let list = |plural: &'static str| {
        let client = client.clone();
        async move {
            let api: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
                client,
                NS,
                &kube::core::ApiResource {
                    group: "switchyard.dev".into(),
                    version: "v1alpha1".into(),
                    api_version: "switchyard.dev/v1alpha1".into(),
                    kind: String::new(),
                    plural: plural.into(),
                },
            );
            api.list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|o| serde_json::to_value(o).unwrap())
                .collect::<Vec<Value>>()
        }
    };
    let world = switchyard_api::verdict::World {
        providers: decode(list("llmproviders").await),
        policies: decode(list("routingpolicies").await),
        tenants: decode(list("tenantquotas").await),
        secrets: {
            let mut s = switchyard_api::verdict::SecretIndex::default();
            s.set_access(switchyard_api::verdict::SecretAccess::Synced);
            s.insert(NS, "p-a-key", [("apiKey".to_owned(), true)]);
            s.insert(
                NS,
                "tenant-keys",
                [("good".to_owned(), true), ("orphan".to_owned(), true)],
            );
            s
        },
    };
    let verdicts = switchyard_api::verdict::Judge::default()
        .judge(&world)
        .verdicts;
    assert!(verdicts.rejected("TenantQuota", NS, "t-orphan"));
    assert_eq!(
        verdicts.problems("TenantQuota", NS, "t-orphan")[0].reason,
        "DanglingReference"
    );
    assert!(verdicts.problems("TenantQuota", NS, "t-good").is_empty());
    assert!(verdicts.rejected("RoutingPolicy", NS, "r-bad"));
    router.stop().await.unwrap();
}
