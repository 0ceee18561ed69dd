//! The official OpenAI and Anthropic Python SDKs, and curl, against a real router (issue 4,
//! "Must show": chat with and without streaming, tools, embeddings, messages with streaming;
//! responses parse; DESIGN §6 names the same three clients).
//!
//! The SDKs run from the venv that `scripts/setup-venv.sh` creates at `<repo>/.venv` (override
//! with `SWITCHYARD_PYTHON`). Under CI (`CI=true`) a missing venv fails the test; on a developer
//! machine it is skipped with a message naming the script.
//!
//! The client scripts are first run against a mock provider directly
//! (`sdk_scripts_against_mock_directly_all_checks_pass`), which shows that a failure in the
//! router tests is the router's, not the script's.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{KEY, Policy, Provider, Setup, Stack, check, in_ci, python, run_script, serial};
use serde_json::Value;
use switchyard_mock::{MockConfig, MockProvider};

/// The venv's python, or `None` (skip) outside CI when it is missing.
fn assert_openai_report(r: &Value, expect_provider: Option<&str>, cross: bool, embeddings: bool) {
    let chat = check(r, "chat");
    assert!(
        !chat["content"].as_str().unwrap().is_empty(),
        "chat: {chat}"
    );
    assert_eq!(chat["role"], "assistant", "chat: {chat}");
    assert_eq!(chat["finish_reason"], "stop", "chat: {chat}");
    assert!(chat["prompt_tokens"].as_u64().unwrap() > 0, "chat: {chat}");
    assert!(
        chat["completion_tokens"].as_u64().unwrap() > 0,
        "chat: {chat}"
    );
    if let Some(p) = expect_provider {
        let got = common::provider_name(chat["provider_header"].as_str().unwrap_or_default());
        assert_eq!(got, p, "chat: {chat}");
        assert_eq!(chat["attempts_header"], "1", "chat: {chat}");
        assert!(chat["request_id_header"].is_string(), "chat: {chat}");
    }

    let s = check(r, "chat_stream");
    assert_eq!(s["role_chunks"], 1, "stream: {s}");
    assert!(!s["content"].as_str().unwrap().is_empty(), "stream: {s}");
    assert_eq!(
        s["finish_reasons"],
        serde_json::json!(["stop"]),
        "stream: {s}"
    );
    assert_eq!(s["distinct_ids"], 1, "one completion id across chunks: {s}");
    // Without include_usage the client asked for no usage chunk (field case 15, run 1).
    assert_eq!(s["usage_chunks"], 0, "stream without include_usage: {s}");

    let su = check(r, "chat_stream_usage");
    assert_eq!(su["role_chunks"], 1, "stream+usage: {su}");
    assert!(
        su["usage_chunks"].as_u64().unwrap() >= 1,
        "stream+usage: {su}"
    );
    assert!(
        su["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "stream+usage: {su}"
    );
    assert!(
        su["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "stream+usage: {su}"
    );

    let t = check(r, "tools");
    assert_eq!(t["finish_reason"], "tool_calls", "tools: {t}");
    assert_eq!(t["tool_calls"], 1, "tools: {t}");
    assert_eq!(t["name"], "get_weather", "tools: {t}");
    assert_eq!(t["arguments_json"], true, "tools: {t}");

    let ts = check(r, "tools_stream");
    assert_eq!(
        ts["names"],
        serde_json::json!(["get_weather"]),
        "tools stream: {ts}"
    );
    assert_eq!(
        ts["arguments_json"],
        serde_json::json!([true]),
        "tools stream: {ts}"
    );
    assert_eq!(
        ts["finish_reasons"],
        serde_json::json!(["tool_calls"]),
        "tools stream: {ts}"
    );

    if cross {
        let c = check(r, "cross_chat");
        assert!(
            !c["content"].as_str().unwrap().is_empty(),
            "cross chat: {c}"
        );
        assert!(c["prompt_tokens"].as_u64().unwrap() > 0, "cross chat: {c}");
        let cs = check(r, "cross_stream_usage");
        assert_eq!(cs["role_chunks"], 1, "cross stream: {cs}");
        assert!(
            !cs["content"].as_str().unwrap().is_empty(),
            "cross stream: {cs}"
        );
        assert!(
            cs["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
            "cross stream: {cs}"
        );
        let ct = check(r, "cross_tools");
        assert_eq!(ct["name"], "get_weather", "cross tools: {ct}");
        assert_eq!(ct["arguments_json"], true, "cross tools: {ct}");
    }
    if embeddings {
        let e = check(r, "embeddings");
        assert_eq!(e["count"], 2, "embeddings: {e}");
        assert_eq!(e["indices"], serde_json::json!([0, 1]), "embeddings: {e}");
        assert_eq!(e["all_floats"], true, "embeddings: {e}");
        let dims = e["dims"].as_array().unwrap();
        assert!(
            dims.iter().all(|d| d.as_u64().unwrap() > 0),
            "embeddings: {e}"
        );
        assert_eq!(e["float_dims"], dims[0], "float and base64 dims agree: {e}");
    }
    let m = check(r, "models");
    assert!(!m["ids"].as_array().unwrap().is_empty(), "models: {m}");
    let bad = check(r, "bad_key");
    assert_eq!(bad["status"], 401, "bad key: {bad}");
    assert_eq!(bad["exception"], "AuthenticationError", "bad key: {bad}");
    let unknown = check(r, "unknown_model");
    assert_eq!(unknown["status"], 404, "unknown model: {unknown}");
}

fn assert_anthropic_report(r: &Value, expect_provider: Option<&str>, cross: bool) {
    let c = check(r, "create");
    assert_eq!(c["type"], "message", "create: {c}");
    assert_eq!(c["role"], "assistant", "create: {c}");
    assert!(!c["text"].as_str().unwrap().is_empty(), "create: {c}");
    assert_eq!(c["stop_reason"], "end_turn", "create: {c}");
    assert!(c["input_tokens"].as_u64().unwrap() > 0, "create: {c}");
    assert!(c["output_tokens"].as_u64().unwrap() > 0, "create: {c}");
    if let Some(p) = expect_provider {
        let got = common::provider_name(c["provider_header"].as_str().unwrap_or_default());
        assert_eq!(got, p, "create: {c}");
        assert_eq!(c["attempts_header"], "1", "create: {c}");
        assert!(c["request_id_header"].is_string(), "create: {c}");
    }
    for name in ["stream_helper", "stream_raw"] {
        let s = check(r, name);
        assert_eq!(s["events"]["message_start"], 1, "{name}: {s}");
        assert_eq!(s["events"]["message_stop"], 1, "{name}: {s}");
        assert!(s["events"].get("error").is_none(), "{name}: {s}");
        assert!(!s["text"].as_str().unwrap().is_empty(), "{name}: {s}");
    }
    let h = check(r, "stream_helper");
    assert_eq!(h["stop_reason"], "end_turn", "stream helper: {h}");
    assert!(
        h["output_tokens"].as_u64().unwrap() > 0,
        "stream helper: {h}"
    );
    let t = check(r, "tools");
    assert_eq!(t["stop_reason"], "tool_use", "tools: {t}");
    assert_eq!(t["tool_uses"], 1, "tools: {t}");
    assert_eq!(t["name"], "get_weather", "tools: {t}");
    assert_eq!(t["input_is_dict"], true, "tools: {t}");
    if cross {
        let c = check(r, "cross_create");
        assert!(!c["text"].as_str().unwrap().is_empty(), "cross create: {c}");
        assert!(c["input_tokens"].as_u64().unwrap() > 0, "cross create: {c}");
        let s = check(r, "cross_stream_raw");
        assert_eq!(s["events"]["message_start"], 1, "cross stream: {s}");
        assert_eq!(s["events"]["message_stop"], 1, "cross stream: {s}");
        assert!(!s["text"].as_str().unwrap().is_empty(), "cross stream: {s}");
    }
    let bad = check(r, "bad_key");
    // The mock accepts any key, so only the router test expects a 401 here.
    if expect_provider.is_some() {
        assert_eq!(bad["status"], 401, "bad key: {bad}");
        assert_eq!(bad["exception"], "AuthenticationError", "bad key: {bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_scripts_against_mock_directly_all_checks_pass() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let mock = MockProvider::start(MockConfig {
        api_keys: vec![KEY.to_owned()],
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let base = mock.base_url();
    let oa = run_script(
        &py,
        "openai_client.py",
        &[
            "--base-url",
            &base,
            "--api-key",
            KEY,
            "--chat-model",
            "m",
            "--embed-model",
            "e",
        ],
        &[],
    )
    .await;
    // The mock is a provider, not a router: no decision headers, and any model is served, so
    // only the wire-format checks apply.
    for name in [
        "chat",
        "chat_stream",
        "chat_stream_usage",
        "tools",
        "tools_stream",
        "embeddings",
    ] {
        check(&oa, name);
    }
    assert_openai_report_wire_only(&oa);
    let an = run_script(
        &py,
        "anthropic_client.py",
        &["--base-url", &base, "--api-key", KEY, "--model", "m"],
        &[],
    )
    .await;
    assert_anthropic_report(&an, None, false);
}

/// The parts of the OpenAI report a bare mock can satisfy.
fn assert_openai_report_wire_only(r: &Value) {
    let s = check(r, "chat_stream");
    assert_eq!(s["role_chunks"], 1, "stream: {s}");
    assert_eq!(s["usage_chunks"], 0, "stream: {s}");
    let su = check(r, "chat_stream_usage");
    assert!(
        su["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "stream+usage: {su}"
    );
    let t = check(r, "tools");
    assert_eq!(t["name"], "get_weather", "tools: {t}");
    let e = check(r, "embeddings");
    assert_eq!(e["count"], 2, "embeddings: {e}");
}

fn sdk_setup() -> Setup {
    // The OpenAI-compatible mock only accepts the provider credential, which the router reads
    // from an environment variable (secretRef resolution through the environment); the tenant
    // key comes from the secrets folder.
    Setup::new()
        .provider(
            Provider::openai("oa")
                .models(&[("gpt-e2e", "text"), ("embed-e2e", "embedding")])
                .mock(|m| m.api_keys = vec!["upstream-oa-key".to_owned()])
                .with("credentials: {secretRef: {name: oa-creds, key: api-key}}"),
        )
        .provider(Provider::anthropic("an").models(&[("claude-e2e", "text")]))
        .policy(Policy::chat("gpt-e2e", &["oa"]))
        .policy(Policy::chat("claude-e2e", &["an"]))
        .policy(Policy::embedding("embed-e2e", &["oa"]))
        .env("SWITCHYARD_SECRET_OA_CREDS_API_KEY", "upstream-oa-key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_chat_stream_tools_embeddings_parse_through_router() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let stack = Stack::start(sdk_setup()).await;
    let base = stack.router.base_url.clone();
    let r = run_script(
        &py,
        "openai_client.py",
        &[
            "--base-url",
            &base,
            "--api-key",
            KEY,
            "--chat-model",
            "gpt-e2e",
            "--cross-model",
            "claude-e2e",
            "--embed-model",
            "embed-e2e",
        ],
        &[],
    )
    .await;
    assert_openai_report(&r, Some("oa"), true, true);
    // Every upstream call presented the provider credential, never the client's key.
    let oa_calls = stack.mock("oa").calls();
    assert!(!oa_calls.is_empty());
    for c in &oa_calls {
        assert_eq!(c.key_suffix.as_deref(), Some("-key"), "call {c:?}");
        assert_eq!(c.status, 200, "upstream call failed: {c:?}");
    }
    // Field case 15: a stream always asks the upstream for usage, whatever the client asked.
    let streams: Vec<_> = oa_calls.iter().filter(|c| c.stream).collect();
    assert!(!streams.is_empty());
    assert!(
        streams.iter().all(|c| c.include_usage_requested),
        "upstream streams without include_usage: {streams:?}"
    );
    // Cross-dialect requests landed on the Anthropic provider's /v1/messages.
    assert!(stack.calls_on("an", "/v1/messages") >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_messages_and_streams_parse_through_router() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let stack = Stack::start(sdk_setup()).await;
    let base = stack.router.base_url.clone();
    let r = run_script(
        &py,
        "anthropic_client.py",
        &[
            "--base-url",
            &base,
            "--api-key",
            KEY,
            "--model",
            "claude-e2e",
            "--cross-model",
            "gpt-e2e",
        ],
        &[],
    )
    .await;
    assert_anthropic_report(&r, Some("an"), true);
    assert!(stack.calls_on("an", "/v1/messages") >= 4);
    // Cross-dialect requests landed on the OpenAI provider's chat endpoint.
    assert!(stack.calls_on("oa", "/v1/chat/completions") >= 2);
}

/// `curl`, or `None` (skip) outside CI when it is missing.
fn curl() -> Option<&'static str> {
    let found = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("curl");
    }
    assert!(!in_ci(), "curl not found (.ci/run installs it)");
    eprintln!("SKIPPED: curl not found");
    None
}

async fn run_curl(args: &[&str]) -> String {
    let out = tokio::process::Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--noproxy",
            "*",
            "--max-time",
            "30",
        ])
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .expect("curl did not start");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_posts_and_streams_through_router() {
    let _g = serial().await;
    let Some(_) = curl() else { return };
    let stack = Stack::start(sdk_setup()).await;
    let url = |p: &str| stack.url(p);
    let auth = format!("Authorization: Bearer {KEY}");
    let chat = r#"{"model":"gpt-e2e","messages":[{"role":"user","content":"hi"}]}"#;
    let out = run_curl(&[
        "-H",
        &auth,
        "-H",
        "content-type: application/json",
        "-d",
        chat,
        &url("/v1/chat/completions"),
    ])
    .await;
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(
        !v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{v}"
    );

    // -N: no buffering, as a terminal user would stream.
    let stream = r#"{"model":"claude-e2e","max_tokens":32,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let out = run_curl(&[
        "-N",
        "-H",
        &format!("x-api-key: {KEY}"),
        "-H",
        "content-type: application/json",
        "-d",
        stream,
        &url("/v1/messages"),
    ])
    .await;
    let mut buf = out.clone();
    let mut events = Vec::new();
    let mut comments = 0;
    common::parse_sse(&mut buf, Duration::ZERO, &mut events, &mut comments);
    let names: Vec<String> = events.iter().filter_map(|e| e.event.clone()).collect();
    assert_eq!(
        names.first().map(String::as_str),
        Some("message_start"),
        "{out}"
    );
    assert_eq!(
        names.last().map(String::as_str),
        Some("message_stop"),
        "{out}"
    );
    assert!(buf.trim().is_empty(), "stream ended mid-event: {buf:?}");
}

// ---------------------------------------------------------------------------------------------
// Vertex AI and Bedrock behind the router (issue 11, items 2, 3 and 6): the official SDKs as
// clients, the router's adapters as the only thing speaking the vendors' formats, the mock
// checking OAuth tokens and SigV4 signatures like the real services.
// ---------------------------------------------------------------------------------------------

/// Claude on Vertex, Gemini on Vertex, Claude on Bedrock (InvokeModel) and a non-Anthropic
/// model on Bedrock (Converse), one route each.
fn vendor_setup() -> Setup {
    Setup::new()
        .provider(
            Provider::vertex("vc", "claude-sonnet-4@20250514").models(&[("claude-vx", "text")]),
        )
        .provider(Provider::vertex("vg", "gemini-2.5-flash").models(&[("gemini-vx", "text")]))
        .provider(
            Provider::bedrock("bi", "us.anthropic.claude-3-5-haiku-20241022-v1:0")
                .models(&[("claude-br", "text")]),
        )
        .provider(Provider::bedrock("bc", "amazon.nova-pro-v1:0").models(&[("nova-br", "text")]))
        .policy(Policy::chat("claude-vx", &["vc"]))
        .policy(Policy::chat("gemini-vx", &["vg"]))
        .policy(Policy::chat("claude-br", &["bi"]))
        .policy(Policy::chat("nova-br", &["bc"]))
}

/// Every model call of `mock` succeeded and went to one of `suffixes`; returns how many
/// there were. (OAuth token requests to the mock's `/token` are not model calls.)
fn assert_vendor_calls(stack: &Stack, mock: &str, suffixes: &[&str]) -> usize {
    let calls: Vec<_> = stack
        .mock(mock)
        .calls()
        .into_iter()
        .filter(|c| c.path != "/token")
        .collect();
    assert!(!calls.is_empty(), "{mock}: no upstream calls");
    for c in &calls {
        assert_eq!(c.status, 200, "{mock}: upstream call refused: {c:?}");
        assert!(
            suffixes.iter().any(|s| c.path.ends_with(s)),
            "{mock}: unexpected path {}",
            c.path
        );
    }
    calls.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_through_router_to_gemini_on_vertex_and_converse_on_bedrock() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let stack = Stack::start(vendor_setup()).await;
    let base = stack.router.base_url.clone();
    // Gemini on Vertex in the client's own dialect, Claude on Bedrock across dialects.
    let r = run_script(
        &py,
        "openai_client.py",
        &[
            "--base-url",
            &base,
            "--api-key",
            KEY,
            "--chat-model",
            "gemini-vx",
            "--cross-model",
            "claude-br",
        ],
        &[],
    )
    .await;
    assert_openai_report(&r, Some("vg"), true, false);
    assert_vendor_calls(
        &stack,
        "vg",
        &[":generateContent", ":streamGenerateContent"],
    );
    assert_vendor_calls(&stack, "bi", &["/invoke", "/invoke-with-response-stream"]);
    // Converse on Bedrock, and Claude on Vertex across dialects.
    let r = run_script(
        &py,
        "openai_client.py",
        &[
            "--base-url",
            &base,
            "--api-key",
            KEY,
            "--chat-model",
            "nova-br",
            "--cross-model",
            "claude-vx",
        ],
        &[],
    )
    .await;
    assert_openai_report(&r, Some("bc"), true, false);
    assert_vendor_calls(&stack, "bc", &["/converse", "/converse-stream"]);
    assert_vendor_calls(&stack, "vc", &[":rawPredict", ":streamRawPredict"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_through_router_to_claude_on_vertex_and_bedrock() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let stack = Stack::start(vendor_setup()).await;
    let base = stack.router.base_url.clone();
    for (model, provider, cross) in [
        ("claude-vx", "vc", "gemini-vx"),
        ("claude-br", "bi", "nova-br"),
    ] {
        let r = run_script(
            &py,
            "anthropic_client.py",
            &[
                "--base-url",
                &base,
                "--api-key",
                KEY,
                "--model",
                model,
                "--cross-model",
                cross,
            ],
            &[],
        )
        .await;
        assert_anthropic_report(&r, Some(provider), true);
    }
    assert!(assert_vendor_calls(&stack, "vc", &[":rawPredict", ":streamRawPredict"]) >= 4);
    assert!(assert_vendor_calls(&stack, "bi", &["/invoke", "/invoke-with-response-stream"]) >= 4);
    assert!(
        assert_vendor_calls(
            &stack,
            "vg",
            &[":generateContent", ":streamGenerateContent"]
        ) >= 2
    );
    assert!(assert_vendor_calls(&stack, "bc", &["/converse", "/converse-stream"]) >= 2);
}

/// `client.audio.transcriptions.create` of the official OpenAI SDK through the router (issue
/// 11 item 4): JSON and text response formats parse, to Gemini on Vertex (audio inline) and to
/// an OpenAI-compatible server (multipart forwarded), and an unsupported `response_format` is
/// the SDK's `BadRequestError` naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_audio_transcriptions_through_router() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let stt = |name: &str| {
        let mut p = Provider::openai(name).models(&[("stt-oa", "transcription")]);
        p.upstream = Some("whisper-large-v3".to_owned());
        p
    };
    let stack = Stack::start(
        Setup::new()
            .provider(stt("oa-stt"))
            .provider(
                Provider::vertex("vx-stt", "gemini-2.5-flash")
                    .models(&[("stt-vx", "transcription")]),
            )
            .policy(Policy::transcription("stt-oa", &["oa-stt"]))
            .policy(Policy::transcription("stt-vx", &["vx-stt"])),
    )
    .await;
    let base = stack.router.base_url.clone();
    for (model, provider, path) in [
        ("stt-oa", "oa-stt", "/v1/audio/transcriptions"),
        ("stt-vx", "vx-stt", "gemini-2.5-flash:generateContent"),
    ] {
        let r = run_script(
            &py,
            "openai_audio.py",
            &["--base-url", &base, "--api-key", KEY, "--model", model],
            &[],
        )
        .await;
        let j = check(&r, "transcribe_json");
        assert_eq!(j["type"], "Transcription", "{model}: {j}");
        assert!(j["text"].is_string(), "{model}: {j}");
        assert_eq!(
            common::provider_name(j["provider_header"].as_str().unwrap_or_default()),
            provider
        );
        assert_eq!(j["attempts_header"], "1", "{model}: {j}");
        assert_eq!(j["content_type"], "application/json", "{model}: {j}");
        let t = check(&r, "transcribe_text");
        assert_eq!(t["type"], "str", "{model}: {t}");
        let bad = check(&r, "transcribe_unsupported_format");
        assert_eq!(bad["status"], 400, "{model}: {bad}");
        assert!(
            bad["message"]
                .as_str()
                .unwrap_or_default()
                .contains("response_format"),
            "{model}: {bad}"
        );
        // The model calls (Vertex's OAuth `/token` exchange, whenever it happens, is not one).
        let calls: Vec<_> = stack
            .mock(provider)
            .calls()
            .into_iter()
            .filter(|c| c.path != "/token")
            .collect();
        // Two accepted uploads (json, text) reached the provider; the refused one did not.
        assert_eq!(calls.len(), 2, "{model}: {calls:?}");
        assert!(
            calls
                .iter()
                .all(|c| c.path.ends_with(path) && c.status == 200)
        );
        if model == "stt-oa" {
            assert!(calls.iter().all(|c| c.model == "whisper-large-v3"));
        }
        if model == "stt-vx" {
            // Gemini's answer decoded with its usage (the mock counts inline audio).
            assert_eq!(j["usage_type"], "tokens", "{j}");
            assert!(j["input_tokens"].as_u64().unwrap_or(0) >= 32, "{j}");
        }
    }
}
