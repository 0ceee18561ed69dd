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

// ---------------------------------------------------------------------------------------------
// Items 2 and 3: slow and malformed clients, on raw TCP.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 response (head, then a `Content-Length` body) within `within`;
/// returns the status and the body.
async fn read_response(conn: &mut TcpStream, within: Duration) -> (u16, String) {
    let mut buf = Vec::new();
    let deadline = Instant::now() + within;
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let head = &text[..head_end];
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= head_end + 4 + length {
                let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
                return (status, text[head_end + 4..head_end + 4 + length].to_owned());
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline, conn.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("no full response within {within:?}: {text:?}"))
            .unwrap();
        assert!(n > 0, "connection closed before a full response: {text:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the server closes `conn` within `within` (reads 0 bytes or a reset).
async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut chunk)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn short_timeouts() -> Setup {
    one_provider()
        .env("SWITCHYARD_HEADER_READ_TIMEOUT", "1s")
        .env("SWITCHYARD_BODY_READ_TIMEOUT", "1s")
}

/// Item 2: clients trickling their headers are disconnected after the header-read timeout,
/// and so are idle keep-alive connections; other clients are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_headers_and_idle_keep_alive_are_closed() {
    let _g = serial().await;
    let stack = Stack::start(short_timeouts()).await;
    let addr = stack.router.addr;
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: a")
            .await
            .unwrap();
        slow.push(c);
    }
    // One more byte of header on each, as a trickling client would send.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for c in &mut slow {
        let _ = c.write_all(b"a").await;
    }
    assert_eq!(
        stack.chat(MODEL, None).await.status,
        200,
        "others are served"
    );
    for (i, c) in slow.iter_mut().enumerate() {
        assert!(
            closed_within(c, Duration::from_secs(5)).await,
            "slow connection {i} still open after the header timeout"
        );
    }
    // Idle keep-alive: a complete request, then silence.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert!(
        closed_within(&mut c, Duration::from_secs(5)).await,
        "idle keep-alive connection not closed"
    );
}

fn chat_head(extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\n{extra}\r\n"
    )
}

/// Item 3: each body-read failure has its own status, in the OpenAI error shape: 400 for
/// broken framing (a bad chunk size, a body cut short), 408 for a body that stops arriving,
/// 413 only for size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_framing_errors_have_their_own_status_and_shape() {
    let _g = serial().await;
    let stack = Stack::start(short_timeouts()).await;
    let addr = stack.router.addr;
    let code = |body: &str| -> String {
        serde_json::from_str::<serde_json::Value>(body).unwrap()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    // A malformed chunk size.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{}zz\r\n{{}}\r\n0\r\n\r\n",
        chat_head("Transfer-Encoding: chunked\r\n")
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_request", "{body}");

    // A body shorter than its Content-Length, the client done sending.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!("{}{{\"model\":", chat_head("Content-Length: 100\r\n"));
    c.write_all(req.as_bytes()).await.unwrap();
    c.shutdown().await.unwrap();
    let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(code(&body), "invalid_request", "{body}");

    // A body that stops arriving: 408 after the body-read timeout.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!("{}{{\"model\":", chat_head("Content-Length: 100\r\n"));
    c.write_all(req.as_bytes()).await.unwrap();
    let t0 = Instant::now();
    let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(code(&body), "request_timeout", "{body}");
    assert!(t0.elapsed() >= Duration::from_millis(900));

    // Too large by its Content-Length: 413 before reading.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = chat_head("Content-Length: 999999999999\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(code(&body), "request_too_large", "{body}");

    // Two Transfer-Encoding headers: never a 413.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{}2\r\n{{}}\r\n0\r\n\r\n",
        chat_head("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n")
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
    assert_eq!(status, 400, "{body}");

    // The same connection type still serves a well-formed request.
    assert_eq!(stack.chat(MODEL, None).await.status, 200);
}

/// Item 7: the errors hyper answers itself, before any handler runs, carry a JSON body in the
/// OpenAI shape and close the connection (before: a bare head with `content-length: 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_have_json_bodies() {
    let _g = serial().await;
    let stack = Stack::start(one_provider()).await;
    let addr = stack.router.addr;
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let many_headers = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    let cases: [(&str, Vec<u8>, u16, &str); 5] = [
        (
            "Content-Length not a number",
            chat_head("Content-Length: abc\r\n").into_bytes(),
            400,
            "invalid_request",
        ),
        (
            "two different Content-Lengths",
            chat_head("Content-Length: 2\r\nContent-Length: 3\r\n").into_bytes(),
            400,
            "invalid_request",
        ),
        (
            "a control byte in a header name",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-\x01Bad: v\r\n\r\n".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "too many headers",
            many_headers.into_bytes(),
            431,
            "request_header_fields_too_large",
        ),
        (
            "a 70 KB request target",
            long_uri.into_bytes(),
            414,
            "uri_too_long",
        ),
    ];
    for (what, request, want_status, want_code) in cases {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&request).await.unwrap();
        let (status, body) = read_response(&mut c, Duration::from_secs(5)).await;
        assert_eq!(status, want_status, "{what}: {body}");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body:?}"));
        assert_eq!(v["error"]["code"], want_code, "{what}: {body}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(
            closed_within(&mut c, Duration::from_secs(5)).await,
            "{what}: connection left open"
        );
    }
    // Well-formed requests are untouched.
    assert_eq!(stack.chat(MODEL, None).await.status, 200);
}

/// Item 6: an OpenAI request with parameters Anthropic has no equivalent for is refused with
/// 400 naming them (before: 200 with them silently ignored); a route with
/// `lossyTranslation: true` serves it and lists what was dropped in a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_translation_is_refused_or_reported() {
    let _g = serial().await;
    let setup = |lossy: bool| {
        let mut policy = Policy::chat(MODEL, &["a1"]);
        if lossy {
            policy = policy.with("lossyTranslation: true");
        }
        Setup::new()
            .provider(Provider::anthropic("a1"))
            .policy(policy)
    };
    let mut body = chat_body(MODEL, "hello", false);
    body["seed"] = json!(7);
    body["logit_bias"] = json!({"50256": -100});

    let stack = Stack::start(setup(false)).await;
    let r = stack.chat_body(MODEL, None, body.clone()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], json!("unsupported_parameter"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("logit_bias, seed"), "{message}");
    assert_eq!(stack.calls_on("a1", "/v1/messages"), 0, "nothing was sent");
    // Without the unmappable parameters the same route serves.
    assert_eq!(stack.chat(MODEL, None).await.status, 200);
    drop(stack);

    let stack = Stack::start(setup(true)).await;
    let r = stack.chat_body(MODEL, None, body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("x-switchyard-dropped-parameters").as_deref(),
        Some("logit_bias, seed")
    );
    let clean = stack.chat(MODEL, None).await;
    assert_eq!(clean.header("x-switchyard-dropped-parameters"), None);
}

/// Item 7: a wrong-typed `model` on embeddings and rerank is a 400 (was 404 `model ""`), and
/// an unknown model's name is echoed back cut to 256 bytes (a 1 MB name was echoed whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_typed_and_huge_model_names() {
    let _g = serial().await;
    let stack = Stack::start(one_provider()).await;
    for path in ["/v1/embeddings", "/v1/rerank"] {
        for model in [json!(5), json!(null), json!(["m"])] {
            let r =
                send(stack.post(path).json(
                    &json!({"model": model, "input": "x", "query": "q", "documents": ["d"]}),
                ))
                .await;
            assert_eq!(r.status, 400, "{path} {model}: {}", r.body);
            assert!(r.body.contains("`model` must be a string"), "{}", r.body);
        }
    }
    let huge = "m".repeat(1 << 20);
    let r = stack
        .chat_body(&huge, None, chat_body(&huge, "hi", false))
        .await;
    assert_eq!(r.status, 404);
    assert!(r.body.len() < 1024, "{} bytes echoed", r.body.len());
    assert!(
        r.body.contains(&format!("{}…", "m".repeat(256))),
        "{}",
        r.body
    );
}

/// Item 4: the router refuses out-of-range sizes it would forward (`n`, output caps,
/// `dimensions`) with 400 in the client's shape, and the mock bounds what it allocates
/// (`dimensions: 4294967296` drove it to 12 GB; 2^64−1 panicked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_sizes_are_refused() {
    let _g = serial().await;
    let stack = Stack::start(
        one_provider()
            .provider(Provider::openai("e1").models(&[("e2e-embed", "embedding")]))
            .policy(Policy::embedding("e2e-embed", &["e1"])),
    )
    .await;
    for (field, value) in [
        ("n", json!(1000)),
        ("max_tokens", json!(9_007_199_254_740_991u64)),
        ("max_completion_tokens", json!(2_000_000)),
    ] {
        let mut body = chat_body(MODEL, "hi", false);
        body[field] = value;
        let r = stack.chat_body(MODEL, None, body).await;
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        assert!(r.body.contains(&format!("`{field}`")), "{}", r.body);
    }
    for dims in [
        json!(4_294_967_296u64),
        json!(u64::MAX),
        json!(0),
        json!(-1),
        json!("8"),
    ] {
        let r = send(
            stack
                .post("/v1/embeddings")
                .json(&json!({"model": "e2e-embed", "input": "x", "dimensions": dims})),
        )
        .await;
        assert_eq!(r.status, 400, "{dims}: {}", r.body);
        assert!(r.body.contains("`dimensions`"), "{}", r.body);
    }
    let ok = send(
        stack
            .post("/v1/embeddings")
            .json(&json!({"model": "e2e-embed", "input": "x", "dimensions": 16})),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(
        ok.json()["data"][0]["embedding"].as_array().unwrap().len(),
        16
    );
    // The mock itself, sent to directly.
    let mock = stack.mock("e1").base_url();
    for dims in [json!(4_294_967_296u64), json!(u64::MAX)] {
        let r = send(
            client()
                .post(format!("{mock}/v1/embeddings"))
                .json(&json!({"model": "e2e-embed", "input": "x", "dimensions": dims})),
        )
        .await;
        assert_eq!(r.status, 400, "mock {dims}: {}", r.body);
    }
}
