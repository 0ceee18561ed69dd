//! Routing end to end: client API basics, sticky chains, spread by weights, and the
//! availability controller seen through `/status` (issue 4 "Must show"; field case 22).
//!
//! Weights follow DESIGN §4.2: with every provider healthy the cascade gives weight 1 to the
//! first, so spread is tested on weights the controller computed after the first provider
//! failed (read from `/status`), not on an assumed split.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    KEY, PROJECT_HEADER, Policy, Provider, Setup, Stack, WeightEntry, availability_of, chat_body,
    histogram, messages_body, policy_weights, send, serial,
};
use serde_json::{Value, json};
use switchyard_mock::{Fault, FaultRule, FaultSet, Trigger};
use tokio::time::Instant;

const MODEL: &str = "e2e-chat";
/// Breakers out of the way: these tests watch the availability controller, not the breaker.
const NO_BREAKER: &str = "circuitBreaker: {consecutiveFailures: 1000}";

fn three_providers(interval: &str) -> Setup {
    Setup::new()
        .provider(Provider::openai("p1").with(NO_BREAKER))
        .provider(Provider::openai("p2").with(NO_BREAKER))
        .provider(Provider::openai("p3").with(NO_BREAKER))
        .policy(
            Policy::chat(MODEL, &["p1", "p2", "p3"])
                .set("availability", &format!("{{interval: {interval}}}")),
        )
}

/// Every decision header is present and well formed.
fn assert_decision_headers(r: &common::Reply, what: &str) {
    assert!(
        r.header("x-request-id").is_some_and(|v| !v.is_empty()),
        "{what}: no x-request-id in {:?}",
        r.headers
    );
    assert!(
        r.header("x-switchyard-attempts").is_some(),
        "{what}: no x-switchyard-attempts in {:?}",
        r.headers
    );
    assert!(
        r.header("x-switchyard-provider").is_some(),
        "{what}: no x-switchyard-provider in {:?}",
        r.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_api_auth_errors_and_headers_use_each_dialect() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p1"))
            .provider(Provider::anthropic("p2").models(&[("e2e-claude", "text")]))
            .policy(Policy::chat(MODEL, &["p1"]))
            .policy(Policy::chat("e2e-claude", &["p2"])),
    )
    .await;

    // Bearer and x-api-key both authenticate.
    let bearer = stack.chat(MODEL, Some("proj")).await;
    assert_eq!(bearer.status, 200, "{}", bearer.body);
    assert_decision_headers(&bearer, "200 chat");
    assert_eq!(bearer.provider().as_deref(), Some("p1"));
    assert_eq!(bearer.attempts(), Some(1));
    assert!(!bearer.text().is_empty(), "{}", bearer.body);
    let xkey = send(
        stack
            .http
            .post(stack.url("/v1/messages"))
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .json(&messages_body("e2e-claude", "hi", false)),
    )
    .await;
    assert_eq!(xkey.status, 200, "{}", xkey.body);
    assert_eq!(xkey.json()["type"], "message", "{}", xkey.body);
    assert_eq!(xkey.provider().as_deref(), Some("p2"));

    // Wrong key: 401 in the client's dialect, no upstream call.
    let before = stack.mock("p1").call_count() + stack.mock("p2").call_count();
    let bad = send(
        stack
            .http
            .post(stack.url("/v1/chat/completions"))
            .bearer_auth("sk-wrong")
            .json(&chat_body(MODEL, "hi", false)),
    )
    .await;
    assert_eq!(bad.status, 401, "{}", bad.body);
    assert!(
        bad.json()["error"]["message"].is_string(),
        "OpenAI error shape: {}",
        bad.body
    );
    assert!(bad.header("x-request-id").is_some(), "{:?}", bad.headers);
    let bad_anthropic = send(
        stack
            .http
            .post(stack.url("/v1/messages"))
            .header("x-api-key", "sk-wrong")
            .json(&messages_body("e2e-claude", "hi", false)),
    )
    .await;
    assert_eq!(bad_anthropic.status, 401, "{}", bad_anthropic.body);
    let v = bad_anthropic.json();
    assert_eq!(v["type"], "error", "Anthropic error shape: {v}");
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    let no_key = send(
        stack
            .http
            .post(stack.url("/v1/chat/completions"))
            .json(&chat_body(MODEL, "hi", false)),
    )
    .await;
    assert_eq!(no_key.status, 401, "{}", no_key.body);
    assert_eq!(
        stack.mock("p1").call_count() + stack.mock("p2").call_count(),
        before,
        "rejected requests reached a provider"
    );

    // Unknown model: 404; bad JSON: 400; both in OpenAI shape with a request id.
    let unknown = stack.chat("no-such-model", None).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(
        unknown.json()["error"]["message"].is_string(),
        "{}",
        unknown.body
    );
    assert!(unknown.header("x-request-id").is_some());
    let bad_json = send(
        stack
            .post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body("{\"model\": "),
    )
    .await;
    assert_eq!(bad_json.status, 400, "{}", bad_json.body);
    assert!(bad_json.json()["error"].is_object(), "{}", bad_json.body);

    // What the providers' own APIs refuse is refused before anything is sent: a chat model on
    // the embeddings endpoint, an empty conversation, an output cap of zero.
    let calls_before = stack.mock("p1").call_count() + stack.mock("p2").call_count();
    let wrong_endpoint = send(
        stack
            .post("/v1/embeddings")
            .json(&serde_json::json!({"model": MODEL, "input": "hi"})),
    )
    .await;
    assert_eq!(wrong_endpoint.status, 400, "{}", wrong_endpoint.body);
    assert_eq!(
        wrong_endpoint.json()["error"]["code"],
        "wrong_endpoint_for_model"
    );
    let mut empty = chat_body(MODEL, "hi", false);
    empty["messages"] = serde_json::json!([]);
    let empty = send(stack.post("/v1/chat/completions").json(&empty)).await;
    assert_eq!(empty.status, 400, "{}", empty.body);
    let mut zero = chat_body(MODEL, "hi", false);
    zero["max_tokens"] = 0.into();
    let zero = send(stack.post("/v1/chat/completions").json(&zero)).await;
    assert_eq!(zero.status, 400, "{}", zero.body);
    let long_project = "p".repeat(300);
    let long = stack.chat(MODEL, Some(long_project.as_str())).await;
    assert_eq!(long.status, 400, "{}", long.body);
    assert_eq!(
        stack.mock("p1").call_count() + stack.mock("p2").call_count(),
        calls_before,
        "refused requests reached a provider"
    );
    // A wrong method gets the client's error shape too; the model list needs a key.
    let wrong_method = send(stack.get("/v1/chat/completions")).await;
    assert_eq!(wrong_method.status, 405, "{}", wrong_method.body);
    assert_eq!(
        wrong_method.json()["error"]["code"],
        "method_not_allowed",
        "{}",
        wrong_method.body
    );
    let models_no_key = send(stack.http.get(stack.url("/v1/models"))).await;
    assert_eq!(models_no_key.status, 401, "{}", models_no_key.body);

    // Models list carries both public names.
    let models = send(stack.get("/v1/models")).await;
    assert_eq!(models.status, 200, "{}", models.body);
    let ids: Vec<String> = models.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(ids.contains(&MODEL.to_owned()), "{ids:?}");
    assert!(ids.contains(&"e2e-claude".to_owned()), "{ids:?}");

    // Status, metrics, health.
    let status = stack.status().await;
    assert!(
        policy_weights(&status, MODEL).is_some(),
        "policy missing from /status: {status}"
    );
    let metrics = stack.metrics().await;
    assert!(
        metrics.contains("# TYPE"),
        "not Prometheus text:\n{metrics}"
    );
    assert!(
        metrics.contains("p1"),
        "no series labelled with provider p1:\n{metrics}"
    );
    let healthz = send(stack.http.get(stack.url("/healthz"))).await;
    assert_eq!(healthz.status, 200);
}

/// Sends one request per fresh project and returns the provider that served it at attempt 1.
async fn first_choice(stack: &Stack, project: &str) -> String {
    let r = stack.chat(MODEL, Some(project)).await;
    assert_eq!(r.status, 200, "{project}: {}", r.body);
    assert_eq!(
        r.attempts(),
        Some(1),
        "{project}: served after a failover: {:?}",
        r.headers
    );
    r.provider().expect("x-switchyard-provider")
}

/// Fails `p1` until `/status` shows its availability below `below`, then heals it and waits
/// until it serves again. Returns the availability trajectory seen.
async fn degrade_p1(stack: &Stack, below: f64) -> Vec<f64> {
    stack
        .mock("p1")
        .set_faults(FaultSet::fail_all(Fault::ServerError { status: 500 }));
    let mut seen = Vec::new();
    let t0 = Instant::now();
    let mut n = 0_u32;
    loop {
        // Fresh projects: their chains start at p1 while it has weight 1.
        for _ in 0..5 {
            n += 1;
            let r = stack.chat(MODEL, Some(&format!("warm-{n}"))).await;
            assert_eq!(r.status, 200, "failover should hide p1's 500s: {}", r.body);
        }
        let a = availability_of(&stack.status().await, "p1").unwrap_or(f64::NAN);
        seen.push(a);
        if a < below {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "p1 availability did not fall below {below} within 20 s of 100% errors: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stack.mock("p1").set_faults(FaultSet::none());
    // A short backoff after the 500s is allowed (DESIGN §4.4); wait until p1 serves again so
    // the measurements after this see the weights, not the pause.
    let t1 = Instant::now();
    loop {
        n += 1;
        let r = stack.chat(MODEL, Some(&format!("warm-{n}"))).await;
        if r.provider().as_deref() == Some("p1") {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(10),
            "p1 served nothing within 10 s of healing; availability {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_100_projects_follow_status_weights() {
    let _g = serial().await;
    let stack = Stack::start(three_providers("2s")).await;
    let trajectory = degrade_p1(&stack, 0.8).await;

    // Measure between two /status snapshots that agree, so the weights did not move meanwhile,
    // and while the weights are spread: the window that ends the outage can drive p1 to its
    // floor (its last errors, and the skips while it was paused), from which it climbs back
    // through spread weights interval by interval.
    let mut attempts = Vec::new();
    for round in 0..16 {
        let before = policy_weights(&stack.status().await, MODEL).expect("weights in /status");
        if before.iter().filter(|w| w.weight > 0.05).count() < 2 {
            attempts.push(format!("round {round}: weights not spread {before:?}"));
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let mut firsts = Vec::new();
        for i in 0..100 {
            firsts.push(first_choice(&stack, &format!("spread-{round}-{i}")).await);
        }
        let after = policy_weights(&stack.status().await, MODEL).expect("weights in /status");
        let moved = before
            .iter()
            .zip(&after)
            .any(|(b, a)| (b.weight - a.weight).abs() > 0.05);
        let counts = histogram(firsts);
        if moved {
            attempts.push(format!(
                "round {round}: weights moved {before:?} -> {after:?}"
            ));
            continue;
        }
        check_spread(&before, &counts, &trajectory);
        return;
    }
    panic!("weights never held still for 100 requests: {attempts:#?}");
}

/// Counts per provider within 3 binomial standard deviations (+1) of `100 · weight`.
fn check_spread(weights: &[WeightEntry], counts: &BTreeMap<String, usize>, trajectory: &[f64]) {
    let total: usize = counts.values().sum();
    let wsum: f64 = weights.iter().map(|w| w.weight).sum();
    assert!(
        (wsum - 1.0).abs() < 1e-6,
        "weights sum to {wsum}: {weights:?}"
    );
    let spread_over = weights.iter().filter(|w| w.weight > 0.05).count();
    assert!(
        spread_over >= 2,
        "degrading p1 (availability trajectory {trajectory:?}) left one provider with all weight: {weights:?}"
    );
    for w in weights {
        let got = counts.get(&w.name).copied().unwrap_or(0) as f64;
        let n = total as f64;
        let expect = n * w.weight;
        let sd = (n * w.weight * (1.0 - w.weight)).sqrt();
        if w.weight == 0.0 {
            assert_eq!(
                got, 0.0,
                "{} has weight 0 but got {got}: {counts:?}",
                w.name
            );
        } else {
            assert!(
                (got - expect).abs() <= 3.0 * sd + 1.0,
                "{}: {got} of {total} first choices, weight {} expects {expect:.1} ± {:.1}; counts {counts:?}, weights {weights:?}",
                w.name,
                w.weight,
                3.0 * sd + 1.0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_project_keeps_provider_across_10_turns_while_weights_move() {
    let _g = serial().await;
    // A 3 s interval: p1's recovery ramp takes several intervals, so the weights stay mixed
    // (and keep moving) while the conversations run.
    let stack = Stack::start(three_providers("3s")).await;
    degrade_p1(&stack, 0.8).await;
    let weights_at_start = policy_weights(&stack.status().await, MODEL);
    // p1 now recovers, so weights move while the conversations run; pinned chains must not.
    let mut by_project: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut messages: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for turn in 0..10 {
        for p in 0..20 {
            let project = format!("conv-{p}");
            let msgs = messages.entry(project.clone()).or_default();
            msgs.push(json!({"role": "user", "content": format!("turn {turn} of {project}")}));
            let body = json!({"model": MODEL, "messages": msgs});
            let r = stack.chat_body(MODEL, Some(&project), body).await;
            assert_eq!(r.status, 200, "{}", r.body);
            msgs.push(json!({"role": "assistant", "content": r.text()}));
            by_project
                .entry(project)
                .or_default()
                .push(r.provider().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (project, providers) in &by_project {
        assert!(
            providers.iter().all(|p| p == &providers[0]),
            "{project} changed provider: {providers:?}"
        );
    }
    let distinct = histogram(by_project.values().map(|v| v[0].clone()));
    assert!(
        distinct.len() >= 2,
        "all 20 projects on one provider; stickiness shown only trivially: {distinct:?}; weights at start {weights_at_start:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_availability_and_weights_follow_mock_error_rate() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p1").with(NO_BREAKER))
            .provider(Provider::openai("p2").with(NO_BREAKER))
            .policy(Policy::chat(MODEL, &["p1", "p2"]).with("availability: {interval: 1s}")),
    )
    .await;
    let status = stack.status().await;
    assert_eq!(availability_of(&status, "p1"), Some(1.0), "{status}");
    let w = policy_weights(&status, MODEL).unwrap();
    assert_eq!(
        w.iter().map(|w| w.weight).collect::<Vec<_>>(),
        vec![1.0, 0.0],
        "healthy cascade: {w:?}"
    );

    // Half of p1's answers fail: availability and p1's weight fall, p2's weight rises.
    stack.mock("p1").set_faults(FaultSet::error_rate(
        0.5,
        Fault::ServerError { status: 500 },
        7,
    ));
    let mut n = 0_u32;
    let mut down = Vec::new();
    let t0 = Instant::now();
    loop {
        let (a, w) = traffic_then_status(&stack, &mut n, "p2").await;
        down.push((a, w));
        if a < 0.6 && w > 0.4 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "availability/weights did not move on 50% errors; (a1, w2) seen: {down:?}"
        );
    }

    // Errors stop: availability climbs back and p1 takes the traffic again.
    stack.mock("p1").set_faults(FaultSet::none());
    let mut up = Vec::new();
    let t0 = Instant::now();
    loop {
        let (a, w) = traffic_then_status(&stack, &mut n, "p1").await;
        up.push((a, w));
        if a > 0.9 && w > 0.9 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "availability did not recover within 20 s of clean traffic; (a1, w1) seen: {up:?}"
        );
    }
}

/// Ten requests from fresh projects, then p1's availability and `weight_of`'s weight.
async fn traffic_then_status(stack: &Stack, n: &mut u32, weight_of: &str) -> (f64, f64) {
    for _ in 0..10 {
        *n += 1;
        let r = stack.chat(MODEL, Some(&format!("rate-{n}"))).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = stack.status().await;
    let a = availability_of(&s, "p1").unwrap_or_else(|| panic!("no p1 availability: {s}"));
    let w = policy_weights(&s, MODEL)
        .and_then(|ws| ws.into_iter().find(|w| w.name == weight_of))
        .unwrap_or_else(|| panic!("no weight for {weight_of}: {s}"))
        .weight;
    (a, w)
}

/// One conversation turn: appends the user's message, sends, appends the answer.
async fn turn(stack: &Stack, msgs: &mut Vec<Value>, project: &str, n: usize) -> common::Reply {
    msgs.push(json!({"role": "user", "content": format!("turn {n}: please continue the long story about the lighthouse keeper")}));
    let r = stack
        .chat_body(
            MODEL,
            Some(project),
            json!({"model": MODEL, "messages": msgs}),
        )
        .await;
    assert_eq!(r.status, 200, "turn {n}: {}", r.body);
    msgs.push(json!({"role": "assistant", "content": r.text()}));
    r
}

/// Field case 22's gaps (30 s, 30 s, 6 min, 30 s, 12 min, 30 s, 45 min, 30 s, 30 s) scaled
/// by 1/600, with the cache TTL and pin duration scaled alike (1 h → 6 s).
const CASE_22_GAPS_MS: [u64; 9] = [50, 50, 600, 50, 1200, 50, 4500, 50, 50];

fn case_22_setup(p_a_faults: FaultSet) -> Setup {
    Setup::new()
        .provider(Provider::openai("p-a").mock(|m| {
            m.cache_ttl = Duration::from_secs(6);
            m.faults = p_a_faults;
        }))
        .provider(Provider::openai("p-b").mock(|m| m.cache_ttl = Duration::from_secs(6)))
        .policy(Policy::chat(MODEL, &["p-a", "p-b"]).set(
            "affinity",
            &format!("{{header: {PROJECT_HEADER}, pinDuration: 6s}}"),
        ))
}

fn cached_tokens(r: &common::Reply) -> u64 {
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_22_affinity_lasts_as_long_as_the_prompt_cache() {
    let _g = serial().await;
    let stack = Stack::start(case_22_setup(FaultSet::none())).await;
    let mut msgs = Vec::new();
    let mut served = Vec::new();
    for n in 1..=10 {
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(CASE_22_GAPS_MS[n - 2])).await;
        }
        let r = turn(&stack, &mut msgs, "p1", n).await;
        served.push(r.provider().unwrap());
        if n > 1 {
            assert!(
                cached_tokens(&r) > 0,
                "turn {n}: no cache read in the reply: {}",
                r.body
            );
        }
    }
    assert!(
        served.iter().all(|p| p == &served[0]),
        "turns moved: {served:?}"
    );
    let calls = stack.mock(&served[0]).calls();
    assert_eq!(calls.len(), 10);
    for (i, c) in calls.iter().enumerate().skip(1) {
        let cached = c.usage.map_or(0, |u| u.cached_tokens);
        assert!(cached > 0, "turn {}: upstream cache read 0: {c:?}", i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_22_rate_limit_on_turn_6_moves_affinity_without_flip_flop() {
    let _g = serial().await;
    let limited = retry_after_1s().when(Trigger {
        skip: 5,
        next: Some(1),
        ..Trigger::default()
    });
    let stack = Stack::start(case_22_setup(FaultSet::rules([limited]))).await;
    let mut msgs = Vec::new();
    let mut served = Vec::new();
    for n in 1..=10 {
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(CASE_22_GAPS_MS[n - 2])).await;
        }
        let r = turn(&stack, &mut msgs, "p1", n).await;
        served.push((r.provider().unwrap(), r.attempts()));
        if n >= 8 {
            assert!(
                cached_tokens(&r) > 0,
                "turn {n}: no cache read at the new provider: {}",
                r.body
            );
        }
    }
    let providers: Vec<&str> = served.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        providers,
        vec![
            "p-a", "p-a", "p-a", "p-a", "p-a", "p-b", "p-b", "p-b", "p-b", "p-b"
        ],
        "served (provider, attempts): {served:?}"
    );
    assert_eq!(
        served[5].1,
        Some(2),
        "turn 6 failed over within the request: {served:?}"
    );
    // Turn 8 came 4.5 s after p-a's Retry-After of 1 s ended: still no call to p-a.
    assert_eq!(
        stack.mock("p-a").call_count(),
        6,
        "p-a calls: {:?}",
        stack.mock("p-a").calls()
    );
}

/// Sends fresh-project requests until one is served by `want`; panics after `within`.
async fn until_served_by(stack: &Stack, want: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        let r = stack.chat(MODEL, Some(&format!("reload-{i}"))).await;
        if r.status == 200 && r.provider().as_deref() == Some(want) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "not served by {want} within {within:?}; last: {} {:?} {}",
            r.status,
            r.provider(),
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_reloads_manifests_and_keeps_last_good_config_on_invalid_change() {
    let _g = serial().await;
    let setup = |providers: &[&str]| {
        Setup::new()
            .provider(Provider::openai("p1"))
            .provider(Provider::openai("p2"))
            .policy(Policy::chat(MODEL, providers))
    };
    let stack = Stack::start(setup(&["p1"])).await;
    until_served_by(&stack, "p1", Duration::from_secs(1)).await;

    // A valid edit: the policy now lists only p2.
    stack.rewrite_manifests(&setup(&["p2"]));
    until_served_by(&stack, "p2", Duration::from_secs(10)).await;

    // An invalid edit (a reference to a provider that does not exist): reported, and the last
    // good config keeps serving.
    stack.rewrite_manifests(&setup(&["no-such-provider"]));
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..5 {
        let r = stack.chat(MODEL, Some(&format!("after-invalid-{i}"))).await;
        assert_eq!(
            r.status, 200,
            "invalid config replaced the good one: {}",
            r.body
        );
        assert_eq!(r.provider().as_deref(), Some("p2"));
    }
    let status = stack.status().await.to_string();
    assert!(
        status.contains("no-such-provider"),
        "the invalid change is not reported in /status: {status}"
    );
    // Broken YAML as well.
    stack.write_manifest_text("kind: [unclosed\n");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = stack.chat(MODEL, Some("after-broken-yaml")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.provider().as_deref(), Some("p2"));
}

/// A 429 with `Retry-After: 1` and no other rate-limit headers.
fn retry_after_1s() -> FaultRule {
    FaultRule::always(Fault::RateLimited {
        retry_after: Some(1),
        http_date: false,
        retry_after_ms: None,
        reset_requests: None,
        reset_tokens: None,
    })
}

/// Two projects pinned to `p-a` and one brief `Retry-After: 1` on `p-a` (the first streaming
/// request it sees); returns how the first project's next, non-streaming request was served:
/// (provider, attempts, seconds it took).
async fn after_brief_pause_of_the_head(cache_hold: &str) -> (String, Option<u32>, f64) {
    let limited = retry_after_1s().when(Trigger {
        next: Some(1),
        stream: Some(true),
        ..Trigger::default()
    });
    let setup = Setup::new()
        .provider(Provider::openai("p-a").mock(|m| m.faults = FaultSet::rules([limited])))
        .provider(Provider::openai("p-b"))
        .policy(Policy::chat(MODEL, &["p-a", "p-b"]).set(
            "affinity",
            &format!("{{header: {PROJECT_HEADER}, cacheHold: {cache_hold}}}"),
        ));
    let stack = Stack::start(setup).await;
    // With every provider healthy the cascade gives p-a weight 1: every project heads there.
    let holder = "hold-1";
    assert_eq!(first_choice(&stack, holder).await, "p-a");
    let other = "hold-2";
    assert_eq!(first_choice(&stack, other).await, "p-a");
    let r = stack
        .stream(
            "/v1/chat/completions",
            Some(other),
            chat_body(MODEL, "hello", true),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.provider().as_deref(), Some("p-b"), "the 429 moved it on");
    let t0 = Instant::now();
    let r = stack.chat(MODEL, Some(holder)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    (
        r.provider().unwrap(),
        r.attempts(),
        t0.elapsed().as_secs_f64(),
    )
}

/// `affinity.cacheHold` (default 5 s, the simulator's choice): a pinned project whose cache
/// holder is paused for a second waits for it instead of re-sending its context elsewhere;
/// `cacheHold: 0s` spills at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_hold_waits_for_a_briefly_paused_cache_holder() {
    let _g = serial().await;
    let (provider, attempts, secs) = after_brief_pause_of_the_head("5s").await;
    assert_eq!(provider, "p-a", "held for the cache holder ({secs:.2} s)");
    assert_eq!(attempts, Some(1));
    assert!(
        (0.3..3.0).contains(&secs),
        "waited {secs:.2} s for a 1 s pause"
    );
    let (provider, _, secs) = after_brief_pause_of_the_head("0s").await;
    assert_eq!(provider, "p-b", "cacheHold 0s spills at once");
    assert!(secs < 0.5, "took {secs:.2} s without a hold");
}

/// Issue 18 item 2: a provider that answers five times slower than its own baseline, without a
/// single error, has those answers counted slow on `/outcomes` (the operator's input) and loses
/// availability through the same controller; the provider that kept its pace does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_slower_than_its_baseline_loses_availability_without_errors() {
    let _serial = serial().await;
    let setup = Setup::new()
        .provider(Provider::openai("p1").mock(|m| m.latency_ms = 60))
        .provider(Provider::openai("p2").mock(|m| m.latency_ms = 60))
        .policy(Policy::chat(MODEL, &["p1", "p2"]).set("availability", "{interval: 2s}"));
    let stack = Stack::start(setup).await;
    let slow_of = |outcomes: &Value, p: &str| {
        outcomes["providers"][format!("{}/{p}", common::NAMESPACE)]["slow"]
            .as_u64()
            .unwrap_or(0)
    };
    // Baseline: 40 answers at the usual pace on p1, the head of every chain while healthy.
    for _ in 0..40 {
        let r = stack.chat(MODEL, Some("proj")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.provider().as_deref(), Some("p1"));
    }
    let outcomes: Value = stack
        .get("/outcomes")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(slow_of(&outcomes, "p1"), 0, "{outcomes}");
    // p1 slows down fivefold and keeps answering 200.
    stack
        .mock("p1")
        .set_faults(FaultSet::fail_all(Fault::Latency { ms: 240 }));
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        for _ in 0..5 {
            let r = stack.chat(MODEL, Some("proj")).await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
        let a = availability_of(&stack.status().await, "p1").unwrap_or(f64::NAN);
        seen.push(a);
        if a < 0.9 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "p1 availability did not fall below 0.9 within 30 s of 5x slower answers: {seen:?}"
        );
    }
    let outcomes: Value = stack
        .get("/outcomes")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let p1 = &outcomes["providers"][format!("{}/p1", common::NAMESPACE)];
    assert!(slow_of(&outcomes, "p1") >= 5, "{outcomes}");
    assert_eq!(p1["errors"].as_object().map_or(0, |e| e.len()), 0, "{p1}");
    assert_eq!(slow_of(&outcomes, "p2"), 0, "{outcomes}");
    assert_eq!(
        availability_of(&stack.status().await, "p2"),
        Some(1.0),
        "the provider that kept its pace keeps its availability"
    );
}

/// Issue 18 item 3 with a real router: a 30-second 429 storm on the primary moves every
/// project to the fallback; once it ends, existing and new projects return to the weights
/// (p1 again) within the pin duration plus two intervals (6 s + 2 × 1 s), plus 2 s of slack
/// for the last Retry-After pause and the controller's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_429s_ends_and_pinned_projects_return_within_pin_plus_two_intervals() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p1").with(NO_BREAKER))
            .provider(Provider::openai("p2").with(NO_BREAKER))
            .policy(
                Policy::chat(MODEL, &["p1", "p2"])
                    .set("availability", "{interval: 1s}")
                    .set(
                        "affinity",
                        &format!("{{header: {PROJECT_HEADER}, pinDuration: 6s}}"),
                    ),
            ),
    )
    .await;
    let projects: Vec<String> = (0..20).map(|i| format!("storm-{i}")).collect();
    for p in &projects {
        let r = stack.chat(MODEL, Some(p)).await;
        assert_eq!(r.provider().as_deref(), Some("p1"), "{p} before the storm");
    }
    stack
        .mock("p1")
        .set_faults(FaultSet::fail_all(Fault::RateLimited {
            retry_after: Some(1),
            http_date: false,
            retry_after_ms: None,
            reset_requests: Some("1s".to_owned()),
            reset_tokens: None,
        }));
    let storm = Instant::now();
    while storm.elapsed() < Duration::from_secs(30) {
        for p in &projects {
            let r = stack.chat(MODEL, Some(p)).await;
            assert_eq!(r.status, 200, "{p} in the storm: {}", r.body);
            assert_eq!(r.provider().as_deref(), Some("p2"), "{p} in the storm");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stack.mock("p1").set_faults(FaultSet::none());
    let end = Instant::now();
    let bound = Duration::from_secs(6 + 2 + 2);
    let mut back: BTreeMap<String, Duration> = BTreeMap::new();
    let mut new_on_p2 = Vec::new();
    let mut n = 0;
    while end.elapsed() < bound + Duration::from_secs(5) {
        for p in &projects {
            let r = stack.chat(MODEL, Some(p)).await;
            assert_eq!(r.status, 200, "{p} after the storm: {}", r.body);
            if r.provider().as_deref() == Some("p1") {
                back.entry(p.clone()).or_insert(end.elapsed());
            } else {
                // Once home, a project stays there.
                assert!(!back.contains_key(p), "{p} left p1 again: {:?}", r.headers);
            }
        }
        n += 1;
        let fresh = stack.chat(MODEL, Some(&format!("fresh-{n}"))).await;
        if fresh.provider().as_deref() != Some("p1") && end.elapsed() > Duration::from_secs(4) {
            new_on_p2.push((n, end.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let late: Vec<_> = projects
        .iter()
        .filter(|p| back.get(*p).is_none_or(|t| *t > bound))
        .collect();
    assert!(
        late.is_empty(),
        "not back on p1 within {bound:?}: {late:?}; returns {back:?}; weights {:?}",
        policy_weights(&stack.status().await, MODEL)
    );
    // Returns are spread over the pin, not one mass move.
    let first = back.values().min().copied().unwrap_or_default();
    let last = back.values().max().copied().unwrap_or_default();
    assert!(
        last.saturating_sub(first) >= Duration::from_secs(2),
        "all projects moved back at once: {back:?}"
    );
    assert!(
        new_on_p2.is_empty(),
        "new projects sent to p2 4 s after the storm: {new_on_p2:?}"
    );
}
