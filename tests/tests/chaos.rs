//! The broker under faults (issue 14), against a real `redis-server` and real router
//! processes: random client aborts timed around the reservation, `kill -9` of a replica,
//! SIGSTOP/SIGCONT of Redis, a Redis restart. After each fault every concurrency slot is free
//! again within 5 s of the fault ending, and the ledgers agree with the provider: the tenant
//! that never aborts is charged exactly what its provider reported, and for the tenant that
//! aborts, Redis holds exactly what the routers' ledger lines charged (no reservation leaked,
//! none settled twice). Also here: charges of cut requests (a non-streamed answer whose client
//! left during the body read is cancelled upstream and charged a marked estimate; tokens
//! billed by a failed attempt) and
//! `spec.timeouts.firstToken`.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{KEY, Policy, Provider, Setup, Stack, chat_body, send, serial};
use futures::StreamExt as _;
use switchyard_testkit::RedisServer;
use tokio::time::Instant;

const FLAKY_KEY: &str = "sk-flaky";
const STEADY: &str = "tenant=\"e2e/e2e-tenant\"";
const FLAKY: &str = "tenant=\"e2e/flaky\"";

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

async fn metrics_of(http: &reqwest::Client, base: &str) -> String {
    send(http.get(format!("{base}/metrics"))).await.body
}

/// What the routers at `bases` charged `tenant`: input (all three input kinds) and output,
/// in total and for lines marked `source="estimated"`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Charged {
    input: f64,
    output: f64,
    estimated_input: f64,
    estimated_output: f64,
}

async fn charged(http: &reqwest::Client, bases: &[String], tenant: &str) -> Charged {
    let mut c = Charged::default();
    for base in bases {
        let text = metrics_of(http, base).await;
        let m = |kind: &str, extra: &[&str]| {
            let k = format!("kind=\"{kind}\"");
            let mut needles = vec![tenant, k.as_str()];
            needles.extend_from_slice(extra);
            metric(&text, "switchyard_tenant_charged", &needles)
        };
        let est = ["source=\"estimated\""];
        c.input += m("input_uncached", &[]) + m("cache_read", &[]) + m("cache_write", &[]);
        c.output += m("output", &[]);
        c.estimated_input +=
            m("input_uncached", &est) + m("cache_read", &est) + m("cache_write", &est);
        c.estimated_output += m("output", &est);
    }
    c
}

/// What a provider's mock reported: (input, output) summed over its calls with usage.
fn reported(stack: &Stack, provider: &str) -> (f64, f64) {
    let calls = stack.mock(provider).calls();
    let input: u64 = calls
        .iter()
        .filter_map(|c| c.usage.as_ref())
        .map(|u| u.prompt_tokens)
        .sum();
    let output: u64 = calls
        .iter()
        .filter_map(|c| c.usage.as_ref())
        .map(|u| u.output_tokens)
        .sum();
    (input as f64, output as f64)
}

async fn redis_conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Concurrency slots taken in Redis right now (members not yet expired, by Redis's clock).
async fn live_slots(redis: &RedisServer) -> i64 {
    let mut conn = redis_conn(redis).await;
    redis::Script::new(
        "local t = redis.call('TIME') local now = t[1] * 1000000 + t[2] local n = 0 \
         for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
           n = n + redis.call('ZCOUNT', k, '(' .. now, '+inf') end return n",
    )
    .arg("{switchyard}:c:*")
    .invoke_async(&mut conn)
    .await
    .unwrap()
}

/// Units used in the current window of the fixed-window bucket whose key contains `needle`
/// (0 when Redis has no such bucket).
async fn window_used(redis: &RedisServer, needle: &str) -> f64 {
    let mut conn = redis_conn(redis).await;
    let all: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("{switchyard}:buckets")
        .query_async(&mut conn)
        .await
        .unwrap();
    let hits: Vec<(&String, &String)> = all.iter().filter(|(k, _)| k.contains(needle)).collect();
    assert!(hits.len() <= 1, "{needle}: {hits:?}");
    hits.first().map_or(0.0, |(_, v)| {
        // 'W,capacity,period,used,epoch,end'
        v.split(',').nth(3).unwrap().parse::<f64>().unwrap()
    })
}

/// Waits until no concurrency slot is taken in Redis; returns how long that took. Fails
/// after `limit`.
async fn slots_free_within(redis: &RedisServer, limit: Duration, what: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let n = live_slots(redis).await;
        if n == 0 {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: {n} slots still taken {limit:?} after the fault ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Mixed traffic until `stop`: one request in four from the steady tenant (never aborts,
/// reads everything), the rest from the flaky tenant, which gives up 0–12 ms after sending
/// (around its reservation), after the first chunk, or never. Streams and whole answers mixed.
/// Returns outcome counts.
async fn traffic(
    http: reqwest::Client,
    bases: Vec<String>,
    workers: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, usize> {
    let mut tasks = Vec::new();
    for w in 0..workers {
        let http = http.clone();
        let bases = bases.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (seed << 8) ^ w;
            let mut roll = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut out = BTreeMap::<String, usize>::new();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let r = roll();
                n += 1;
                let base = &bases[(w as usize + n) % bases.len()];
                let steady = r % 4 == 0;
                let stream = (r >> 3) % 2 == 0;
                let (model, key) = if steady {
                    ("steady", KEY)
                } else {
                    ("flaky", FLAKY_KEY)
                };
                let req = http
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(key)
                    .json(&chat_body(model, &format!("question {}", r % 89), stream));
                let mode = if steady { 2 } else { (r >> 8) % 3 };
                let outcome = match mode {
                    0 => {
                        let after = Duration::from_millis((r >> 16) % 13);
                        match tokio::time::timeout(after, req.send()).await {
                            Err(_) => "aborted_early".to_owned(),
                            Ok(Ok(resp)) => format!("{} early", resp.status().as_u16()),
                            Ok(Err(_)) => "transport_error".to_owned(),
                        }
                    }
                    1 => match req.send().await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let mut body = resp.bytes_stream();
                            let _ = body.next().await;
                            format!("{status} cut")
                        }
                        Err(_) => "transport_error".to_owned(),
                    },
                    _ => match req.send().await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            match resp.bytes().await {
                                Ok(_) => {
                                    format!("{} {status}", if steady { "steady" } else { "flaky" })
                                }
                                Err(_) => "transport_error".to_owned(),
                            }
                        }
                        Err(_) => "transport_error".to_owned(),
                    },
                };
                *out.entry(outcome).or_default() += 1;
            }
            out
        }));
    }
    let mut all = BTreeMap::new();
    for t in tasks {
        for (k, v) in t.await.unwrap() {
            *all.entry(k).or_default() += v;
        }
    }
    all
}

/// Runs [`traffic`] while `fault` runs, stops it when `fault` returns, and returns the outcomes.
async fn during<F: std::future::Future<Output = ()>>(
    stack: &Stack,
    bases: &[String],
    seed: u64,
    fault: F,
) -> BTreeMap<String, usize> {
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(traffic(
        stack.http.clone(),
        bases.to_vec(),
        12,
        seed,
        stop.clone(),
    ));
    fault.await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap()
}

fn chaos_setup(redis: &RedisServer) -> Setup {
    let limits = |slots: u32| {
        format!(
            "limits: [{{name: slots, dimension: concurrency, amount: {slots}, rule: concurrency}}, \
             {{name: itok-day, dimension: inputTokens, amount: 1000000000, rule: fixedWindow, period: 24h}}, \
             {{name: otok-day, dimension: outputTokens, amount: 1000000000, rule: fixedWindow, period: 24h}}]"
        )
    };
    let flaky_tenant = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: TenantQuota\nmetadata: {{name: flaky, namespace: {ns}}}\nspec:\n  apiKeys: [{{name: k, secretRef: {{name: e2e-keys, key: flaky}}}}]\n  {}",
        limits(8),
        ns = common::NAMESPACE
    );
    let tokens = |n: u64, per_sec: f64| {
        move |m: &mut switchyard_mock::MockConfig| {
            m.output_tokens = n;
            m.tokens_per_sec = per_sec;
            m.record_limit = 50_000;
        }
    };
    Setup::new()
        .provider(
            Provider::anthropic("p-steady")
                .models(&[("steady", "text")])
                .mock(tokens(12, 600.0)),
        )
        .provider(
            Provider::anthropic("p-flaky")
                .models(&[("flaky", "text")])
                .mock(tokens(20, 300.0)),
        )
        .provider(
            Provider::anthropic("p-slow")
                .models(&[("slow", "text")])
                .mock(tokens(60, 10.0)),
        )
        .policy(Policy::chat("steady", &["p-steady"]))
        .policy(Policy::chat("flaky", &["p-flaky"]))
        .policy(Policy::chat("slow", &["p-slow"]))
        .tenant(&limits(32))
        .key("flaky", FLAKY_KEY)
        .doc(&flaky_tenant)
        .env("SWITCHYARD_REDIS_URL", &redis.url())
        .env("SWITCHYARD_REPLICAS", "3")
        // Two shared cores and a debug build: long enough that load alone is no outage.
        .env("SWITCHYARD_REDIS_TIMEOUT", "300ms")
        .env("SWITCHYARD_REDIS_SLOT_LEASE", "2s")
}

fn no_server_errors(outcomes: &BTreeMap<String, usize>, phase: &str) {
    assert!(
        outcomes
            .keys()
            .all(|k| !k.contains(" 5") && !k.starts_with("steady 4")),
        "{phase}: {outcomes:?}"
    );
}

/// Every mode gauge says `redis` and nothing waits for replay, on every replica.
async fn all_back_on_redis(http: &reqwest::Client, bases: &[String], within: Duration) {
    let t0 = Instant::now();
    'outer: loop {
        for b in bases {
            let text = metrics_of(http, b).await;
            let on_redis = metric(&text, "switchyard_quota_store_mode", &["mode=\"redis\""]) == 1.0;
            let pending = metric(&text, "switchyard_quota_replay_pending", &[]);
            if !on_redis || pending > 0.0 {
                assert!(
                    t0.elapsed() < within,
                    "{b} not back on redis (pending replays {pending}) within {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'outer;
            }
        }
        return;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_aborts_kill_freeze_restart_leave_no_slot_and_exact_ledgers() {
    let _g = serial().await;
    let mut redis = RedisServer::start().expect("redis-server");
    let stack = Stack::start(chaos_setup(&redis)).await;
    let r2 = stack.spawn_replica(&[]).await;
    let r3 = stack.spawn_replica(&[]).await;
    let all = vec![
        stack.router.base_url.clone(),
        r2.base_url.clone(),
        r3.base_url.clone(),
    ];
    let survivors = all[..2].to_vec();
    let http = stack.http.clone();
    // The test Redis persists nothing while four daily limits are configured: each replica
    // says so at start (and logs a warning).
    let t0 = Instant::now();
    while metric(
        &metrics_of(&http, &all[0]).await,
        "switchyard_quota_unpersisted_limits",
        &[],
    ) != 4.0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no persistence warning"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stack.router.output().contains("Redis persists nothing"));

    // 1. Client aborts around the reservation, on all three replicas, Redis healthy.
    let outcomes = during(&stack, &all, 1, tokio::time::sleep(Duration::from_secs(6))).await;
    no_server_errors(&outcomes, "aborts");
    assert!(
        outcomes.get("aborted_early").copied().unwrap_or(0) > 50,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("steady 200").copied().unwrap_or(0) > 50,
        "{outcomes:?}"
    );
    let took = slots_free_within(&redis, Duration::from_secs(5), "aborts").await;
    eprintln!("aborts: {outcomes:?}; slots free {took:?} after the last abort");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let steady = charged(&http, &all, STEADY).await;
    let (rin, rout) = reported(&stack, "p-steady");
    assert_eq!(
        (steady.input, steady.output),
        (rin, rout),
        "steady charged = reported"
    );
    assert_eq!(
        (steady.estimated_input, steady.estimated_output),
        (0.0, 0.0)
    );
    // Redis's ledger is the routers' ledger: every reservation settled once, none leaked.
    assert_eq!(
        window_used(&redis, "e2e-tenant/itok-day").await,
        steady.input
    );
    assert_eq!(
        window_used(&redis, "e2e-tenant/otok-day").await,
        steady.output
    );
    let flaky = charged(&http, &all, FLAKY).await;
    assert_eq!(
        window_used(&redis, "flaky/itok-day").await,
        flaky.input,
        "flaky input in Redis = flaky input in the ledger lines ({flaky:?})"
    );
    assert_eq!(window_used(&redis, "flaky/otok-day").await, flaky.output);
    // Lines not marked estimated are the provider's own counts: never more than it reported.
    let (fin, fout) = reported(&stack, "p-flaky");
    assert!(
        flaky.input - flaky.estimated_input <= fin,
        "{flaky:?} vs {fin}"
    );
    assert!(
        flaky.output - flaky.estimated_output <= fout,
        "{flaky:?} vs {fout}"
    );

    // 2. kill -9 of a replica holding slots: six slow streams through r3.
    let mut held = Vec::new();
    for i in 0..6 {
        let req = http
            .post(format!("{}/v1/chat/completions", all[2]))
            .bearer_auth(FLAKY_KEY)
            .json(&chat_body("slow", &format!("long {i}"), true));
        held.push(tokio::spawn(async move {
            if let Ok(resp) = req.send().await {
                let mut body = resp.bytes_stream();
                while let Some(Ok(_)) = body.next().await {}
            }
        }));
    }
    let t0 = Instant::now();
    while live_slots(&redis).await < 6 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "slow calls never took their slots"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(r3); // SIGKILL: no settle, no renewal
    let took = slots_free_within(&redis, Duration::from_secs(5), "kill -9").await;
    eprintln!("kill -9: the dead replica's 6 slots free after {took:?}");
    for h in held {
        h.await.unwrap();
    }

    // 3. Redis frozen for 1.5 s under load, then 4. restarted (empty) under load.
    for (phase, seed) in [("freeze", 2u64), ("restart", 3)] {
        let before = charged(&http, &survivors, STEADY).await;
        let (bin, bout) = reported(&stack, "p-steady");
        let outcomes = match phase {
            "freeze" => {
                during(&stack, &survivors, seed, async {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    redis.freeze().unwrap();
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    redis.resume().unwrap();
                })
                .await
            }
            _ => {
                during(&stack, &survivors, seed, async {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    redis.restart().unwrap();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                })
                .await
            }
        };
        no_server_errors(&outcomes, phase);
        let took = slots_free_within(&redis, Duration::from_secs(5), phase).await;
        all_back_on_redis(&http, &survivors, Duration::from_secs(5)).await;
        eprintln!("{phase}: {outcomes:?}; slots free {took:?} after the fault ended");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = charged(&http, &survivors, STEADY).await;
        let (ain, aout) = reported(&stack, "p-steady");
        assert_eq!(
            (after.input - before.input, after.output - before.output),
            (ain - bin, aout - bout),
            "{phase}: steady charged = reported"
        );
        assert_eq!(after.estimated_output, 0.0, "{phase}");
    }

    // Every slot is usable again: 8 flaky requests at once are all admitted.
    let mut burst = Vec::new();
    for i in 0..8 {
        let req = http
            .post(format!("{}/v1/chat/completions", survivors[i % 2]))
            .bearer_auth(FLAKY_KEY)
            .json(&chat_body("flaky", "again", false));
        burst.push(tokio::spawn(send(req)));
    }
    for b in burst {
        let r = b.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

// ---------------------------------------------------------------------------------------------
// Charges of cut requests and failed attempts; per-provider first-token timeout
// ---------------------------------------------------------------------------------------------

const LIMITS: &str = "limits: [{name: itok-day, dimension: inputTokens, amount: 1000000000, rule: fixedWindow, period: 24h}]";

async fn tenant_charged(stack: &Stack) -> Charged {
    charged(
        &stack.http,
        std::slice::from_ref(&stack.router.base_url),
        STEADY,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_answer_whose_client_left_is_cancelled_and_charged_the_marked_estimate() {
    let _g = serial().await;
    // 100 tokens at 100/s: the body arrives about 1 s after the headers.
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| {
                m.output_tokens = 100;
                m.tokens_per_sec = 100.0;
            }))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant(LIMITS),
    )
    .await;
    let req = stack
        .post("/v1/chat/completions")
        .json(&chat_body("e2e-chat", "a question", false));
    let gone = tokio::time::timeout(Duration::from_millis(300), req.send()).await;
    assert!(gone.is_err(), "the client left before the answer");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls = stack.mock("p-a").calls();
    assert_eq!(calls.len(), 1);
    // Field case 17: the provider is told to stop, well before its answer would be done.
    let cancelled = calls[0]
        .cancelled_at
        .expect("the upstream call was cancelled");
    assert!(cancelled < Duration::from_millis(1300), "{:?}", calls[0]);
    assert!(
        calls[0].usage.is_none(),
        "the provider never finished: {:?}",
        calls[0]
    );
    // No usage exists: the input estimate is charged, no output, and both are marked.
    let c = tenant_charged(&stack).await;
    assert!(c.input > 0.0, "{c:?}");
    assert_eq!(c.output, 0.0, "{c:?}");
    assert_eq!(
        (c.estimated_input, c.estimated_output),
        (c.input, 0.0),
        "marked estimated: {c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_billed_by_a_failed_attempt_are_charged_as_their_own_line() {
    use switchyard_mock::{Fault, FaultSet, StreamError};
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::anthropic("p-a").mock(|m| {
                m.faults = FaultSet::fail_all(Fault::StreamErrorBeforeContent {
                    error: StreamError::Overloaded,
                });
            }))
            .provider(Provider::anthropic("p-b"))
            .policy(Policy::chat("e2e-chat", &["p-a", "p-b"]))
            .tenant(LIMITS),
    )
    .await;
    let s = stack
        .stream(
            "/v1/chat/completions",
            Some("proj"),
            chat_body("e2e-chat", "hello there", true),
        )
        .await;
    assert_eq!(s.status, 200, "{}", s.describe());
    assert_eq!(s.provider().as_deref(), Some("p-b"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = stack.mock("p-b").calls()[0].usage.expect("p-b usage");
    let c = tenant_charged(&stack).await;
    // p-a's message_start reported the same prompt (and 1 output token) before failing.
    assert_eq!(c.input, 2.0 * b.prompt_tokens as f64, "{c:?}");
    assert_eq!(c.output, b.output_tokens as f64 + 1.0, "{c:?}");
    assert_eq!(c.estimated_input, 0.0);
    let text = stack.metrics().await;
    assert!(text.contains("source=\"reported\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_first_token_timeout_is_honoured() {
    use switchyard_mock::{Fault, FaultSet};
    let _g = serial().await;
    // The route waits 20 s for first content; p-a's own firstToken is 300 ms.
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::openai("p-a")
                    .mock(|m| m.faults = FaultSet::fail_all(Fault::SlowFirstToken { ms: 3000 }))
                    .with("timeouts: {firstToken: 300ms}"),
            )
            .provider(Provider::openai("p-b"))
            .policy(
                Policy::chat("e2e-chat", &["p-a", "p-b"])
                    .with("fallback: {firstTokenTimeout: 20s}"),
            ),
    )
    .await;
    let t0 = Instant::now();
    let s = stack
        .stream(
            "/v1/chat/completions",
            Some("proj"),
            chat_body("e2e-chat", "hi", true),
        )
        .await;
    let took = t0.elapsed();
    assert_eq!(s.status, 200, "{}", s.describe());
    assert_eq!(s.provider().as_deref(), Some("p-b"), "{}", s.describe());
    assert!(
        took < Duration::from_millis(2500),
        "p-a given up at its own 300 ms, not the route's 20 s nor the 3 s delay: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_key_is_sent_upstream_once_across_two_replicas_on_one_redis() {
    let _g = serial().await;
    let redis = RedisServer::start().expect("redis-server");
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(|m| m.latency_ms = 500))
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .env("SWITCHYARD_REDIS_URL", &redis.url())
            .env("SWITCHYARD_REPLICAS", "2"),
    )
    .await;
    let r2 = stack.spawn_replica(&[]).await;
    let bases = [stack.router.base_url.clone(), r2.base_url.clone()];
    let with_key = |base: &str, key: &str, text: &str| {
        stack
            .http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("Idempotency-Key", key)
            .json(&chat_body("e2e-chat", text, false))
    };
    // The retry lands on the other replica while the first is in flight: it waits and gets
    // the same answer; one upstream call.
    let first = send(with_key(&bases[0], "order-17", "charge my card once"));
    let retry = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        send(with_key(&bases[1], "order-17", "charge my card once")).await
    };
    let (a, b) = tokio::join!(first, retry);
    assert_eq!((a.status, b.status), (200, 200), "{} / {}", a.body, b.body);
    assert_eq!(a.json()["id"], b.json()["id"]);
    assert_eq!(b.headers["x-switchyard-idempotent-replay"], "true");
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 1);
    // Later, on either replica: replayed.
    for base in &bases {
        let c = send(with_key(base, "order-17", "charge my card once")).await;
        assert_eq!(c.status, 200);
        assert_eq!(c.json()["id"], a.json()["id"]);
        assert_eq!(c.headers["x-switchyard-idempotent-replay"], "true");
    }
    // The same key on another request is refused on the other replica too.
    let reused = send(with_key(&bases[1], "order-17", "something else")).await;
    assert_eq!(reused.status, 422, "{}", reused.body);
    assert_eq!(reused.json()["error"]["code"], "idempotency_key_reused");
    assert_eq!(stack.calls_on("p-a", "/v1/chat/completions"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_cap_forwarded_is_the_one_reserved_and_clamped_to_the_context_window() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::openai("p-a")
                    .context_window(600)
                    .mock(|m| m.output_tokens = 1000),
            )
            .policy(Policy::chat("e2e-chat", &["p-a"]))
            .tenant("limits: [{name: otok-day, dimension: outputTokens, amount: 2000, rule: fixedWindow, period: 24h}]"),
    )
    .await;
    let ask = |body: serde_json::Value| stack.post("/v1/chat/completions").json(&body);
    // Two cap fields: 10 is reserved (max_completion_tokens), and only it is forwarded — this
    // mock, like older compatible servers, obeys max_tokens first.
    let r = send(ask(serde_json::json!({"model": "e2e-chat",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 40, "max_completion_tokens": 10})))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = stack.mock("p-a").calls()[0].usage.unwrap();
    assert_eq!(
        usage.output_tokens, 10,
        "the provider obeyed the reserved cap"
    );
    // A "no limit" cap far above the bucket: clamped to the window minus the input, it fits.
    let r = send(ask(serde_json::json!({"model": "e2e-chat",
        "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100000})))
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let out = stack.mock("p-a").calls()[1].usage.unwrap().output_tokens;
    assert!(
        (500..600).contains(&out),
        "clamped to about 600 minus the prompt: {out}"
    );
    let c = tenant_charged(&stack).await;
    assert_eq!(c.output, (10 + out) as f64, "{c:?}");
}
