//! Failover end to end: Retry-After pauses, request errors, retries on one provider, quota
//! groups, the fallback throttle and region allow-lists (issue 4 "Must show"; field cases 1, 2
//! and 25).
//!
//! Times are scaled down from the field cases (seconds instead of tens of seconds) with the
//! structure kept; each test says its scale.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{Policy, Provider, Reply, Setup, Stack, chat_body, histogram, policy_weights, serial};
use switchyard_mock::{Fault, FaultRule, FaultSet};
use tokio::time::Instant;

const MODEL: &str = "e2e-chat";

/// A 429 whose `Retry-After` and `x-ratelimit-reset-requests` agree (a real vendor's 429 carries
/// both; the mock would otherwise report its own one-minute window in the reset header).
fn limited(secs: u64) -> Fault {
    Fault::RateLimited {
        retry_after: Some(secs),
        http_date: false,
        retry_after_ms: None,
        reset_requests: Some(format!("{secs}s")),
        reset_tokens: None,
    }
}

fn once(fault: Fault) -> FaultRule {
    FaultRule::next(1, fault)
}

fn two(p1_faults: FaultSet) -> Setup {
    Setup::new()
        .provider(Provider::openai("p1").mock(|m| m.faults = p1_faults))
        .provider(Provider::openai("p2"))
        .policy(Policy::chat(MODEL, &["p1", "p2"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_429_retry_after_20_fails_over_at_once_and_pauses_provider() {
    let _g = serial().await;
    let stack = Stack::start(two(FaultSet::fail_all(limited(20)))).await;
    let first = stack.chat(MODEL, Some("proj-0")).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.provider().as_deref(), Some("p2"));
    assert_eq!(first.attempts(), Some(2));
    assert!(
        first.elapsed < Duration::from_millis(500),
        "failover waited {:?} instead of moving on at once",
        first.elapsed
    );
    // The failed attempt is logged (at the default level) under the request's context.
    let id = first.headers["x-request-id"].to_str().unwrap().to_owned();
    let log = stack.router.output();
    let line = log
        .lines()
        .find(|l| l.contains("attempt failed") && l.contains(&id))
        .unwrap_or_else(|| panic!("no `attempt failed` line with request id {id}:\n{log}"));
    for field in ["request{route=e2e/", "tenant=", "provider=e2e/p1"] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    // 3 s of traffic, same and fresh projects: nothing reaches p1 while it is paused.
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        i += 1;
        let project = if i % 2 == 0 {
            "proj-0".to_owned()
        } else {
            format!("proj-{i}")
        };
        let r = stack.chat(MODEL, Some(&project)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.provider().as_deref(), Some("p2"), "request {i}");
        assert_eq!(
            r.attempts(),
            Some(1),
            "request {i} tried paused p1: {:?}",
            r.headers
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(i >= 20, "only {i} requests in 3 s");
    assert_eq!(
        stack.mock("p1").call_count(),
        1,
        "p1 calls: {:?}",
        stack.mock("p1").calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_short_retry_after_provider_returns_after_pause() {
    let _g = serial().await;
    let stack = Stack::start(two(FaultSet::rules([once(limited(2))]))).await;
    let first = stack.chat(MODEL, Some("first")).await;
    assert_eq!(first.provider().as_deref(), Some("p2"), "{}", first.body);
    let t0 = Instant::now();
    let mut i = 0;
    let back_at = loop {
        i += 1;
        let r = stack.chat(MODEL, Some(&format!("fresh-{i}"))).await;
        assert_eq!(r.status, 200, "{}", r.body);
        if r.provider().as_deref() == Some("p1") {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "p1 never came back after its 2 s pause"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let calls = stack.mock("p1").calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    let gap = calls[1].at - calls[0].at;
    assert!(
        gap >= Duration::from_secs(2),
        "p1 called again {gap:?} after a Retry-After of 2 s"
    );
    assert!(
        back_at < Duration::from_secs(4),
        "p1 paused for {back_at:?} after Retry-After 2 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_error_400_returned_to_client_and_never_retried() {
    let _g = serial().await;
    let stack = Stack::start(two(FaultSet::fail_all(Fault::InvalidParameter {
        param: "temperature".to_owned(),
        message: Some("temperature must be at most 2".to_owned()),
    })))
    .await;
    let mut body = chat_body(MODEL, "hi", false);
    body["temperature"] = 7.into();
    let r = stack.chat_body(MODEL, Some("proj"), body).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let v = r.json();
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("temperature must be at most 2")),
        "provider's message not passed through: {v}"
    );
    assert_eq!(r.attempts(), Some(1), "{:?}", r.headers);
    assert_eq!(r.provider().as_deref(), Some("p1"));
    assert_eq!(stack.mock("p1").call_count(), 1);
    assert_eq!(stack.mock("p2").call_count(), 0, "a 400 was retried on p2");
    // A streaming request is not retried either, and gets an HTTP error, not an SSE body.
    let mut body = chat_body(MODEL, "hi", true);
    body["temperature"] = 7.into();
    let s = stack
        .stream("/v1/chat/completions", Some("proj"), body)
        .await;
    assert_eq!(s.status, 400, "{}", s.describe());
    assert_eq!(
        stack.mock("p2").call_count(),
        0,
        "a streaming 400 was retried on p2"
    );
}

// ---------------------------------------------------------------------------------------------
// Field case 1: each retry honours the Retry-After of the response it just got.
// Scale: 5 s, 15 s, 40 s → 1 s, 2 s, 3 s; deadline 300 s → 30 s (30 s → 2 s in the deadline run).
// ---------------------------------------------------------------------------------------------

fn case_01_setup(rules: Vec<FaultRule>, deadline: &str) -> Setup {
    Setup::new()
        .provider(Provider::openai("p-a").mock(|m| m.faults = FaultSet::rules(rules)))
        .policy(
            Policy::chat(MODEL, &["p-a"])
                .set("fallback", "{sameProviderRetries: 3, maxAttempts: 4}")
                .set("deadline", deadline),
        )
}

/// A non-streaming chat with a ~2 KB body.
async fn two_kb_request(stack: &Stack) -> Reply {
    let text = "lorem ipsum dolor sit amet ".repeat(75);
    stack
        .chat_body(MODEL, Some("proj"), chat_body(MODEL, &text, false))
        .await
}

/// Gaps between consecutive calls to a mock.
fn gaps(stack: &Stack, mock: &str) -> Vec<Duration> {
    let calls = stack.mock(mock).calls();
    calls.windows(2).map(|w| w[1].at - w[0].at).collect()
}

/// `gap` is at least `want` and at most 10 % (+250 ms of scheduling) above it.
fn assert_gap(gap: Duration, want: Duration, what: &str) {
    assert!(
        gap >= want,
        "{what}: retried after {gap:?}, before the advertised {want:?}"
    );
    let max = want.mul_f64(1.1) + Duration::from_millis(250);
    assert!(
        gap <= max,
        "{what}: waited {gap:?}, more than {max:?} for an advertised {want:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_01_each_retry_honours_retry_after_of_its_response() {
    let _g = serial().await;
    let rules = vec![once(limited(1)), once(limited(2)), once(limited(3))];
    let stack = Stack::start(case_01_setup(rules, "30s")).await;
    let r = two_kb_request(&stack).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        stack.mock("p-a").call_count(),
        4,
        "{:?}",
        stack.mock("p-a").calls()
    );
    let g = gaps(&stack, "p-a");
    for (i, want) in [1, 2, 3].into_iter().enumerate() {
        assert_gap(g[i], Duration::from_secs(want), &format!("gap {}", i + 1));
    }
    assert!(
        r.elapsed >= Duration::from_secs(6),
        "client answered after {:?}",
        r.elapsed
    );
    assert_eq!(r.attempts(), Some(4), "{:?}", r.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_01_variant_h_http_date_and_reset_header_are_parsed() {
    let _g = serial().await;
    // Attempt 2: Retry-After as an HTTP-date 3 s ahead (1 s resolution: 2..=4 s accepted, the
    // case's ±1 s). Attempt 3: no Retry-After, only `x-ratelimit-reset-requests: 2s`.
    let rules = vec![
        once(limited(1)),
        once(Fault::RateLimited {
            retry_after: Some(3),
            http_date: true,
            retry_after_ms: None,
            reset_requests: Some("3s".to_owned()),
            reset_tokens: None,
        }),
        once(Fault::RateLimited {
            retry_after: None,
            http_date: false,
            retry_after_ms: None,
            reset_requests: Some("2s".to_owned()),
            reset_tokens: None,
        }),
    ];
    let stack = Stack::start(case_01_setup(rules, "30s")).await;
    let r = two_kb_request(&stack).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        stack.mock("p-a").call_count(),
        4,
        "{:?}",
        stack.mock("p-a").calls()
    );
    let g = gaps(&stack, "p-a");
    assert_gap(g[0], Duration::from_secs(1), "Retry-After: 1");
    assert!(
        g[1] >= Duration::from_secs(2) && g[1] <= Duration::from_millis(4300),
        "HTTP-date 3 s ahead waited {:?}",
        g[1]
    );
    assert_gap(
        g[2],
        Duration::from_secs(2),
        "x-ratelimit-reset-requests: 2s",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_01_deadline_stops_retries_and_returns_429_with_remaining_wait() {
    let _g = serial().await;
    // Deadline 2 s: attempt 2 is at 1 s and answers "wait 3 s", so attempt 3 would start after
    // the deadline and must not be sent.
    let rules = vec![once(limited(1)), once(limited(3))];
    let stack = Stack::start(case_01_setup(rules, "2s")).await;
    let r = two_kb_request(&stack).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.elapsed < Duration::from_millis(2300),
        "answered after {:?}",
        r.elapsed
    );
    assert_eq!(
        stack.mock("p-a").call_count(),
        2,
        "{:?}",
        stack.mock("p-a").calls()
    );
    let ra: u64 = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("429 without Retry-After: {:?}", r.headers))
        .parse()
        .unwrap();
    assert!(
        ra >= 3,
        "Retry-After {ra} is below the advertised remaining wait of 3 s"
    );
    assert!(r.json()["error"].is_object(), "{}", r.body);

    // Second run: `x-ratelimit-reset-requests: 1m30s` alone is read as 90 s.
    let rules = vec![once(Fault::RateLimited {
        retry_after: None,
        http_date: false,
        retry_after_ms: None,
        reset_requests: Some("1m30s".to_owned()),
        reset_tokens: None,
    })];
    let stack = Stack::start(case_01_setup(rules, "2s")).await;
    let r = two_kb_request(&stack).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.elapsed < Duration::from_millis(2300),
        "answered after {:?}",
        r.elapsed
    );
    assert_eq!(stack.mock("p-a").call_count(), 1);
    let ra: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    // 90 s plus the router's bounded pause jitter (DESIGN §4.4), never less.
    assert!((89..=100).contains(&ra), "1m30s read as Retry-After {ra}");
}

// ---------------------------------------------------------------------------------------------
// Field case 2: siblings sharing one upstream quota are not retried instantly.
// Scale: Retry-After 20 s → 3 s; 50 requests over 5 s → over 2 s.
// ---------------------------------------------------------------------------------------------

/// P-A1 and P-A2 share quota group `acct-a`; their answers take 300 ms so that a probe after
/// the pause is still in flight when the next requests arrive.
fn case_02_setup(a_faults: FaultSet, fallback: &str) -> Setup {
    let group = "limits: [{dimension: requests, amount: 100000, period: 60s, quotaGroup: acct-a}]";
    let a = |name: &str| {
        Provider::openai(name).with(group).mock(|m| {
            m.faults = a_faults.clone();
            m.latency_ms = 300;
        })
    };
    Setup::new()
        .provider(a("p-a1"))
        .provider(a("p-a2"))
        .provider(Provider::openai("p-b"))
        .policy(Policy::chat(MODEL, &["p-a1", "p-a2", "p-b"]).set("fallback", fallback))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_02_quota_group_siblings_are_not_retried_instantly() {
    let _g = serial().await;
    let window = FaultSet::rules([FaultRule::window(
        Duration::ZERO,
        Duration::from_secs(3),
        limited(3),
    )]);
    let stack = Stack::start(case_02_setup(window, "{throttlePerSecond: 100}")).await;
    for i in 0..50 {
        let r = stack.chat(MODEL, Some(&format!("proj-{i}"))).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        assert_eq!(r.provider().as_deref(), Some("p-b"), "request {i}");
        assert!(
            r.attempts().unwrap() <= 3,
            "request {i} bounced in the A group: {:?}",
            r.headers
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(
        stack.since_epoch() < Duration::from_secs(3),
        "the 50 requests overran the window"
    );
    let a = stack.mock("p-a1").call_count() + stack.mock("p-a2").call_count();
    assert!(
        a <= 2,
        "A group got {a} calls during its shared 429 (at most one each)"
    );
    assert_eq!(stack.mock("p-b").call_count(), 50);

    // After the window: one probe goes to the A group, not the whole burst.
    let wait = Duration::from_millis(3500).saturating_sub(stack.since_epoch());
    tokio::time::sleep(wait).await;
    let burst = (0..10).map(|i| {
        let stack = &stack;
        async move { stack.chat(MODEL, Some(&format!("after-{i}"))).await }
    });
    let replies = futures::future::join_all(burst).await;
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    let a_after = stack.mock("p-a1").call_count() + stack.mock("p-a2").call_count() - a;
    assert_eq!(
        a_after, 1,
        "A group got {a_after} of 10 concurrent requests right after its pause"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_02_fallback_throttle_caps_spill_over() {
    let _g = serial().await;
    let stack = Stack::start(case_02_setup(
        FaultSet::fail_all(limited(30)),
        "{throttlePerSecond: 5, throttleBurst: 5}",
    ))
    .await;
    let t0 = Instant::now();
    let mut rejected = Vec::new();
    for i in 0..40 {
        let r = stack.chat(MODEL, Some(&format!("proj-{i}"))).await;
        if r.status == 200 {
            assert_eq!(r.provider().as_deref(), Some("p-b"));
        } else {
            assert!(
                r.status == 429 || r.status == 503,
                "request {i}: {} {}",
                r.status,
                r.body
            );
            assert!(
                r.header("retry-after").is_some(),
                "rejection without Retry-After: {:?}",
                r.headers
            );
            rejected.push(i);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let b = stack.mock("p-b").call_count() as f64;
    let max = 5.0 + 5.0 * secs + 1.0;
    assert!(
        b <= max,
        "p-b got {b} spill-over calls in {secs:.1} s; throttle allows {max:.0}"
    );
    assert!(
        b >= 5.0,
        "the throttle's burst of 5 did not get through: {b}"
    );
    assert!(!rejected.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Field case 25: region allow-list holds across fallback and provider-side geo routing.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_25_region_allow_list_holds_across_fallback() {
    let _g = serial().await;
    let unavailable = FaultSet::fail_all(Fault::ServiceUnavailable { retry_after: None });
    let stack = Stack::start(
        Setup::new()
            .provider(
                Provider::openai("p-eu1")
                    .region("eu-west-1")
                    .mock(|m| m.faults = unavailable.clone()),
            )
            .provider(
                Provider::openai("p-geo-eu")
                    .region("eu-west-1")
                    .with("executionRegions: [eu-west-1, eu-central-1]"),
            )
            .provider(Provider::openai("p-us").region("us-east-1"))
            .provider(
                Provider::openai("p-global")
                    .region("eu-west-1")
                    .with("executionRegions: [eu-west-1, us-east-1, ap-northeast-1]"),
            )
            .policy(
                Policy::chat(MODEL, &["p-eu1", "p-geo-eu", "p-us", "p-global"])
                    .set("allowedRegions", "[eu-west-1, eu-central-1]")
                    .set("fallback", "{maxAttempts: 4}"),
            ),
    )
    .await;
    for i in 0..20 {
        let r = stack.chat(MODEL, Some(&format!("eu-{i}"))).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
        assert_eq!(r.provider().as_deref(), Some("p-geo-eu"), "request {i}");
    }
    assert_eq!(stack.mock("p-us").call_count(), 0);
    assert_eq!(stack.mock("p-global").call_count(), 0);

    // The operator's view: providers outside the allow-list are ineligible, with a reason.
    let status = stack.status().await;
    let w = policy_weights(&status, MODEL).unwrap_or_else(|| panic!("no policy status: {status}"));
    for name in ["p-us", "p-global"] {
        let e = w
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name}: {w:?}"));
        assert!(
            !e.eligible,
            "{name} shown eligible under an EU allow-list: {e:?}"
        );
        assert!(
            e.reason.is_some(),
            "{name} ineligible without a reason: {e:?}"
        );
        assert_eq!(e.weight, 0.0, "{name}: {e:?}");
    }

    // Second run: the EU geo profile fails too. Nothing leaves the allowed regions; the client
    // gets a policy error that names the region constraint.
    stack.mock("p-geo-eu").set_faults(unavailable);
    let mut answers = Vec::new();
    for i in 0..20 {
        let r = stack.chat(MODEL, Some(&format!("eu2-{i}"))).await;
        let v = r.json();
        answers.push(format!(
            "{} {} {} {}",
            r.status, v["error"]["code"], v["error"]["type"], v["error"]["message"]
        ));
    }
    let kinds = histogram(answers);
    assert!(
        kinds
            .keys()
            .all(|k| !k.starts_with("200") && k.to_lowercase().contains("region")),
        "answers (status code type message → count) do not all name the region constraint: {kinds:#?}"
    );
    assert_eq!(
        stack.mock("p-us").call_count(),
        0,
        "a request left the allowed regions"
    );
    assert_eq!(
        stack.mock("p-global").call_count(),
        0,
        "a request left the allowed regions"
    );
}

// ---------------------------------------------------------------------------------------------
// A hung provider on a non-streamed request: with another provider left, one attempt may use at
// most half of the time left, so the request fails over instead of waiting out its deadline.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_request_hung_provider_fails_over_within_half_the_deadline() {
    let _g = serial().await;
    let setup = Setup::new()
        .provider(
            Provider::openai("p1").mock(|m| m.faults = FaultSet::fail_all(Fault::HangNoHeaders)),
        )
        .provider(Provider::openai("p2"))
        .policy(Policy::chat(MODEL, &["p1", "p2"]).set("deadline", "4s"));
    let stack = Stack::start(setup).await;
    let r = stack.chat(MODEL, Some("proj-hang")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.provider().as_deref(), Some("p2"));
    assert_eq!(r.attempts(), Some(2));
    assert!(
        r.elapsed >= Duration::from_millis(1900) && r.elapsed < Duration::from_millis(3500),
        "failover after {:?}; expected about half of the 4 s deadline",
        r.elapsed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_request_only_provider_hung_gets_deadline_error() {
    let _g = serial().await;
    let setup = Setup::new()
        .provider(
            Provider::openai("p1").mock(|m| m.faults = FaultSet::fail_all(Fault::HangNoHeaders)),
        )
        .policy(Policy::chat(MODEL, &["p1"]).set("deadline", "2s"));
    let stack = Stack::start(setup).await;
    let r = stack.chat(MODEL, Some("proj-hang")).await;
    assert_eq!(r.status, 504, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "deadline_exceeded", "{}", r.body);
    assert!(
        r.elapsed < Duration::from_millis(3000),
        "took {:?}",
        r.elapsed
    );
}
