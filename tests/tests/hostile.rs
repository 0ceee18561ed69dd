//! Hostile and careless input end to end (issue 12): one client must not stall the router,
//! no configuration change may open it.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{KEY, Policy, Provider, Setup, Stack, chat_body, client, send, serial};
use serde_json::json;
use tokio::time::Instant;

const MODEL: &str = "e2e-chat";

fn one_provider() -> Setup {
    Setup::new()
        .provider(Provider::openai("p1"))
        .policy(Policy::chat(MODEL, &["p1"]))
}

/// The manifests of `setup` without the TenantQuota document.
fn without_tenants(stack: &Stack, setup: &Setup) -> String {
    let addrs: BTreeMap<String, SocketAddr> = stack
        .mocks
        .iter()
        .map(|(name, m)| (name.clone(), m.addr()))
        .collect();
    common::manifests(setup, &addrs)
        .split("---\n")
        .filter(|doc| !doc.trim().is_empty() && !doc.contains("kind: TenantQuota"))
        .map(|doc| format!("---\n{doc}"))
        .collect()
}

async fn chat_without_key(stack: &Stack) -> common::Reply {
    send(
        client()
            .post(stack.url("/v1/chat/completions"))
            .json(&chat_body(MODEL, "hello", false)),
    )
    .await
}

/// Item 5: deleting the last TenantQuota does not turn authentication off. Before, the reload
/// was logged as ok and a request with no key got 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_last_tenant_quota_keeps_keys_required() {
    let _g = serial().await;
    let setup = one_provider();
    let stack = Stack::start(setup.clone()).await;
    assert_eq!(stack.chat(MODEL, None).await.status, 200);
    let r = chat_without_key(&stack).await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], json!("missing_api_key"));

    stack.write_manifest_text(&without_tenants(&stack, &setup));
    let t0 = Instant::now();
    while stack.chat(MODEL, None).await.status != 401 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the reload without the TenantQuota was not applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = chat_without_key(&stack).await;
    assert_eq!(r.status, 401, "no TenantQuota left: {}", r.body);
    let status = stack.status().await;
    assert_eq!(status["tenants"], json!([]));
    assert_eq!(status["authentication"]["anonymousAllowed"], json!(false));
    let metrics = stack.metrics().await;
    assert!(
        metrics.contains("switchyard_anonymous_access_allowed 0"),
        "{metrics}"
    );
}

/// Item 5: the opt-out is explicit and visible: `--allow-anonymous` (here through its
/// environment variable) serves requests without a key, and says so in `/status` and the
/// metric; a wrong key is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_anonymous_is_explicit_and_visible() {
    let _g = serial().await;
    let stack = Stack::start(one_provider().env("SWITCHYARD_ALLOW_ANONYMOUS", "true")).await;
    let r = chat_without_key(&stack).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let wrong = send(
        client()
            .post(stack.url("/v1/chat/completions"))
            .bearer_auth("sk-wrong")
            .json(&chat_body(MODEL, "hello", false)),
    )
    .await;
    assert_eq!(wrong.status, 401);
    let status = stack.status().await;
    assert_eq!(status["authentication"]["anonymousAllowed"], json!(true));
    assert!(
        stack
            .metrics()
            .await
            .contains("switchyard_anonymous_access_allowed 1")
    );
}

/// Item 7: the auth scheme is case-insensitive (RFC 9110 §11.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_scheme_is_case_insensitive() {
    let _g = serial().await;
    let stack = Stack::start(one_provider()).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let r = send(
            client()
                .post(stack.url("/v1/chat/completions"))
                .header("authorization", format!("{scheme} {KEY}"))
                .json(&chat_body(MODEL, "hello", false)),
        )
        .await;
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
}

/// Item 1: requests carrying megabytes of one long run (digits, the quadratic case; letters)
/// are estimated off the runtime workers and within a bounded budget: while several are in
/// flight, `/healthz` keeps answering, and the big requests themselves are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_runs_do_not_stall_the_router() {
    let _g = serial().await;
    let stack = Stack::start(one_provider()).await;
    let mut big = Vec::new();
    for (i, unit) in ["7", "a", "7", "東"].into_iter().enumerate() {
        let text = unit.repeat((3 << 20) / unit.len());
        let req = stack
            .post("/v1/chat/completions")
            .header("x-project-id", format!("big-{i}"))
            .json(&chat_body(MODEL, &text, false));
        big.push(tokio::spawn(async move { send(req).await }));
    }
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let t0 = Instant::now();
        let r = send(client().get(stack.url("/healthz"))).await;
        assert_eq!(r.status, 200);
        slowest = slowest.max(t0.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for handle in big {
        let r = handle.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz took {slowest:?} while big requests were estimated"
    );
}
