//! The rate-limit broker end to end (issue 5): reservations before sending, reconciliation with
//! reported usage, 429s in the client's shape with Retry-After and `x-ratelimit-*`, queues,
//! several router replicas sharing one real `redis-server`. Field cases 10, 11, 13, 17.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{KEY, Policy, Provider, Reply, Setup, Stack, chat_body, send, serial};
use serde_json::{Value, json};
use switchyard_testkit::RedisServer;

/// A chat body asking for at most `max_tokens` output tokens.
fn capped(max_tokens: u64) -> Value {
    json!({
        "model": "e2e-chat",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
    })
}

/// Sends `n` requests at once (all started before any is awaited) through `routers`
/// round-robin and returns the replies in order.
async fn burst(stack: &Stack, bases: &[String], n: usize, body: Value) -> Vec<Reply> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let req = stack
            .http
            .post(format!("{}/v1/chat/completions", bases[i % bases.len()]))
            .bearer_auth(KEY)
            .json(&body);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            send(req).await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

fn count(replies: &[Reply], status: u16) -> usize {
    replies.iter().filter(|r| r.status == status).count()
}

/// A metric's value summed over the series whose labels contain every `needle`.
fn metric(text: &str, name: &str, needles: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' '])
                .next()
                .is_some_and(|n| n == name || n == format!("{name}_total"))
        })
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn one_provider() -> Setup {
    Setup::new()
        .provider(Provider::openai("p-a"))
        .policy(Policy::chat("e2e-chat", &["p-a"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_thousand_concurrent_requests_admit_exactly_the_cap_in_process() {
    let _g = serial().await;
    let stack = Stack::start(one_provider().tenant(
        "limits: [{name: daily-requests, dimension: requests, amount: 100, rule: fixedWindow, period: 24h}]",
    ))
    .await;
    let bases = vec![stack.router.base_url.clone()];
    let replies = burst(&stack, &bases, 1000, chat_body("e2e-chat", "hi", false)).await;
    assert_eq!(count(&replies, 200), 100, "exactly the cap is admitted");
    assert_eq!(count(&replies, 429), 900);
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 100);
    let refused = replies.iter().find(|r| r.status == 429).unwrap();
    assert_eq!(
        refused.json()["error"]["code"],
        "tenant_requests_per_day",
        "{}",
        refused.body
    );
    // Retry-After reaches the next window; the caller's own bucket is in the headers.
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry), "retry-after {retry}");
    assert_eq!(refused.headers["x-ratelimit-limit"], "100");
    assert_eq!(refused.headers["x-ratelimit-remaining"], "0");
    let ok = replies.iter().find(|r| r.status == 200).unwrap();
    assert_eq!(ok.headers["x-ratelimit-limit"], "100");
    assert!(ok.headers.contains_key("x-ratelimit-remaining"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_three_replicas_sharing_redis_admit_exactly_the_cap() {
    let _g = serial().await;
    let redis = RedisServer::start().expect("redis-server");
    let env = [
        ("SWITCHYARD_REDIS_URL".to_owned(), redis.url()),
        ("SWITCHYARD_REPLICAS".to_owned(), "3".to_owned()),
        // A debug build answering 1,000 requests at once on two cores: give Redis time, so
        // the test measures sharing, not the outage fallback.
        ("SWITCHYARD_REDIS_TIMEOUT".to_owned(), "5s".to_owned()),
    ];
    let mut setup = one_provider().tenant(
        "limits: [{name: daily-requests, dimension: requests, amount: 100, rule: fixedWindow, period: 24h}]",
    );
    for (k, v) in &env {
        setup = setup.env(k, v);
    }
    let stack = Stack::start(setup).await;
    let r2 = stack.spawn_replica(&[]).await;
    let r3 = stack.spawn_replica(&[]).await;
    let bases = vec![
        stack.router.base_url.clone(),
        r2.base_url.clone(),
        r3.base_url.clone(),
    ];
    let replies = burst(&stack, &bases, 1000, chat_body("e2e-chat", "hi", false)).await;
    assert_eq!(
        count(&replies, 200),
        100,
        "three replicas together admit exactly the cap"
    );
    assert_eq!(count(&replies, 429), 900);
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 100);
    // Every replica admitted some (the cap is not one replica's).
    for (i, base) in bases.iter().enumerate() {
        let text = send(stack.http.get(format!("{base}/metrics"))).await.body;
        assert_eq!(
            metric(&text, "switchyard_quota_store_mode", &["mode=\"redis\""]),
            1.0,
            "replica {i} uses redis"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_spend_cap_admits_one_of_ten_then_reconciles_to_actual_cost() {
    // Field case 11 with $0.05 left: each request's worst case is 4,000 output tokens at
    // $10/MTok = $0.04; each really costs 3,000 tokens = $0.03.
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::openai("p-a")
                    .pricing("0", "10")
                    .mock(|m| m.output_tokens = 3000),
            )
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant(
                "limits: [{name: spend, dimension: spendMicroUsd, amount: 50000, rule: fixedWindow, period: 24h}]",
            ),
    )
    .await;
    let bases = vec![stack.router.base_url.clone()];
    let replies = burst(&stack, &bases, 10, capped(4000)).await;
    assert_eq!(count(&replies, 200), 1, "exactly one of ten is admitted");
    assert_eq!(count(&replies, 429), 9);
    for r in replies.iter().filter(|r| r.status == 429) {
        assert_eq!(r.json()["error"]["code"], "tenant_spend", "{}", r.body);
    }
    assert_eq!(
        stack.calls_on("p-a", "/v1/chat/completions"),
        1,
        "refused requests never reach the provider"
    );
    // After reconciliation $0.03 is spent and $0.02 left: a $0.02 worst case fits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = stack.metrics().await;
    assert_eq!(
        metric(
            &text,
            "switchyard_tenant_charged",
            &["kind=\"spend_micro_usd\""]
        ),
        30_000.0
    );
    let follow = stack.chat_body("e2e-chat", None, capped(2000)).await;
    assert_eq!(follow.status, 200, "{}", follow.body);
    let over = stack.chat_body("e2e-chat", None, capped(2000)).await;
    assert_eq!(over.status, 429, "the cap holds after the follow-up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_concurrency_slot_freed_when_stream_client_disconnects() {
    // Field case 13: concurrency 1, a slow stream aborted by the client, then a request.
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| {
                m.output_tokens = 600;
                m.tokens_per_sec = 10.0;
            }))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant("limits: [{name: one-at-a-time, dimension: concurrency, amount: 1, rule: concurrency}]"),
    )
    .await;
    for cycle in 0..20 {
        let resp = stack
            .post("/v1/chat/completions")
            .json(&chat_body("e2e-chat", "tell me a long story", true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "cycle {cycle}");
        let mut body = resp.bytes_stream();
        use futures::StreamExt as _;
        let _first = body.next().await;
        // While the stream holds the slot, a second request is refused at once.
        if cycle == 0 {
            let busy = stack.chat_body("e2e-chat", None, capped(3)).await;
            assert_eq!(busy.status, 429, "{}", busy.body);
            assert_eq!(busy.json()["error"]["code"], "tenant_concurrency");
        }
        drop(body);
        tokio::time::sleep(Duration::from_millis(150)).await;
        // Three tokens at 10 per second: a short answer, so the slot frees again quickly.
        let next = stack.chat_body("e2e-chat", None, capped(3)).await;
        assert_eq!(
            next.status, 200,
            "cycle {cycle}: slot freed after the abort: {}",
            next.body
        );
    }
    let text = stack.metrics().await;
    assert_eq!(
        metric(&text, "switchyard_quota_reservations_in_flight", &[]),
        0.0
    );
    assert_eq!(metric(&text, "switchyard_in_flight", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_tenant_refusal_is_anthropic_shaped_for_messages_clients() {
    let _g = serial().await;
    let stack = Stack::start(
        one_provider().tenant("limits: [{name: rpm, dimension: requests, amount: 1, period: 60s}]"),
    )
    .await;
    let body = common::messages_body("e2e-chat", "hi", false);
    let first = send(stack.post("/v1/messages").json(&body)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let second = send(stack.post("/v1/messages").json(&body)).await;
    assert_eq!(second.status, 429);
    let v = second.json();
    assert_eq!(v["type"], "error", "{}", second.body);
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(
        second.body.contains("tenant_requests_per_minute"),
        "{}",
        second.body
    );
    let retry: u64 = second.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_queue_deadline_and_full_queue() {
    // Concurrency 1 held by a slow request; a queue of depth 1 with a 300 ms deadline.
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.latency_ms = 1500))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant("limits: [{name: one, dimension: concurrency, amount: 1, rule: concurrency}]")
            .tenant("queue: {maxDepth: 1, deadline: 300ms}"),
    )
    .await;
    let holder = {
        let req = stack
            .post("/v1/chat/completions")
            .json(&chat_body("e2e-chat", "slow", false));
        tokio::spawn(async move { send(req).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = {
        let req = stack
            .post("/v1/chat/completions")
            .json(&chat_body("e2e-chat", "queued", false));
        tokio::spawn(async move { send(req).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let full = stack.chat("e2e-chat", None).await;
    assert_eq!(full.status, 429);
    assert_eq!(full.json()["error"]["code"], "queue_full", "{}", full.body);
    let waited = waiting.await.unwrap();
    assert_eq!(waited.status, 429);
    assert_eq!(
        waited.json()["error"]["code"],
        "queue_deadline",
        "{}",
        waited.body
    );
    assert!(
        waited.elapsed >= Duration::from_millis(250),
        "{:?}",
        waited.elapsed
    );
    assert_eq!(holder.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_queued_request_admitted_when_capacity_frees() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.latency_ms = 300))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant("limits: [{name: one, dimension: concurrency, amount: 1, rule: concurrency}]")
            .tenant("queue: {maxDepth: 10, deadline: 5s}"),
    )
    .await;
    let bases = vec![stack.router.base_url.clone()];
    let replies = burst(&stack, &bases, 5, chat_body("e2e-chat", "hi", false)).await;
    let bodies: Vec<&str> = replies.iter().map(|r| r.body.as_str()).collect();
    assert_eq!(
        count(&replies, 200),
        5,
        "every queued request is served in turn: {bodies:?}"
    );
    let slowest = replies.iter().map(|r| r.elapsed).max().unwrap();
    assert!(
        slowest >= Duration::from_millis(1400),
        "served one at a time: {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(4),
        "admitted as capacity freed: {slowest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_weighted_tenants_share_a_saturated_provider_three_to_one() {
    // Two tenants, weights 3 and 1, both saturating one provider whose concurrency is 2.
    let _g = serial().await;
    let gold = "sk-gold";
    let bronze = "sk-bronze";
    let tenant = |name: &str, key: &str, weight: u32| {
        format!(
            "apiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  apiKeys: [{{name: k, secretRef: {{name: e2e-keys, key: {key}}}}}]\n  weight: {weight}\n  queue: {{maxDepth: 1000, deadline: 60s}}",
            ns = common::NAMESPACE
        )
    };
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.latency_ms = 20).with(
                "limits: [{name: slots, dimension: concurrency, amount: 2, rule: concurrency}]",
            ))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .key("gold", gold)
            .key("bronze", bronze)
            .doc(&tenant("gold", "gold", 3))
            .doc(&tenant("bronze", "bronze", 1)),
    )
    .await;
    // Each tenant keeps 40 requests outstanding for 4 s; count what each got served.
    let run = |key: &'static str| {
        let http = stack.http.clone();
        let url = stack.url("/v1/chat/completions");
        tokio::spawn(async move {
            let stop = tokio::time::Instant::now() + Duration::from_secs(4);
            let mut workers = Vec::new();
            for _ in 0..40 {
                let http = http.clone();
                let url = url.clone();
                workers.push(tokio::spawn(async move {
                    let mut served = 0u32;
                    while tokio::time::Instant::now() < stop {
                        let r = send(
                            http.post(&url)
                                .bearer_auth(key)
                                .json(&chat_body("e2e-chat", "hi", false)),
                        )
                        .await;
                        // Only answers completed inside the window count: the backlog
                        // still queued at the end drains evenly and is no measure of shares.
                        if r.status == 200 && tokio::time::Instant::now() < stop {
                            served += 1;
                        }
                    }
                    served
                }));
            }
            let mut total = 0;
            for w in workers {
                total += w.await.unwrap();
            }
            total
        })
    };
    let (g, b) = (run(gold), run(bronze));
    let (g, b) = (g.await.unwrap(), b.await.unwrap());
    let ratio = f64::from(g) / f64::from(b.max(1));
    assert!(
        (2.7..=3.3).contains(&ratio),
        "gold {g} : bronze {b} = {ratio:.2}, expected 3 ± 10 %"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_never_fitting_demand_is_a_client_error_without_retry_after() {
    let _g = serial().await;
    let stack = Stack::start(
        one_provider()
            .tenant("limits: [{name: otpm, dimension: outputTokens, amount: 1000, period: 60s}]"),
    )
    .await;
    let r = stack.chat_body("e2e-chat", None, capped(5000)).await;
    // Waiting cannot help: a client error (SDKs do not retry it), naming the limit.
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "request_exceeds_limit");
    assert!(
        r.body.contains("otpm") && r.body.contains("max_tokens"),
        "{}",
        r.body
    );
    assert!(!r.headers.contains_key("retry-after"), "it will never fit");
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_provider_without_room_is_skipped_before_sending() {
    // p-a allows 2 requests per minute; the third goes to p-b without touching p-a.
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::openai("p-a")
                    .with("limits: [{name: rpm, dimension: requests, amount: 2, period: 60s}]"),
            )
            .provider(Provider::openai("p-b"))
            .policy(Policy::chat("e2e-chat", &["p-a", "p-b"]).with("availability: {interval: 1h}")),
    )
    .await;
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..5 {
        let r = stack.chat("e2e-chat", Some("one-project")).await;
        assert_eq!(r.status, 200, "{}", r.body);
        *by.entry(
            r.headers["x-switchyard-provider"]
                .to_str()
                .unwrap()
                .to_owned(),
        )
        .or_default() += 1;
    }
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 2, "{by:?}");
    assert_eq!(stack.calls_on("p-b", "/v1/chat/completions"), 3, "{by:?}");
}

/// Three replicas (one started after the event) on one Redis, `p-a` then `p-b`.
async fn shared_state_stack(p_a: switchyard_mock::FaultSet, extra: &str) -> (Stack, RedisServer) {
    let redis = RedisServer::start().expect("redis-server");
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.faults = p_a).with(extra))
            .provider(Provider::openai("p-b"))
            .policy(Policy::chat("e2e-chat", &["p-a", "p-b"]).with("availability: {interval: 1h}"))
            .env("SWITCHYARD_REDIS_URL", &redis.url())
            .env("SWITCHYARD_REPLICAS", "3")
            .env("SWITCHYARD_REDIS_TIMEOUT", "2s"),
    )
    .await;
    (stack, redis)
}

async fn chat_via(stack: &Stack, base: &str, project: &str) -> Reply {
    send(
        stack
            .http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(KEY)
            .header(common::PROJECT_HEADER, project)
            .json(&chat_body("e2e-chat", "hi", false)),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn case_08_retry_after_on_one_replica_is_honoured_by_all() {
    use switchyard_mock::{Fault, FaultRule, FaultSet};
    let _g = serial().await;
    let limited = Fault::RateLimited {
        retry_after: Some(4),
        http_date: false,
        retry_after_ms: None,
        reset_requests: Some("4s".to_owned()),
        reset_tokens: None,
    };
    let (stack, _redis) = shared_state_stack(
        FaultSet::rules([FaultRule::next(1, limited)]),
        "circuitBreaker: {consecutiveFailures: 100}",
    )
    .await;
    let r2 = stack.spawn_replica(&[]).await;
    // R1 meets the 429 and fails over.
    let first = chat_via(&stack, &stack.router.base_url, "case-8").await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.headers["x-switchyard-provider"], "e2e/p-b");
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 1);
    // A replica started after the pause loads it.
    let r3 = stack.spawn_replica(&[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for base in [&r2.base_url, &r3.base_url, &stack.router.base_url] {
        for i in 0..3 {
            let r = chat_via(&stack, base, &format!("during-{i}")).await;
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.headers["x-switchyard-provider"], "e2e/p-b", "{base}");
        }
    }
    assert_eq!(
        stack.calls_on("p-a", "/v1/chat/completions"),
        1,
        "no replica sends to p-a while its Retry-After runs"
    );
    // After the pause (4 s plus at most its jitter) p-a serves again, on every replica. Fresh
    // projects: those that spilled during the pause moved their affinity to p-b (case 22).
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    for base in [&r2.base_url, &r3.base_url] {
        let mut served_by_a = false;
        for i in 0..5 {
            let r = chat_via(&stack, base, &format!("after-{i}")).await;
            served_by_a |= r.headers["x-switchyard-provider"] == "e2e/p-a";
        }
        assert!(served_by_a, "{base} uses p-a again after the pause");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn case_08_breaker_opened_on_one_replica_opens_on_all() {
    use switchyard_mock::{Fault, FaultSet};
    let _g = serial().await;
    let (stack, _redis) = shared_state_stack(
        FaultSet::fail_all(Fault::ServerError { status: 500 }),
        "circuitBreaker: {consecutiveFailures: 3, cooldown: 20s}",
    )
    .await;
    let r2 = stack.spawn_replica(&[]).await;
    // Three projects, each with p-a first: three failures open R1's breaker.
    for i in 0..3 {
        let r = chat_via(&stack, &stack.router.base_url, &format!("trip-{i}")).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        let r = chat_via(&stack, &r2.base_url, &format!("other-{i}")).await;
        assert_eq!(r.headers["x-switchyard-provider"], "e2e/p-b");
    }
    assert_eq!(
        stack.calls_on("p-a", "/v1/chat/completions"),
        3,
        "the other replica's open breaker keeps this one off p-a"
    );
    let text = send(stack.http.get(format!("{}/metrics", r2.base_url)))
        .await
        .body;
    assert_eq!(metric(&text, "switchyard_circuit_open", &["p-a"]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_ten_thousand_requests_with_random_aborts_leave_nothing_held() {
    // Two tenants on two providers: "steady" (the default key) never aborts, so what it is
    // charged must equal what its provider reported; "flaky" aborts at random — before the
    // first byte, mid-stream, or after reading everything — and must leave no slot, gauge or
    // reservation behind.
    use futures::StreamExt as _;
    let _g = serial().await;
    let flaky_key = "sk-flaky";
    let limits = "limits: [{name: slots, dimension: concurrency, amount: 64, rule: concurrency}, {name: itpm, dimension: inputTokens, amount: 100000000, period: 60s}, {name: spend, dimension: spendMicroUsd, amount: 100000000000, rule: fixedWindow, period: 24h}]";
    let flaky_tenant = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: flaky, namespace: {ns}}}\nspec:\n  apiKeys: [{{name: k, secretRef: {{name: e2e-keys, key: flaky}}}}]\n  {limits}",
        ns = common::NAMESPACE
    );
    let slow = |m: &mut switchyard_mock::MockConfig| {
        m.output_tokens = 20;
        m.tokens_per_sec = 400.0;
        m.record_limit = 20_000;
    };
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::anthropic("p-steady")
                    .models(&[("steady", "text")])
                    .pricing("3", "15")
                    .mock(slow),
            )
            .provider(
                Provider::anthropic("p-flaky")
                    .models(&[("flaky", "text")])
                    .pricing("3", "15")
                    .mock(slow),
            )
            .policy(Policy::chat("steady", &["p-steady"]))
            .policy(Policy::chat("flaky", &["p-flaky"]))
            .tenant(limits)
            .key("flaky", flaky_key)
            .doc(&flaky_tenant),
    )
    .await;
    let total = 10_000usize;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..32u64 {
        let http = stack.http.clone();
        let url = stack.url("/v1/chat/completions");
        let next = next.clone();
        workers.push(tokio::spawn(async move {
            // A small deterministic generator per worker: reproducible runs.
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ w;
            let mut roll = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut statuses = BTreeMap::<String, usize>::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                let r = roll();
                let steady = r % 5 == 0;
                let stream = r % 2 == 0;
                let (model, key) = if steady {
                    ("steady", KEY)
                } else {
                    ("flaky", flaky_key)
                };
                let req = http.post(&url).bearer_auth(key).json(&chat_body(
                    model,
                    &format!("question {}", r % 97),
                    stream,
                ));
                let mode = if steady { 3 } else { (r >> 8) % 4 };
                let outcome = match mode {
                    // Abort before the first byte: give up after a few milliseconds.
                    0 => {
                        match tokio::time::timeout(Duration::from_millis((r >> 16) % 8), req.send())
                            .await
                        {
                            Err(_) => "aborted_before_first_byte".to_owned(),
                            Ok(Ok(resp)) => resp.status().as_u16().to_string(),
                            Ok(Err(e)) => format!("error {e}"),
                        }
                    }
                    // Abort mid-stream (or mid-body): read one chunk, then hang up.
                    1 => match req.send().await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let mut body = resp.bytes_stream();
                            let _ = body.next().await;
                            drop(body);
                            format!("{status} cut")
                        }
                        Err(e) => format!("error {e}"),
                    },
                    // Read everything.
                    _ => match req.send().await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let _ = resp.bytes().await;
                            status.to_string()
                        }
                        Err(e) => format!("error {e}"),
                    },
                };
                *statuses.entry(outcome).or_default() += 1;
            }
            statuses
        }));
    }
    let mut outcomes = BTreeMap::<String, usize>::new();
    for w in workers {
        for (k, v) in w.await.unwrap() {
            *outcomes.entry(k).or_default() += v;
        }
    }
    assert!(
        outcomes
            .keys()
            .all(|k| !k.starts_with("error") && !k.starts_with("429") && !k.starts_with("5")),
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .get("aborted_before_first_byte")
            .copied()
            .unwrap_or(0)
            > 100,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("200 cut").copied().unwrap_or(0) > 1000,
        "{outcomes:?}"
    );
    // Abandoned attempts settle as their connections close.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = stack.metrics().await;
    assert_eq!(
        metric(&text, "switchyard_quota_reservations_in_flight", &[]),
        0.0,
        "{outcomes:?}"
    );
    assert_eq!(metric(&text, "switchyard_in_flight", &[]), 0.0);
    // Every concurrency slot is back: 64 requests at once are all admitted.
    let bases = vec![stack.router.base_url.clone()];
    let replies = burst(&stack, &bases, 64, chat_body("steady", "again", false)).await;
    assert_eq!(count(&replies, 200), 64);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = stack.metrics().await;
    // What "steady" was charged is what its provider reported, token for token.
    let reported = stack.mock("p-steady").calls();
    let sum = |f: fn(&switchyard_mock::UsageRecord) -> u64| -> f64 {
        reported
            .iter()
            .filter_map(|c| c.usage.as_ref())
            .map(f)
            .sum::<u64>() as f64
    };
    let charged = |kind: &str| {
        metric(
            &text,
            "switchyard_tenant_charged",
            &["tenant=\"e2e/e2e-tenant\"", &format!("kind=\"{kind}\"")],
        )
    };
    assert!(reported.len() > 1500, "{}", reported.len());
    assert_eq!(
        charged("input_uncached") + charged("cache_read") + charged("cache_write"),
        sum(|u| u.prompt_tokens),
        "input charged = input reported"
    );
    assert_eq!(charged("cache_read"), sum(|u| u.cached_tokens));
    assert_eq!(
        charged("output"),
        sum(|u| u.output_tokens),
        "output charged = output reported"
    );
    // "flaky" paid for what it used: never more output than its provider produced.
    let flaky_calls = stack.mock("p-flaky").calls();
    let produced: u64 = flaky_calls
        .iter()
        .map(|c| c.usage.map_or(c.tokens_streamed, |u| u.output_tokens))
        .sum();
    let flaky_output = metric(
        &text,
        "switchyard_tenant_charged",
        &["tenant=\"e2e/flaky\"", "kind=\"output\""],
    );
    assert!(flaky_output > 0.0);
    // A cut stream is charged the tokenizer's count of what was delivered. The mock's "token"
    // is a word like `token12`, which o200k splits in two, so the bound is twice the mock's
    // count plus slack, not equality.
    assert!(
        flaky_output <= produced as f64 * 2.5,
        "charged {flaky_output} output tokens for {produced} produced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_key_in_flight_and_completed_is_not_sent_again() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.latency_ms = 300))
            .policy(Policy::chat("e2e-chat", &["p-a"])),
    )
    .await;
    let with_key = |key: &str| {
        stack
            .post("/v1/chat/completions")
            .header("Idempotency-Key", key)
            .json(&chat_body("e2e-chat", "charge my card once", false))
    };
    // Two at once with the same key: one upstream call, the same answer twice.
    let (a, b) = tokio::join!(send(with_key("order-17")), send(with_key("order-17")));
    assert_eq!((a.status, b.status), (200, 200), "{} / {}", a.body, b.body);
    assert_eq!(a.json()["id"], b.json()["id"]);
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 1);
    // Later: replayed, marked as such.
    let c = send(with_key("order-17")).await;
    assert_eq!(c.json()["id"], a.json()["id"]);
    assert_eq!(c.headers["x-switchyard-idempotent-replay"], "true");
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 1);
    // Another key is another request.
    let d = send(with_key("order-18")).await;
    assert_eq!(d.status, 200);
    assert_ne!(d.json()["id"], a.json()["id"]);
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provider_rate_limit_headers_correct_its_bucket_before_it_refuses() {
    // The manifest says p-a takes 100 requests a minute; the provider itself reports only 2
    // (its headers). After two requests the router believes the provider, not the manifest,
    // and sends the rest to p-b without waiting for a 429.
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::openai("p-a")
                    .mock(|m| m.rate_limits.requests_per_minute = 2)
                    .with("limits: [{name: rph, dimension: requests, amount: 100, rule: fixedWindow, period: 1h}]"),
            )
            .provider(Provider::openai("p-b"))
            .policy(Policy::chat("e2e-chat", &["p-a", "p-b"]).with("availability: {interval: 1h}")),
    )
    .await;
    for i in 0..6 {
        let r = stack.chat("e2e-chat", Some(&format!("proj-{i}"))).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 2);
    assert_eq!(stack.calls_on("p-b", "/v1/chat/completions"), 4);
    assert!(
        stack.mock("p-a").calls().iter().all(|c| c.status == 200),
        "p-a never had to refuse"
    );
}

/// Sleeps until the wall clock is in the first `within` seconds of a UTC minute, so a test of
/// per-minute fixed windows does not straddle a window boundary.
async fn align_to_minute(within: u64) {
    loop {
        #[allow(clippy::disallowed_methods)] // a test aligning to the wall-clock minute
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let into = now.as_secs() % 60;
        if into < within {
            return;
        }
        tokio::time::sleep(Duration::from_millis(
            (60 - into) * 1000 - u64::from(now.subsec_millis()) + 50,
        ))
        .await;
    }
}

async fn case_10_run(replicas: usize) {
    let redis = RedisServer::start().expect("redis-server");
    let mut setup = one_provider().tenant(
        "limits: [{name: itpm, dimension: inputTokens, amount: 10000, rule: fixedWindow, period: 60s}, {name: rpm, dimension: requests, amount: 12, rule: fixedWindow, period: 60s}]",
    );
    if replicas > 1 {
        setup = setup
            .env("SWITCHYARD_REDIS_URL", &redis.url())
            .env("SWITCHYARD_REPLICAS", &replicas.to_string())
            .env("SWITCHYARD_REDIS_TIMEOUT", "2s");
    }
    let stack = Stack::start(setup).await;
    let mut extra = Vec::new();
    for _ in 1..replicas {
        extra.push(stack.spawn_replica(&[]).await);
    }
    let mut bases = vec![stack.router.base_url.clone()];
    bases.extend(extra.iter().map(|r| r.base_url.clone()));
    // ~1,000 input tokens per request (o200k counts " the" as one token), max_tokens 50.
    let prompt = " the".repeat(990);
    let body = json!({"model": "e2e-chat", "max_tokens": 50,
        "messages": [{"role": "user", "content": prompt}]});
    align_to_minute(30).await;
    let mut replies = Vec::new();
    for i in 0..30 {
        let base = &bases[i % bases.len()];
        let r = send(
            stack
                .http
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(KEY)
                .json(&body),
        )
        .await;
        replies.push(r);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let admitted = count(&replies, 200);
    assert!(
        (9..=10).contains(&admitted),
        "{replicas} replica(s): {admitted} admitted in the minute"
    );
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), admitted);
    for r in replies.iter().filter(|r| r.status != 200) {
        assert_eq!(r.status, 429, "{}", r.body);
        let code = r.json()["error"]["code"].as_str().unwrap().to_owned();
        assert!(
            code == "tenant_input_tokens_per_minute" || code == "tenant_requests_per_minute",
            "a tenant-quota code, not a provider one: {code}"
        );
        let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(
            (1..=60).contains(&retry),
            "Retry-After within the window: {retry}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn case_10_limits_hold_with_one_replica() {
    let _g = serial().await;
    case_10_run(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn case_10_limits_hold_with_three_replicas_sharing_redis() {
    let _g = serial().await;
    case_10_run(3).await;
}

/// What the tenant has been charged so far, by kind.
async fn charged(stack: &Stack, kind: &str) -> f64 {
    let text = stack.metrics().await;
    metric(
        &text,
        "switchyard_tenant_charged",
        &["tenant=\"e2e/e2e-tenant\"", &format!("kind=\"{kind}\"")],
    )
}

/// The router's count of the mock's first `n` content deltas (`token0`, ` token1`, …), each
/// counted on its own as the router counts delivered deltas.
fn delivered_tokens(n: u64) -> u64 {
    (0..n)
        .map(|i| {
            let text = if i == 0 {
                "token0".to_owned()
            } else {
                format!(" token{i}")
            };
            switchyard_router::estimate::count_tokens(&text)
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn case_17_client_disconnect_cancels_upstream_and_charges_what_was_used() {
    use futures::StreamExt as _;
    use switchyard_mock::{Fault, FaultRule, FaultSet};
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::anthropic("p-a").pricing("3", "15").mock(|m| {
                m.output_tokens = 3000;
                m.tokens_per_sec = 500.0;
            }))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant(
                "limits: [{name: otpm, dimension: outputTokens, amount: 1000000, period: 60s}]",
            ),
    )
    .await;
    let prompt = " the".repeat(1200);
    let body = json!({"model": "e2e-chat", "max_tokens": 4000, "stream": true,
        "messages": [{"role": "user", "content": prompt}]});

    // (a) Hang up after 400 content deltas.
    let resp = stack.post("/v1/messages").json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut events = resp.bytes_stream();
    let mut deltas = 0u64;
    while deltas < 400 {
        let chunk = events.next().await.expect("stream open").unwrap();
        deltas += String::from_utf8_lossy(&chunk)
            .matches("\"content_block_delta\"")
            .count() as u64;
    }
    drop(events);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let call = stack.mock("p-a").calls().pop().unwrap();
    assert!(
        call.cancelled_at.is_some(),
        "the upstream request was cancelled"
    );
    assert!(
        call.tokens_streamed < 1000,
        "p-a stopped early: {}",
        call.tokens_streamed
    );
    // The cut call has no final usage record; its opening `message_start` reported the
    // prompt as the mock counts it.
    let reported_input = switchyard_mock::count_tokens(&prompt) as f64;
    let input = charged(&stack, "input_uncached").await
        + charged(&stack, "cache_read").await
        + charged(&stack, "cache_write").await;
    assert_eq!(
        input, reported_input,
        "the prompt is charged as the provider counted it"
    );
    let output = charged(&stack, "output").await;
    assert!(
        output >= delivered_tokens(deltas) as f64 && output <= delivered_tokens(deltas + 50) as f64,
        "charged {output} output tokens for {deltas} deltas delivered (not 0, not 4,000)"
    );
    let text = stack.metrics().await;
    assert_eq!(
        metric(&text, "switchyard_quota_reservations_in_flight", &[]),
        0.0
    );

    // (b) Hang up at 300 ms, before the first byte (first content comes at 1 s).
    stack
        .mock("p-a")
        .set_faults(FaultSet::rules([FaultRule::next(
            1,
            Fault::SlowFirstToken { ms: 1000 },
        )]));
    let before_in = charged(&stack, "input_uncached").await;
    let before_out = charged(&stack, "output").await;
    let req = stack.post("/v1/messages").json(&body);
    let _ = tokio::time::timeout(Duration::from_millis(300), req.send()).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let input = charged(&stack, "input_uncached").await - before_in;
    let output = charged(&stack, "output").await - before_out;
    assert!(
        (1150.0..=1300.0).contains(&input),
        "the prompt estimate is charged: {input}"
    );
    assert!(output <= 50.0, "at most a few output tokens: {output}");
    let call = stack.mock("p-a").calls().pop().unwrap();
    assert!(call.cancelled_at.is_some());

    // (c) The provider reports 0 / 0 and the client hangs up after it: 0 / 0 as reported.
    stack
        .mock("p-a")
        .set_faults(FaultSet::rules([FaultRule::next(
            1,
            Fault::ReportUsage {
                input_tokens: 0,
                output_tokens: 0,
            },
        )]));
    let small = json!({"model": "e2e-chat", "max_tokens": 5, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let before_in = charged(&stack, "input_uncached").await;
    let before_out = charged(&stack, "output").await;
    let r = send(stack.post("/v1/messages").json(&small)).await;
    assert_eq!(r.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(charged(&stack, "input_uncached").await - before_in, 0.0);
    assert_eq!(charged(&stack, "output").await - before_out, 0.0);
    let text = stack.metrics().await;
    assert_eq!(
        metric(&text, "switchyard_quota_reservations_in_flight", &[]),
        0.0
    );
}

/// The tenant's entry in a `/status` document.
fn tenant_status(status: &Value, name: &str) -> Value {
    status["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name))
        .map(|t| t["status"].clone())
        .unwrap_or_else(|| panic!("tenant {name} in /status: {status}"))
}

/// One limit's usage in a tenant status.
fn limit_usage(tenant: &Value, limit: &str) -> Value {
    tenant["usage"]
        .as_array()
        .and_then(|u| u.iter().find(|l| l["limit"] == limit))
        .cloned()
        .unwrap_or_else(|| panic!("limit {limit} in {tenant}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_tenant_status_shows_usage_throttled_and_rejected() {
    // Issue 17 item 5. Concurrency 1 held by a slow request, a queue of depth 1 with a 300 ms
    // deadline, and 3 requests per hour: one request waits and times out (throttled and
    // rejected), one finds the queue full (rejected), the fourth admitted request exceeds the
    // hourly window (rejected at once: waiting cannot help before the deadline).
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.latency_ms = 1500))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant("limits: [{name: one, dimension: concurrency, amount: 1, rule: concurrency}, {name: hourly, dimension: requests, amount: 3, rule: fixedWindow, period: 1h}]")
            .tenant("queue: {maxDepth: 1, deadline: 300ms}"),
    )
    .await;
    let idle = tenant_status(&stack.status().await, "e2e-tenant");
    assert_eq!(idle["throttled"], 0, "{idle}");
    assert_eq!(idle["rejected"], 0, "{idle}");
    let one = limit_usage(&idle, "one");
    assert_eq!(
        (&one["used"], &one["amount"], &one["remaining"]),
        (&json!(0), &json!(1), &json!(1)),
        "{idle}"
    );
    assert_eq!(one["dimension"], "concurrency");
    assert!(one.get("window").is_none(), "{one}");
    let hourly = limit_usage(&idle, "hourly");
    assert_eq!(hourly["window"], "3600s", "{hourly}");
    assert_eq!((&hourly["used"], &hourly["amount"]), (&json!(0), &json!(3)));

    let holder = {
        let req = stack
            .post("/v1/chat/completions")
            .json(&chat_body("e2e-chat", "slow", false));
        tokio::spawn(async move { send(req).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = {
        let req = stack
            .post("/v1/chat/completions")
            .json(&chat_body("e2e-chat", "queued", false));
        tokio::spawn(async move { send(req).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // While the holder is in flight: its slot and its request are in use.
    let busy = tenant_status(&stack.status().await, "e2e-tenant");
    assert_eq!(limit_usage(&busy, "one")["used"], 1, "{busy}");
    assert_eq!(limit_usage(&busy, "one")["remaining"], 0, "{busy}");
    assert_eq!(limit_usage(&busy, "hourly")["used"], 1, "{busy}");
    let full = stack.chat("e2e-chat", None).await;
    assert_eq!(full.json()["error"]["code"], "queue_full", "{}", full.body);
    let waited = waiting.await.unwrap();
    assert_eq!(
        waited.json()["error"]["code"],
        "queue_deadline",
        "{}",
        waited.body
    );
    assert_eq!(holder.await.unwrap().status, 200);
    for _ in 0..2 {
        let ok = stack.chat("e2e-chat", None).await;
        assert_eq!(ok.status, 200, "{}", ok.body);
    }
    let over = stack.chat("e2e-chat", None).await;
    assert_eq!(over.status, 429);
    assert_eq!(
        over.json()["error"]["code"],
        "tenant_requests_per_hour",
        "{}",
        over.body
    );

    let done = tenant_status(&stack.status().await, "e2e-tenant");
    assert_eq!(
        done["throttled"], 1,
        "only the queued request waited: {done}"
    );
    assert_eq!(
        done["rejected"], 3,
        "queue_deadline, queue_full, hourly: {done}"
    );
    let hourly = limit_usage(&done, "hourly");
    assert_eq!(
        (&hourly["used"], &hourly["remaining"]),
        (&json!(3), &json!(0)),
        "{done}"
    );
    let reset = hourly["resetAfterSeconds"].as_u64().unwrap();
    assert!((1..=3600).contains(&reset), "{hourly}");
    assert_eq!(limit_usage(&done, "one")["used"], 0, "{done}");
    assert!(done["lastUpdateTime"].is_string(), "{done}");

    // The queue metrics carry the tenant.
    let text = stack.metrics().await;
    let tenant = format!("tenant=\"{}/e2e-tenant\"", common::NAMESPACE);
    // Observed for the request that waited and for the one the full queue refused at once.
    assert_eq!(
        metric(&text, "switchyard_queue_wait_seconds_count", &[&tenant]),
        2.0,
        "{text}"
    );
    assert_eq!(metric(&text, "switchyard_queue_depth", &[&tenant]), 0.0);
}

/// Issue 16 item 1: a router whose limits count only requests never loads the tokenizer's
/// vocabulary, whatever it serves (chat, a stream, a translated Messages request); one whose
/// limits count tokens has it loaded before it reports ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_is_loaded_only_when_a_limit_counts_tokens() {
    let _g = serial().await;
    let stack = Stack::start(
        one_provider()
            .tenant("limits: [{name: rpm, dimension: requests, amount: 1000, period: 60s}]"),
    )
    .await;
    assert_eq!(stack.chat("e2e-chat", Some("p1")).await.status, 200);
    let streamed = stack
        .stream(
            "/v1/chat/completions",
            Some("p1"),
            chat_body("e2e-chat", "hello there, stream me", true),
        )
        .await;
    assert_eq!(streamed.status, 200);
    let messages = send(stack.post("/v1/messages").json(&common::messages_body(
        "e2e-chat",
        "hello from messages",
        false,
    )))
    .await;
    assert_eq!(messages.status, 200, "{}", messages.body);
    let metrics = stack.metrics().await;
    assert_eq!(
        metric(&metrics, "switchyard_tokenizer_loaded", &[]),
        0.0,
        "no limit counts tokens, yet the vocabulary was loaded"
    );
    drop(stack);

    let stack =
        Stack::start(one_provider().tenant(
            "limits: [{name: itpm, dimension: inputTokens, amount: 100000000, period: 60s}]",
        ))
        .await;
    let metrics = stack.metrics().await;
    assert_eq!(
        metric(&metrics, "switchyard_tokenizer_loaded", &[]),
        1.0,
        "ready with a token limit, but the vocabulary is not loaded"
    );
}
