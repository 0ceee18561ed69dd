//! Vertex AI and Bedrock end to end (issue 11, items 2, 3 and 6, and "Bad input"): a real
//! router process, mocks that check OAuth tokens and SigV4 signatures like the services, and
//! the vendors' own throttling shapes.
//!
//! - The trio (Anthropic, Claude on Vertex, Claude on Bedrock) in one chain: projects stay on
//!   their provider; Vertex `RESOURCE_EXHAUSTED` and Bedrock `ThrottlingException` move
//!   traffic down the chain without a client error, availability falls and weights follow.
//! - Bad credentials and settings: an unparsable service-account key, a key the token endpoint
//!   refuses, a missing IRSA token file and a wrong region are each `Ready=False` with a
//!   message naming the problem, and requests fail over to the next provider.
//! - IRSA: a web-identity token file exchanged at the mock's STS signs real requests.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use common::{Policy, Provider, Setup, Stack, availability_of, provider_name, serial, weight_of};
use serde_json::{Value, json};
use switchyard_mock::FaultSet;

const MODEL: &str = "e2e-chat";
const NO_BREAKER: &str = "circuitBreaker: {consecutiveFailures: 1000}";

/// The `Ready` condition (status, reason, message) of the object named `name` in `/status`.
fn ready_of(status: &Value, name: &str) -> Option<(String, String, String)> {
    fn walk<'a>(v: &'a Value, name: &str, out: &mut Vec<&'a Value>) {
        match v {
            Value::Object(map) => {
                let named = map
                    .get("metadata")
                    .and_then(|m| m.get("name"))
                    .or_else(|| map.get("name"))
                    .and_then(Value::as_str)
                    == Some(name);
                if named {
                    out.push(v);
                }
                map.values().for_each(|x| walk(x, name, out));
            }
            Value::Array(items) => items.iter().for_each(|x| walk(x, name, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(status, name, &mut found);
    found.iter().find_map(|v| {
        let conditions = v
            .pointer("/status/conditions")
            .or_else(|| v.get("conditions"))?
            .as_array()?;
        let c = conditions.iter().find(|c| c["type"] == "Ready")?;
        Some((
            c["status"].as_str()?.to_owned(),
            c["reason"].as_str().unwrap_or_default().to_owned(),
            c["message"].as_str().unwrap_or_default().to_owned(),
        ))
    })
}

fn faults(v: Value) -> FaultSet {
    serde_json::from_value(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trio_sticky_and_vendor_throttling_moves_traffic_down_the_chain() {
    let _g = serial().await;
    let stack = Stack::start(
        Setup::new()
            .provider(Provider::vertex("vx", "claude-sonnet-4@20250514").with(NO_BREAKER))
            .provider(
                Provider::bedrock("br", "anthropic.claude-3-5-haiku-20241022-v1:0")
                    .with(NO_BREAKER),
            )
            .provider(Provider::anthropic("an").with(NO_BREAKER))
            .policy(Policy::chat(MODEL, &["vx", "br", "an"]).with("availability: {interval: 1s}")),
    )
    .await;
    let status = stack.status().await;
    for name in ["vx", "br", "an"] {
        let ready = ready_of(&status, name).unwrap_or_else(|| panic!("no Ready for {name}"));
        assert_eq!(ready.0, "True", "{name} not Ready: {ready:?}");
    }

    // Healthy: the cascade sends everything to Vertex, and every project stays there.
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for round in 0..3 {
        for p in 0..10 {
            let project = format!("proj-{p}");
            let r = stack.chat(MODEL, Some(&project)).await;
            assert_eq!(r.status, 200, "round {round}: {}", r.body);
            seen.entry(project)
                .or_default()
                .push(provider_name(&r.header("x-switchyard-provider").unwrap()));
        }
    }
    for (project, providers) in &seen {
        assert!(
            providers.iter().all(|p| p == "vx"),
            "{project} moved while healthy: {providers:?}"
        );
    }

    // Vertex's shared pool is exhausted: every answer there is 429 RESOURCE_EXHAUSTED. The
    // client still gets 200s (from Bedrock), availability of vx falls and br's weight rises.
    stack.mock("vx").set_faults(faults(json!({
        "fail_all": {"kind": "vertex_resource_exhausted", "cause": "shared_capacity"}
    })));
    let t0 = Instant::now();
    let mut n = 0;
    let mut trail = Vec::new();
    loop {
        for _ in 0..10 {
            n += 1;
            let r = stack.chat(MODEL, Some(&format!("v-{n}"))).await;
            assert_eq!(r.status, 200, "Vertex 429 reached the client: {}", r.body);
            assert_ne!(
                provider_name(&r.header("x-switchyard-provider").unwrap()),
                "vx",
                "served by the exhausted provider"
            );
        }
        let s = stack.status().await;
        let a = availability_of(&s, "vx").unwrap();
        let w = weight_of(&s, MODEL, "br").unwrap();
        trail.push((a, w));
        // A 429 pauses the scope (no Retry-After from Vertex: the router's backoff), so few
        // attempts reach vx and its availability moves by little before the pause hides the
        // rest: capacity is a penalty, not an eviction (STYLE 8). It must still move, and the
        // cascade must hand br the difference.
        if a < 1.0 && w > 0.0 {
            assert!((a + w - 1.0).abs() < 1e-6, "cascade: {trail:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "vx availability / br weight did not follow Vertex 429s: {trail:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let vx_calls = stack.mock("vx").calls();
    assert!(
        vx_calls.iter().any(|c| c.status == 429),
        "the mock never answered 429"
    );

    // Bedrock throttles too: traffic goes to Anthropic, still without client errors.
    stack.mock("br").set_faults(faults(json!({
        "fail_all": {"kind": "bedrock_exception", "exception": "ThrottlingException"}
    })));
    for i in 0..10 {
        let r = stack.chat(MODEL, Some(&format!("b-{i}"))).await;
        assert_eq!(
            r.status, 200,
            "Bedrock throttling reached the client: {}",
            r.body
        );
        assert_eq!(
            provider_name(&r.header("x-switchyard-provider").unwrap()),
            "an",
            "{}",
            r.body
        );
    }
    let metrics = stack.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("br") && l.contains("capacity")),
        "no capacity outcome recorded for br"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_vendor_credentials_are_not_ready_and_fail_over() {
    let _g = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::new()
        .provider(
            Provider::vertex("garbage-key", "claude-sonnet-4@20250514")
                .credentials("{secretRef: {name: vertex-sa, key: garbage.json}}"),
        )
        .provider(
            Provider::vertex("untrusted-key", "claude-sonnet-4@20250514")
                .credentials("{secretRef: {name: vertex-sa, key: untrusted.json}}"),
        )
        .provider(
            Provider::bedrock("no-irsa-file", "anthropic.claude-3-5-haiku-20241022-v1:0")
                .credentials("")
                .with(&format!(
                    "bedrock: {{roleArn: \"arn:aws:iam::123456789012:role/switchyard\", webIdentityTokenFile: \"{}/missing-token\"}}",
                    dir.path().display()
                )),
        )
        .provider(
            Provider::bedrock("wrong-region", "anthropic.claude-3-5-haiku-20241022-v1:0")
                .region("us-east1"),
        )
        .provider(Provider::anthropic("an"))
        .policy(Policy::chat(
            MODEL,
            &[
                "garbage-key",
                "untrusted-key",
                "no-irsa-file",
                "wrong-region",
                "an",
            ],
        ));
    let stack = Stack::start(setup).await;

    // Every request is answered by the one good provider.
    for i in 0..5 {
        let r = stack.chat(MODEL, Some(&format!("p{i}"))).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            provider_name(&r.header("x-switchyard-provider").unwrap()),
            "an"
        );
    }
    // Nothing reached the untrusted provider's model paths: its token was refused first.
    assert!(
        stack
            .mock("untrusted-key")
            .calls()
            .iter()
            .all(|c| c.path == "/token"),
        "a model call went out without a valid token"
    );

    let status = stack.status().await;
    for (name, needle) in [
        ("garbage-key", "not a JSON key file"),
        ("untrusted-key", "token request refused"),
        ("no-irsa-file", "missing-token does not exist"),
        ("wrong-region", "\"us-east1\" is not an AWS region name"),
    ] {
        let (ready, reason, message) =
            ready_of(&status, name).unwrap_or_else(|| panic!("no Ready condition for {name}"));
        assert_eq!(ready, "False", "{name}: {reason} {message}");
        assert!(
            message.contains(needle),
            "{name}: message {message:?} does not name the problem ({needle:?})"
        );
    }
    let (_, reason, _) = ready_of(&status, "untrusted-key").unwrap();
    assert_eq!(reason, "CredentialsRejected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn irsa_web_identity_is_exchanged_at_sts_and_signs_requests() {
    let _g = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(
        &token,
        "eyJhbGciOiJSUzI1NiJ9.e30.projected-service-account-token",
    )
    .unwrap();
    // The mock serves STS on its own address; the provider points its stsEndpoint there.
    let setup = |sts: &str| {
        Setup::new()
            .provider(
                Provider::bedrock("irsa", "anthropic.claude-3-5-haiku-20241022-v1:0")
                    .credentials("")
                    .with(&format!(
                        "bedrock: {{roleArn: \"arn:aws:iam::123456789012:role/switchyard\", webIdentityTokenFile: \"{}\", stsEndpoint: \"{sts}\"}}",
                        token.display()
                    )),
            )
            .policy(Policy::chat(MODEL, &["irsa"]))
    };
    // First start with a placeholder STS to learn the mock's address, then point at it.
    let stack = Stack::start(setup("http://127.0.0.1:9")).await;
    let sts = stack.mock("irsa").base_url();
    stack.rewrite_manifests(&setup(&sts));
    let t0 = Instant::now();
    loop {
        let r = stack.chat(MODEL, Some("irsa")).await;
        if r.status == 200 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "IRSA never worked: {} {}",
            r.status,
            r.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let calls = stack.mock("irsa").calls();
    assert!(
        calls
            .iter()
            .any(|c| c.path.ends_with("/invoke") && c.status == 200),
        "no signed InvokeModel call: {calls:?}"
    );
    let status = stack.status().await;
    assert_eq!(ready_of(&status, "irsa").unwrap().0, "True");
}

/// Temporary keys from the mock's STS that expire one second after issue.
async fn expired_sts_keys() -> (String, String, String) {
    use base64::Engine as _;
    let sts = switchyard_mock::MockProvider::start(switchyard_mock::MockConfig {
        name: "sts".to_owned(),
        aws_auth: Some(switchyard_mock::AwsAuthConfig::default()),
        ..switchyard_mock::MockConfig::default()
    })
    .await
    .unwrap();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let exp = chrono::Utc::now().timestamp() + 3600;
    let jwt = format!(
        "{}.{}.sig",
        b64.encode(r#"{"alg":"RS256"}"#),
        b64.encode(format!(
            r#"{{"sub":"system:serviceaccount:ai:router","exp":{exp}}}"#
        ))
    );
    let xml = reqwest::Client::new()
        .post(sts.base_url())
        .form(&[
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", "arn:aws:iam::123456789012:role/switchyard"),
            ("RoleSessionName", "e2e"),
            ("WebIdentityToken", jwt.as_str()),
            ("DurationSeconds", "1"),
        ])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (keys, _) = switchyard_providers::bedrock::credentials::parse_assume_role(&xml)
        .unwrap_or_else(|e| panic!("STS answer {xml}: {e}"));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    (
        keys.access_key_id,
        keys.secret_access_key,
        keys.session_token.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_bedrock_keys_are_not_ready_and_fail_over() {
    let _g = serial().await;
    let (id, secret, token) = expired_sts_keys().await;
    let stack = Stack::start(
        Setup::new()
            .key("exp-id", &id)
            .key("exp-secret", &secret)
            .key("exp-token", &token)
            .provider(
                Provider::bedrock("expired", "anthropic.claude-3-5-haiku-20241022-v1:0")
                    .credentials("{secretRef: {name: e2e-keys, key: exp-secret}, accessKeyIdRef: {name: e2e-keys, key: exp-id}, sessionTokenRef: {name: e2e-keys, key: exp-token}}")
                    .with(NO_BREAKER),
            )
            .provider(Provider::anthropic("an"))
            .policy(Policy::chat(MODEL, &["expired", "an"])),
    )
    .await;
    for i in 0..3 {
        let r = stack.chat(MODEL, Some(&format!("p{i}"))).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            provider_name(&r.header("x-switchyard-provider").unwrap()),
            "an"
        );
    }
    let calls = stack.mock("expired").calls();
    assert!(
        !calls.is_empty() && calls.iter().all(|c| c.status == 403),
        "expected only 403s from Bedrock: {calls:?}"
    );
    let status = stack.status().await;
    let (ready, reason, message) = ready_of(&status, "expired").unwrap();
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "CredentialsRejected"),
        "{message}"
    );
    assert!(message.contains("HTTP 403"), "{message}");
}
