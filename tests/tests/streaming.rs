//! Streaming end to end: failover before content, errors after content, first-token timeouts,
//! client aborts, and p2c in-flight accounting (issue 4 "Must show"; field cases 18, 19, 21, 24).
//!
//! Scale: the first-token timeout of case 21 is 500 ms instead of 2 s (keep-alives every 100 ms
//! instead of 1 s, deadline 1.2 s instead of 20 s); P-B's 300 ms TTFT and the ±200 ms switch
//! tolerance are kept. Case 24 runs 1,200 requests at 200 ms latency instead of 12,000 over 40
//! minutes at 1 s, in two phases: the spread is judged on a phase with cancellations and instant
//! answers but no upstream errors (with errors at a density a short run can show, the error
//! penalty's 10 s memory, not the balancer, decides the split), and in-flight honesty on a phase
//! with all three kinds of fault.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{
    Policy, Provider, Setup, Stack, availability_of, chat_body, histogram, messages_body, serial,
};
use serde_json::json;
use switchyard_mock::{CallRecord, Fault, FaultRule, FaultSet, StreamError};
use tokio::time::Instant;

const MODEL: &str = "e2e-chat";
const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn pair(a: Provider, b: Provider, policy_extra: &[(&str, &str)]) -> Setup {
    let mut policy = Policy::chat(MODEL, &[&a.name, &b.name]);
    for (k, v) in policy_extra {
        policy = policy.set(k, v);
    }
    Setup::new().provider(a).provider(b).policy(policy)
}

fn faults(f: Fault) -> impl FnOnce(&mut switchyard_mock::MockConfig) {
    move |m| m.faults = FaultSet::fail_all(f)
}

fn before_content(error: StreamError) -> Fault {
    Fault::StreamErrorBeforeContent { error }
}

// ---------------------------------------------------------------------------------------------
// Failover before content (must show; field case 18)
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_failing_before_content_is_served_by_next_provider_as_one_clean_stream() {
    let _g = serial().await;
    let stack = Stack::start(pair(
        Provider::openai("p1").mock(faults(before_content(StreamError::Overloaded))),
        Provider::openai("p2"),
        &[],
    ))
    .await;
    let s = stack
        .stream(CHAT, Some("proj"), chat_body(MODEL, "hi", true))
        .await;
    assert_eq!(s.status, 200, "{}", s.describe());
    assert_eq!(s.provider().as_deref(), Some("p2"), "{}", s.describe());
    assert_eq!(s.openai_role_chunks(), 1, "{}", s.describe());
    assert!(s.error_payloads().is_empty(), "{}", s.describe());
    assert_eq!(s.openai_finish_reasons(), vec!["stop"], "{}", s.describe());
    assert_eq!(s.openai_content_chunks(), 16, "{}", s.describe());
    assert!(s.has_done(), "{}", s.describe());
    let ids = histogram(
        s.payloads()
            .iter()
            .filter_map(|v| v["id"].as_str().map(str::to_owned)),
    );
    assert_eq!(
        ids.len(),
        1,
        "chunks from more than one completion: {ids:?}"
    );
    assert_eq!(stack.mock("p1").call_count(), 1);
    assert_eq!(stack.mock("p2").call_count(), 1);
}

/// Case 18, Anthropic format: `message_start`, `ping`, then `event: error` from P-A; P-B
/// (TTFT 300 ms) serves the whole stream.
async fn case_18_run(error: StreamError) {
    let mut stack = Stack::start(pair(
        Provider::anthropic("p-a").mock(faults(before_content(error))),
        Provider::anthropic("p-b").mock(|m| m.ttft_ms = 300),
        &[("availability", "{interval: 1s}")],
    ))
    .await;
    stack.reset_mocks();
    let sent = stack.since_epoch();
    let s = stack
        .stream(MESSAGES, Some("proj"), messages_body(MODEL, "hi", true))
        .await;
    assert_eq!(s.status, 200, "{}", s.describe());
    assert_eq!(s.provider().as_deref(), Some("p-b"), "{}", s.describe());
    assert_eq!(s.anthropic_count("message_start"), 1, "{}", s.describe());
    assert_eq!(s.anthropic_count("error"), 0, "{}", s.describe());
    assert_eq!(s.anthropic_count("message_stop"), 1, "{}", s.describe());
    assert!(
        s.anthropic_count("ping") <= 1,
        "P-A's ping reached the client: {}",
        s.describe()
    );
    assert!(!s.anthropic_text().is_empty(), "{}", s.describe());
    let a = &stack.mock("p-a").calls()[0];
    let a_failed = a.finished_at.expect("p-a finished") - sent;
    let first = s.first_content_at().expect("content");
    let bound = a_failed + Duration::from_millis(400);
    assert!(
        first <= bound,
        "first content at {first:?}; P-A failed at {a_failed:?}, P-B TTFT 300 ms: bound {bound:?}"
    );
    // P-A's attempt counts as a provider failure: its availability drops after one interval.
    let t0 = Instant::now();
    loop {
        let a = availability_of(&stack.status().await, "p-a").unwrap_or(1.0);
        if a < 1.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "P-A's in-stream {error:?} was not counted as a failure (availability still {a})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_18_overload_inside_200_stream_fails_over_cleanly() {
    let _g = serial().await;
    case_18_run(StreamError::Overloaded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_18_insufficient_quota_inside_200_stream_fails_over_cleanly() {
    let _g = serial().await;
    case_18_run(StreamError::InsufficientQuota).await;
}

// ---------------------------------------------------------------------------------------------
// Field case 19: nothing can serve → HTTP error; partial output → one error event.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_19a_nothing_can_serve_gives_http_503_without_sse_framing() {
    let _g = serial().await;
    let f = || faults(before_content(StreamError::Overloaded));
    for (a, b, path, body) in [
        (
            Provider::openai("p-a").mock(f()),
            Provider::openai("p-b").mock(f()),
            CHAT,
            chat_body(MODEL, "hi", true),
        ),
        (
            Provider::anthropic("p-a").mock(f()),
            Provider::anthropic("p-b").mock(f()),
            MESSAGES,
            messages_body(MODEL, "hi", true),
        ),
    ] {
        let stack = Stack::start(pair(a, b, &[])).await;
        let s = stack.stream(path, Some("proj"), body).await;
        assert_eq!(s.status, 503, "{path}: {}", s.describe());
        let ct = common::header(&s.headers, "content-type").unwrap_or_default();
        assert!(
            ct.starts_with("application/json"),
            "{path}: content-type {ct}"
        );
        assert!(
            !s.raw.contains("data:"),
            "{path}: SSE framing in an error: {}",
            s.raw
        );
        let v: serde_json::Value = serde_json::from_str(&s.raw)
            .unwrap_or_else(|e| panic!("{path}: error body not JSON ({e}): {}", s.raw));
        assert!(v["error"].is_object(), "{path}: {v}");
        if path == MESSAGES {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
        }
        assert_eq!(stack.mock("p-a").call_count(), 1, "{path}");
        assert_eq!(stack.mock("p-b").call_count(), 1, "{path}");
    }

    // One of the two gave a Retry-After (P-A: HTTP 529 with `Retry-After: 2`): the client's 503
    // carries one too.
    let stack = Stack::start(pair(
        Provider::anthropic("p-a").mock(faults(Fault::Overloaded {
            status: 529,
            retry_after: Some(2),
        })),
        Provider::anthropic("p-b").mock(f()),
        &[],
    ))
    .await;
    let s = stack
        .stream(MESSAGES, Some("proj"), messages_body(MODEL, "hi", true))
        .await;
    assert_eq!(s.status, 503, "{}", s.describe());
    let ra = common::header(&s.headers, "retry-after").unwrap_or_else(|| {
        panic!(
            "503 without Retry-After though P-A sent one: {}",
            s.describe()
        )
    });
    let ra: u64 = ra
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After {ra:?} is not seconds"));
    assert!(ra >= 1, "Retry-After {ra}");
}

fn cut_after_20() -> impl FnOnce(&mut switchyard_mock::MockConfig) {
    |m| {
        m.output_tokens = 40;
        m.faults = FaultSet::fail_all(Fault::CutMidStream { after_deltas: 20 });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_19b_cut_after_content_gives_one_error_event_and_no_retry() {
    let _g = serial().await;
    // OpenAI dialect.
    let stack = Stack::start(pair(
        Provider::openai("p-a").mock(cut_after_20()),
        Provider::openai("p-b"),
        &[],
    ))
    .await;
    let s = stack
        .stream(CHAT, Some("proj"), chat_body(MODEL, "hi", true))
        .await;
    assert_eq!(s.status, 200, "{}", s.describe());
    // Every payload is exactly one JSON object (payloads() panics otherwise).
    assert_eq!(s.openai_content_chunks(), 20, "{}", s.describe());
    let errors = s.error_payloads();
    assert_eq!(errors.len(), 1, "{}", s.describe());
    let last_content = s
        .payloads()
        .iter()
        .rposition(|v| v["choices"][0]["delta"]["content"].is_string())
        .unwrap();
    let error_at = s
        .payloads()
        .iter()
        .position(|v| v.get("error").is_some())
        .unwrap();
    assert!(
        error_at > last_content,
        "error event before the content: {}",
        s.describe()
    );
    assert!(
        !s.openai_finish_reasons().iter().any(|f| f == "stop"),
        "a cut stream claims success: {}",
        s.describe()
    );
    assert_eq!(
        stack.mock("p-b").call_count(),
        0,
        "retried after content reached the client"
    );
    assert_eq!(stack.mock("p-a").call_count(), 1);

    // Anthropic dialect.
    let stack = Stack::start(pair(
        Provider::anthropic("p-a").mock(cut_after_20()),
        Provider::anthropic("p-b"),
        &[],
    ))
    .await;
    let s = stack
        .stream(MESSAGES, Some("proj"), messages_body(MODEL, "hi", true))
        .await;
    assert_eq!(s.status, 200, "{}", s.describe());
    let _ = s.payloads();
    assert_eq!(
        s.anthropic_count("content_block_delta"),
        20,
        "{}",
        s.describe()
    );
    assert_eq!(s.anthropic_count("error"), 1, "{}", s.describe());
    assert_eq!(s.anthropic_count("message_stop"), 0, "{}", s.describe());
    let names = s.anthropic_event_names();
    assert_eq!(names.last().map(String::as_str), Some("error"), "{names:?}");
    assert_eq!(
        stack.mock("p-b").call_count(),
        0,
        "retried after content reached the client"
    );
}

// ---------------------------------------------------------------------------------------------
// Client abort (must show; field case 17 a/b timing)
// ---------------------------------------------------------------------------------------------

/// Polls the mock until its first call is marked cancelled; returns it.
async fn wait_cancelled(stack: &Stack, mock: &str, within: Duration) -> CallRecord {
    let t0 = Instant::now();
    loop {
        if let Some(c) = stack.mock(mock).calls().first()
            && c.cancelled_at.is_some()
        {
            return c.clone();
        }
        assert!(
            t0.elapsed() < within,
            "{mock}'s call not cancelled within {within:?}: {:?}",
            stack.mock(mock).calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_abort_mid_stream_cancels_upstream_within_1s() {
    let _g = serial().await;
    let stack = Stack::start(pair(
        Provider::openai("p1").mock(|m| {
            m.output_tokens = 400;
            m.tokens_per_sec = 20.0;
        }),
        Provider::openai("p2"),
        &[],
    ))
    .await;
    let resp = stack
        .post(CHAT)
        .header(common::PROJECT_HEADER, "proj")
        .json(&chat_body(MODEL, "hi", true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    // Read until some content arrived, then hang up.
    while !seen.contains("token2") {
        let chunk = futures::StreamExt::next(&mut body).await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(body);
    let dropped = stack.since_epoch();
    let c = wait_cancelled(&stack, "p1", Duration::from_secs(3)).await;
    let lag = c.cancelled_at.unwrap().saturating_sub(dropped);
    assert!(
        lag <= Duration::from_secs(1),
        "upstream cancelled {lag:?} after the client left"
    );
    assert!(c.tokens_streamed < 400, "upstream ran to the end: {c:?}");
    assert_eq!(
        stack.mock("p2").call_count(),
        0,
        "a client abort was retried: {c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_abort_before_first_byte_cancels_upstream_within_1s() {
    let _g = serial().await;
    let stack = Stack::start(pair(
        Provider::openai("p1").mock(|m| m.ttft_ms = 5000),
        Provider::openai("p2"),
        &[("fallback", "{firstTokenTimeout: 30s}")],
    ))
    .await;
    for stream in [true, false] {
        let index = stack.mock("p1").call_count();
        let req = stack
            .post(CHAT)
            .header(common::PROJECT_HEADER, "proj")
            .json(&chat_body(MODEL, "hi", stream));
        // Give up after 300 ms: the future (and its connection) is dropped.
        let r = tokio::time::timeout(Duration::from_millis(300), async move {
            let resp = req.send().await?;
            resp.bytes().await
        })
        .await;
        assert!(
            r.is_err(),
            "stream={stream}: answered before the client gave up"
        );
        let dropped = stack.since_epoch();
        let t0 = Instant::now();
        let c = loop {
            let calls = stack.mock("p1").calls();
            if let Some(c) = calls.get(index)
                && c.cancelled_at.is_some()
            {
                break c.clone();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "stream={stream}: upstream not cancelled: {calls:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let lag = c.cancelled_at.unwrap().saturating_sub(dropped);
        assert!(
            lag <= Duration::from_secs(1),
            "stream={stream}: cancelled {lag:?} after abort"
        );
        assert_eq!(c.tokens_streamed, 0, "{c:?}");
    }
    assert_eq!(
        stack.mock("p2").call_count(),
        0,
        "a client abort was retried"
    );
}

// ---------------------------------------------------------------------------------------------
// Field case 21: the first-token deadline is real, and keep-alives do not count as tokens.
// ---------------------------------------------------------------------------------------------

async fn case_21_run(variant: &str, fault: Fault) {
    let mut stack = Stack::start(pair(
        Provider::openai("p-a").mock(faults(fault)),
        Provider::openai("p-b").mock(|m| m.ttft_ms = 300),
        &[
            ("fallback", "{firstTokenTimeout: 500ms}"),
            ("deadline", "5s"),
        ],
    ))
    .await;
    stack.reset_mocks();
    let s = stack
        .stream(CHAT, Some("proj"), chat_body(MODEL, "hi", true))
        .await;
    assert_eq!(s.status, 200, "({variant}) {}", s.describe());
    assert_eq!(
        s.provider().as_deref(),
        Some("p-b"),
        "({variant}) {}",
        s.describe()
    );
    assert_eq!(s.openai_role_chunks(), 1, "({variant}) {}", s.describe());
    assert!(
        s.openai_content_chunks() > 0,
        "({variant}) {}",
        s.describe()
    );
    let a = stack.mock("p-a").calls()[0].clone();
    let b = stack.mock("p-b").calls()[0].clone();
    let switch = b.at - a.at;
    // The router's 500 ms run from before it sends; the mock stamps P-A's start when the request
    // arrives, a few ms later on a loaded machine (seen: 495 ms at load 8), hence 450 ms.
    assert!(
        switch >= Duration::from_millis(450) && switch <= Duration::from_millis(700),
        "({variant}) switched to P-B {switch:?} after P-A's start; timeout is 500 ms (-50/+200 ms)"
    );
    let closed = a
        .cancelled_at
        .unwrap_or_else(|| panic!("({variant}) P-A never closed: {a:?}"));
    assert!(
        closed.saturating_sub(b.at) <= Duration::from_millis(200),
        "({variant}) P-A closed at {closed:?}, switch at {:?}",
        b.at
    );
    let first = s.first_content_at().unwrap();
    assert!(
        first <= Duration::from_millis(1100),
        "({variant}) first content at {first:?}, expected by 0.5 s + 0.3 s TTFT + 0.3 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_21a_headers_then_silence_switches_at_first_token_timeout() {
    let _g = serial().await;
    case_21_run("a", Fault::HangAfterHeaders).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_21b_keep_alives_do_not_reset_first_token_timeout() {
    let _g = serial().await;
    case_21_run("b", Fault::HangKeepAlive { interval_ms: 100 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_21c_no_headers_switches_at_first_token_timeout() {
    let _g = serial().await;
    case_21_run("c", Fault::HangNoHeaders).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_21_all_providers_keep_alive_only_ends_at_request_deadline() {
    let _g = serial().await;
    let keep_alive = || faults(Fault::HangKeepAlive { interval_ms: 100 });
    let mut stack = Stack::start(
        Setup::new()
            .provider(Provider::openai("p-a").mock(keep_alive()))
            .provider(Provider::openai("p-b").mock(keep_alive()))
            .provider(Provider::openai("p-c").mock(keep_alive()))
            .policy(
                Policy::chat(MODEL, &["p-a", "p-b", "p-c"])
                    .set("fallback", "{firstTokenTimeout: 500ms, maxAttempts: 16}")
                    .set("deadline", "1200ms"),
            ),
    )
    .await;
    stack.reset_mocks();
    let sent = stack.since_epoch();
    let s = stack
        .stream(CHAT, Some("proj"), chat_body(MODEL, "hi", true))
        .await;
    assert_ne!(s.status, 200, "{}", s.describe());
    assert!(
        s.status == 504 || s.raw.to_lowercase().contains("deadline"),
        "not a deadline error: {}",
        s.describe()
    );
    assert!(
        s.elapsed >= Duration::from_millis(1000) && s.elapsed <= Duration::from_millis(1700),
        "deadline error after {:?}, deadline 1.2 s",
        s.elapsed
    );
    let deadline = sent + Duration::from_millis(1200);
    for m in ["p-a", "p-b", "p-c"] {
        for c in stack.mock(m).calls() {
            assert!(
                c.at < deadline,
                "{m}: attempt started at {:?} after the deadline",
                c.at
            );
        }
    }
    // Every upstream attempt is closed within 1 s of the client's answer.
    let t0 = Instant::now();
    loop {
        let open: Vec<_> = ["p-a", "p-b", "p-c"]
            .iter()
            .flat_map(|m| stack.mock(m).calls())
            .filter(|c| c.finished_at.is_none())
            .collect();
        if open.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "attempts still open 1 s after the deadline error: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Field case 24: p2c keeps honest in-flight counts across endpoints, cancellations, errors.
// ---------------------------------------------------------------------------------------------

const P2C: [&str; 4] = ["p-e1", "p-e2", "p-e3", "p-e4"];

/// 1 in 8 answers at once (the "instant" answers); the rest take 200 ms. The latency is long
/// next to scheduling noise on a loaded 2-core machine (tens of ms): peak-EWMA keeps a slow
/// sample for about its 10 s time constant, so with 20 ms answers one descheduled request would
/// skew a short run.
fn p2c_timing(seed: u64) -> FaultSet {
    FaultSet {
        seed,
        rules: vec![FaultRule::probability(0.875, Fault::Latency { ms: 200 })],
        ..FaultSet::default()
    }
}

/// Sends `total` requests, `concurrency` at a time, alternating embeddings and rerank; every
/// request with `i % cancel_every == 3` is abandoned by its client after 5 ms. Returns the
/// number of abandoned requests.
async fn p2c_traffic(stack: &Stack, first: usize, total: usize, cancel_every: usize) -> usize {
    let concurrency = 16;
    let mut cancelled = 0;
    let mut next = first;
    while next < first + total {
        let batch: Vec<_> = (next..(next + concurrency).min(first + total))
            .map(|i| async move {
                let (path, body) = if i % 2 == 0 {
                    (
                        "/v1/embeddings",
                        json!({"model": "e2e-embed", "input": format!("text {i}")}),
                    )
                } else {
                    (
                        "/v1/rerank",
                        json!({"model": "e2e-rerank", "query": "q", "documents": ["a", "b", "c"]}),
                    )
                };
                let req = stack.post(path).json(&body);
                if i % cancel_every == 3 {
                    // A client that gives up mid-request.
                    let r = tokio::time::timeout(Duration::from_millis(5), req.send()).await;
                    return r.is_err();
                }
                let r = common::send(req).await;
                assert!(
                    r.status == 200 || r.status >= 500,
                    "request {i}: {} {}",
                    r.status,
                    r.body
                );
                false
            })
            .collect();
        cancelled += futures::future::join_all(batch)
            .await
            .into_iter()
            .filter(|c| *c)
            .count();
        next += concurrency;
    }
    cancelled
}

/// After a drain, every in-flight count reads 0: the mocks' and the router's gauges.
async fn assert_in_flight_zero(stack: &Stack) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in P2C {
        assert_eq!(stack.mock(n).stats().in_flight, 0, "{n} still busy");
    }
    let metrics = stack.metrics().await;
    let in_flight: Vec<(String, f64)> = metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let name = l
                .split(['{', ' '])
                .next()
                .unwrap_or_default()
                .to_lowercase();
            name.contains("in_flight") || name.contains("inflight")
        })
        .map(|l| {
            let v = l.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
            (l.to_owned(), v)
        })
        .collect();
    assert!(
        !in_flight.is_empty(),
        "no in-flight gauge in /metrics:\n{metrics}"
    );
    for (line, v) in &in_flight {
        assert!(*v >= 0.0, "negative in-flight gauge: {line}");
        assert!(
            *v == 0.0,
            "in-flight gauge not back to 0 after drain: {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_24_p2c_spreads_evenly_and_in_flight_returns_to_zero() {
    let _g = serial().await;
    let mut setup = Setup::new();
    for (i, n) in P2C.into_iter().enumerate() {
        setup = setup.provider(
            Provider::openai(n)
                .models(&[("e2e-embed", "embedding"), ("e2e-rerank", "rerank")])
                .mock(|m| m.faults = p2c_timing(i as u64)),
        );
    }
    let mut stack = Stack::start(
        setup
            .policy(Policy::embedding("e2e-embed", &P2C))
            .policy(Policy::rerank("e2e-rerank", &P2C)),
    )
    .await;

    // Phase 1, spread: 800 requests over both endpoints with instant answers and 1 in 20
    // clients cancelling. Each provider gets 25 % ± 5 points of the upstream calls, and none
    // more than 40 % of any 100 consecutive calls (the scaled "1-minute bucket").
    let cancelled = p2c_traffic(&stack, 0, 800, 20).await;
    assert!(
        cancelled >= 20,
        "only {cancelled} client cancellations happened"
    );
    assert_in_flight_zero(&stack).await;
    let mut calls: Vec<(Duration, &str)> = P2C
        .iter()
        .flat_map(|n| stack.mock(n).calls().into_iter().map(move |c| (c.at, *n)))
        .collect();
    calls.sort();
    let counts = histogram(calls.iter().map(|(_, n)| (*n).to_owned()));
    let all = calls.len() as f64;
    for n in P2C {
        let share = counts.get(n).copied().unwrap_or(0) as f64 / all;
        assert!(
            (share - 0.25).abs() <= 0.05,
            "{n} got {share:.3} of {all} calls: {counts:?}"
        );
        // Both endpoints move the same provider counters, and both reach every provider.
        assert!(
            stack.calls_on(n, "/v1/embeddings") > 0,
            "{n}: no embeddings"
        );
        assert!(stack.calls_on(n, "/v1/rerank") > 0, "{n}: no rerank");
    }
    for (i, bucket) in calls
        .chunks(100)
        .enumerate()
        .filter(|(_, b)| b.len() == 100)
    {
        let h = histogram(bucket.iter().map(|(_, n)| (*n).to_owned()));
        let max = h.values().max().copied().unwrap_or(0);
        assert!(max <= 40, "bucket {i}: {h:?}");
    }

    // Phase 2, honesty under faults: 1 in 8 answers is a 500 and 1 in 8 clients cancels. The
    // spread is not judged here (the error penalty's 10 s memory outlasts a 5 s run); the counts
    // must still return to exactly zero.
    stack.reset_mocks();
    for (i, n) in P2C.into_iter().enumerate() {
        let mut f = p2c_timing(100 + i as u64);
        f.error_rate = Some(switchyard_mock::ErrorRate {
            fraction: 0.125,
            fault: Fault::ServerError { status: 500 },
        });
        stack.mock(n).set_faults(f);
    }
    let cancelled = p2c_traffic(&stack, 800, 400, 8).await;
    assert!(
        cancelled >= 25,
        "only {cancelled} client cancellations happened"
    );
    let errors: usize = P2C
        .iter()
        .map(|n| {
            stack
                .mock(n)
                .calls()
                .iter()
                .filter(|c| c.status == 500)
                .count()
        })
        .sum();
    assert!(errors >= 20, "only {errors} upstream errors happened");
    assert_in_flight_zero(&stack).await;
}
