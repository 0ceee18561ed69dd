//! OpenTelemetry traces end to end (issue 17 item 1): a standalone router exporting OTLP/HTTP
//! to a real receiver (`tests/python/otlp_receiver.py`, built on the official
//! `opentelemetry-proto` definitions), which decodes every exported span. The tests check what
//! a tracing backend would show: the request span is a child of the client's `traceparent`,
//! carries the GenAI semantic conventions and ours, has one client-kind child per attempt, the
//! provider received the attempt's context in its own `traceparent`, and no prompt, completion
//! or key is anywhere in the export.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{KEY, Policy, Provider, Setup, Stack, chat_body, python, serial, workspace_root};
use serde_json::Value;
use switchyard_mock::{Fault, FaultRule, FaultSet};
use tokio::io::AsyncBufReadExt as _;

const MODEL: &str = "e2e-chat";
const PROMPT: &str = "a very private prompt about kittens";

/// The receiver process and the file it writes spans to.
struct Receiver {
    _child: tokio::process::Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
    port: u16,
}

impl Receiver {
    async fn start(python: &std::path::Path) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spans.jsonl");
        let mut child = tokio::process::Command::new(python)
            .arg(workspace_root().join("tests/python/otlp_receiver.py"))
            .arg(&out)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("otlp_receiver.py did not start");
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("otlp_receiver.py did not say it was listening")
            .unwrap()
            .expect("otlp_receiver.py exited");
        let port = line
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected receiver line {line:?}"));
        Receiver {
            _child: child,
            out,
            _dir: dir,
            port,
        }
    }

    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("receiver wrote a bad line"))
            .collect()
    }

    /// Waits until the spans of `trace_id` include a server span and `attempts` client spans.
    async fn trace(&self, trace_id: &str, attempts: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let spans: Vec<Value> = self
                .spans()
                .into_iter()
                .filter(|s| s["trace_id"] == trace_id)
                .collect();
            let servers = spans
                .iter()
                .filter(|s| s["kind"] == "SPAN_KIND_SERVER")
                .count();
            let clients = spans
                .iter()
                .filter(|s| s["kind"] == "SPAN_KIND_CLIENT")
                .count();
            if servers >= 1 && clients >= attempts {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "trace {trace_id}: {servers} server and {clients} client spans after 15 s: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn traced(receiver: &Receiver, p1_faults: FaultSet) -> Setup {
    Setup::new()
        .provider(Provider::openai("p1").mock(|m| m.faults = p1_faults))
        .provider(Provider::openai("p2"))
        .policy(Policy::chat(MODEL, &["p1", "p2"]))
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            &format!("http://127.0.0.1:{}", receiver.port),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_SERVICE_NAME", "switchyard-e2e")
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn one_server(spans: &[Value]) -> &Value {
    let servers: Vec<&Value> = spans
        .iter()
        .filter(|s| s["kind"] == "SPAN_KIND_SERVER")
        .collect();
    assert_eq!(servers.len(), 1, "one request span per request: {spans:#?}");
    servers[0]
}

fn clients(spans: &[Value]) -> Vec<&Value> {
    let mut c: Vec<&Value> = spans
        .iter()
        .filter(|s| s["kind"] == "SPAN_KIND_CLIENT")
        .collect();
    c.sort_by_key(|s| attr(s, "switchyard.attempt").as_i64());
    c
}

/// No prompt, completion text or key in any exported span.
fn assert_nothing_private(spans: &[Value], completion: &str) {
    let all = serde_json::to_string(spans).unwrap();
    assert!(!all.contains(PROMPT), "the prompt was exported: {all}");
    assert!(!all.contains(KEY), "the API key was exported: {all}");
    assert!(
        completion.is_empty() || !all.contains(completion),
        "the completion was exported: {all}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_attempt_spans_follow_the_clients_trace_with_genai_attributes() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let receiver = Receiver::start(&py).await;
    // p1 fails its first request with a 503: the request needs two attempts.
    let faults = FaultSet::rules([FaultRule::next(
        1,
        Fault::ServiceUnavailable { retry_after: None },
    )]);
    let stack = Stack::start(traced(&receiver, faults)).await;

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let reply = common::send(
        stack
            .post("/v1/chat/completions")
            .header("x-project-id", "proj-otel")
            .header("traceparent", format!("00-{trace_id}-{client_span}-01"))
            .header("tracestate", "vendor=opaque")
            .json(&chat_body(MODEL, PROMPT, false)),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let completion = reply.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    let spans = receiver.trace(trace_id, 2).await;
    let server = one_server(&spans);
    assert_eq!(server["service"], "switchyard-e2e");
    assert_eq!(
        server["parent_span_id"], client_span,
        "the request span is the client's span's child"
    );
    assert_eq!(server["name"], format!("chat {MODEL}"));
    assert_eq!(attr(server, "gen_ai.operation.name"), "chat");
    assert_eq!(attr(server, "gen_ai.request.model"), MODEL);
    assert_eq!(attr(server, "gen_ai.provider.name"), "openai");
    assert!(
        attr(server, "gen_ai.response.model").is_string(),
        "{server:#}"
    );
    let tokens = |key: &str| {
        attr(server, key)
            .as_i64()
            .unwrap_or_else(|| panic!("{key} missing: {server:#}"))
    };
    let input = tokens("gen_ai.usage.input_tokens");
    let output = tokens("gen_ai.usage.output_tokens");
    let usage = &reply.json()["usage"];
    assert_eq!(input, usage["prompt_tokens"].as_i64().unwrap());
    assert_eq!(output, usage["completion_tokens"].as_i64().unwrap());
    assert!(
        attr(server, "gen_ai.response.finish_reasons")
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == "stop")),
        "{server:#}"
    );
    assert_eq!(*attr(server, "switchyard.route"), format!("e2e/{MODEL}"));
    assert_eq!(attr(server, "switchyard.attempts"), 2);
    assert_eq!(attr(server, "switchyard.outcome"), "success");
    assert_eq!(attr(server, "http.response.status_code"), 200);

    let attempts = clients(&spans);
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    for a in &attempts {
        assert_eq!(a["parent_span_id"], server["span_id"], "{a:#}");
        assert_eq!(attr(a, "gen_ai.operation.name"), "chat");
        assert_eq!(attr(a, "gen_ai.provider.name"), "openai");
        assert!(attr(a, "switchyard.reservation.wait_ms").is_i64(), "{a:#}");
    }
    let (first, second) = (attempts[0], attempts[1]);
    assert_eq!(attr(first, "switchyard.attempt"), 1);
    assert_eq!(attr(first, "switchyard.provider"), "e2e/p1");
    assert_eq!(attr(first, "switchyard.chain.position"), 0);
    assert!(attr(first, "error.type").is_string(), "{first:#}");
    assert_eq!(first["status"], "STATUS_CODE_ERROR");
    assert_eq!(attr(second, "switchyard.attempt"), 2);
    assert!(attr(second, "error.type").is_null(), "{second:#}");
    // The served attempt's usage is on the request span only (recorded once).
    assert!(
        attr(second, "gen_ai.usage.output_tokens").is_null(),
        "{second:#}"
    );
    assert!(
        attr(second, "gen_ai.response.model").is_null(),
        "{second:#}"
    );

    // Each attempt's context reached the provider it went to: same trace, the attempt span as
    // the parent, and never the client's span id.
    let mut upstream: Vec<String> = ["p1", "p2"]
        .iter()
        .flat_map(|p| stack.mock(p).calls())
        .filter_map(|c| c.traceparent)
        .collect();
    upstream.sort();
    let mut expected: Vec<String> = attempts
        .iter()
        .map(|a| format!("00-{trace_id}-{}-01", a["span_id"].as_str().unwrap()))
        .collect();
    expected.sort();
    assert_eq!(upstream, expected, "the providers' traceparent headers");
    assert_nothing_private(&spans, &completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_request_is_traced_with_usage_and_a_fresh_trace_without_client_context() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let receiver = Receiver::start(&py).await;
    let stack = Stack::start(traced(&receiver, FaultSet::none())).await;

    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let mut body = chat_body(MODEL, PROMPT, true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let reply = common::stream(
        stack
            .post("/v1/chat/completions")
            .header("x-project-id", "proj-otel-stream")
            .header("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01"))
            .json(&body),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.describe());
    let spans = receiver.trace(trace_id, 1).await;
    let server = one_server(&spans);
    assert_eq!(server["parent_span_id"], "b7ad6b7169203331");
    assert_eq!(attr(server, "switchyard.stream"), true);
    assert_eq!(attr(server, "switchyard.outcome"), "success");
    assert!(
        attr(server, "gen_ai.usage.output_tokens").as_i64().unwrap() > 0,
        "{server:#}"
    );
    assert!(
        attr(server, "gen_ai.response.finish_reasons")
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == "stop")),
        "streams record their finish reasons too: {server:#}"
    );
    assert_eq!(clients(&spans).len(), 1);
    assert_nothing_private(&spans, &reply.openai_text());

    // A request without a traceparent starts its own trace (a root server span), and the
    // provider still gets a context to continue it.
    let plain = stack.chat(MODEL, Some("proj-otel-root")).await;
    assert_eq!(plain.status, 200, "{}", plain.body);
    let sent = stack
        .mock("p1")
        .calls()
        .into_iter()
        .chain(stack.mock("p2").calls())
        .filter_map(|c| c.traceparent)
        .find(|tp| !tp.contains(trace_id))
        .expect("the provider got a traceparent for an untraced client");
    let root_trace = sent.split('-').nth(1).unwrap().to_owned();
    assert_ne!(root_trace, trace_id);
    let spans = receiver.trace(&root_trace, 1).await;
    assert_eq!(one_server(&spans)["parent_span_id"], "");
}
