//! The vendors' own SDKs against the mock's Vertex AI and Bedrock paths (issue 11, item 5):
//! `boto3` `bedrock-runtime` (converse, converse_stream, invoke_model,
//! invoke_model_with_response_stream) and `sts`, the anthropic SDK's `AnthropicBedrock` and
//! `AnthropicVertex`, google-auth service-account and metadata-server credentials, and
//! `google-genai` in Vertex mode. If these clients parse the mock's answers, decode its event
//! streams, sign requests it accepts and refuse what it refuses with the vendor's error codes,
//! the mock speaks the vendors' wire formats and not our guess of them — which is what the
//! router's adapters are then tested against.
//!
//! The scripts run from `<repo>/.venv` (`scripts/setup-venv.sh`; override `SWITCHYARD_PYTHON`).
//! Under CI (`CI=true`) a missing venv fails; elsewhere the test is skipped with a message.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{check, python, run_script, serial, workspace_root};
use serde_json::{Value, json};
use switchyard_mock::{
    AwsAuthConfig, FaultSet, GoogleAuthConfig, MockConfig, MockProvider, TEST_AWS_ACCESS_KEY_ID,
    TEST_AWS_SECRET_ACCESS_KEY,
};

/// The venv's python, or `None` (skip) outside CI when it is missing.
fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

/// `token0 token1 ... token{n-1}`, the mock's answer of n tokens.
fn answer(n: u64) -> String {
    (0..n)
        .map(|i| {
            if i == 0 {
                "token0".to_owned()
            } else {
                format!(" token{i}")
            }
        })
        .collect()
}

fn faults(rules: Value) -> FaultSet {
    serde_json::from_value(json!({ "rules": rules })).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_boto3_and_anthropic_bedrock_against_mock() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let mock = MockProvider::start(MockConfig {
        name: "bedrock-us-east-1".to_owned(),
        output_tokens: 8,
        aws_auth: Some(AwsAuthConfig::default()),
        faults: faults(json!([
            {"kind": "bedrock_exception", "exception": "ThrottlingException",
             "when": {"models": ["throttled.model-v1:0"]}},
            {"kind": "bedrock_exception", "exception": "ServiceQuotaExceededException",
             "when": {"models": ["quota.model-v1:0"]}},
            {"kind": "bedrock_exception", "exception": "ModelNotReadyException",
             "when": {"models": ["notready.model-v1:0"]}},
            {"kind": "bedrock_stream_exception", "exception": "ThrottlingException",
             "after_deltas": 3, "when": {"models": ["broken-stream.model-v1:0"]}},
            {"kind": "bedrock_stream_exception", "exception": "ModelStreamErrorException",
             "after_deltas": 2, "when": {"models": ["broken-invoke.model-v1:0"]}},
        ])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let base = mock.base_url();
    let r = run_script(
        &py,
        "bedrock_client.py",
        &[
            "--endpoint",
            &base,
            "--region",
            "us-east-1",
            "--access-key",
            TEST_AWS_ACCESS_KEY_ID,
            "--secret-key",
            TEST_AWS_SECRET_ACCESS_KEY,
        ],
        &[],
    )
    .await;
    eprintln!("{r:#}");

    let c = check(&r, "converse");
    assert_eq!(c["status"], 200, "{c}");
    assert_eq!(c["role"], "assistant", "{c}");
    assert_eq!(c["text"], answer(8), "{c}");
    assert_eq!(c["stop_reason"], "end_turn", "{c}");
    // "say hello" = 1 + 2 tokens (a word costs ceil(chars / 4)); no cachePoint, no cache fields.
    assert_eq!(
        c["usage"],
        json!({"inputTokens": 3, "outputTokens": 8, "totalTokens": 11}),
        "{c}"
    );
    assert!(c["latency_ms"].is_u64(), "{c}");
    assert!(!c["request_id"].as_str().unwrap().is_empty(), "{c}");

    // A cachePoint after the system prompt: the first call writes it, the second reads it.
    let cache = check(&r, "converse_cache");
    let (first, second) = (&cache["first"], &cache["second"]);
    let system_tokens = 8 * 20; // "You are a careful assistant. " = 1+1+1+2+3, x 20
    assert_eq!(u(&first["cacheWriteInputTokens"]), system_tokens, "{cache}");
    assert_eq!(u(&first["cacheReadInputTokens"]), 0, "{cache}");
    assert_eq!(u(&first["inputTokens"]), 4, "\"first question\": {cache}");
    assert_eq!(u(&second["cacheReadInputTokens"]), system_tokens, "{cache}");
    assert_eq!(u(&second["cacheWriteInputTokens"]), 0, "{cache}");
    assert_eq!(
        u(&second["inputTokens"]),
        5,
        "\"second question here\": {cache}"
    );
    assert_eq!(
        u(&second["totalTokens"]),
        system_tokens + 5 + u(&second["outputTokens"]),
        "totalTokens includes cache reads: {cache}"
    );

    let t = check(&r, "converse_tools");
    assert_eq!(t["stop_reason"], "tool_use", "{t}");
    assert_eq!(t["names"], json!(["get_weather"]), "{t}");
    assert_eq!(t["input_is_dict"], true, "{t}");

    let s = check(&r, "converse_stream");
    assert_eq!(
        s["content_type"], "application/vnd.amazon.eventstream",
        "{s}"
    );
    assert_eq!(s["first"], "messageStart", "{s}");
    assert_eq!(s["last"], "metadata", "{s}");
    assert_eq!(s["role"], "assistant", "{s}");
    assert_eq!(s["deltas"], 8, "{s}");
    assert_eq!(s["text"], answer(8), "{s}");
    assert_eq!(s["stop_reason"], "end_turn", "{s}");
    assert_eq!(
        s["usage"],
        json!({"inputTokens": 5, "outputTokens": 8, "totalTokens": 13}),
        "{s}"
    );

    let st = check(&r, "converse_stream_tools");
    assert_eq!(st["tool_names"], json!(["get_weather"]), "{st}");
    assert_eq!(st["tool_input"], "{}", "{st}");
    assert_eq!(st["stop_reason"], "tool_use", "{st}");

    let i = check(&r, "invoke");
    assert_eq!(i["type"], "message", "{i}");
    assert_eq!(
        i["model"], "anthropic.claude-sonnet-4-20250514-v1:0",
        "the ARN's base model: {i}"
    );
    assert_eq!(i["text"], answer(8), "{i}");
    assert_eq!(u(&i["usage"]["input_tokens"]), 3, "{i}");
    assert_eq!(u(&i["usage"]["output_tokens"]), 8, "{i}");
    assert_eq!(i["input_header"], "3", "{i}");
    assert_eq!(i["output_header"], "8", "{i}");

    let is = check(&r, "invoke_stream");
    assert_eq!(is["content_type"], "application/json", "{is}");
    assert_eq!(
        is["types"],
        json!(
            ["message_start", "content_block_start"]
                .into_iter()
                .chain(std::iter::repeat_n("content_block_delta", 8))
                .chain(["content_block_stop", "message_delta", "message_stop"])
                .collect::<Vec<_>>()
        ),
        "{is}"
    );
    assert_eq!(is["text"], answer(8), "{is}");
    assert_eq!(u(&is["usage"]["output_tokens"]), 8, "{is}");
    assert_eq!(u(&is["usage"]["input_tokens"]), 5, "{is}");
    assert_eq!(u(&is["metrics"]["inputTokenCount"]), 5, "{is}");
    assert_eq!(u(&is["metrics"]["outputTokenCount"]), 8, "{is}");

    // Auth refusals, with the codes botocore reads from x-amzn-errortype.
    let w = check(&r, "wrong_secret");
    assert_eq!(
        (w["status"].clone(), w["code"].clone()),
        (json!(403), json!("InvalidSignatureException")),
        "{w}"
    );
    assert!(
        w["message"]
            .as_str()
            .unwrap()
            .starts_with("The request signature we calculated does not match"),
        "{w}"
    );
    let k = check(&r, "unknown_key");
    assert_eq!(k["code"], "UnrecognizedClientException", "{k}");
    assert_eq!(k["status"], 403, "{k}");
    let reg = check(&r, "wrong_region");
    assert_eq!(reg["code"], "InvalidSignatureException", "{reg}");
    assert!(
        reg["message"].as_str().unwrap().contains("valid region"),
        "{reg}"
    );

    // Fault kinds as boto3 sees them.
    for (name, code, status) in [
        ("throttled", "ThrottlingException", 429),
        ("quota", "ServiceQuotaExceededException", 400),
        ("not_ready", "ModelNotReadyException", 429),
        ("invoke_no_version", "ValidationException", 400),
    ] {
        let e = check(&r, name);
        assert_eq!(e["code"], code, "{name}: {e}");
        assert_eq!(e["status"], status, "{name}: {e}");
    }
    let nv = check(&r, "invoke_no_version");
    assert!(
        nv["message"]
            .as_str()
            .unwrap()
            .contains("required key [anthropic_version]"),
        "{nv}"
    );
    let se = check(&r, "stream_exception");
    assert_eq!(se["status"], 200, "exception inside a 200 stream: {se}");
    assert_eq!(se["deltas_before"], 3, "{se}");
    assert_eq!(se["code"], "throttlingException", "{se}");
    let ie = check(&r, "invoke_stream_exception");
    assert_eq!(ie["status"], 200, "{ie}");
    assert_eq!(ie["deltas_before"], 2, "{ie}");
    assert_eq!(ie["code"], "modelStreamErrorException", "{ie}");
    let ae = check(&r, "anthropic_bedrock_stream_exception");
    assert_eq!(ae["text_before"], answer(2), "{ae}");
    assert_eq!(ae["error_type"], "modelStreamErrorException", "{ae}");

    // STS web identity -> temporary credentials the SigV4 check accepts; a forged token not.
    let sts = check(&r, "sts");
    assert_eq!(sts["access_key_prefix"], "ASIA", "{sts}");
    let left = u(&sts["expires_in_s"]);
    assert!((3500..=3600).contains(&left), "{sts}");
    assert_eq!(
        sts["assumed_role_arn"],
        "arn:aws:sts::123456789012:assumed-role/switchyard-bedrock/switchyard-test",
        "{sts}"
    );
    assert_eq!(sts["converse_text"], answer(8), "{sts}");
    assert_eq!(
        sts["forged_token"]["code"], "UnrecognizedClientException",
        "{sts}"
    );

    let ab = check(&r, "anthropic_bedrock");
    assert_eq!(ab["create_text"], answer(8), "{ab}");
    assert_eq!(
        ab["create_model"], "anthropic.claude-sonnet-4-20250514-v1:0",
        "{ab}"
    );
    assert_eq!(ab["create_usage"], json!({"input": 1, "output": 8}), "{ab}");
    assert_eq!(ab["stream_text"], answer(8), "{ab}");
    assert_eq!(ab["stream_stop_reason"], "end_turn", "{ab}");
    assert_eq!(ab["stream_output_tokens"], 8, "{ab}");
    assert_eq!(ab["wrong_secret_status"], 403, "{ab}");
    assert_eq!(
        ab["wrong_secret_exception"], "PermissionDeniedError",
        "{ab}"
    );

    // Requests are recorded with the signing key's last 4 characters: the test key's ("ST01")
    // and an STS-issued ASIA key's.
    let suffixes: Vec<String> = mock
        .calls()
        .into_iter()
        .filter(|c| c.path.starts_with("/model/"))
        .filter_map(|c| c.key_suffix)
        .collect();
    assert!(suffixes.iter().any(|k| k == "ST01"), "{suffixes:?}");

    // The mock saw the signed paths the SDKs built for every model-id form.
    let paths: Vec<String> = mock.calls().into_iter().map(|c| c.path).collect();
    for want in [
        "/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse",
        "/model/us.anthropic.claude-sonnet-4-20250514-v1%3A0/converse-stream",
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fglobal.anthropic.claude-sonnet-4-20250514-v1%3A0/invoke",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_anthropic_vertex_and_google_genai_against_mock() {
    let _g = serial().await;
    let Some(py) = python() else { return };
    let mock = MockProvider::start(MockConfig {
        name: "vertex-us-central1".to_owned(),
        output_tokens: 8,
        gemini_thoughts_tokens: 5,
        google_auth: Some(GoogleAuthConfig::default()),
        faults: faults(json!([
            {"kind": "vertex_resource_exhausted", "cause": "shared_capacity",
             "when": {"models": ["gemini-exhausted"]}},
            {"kind": "vertex_resource_exhausted", "cause": "project_quota",
             "when": {"models": ["gemini-quota"]}},
            {"kind": "vertex_resource_exhausted", "cause": "provisioned_throughput",
             "when": {"models": ["gemini-pt"]}},
        ])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let base = mock.base_url();
    let testdata = workspace_root().join("crates/mock/testdata");
    let key = testdata.join("vertex-test-sa.json");
    let untrusted = testdata.join("vertex-test-sa-untrusted.json");
    let metadata_host = mock.addr().to_string();
    let r = run_script(
        &py,
        "vertex_client.py",
        &[
            "--base-url",
            &base,
            "--key-file",
            key.to_str().unwrap(),
            "--untrusted-key-file",
            untrusted.to_str().unwrap(),
        ],
        &[("GCE_METADATA_HOST", &metadata_host)],
    )
    .await;
    eprintln!("{r:#}");

    let tg = check(&r, "token_grant");
    assert_eq!(tg["token_prefix"], "ya29.mock.", "{tg}");
    assert_eq!(tg["valid"], true, "{tg}");
    let untrusted_err = tg["untrusted_error"].as_str().unwrap();
    assert!(
        untrusted_err.contains("invalid_grant") && untrusted_err.contains("account not found"),
        "{tg}"
    );
    let md = check(&r, "metadata_token");
    assert_eq!(md["token_prefix"], "ya29.mock.", "{md}");
    assert_eq!(
        md["email"], "switchyard-mock-test@switchyard-test.iam.gserviceaccount.com",
        "{md}"
    );

    let av = check(&r, "anthropic_vertex");
    assert_eq!(av["text"], answer(8), "{av}");
    assert_eq!(
        av["model"], "claude-sonnet-4@20250514",
        "model from the path: {av}"
    );
    let system_tokens = 4 * 30; // "You are terse. " = 1+1+2, x 30
    assert_eq!(
        u(&av["first_usage"]["cache_creation_input_tokens"]),
        system_tokens,
        "{av}"
    );
    assert_eq!(u(&av["first_usage"]["input_tokens"]), 2, "\"hello\": {av}");
    assert_eq!(
        u(&av["second_usage"]["cache_read_input_tokens"]),
        system_tokens,
        "{av}"
    );
    assert_eq!(
        u(&av["second_usage"]["input_tokens"]),
        4,
        "\"hello again\": {av}"
    );
    assert_eq!(av["stream_text"], answer(8), "{av}");
    assert_eq!(av["stream_stop_reason"], "end_turn", "{av}");
    assert_eq!(av["stream_output_tokens"], 8, "{av}");
    assert_eq!(av["tool_stop_reason"], "tool_use", "{av}");
    assert_eq!(av["tool_names"], json!(["get_weather"]), "{av}");
    assert_eq!(av["bad_token_status"], 401, "{av}");
    assert_eq!(av["bad_token_exception"], "AuthenticationError", "{av}");
    assert_eq!(
        av["bad_token_body"]["error"]["status"], "UNAUTHENTICATED",
        "{av}"
    );

    let g = check(&r, "gemini");
    assert_eq!(g["text"], answer(8), "{g}");
    assert_eq!(g["finish_reason"], "STOP", "{g}");
    assert_eq!(g["model_version"], "gemini-2.5-flash", "{g}");
    let first_prompt = 8 * 10 + 4; // "You are a careful assistant. " x 10 + "first question"
    assert_eq!(
        g["first_usage"],
        json!({"prompt": first_prompt, "cached": null, "candidates": 8, "thoughts": 5,
            "total": first_prompt + 8 + 5}),
        "thoughts are separate from candidates and counted in the total: {g}"
    );
    // Implicit cache: the second turn reads the first prompt; promptTokenCount includes it.
    let second = &g["second_usage"];
    assert_eq!(u(&second["cached"]), first_prompt, "{g}");
    // + the model turn (8 words of 2 tokens) + "and a second one" (5).
    let second_prompt = first_prompt + 16 + 5;
    assert_eq!(u(&second["prompt"]), second_prompt, "{g}");
    assert_eq!(u(&second["total"]), second_prompt + 8 + 5, "{g}");
    assert_eq!(g["short_text"], answer(3), "{g}");
    assert_eq!(g["short_finish_reason"], "MAX_TOKENS", "{g}");

    let gs = check(&r, "gemini_stream");
    assert_eq!(gs["text"], answer(8), "{gs}");
    assert_eq!(gs["chunks"], 9, "8 token chunks + the final one: {gs}");
    assert_eq!(gs["finish_reason"], "STOP", "{gs}");
    let usages = gs["usages"].as_array().unwrap();
    assert_eq!(usages.len(), 9, "usage in every chunk: {gs}");
    let candidates: Vec<u64> = usages.iter().map(|x| u(&x["candidates"])).collect();
    assert_eq!(candidates, [1, 2, 3, 4, 5, 6, 7, 8, 8], "cumulative: {gs}");
    assert!(
        usages.iter().all(|x| x["prompt"] == 5),
        "\"tell me a story\": {gs}"
    );
    assert_eq!(u(&usages[8]["total"]), 5 + 8 + 5, "{gs}");

    let gt = check(&r, "gemini_tools");
    assert_eq!(gt["names"], json!(["get_weather"]), "{gt}");
    assert_eq!(gt["args_is_dict"], true, "{gt}");
    assert_eq!(gt["after_result_calls"], 0, "{gt}");
    assert_eq!(gt["after_result_text"], answer(8), "{gt}");
    assert_eq!(gt["stream_names"], json!(["get_weather"]), "{gt}");

    let ja = check(&r, "gemini_json_audio");
    assert_eq!(
        ja["json"],
        json!({"city": answer(8), "temp_c": 0}),
        "JSON mode follows the schema: {ja}"
    );
    assert_eq!(ja["audio_text"], answer(8), "{ja}");
    // "Transcribe this audio." = 3 + 1 + 2 tokens, + 32000 bytes of audio = 32.
    assert_eq!(ja["audio_bytes"], 32000, "{ja}");
    assert_eq!(u(&ja["audio_prompt_tokens"]), 6 + 32, "{ja}");

    let ge = check(&r, "gemini_errors");
    for (model, needle) in [
        (
            "gemini-exhausted",
            "Resource exhausted, please try again later.",
        ),
        (
            "gemini-quota",
            "Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_minute_per_project_per_base_model with base model: gemini-quota.",
        ),
        (
            "gemini-pt",
            "Too many requests. Exceeded the Provisioned Throughput.",
        ),
    ] {
        let e = &ge[model];
        assert_eq!(e["code"], 429, "{model}: {e}");
        assert_eq!(e["status"], "RESOURCE_EXHAUSTED", "{model}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{model}: {e}"
        );
    }
    assert_eq!(ge["forged_token"]["code"], 401, "{ge}");
    assert_eq!(ge["forged_token"]["status"], "UNAUTHENTICATED", "{ge}");

    // Vertex sends no Retry-After; the paths are the ones the SDKs built.
    let calls = mock.calls();
    let paths: Vec<&str> = calls.iter().map(|c| c.path.as_str()).collect();
    for want in [
        "/token",
        "/v1/projects/switchyard-test/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict",
        "/v1/projects/switchyard-test/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict",
        "/v1/projects/switchyard-test/locations/us-central1/publishers/google/models/gemini-2.5-flash:generateContent",
        "/v1/projects/switchyard-test/locations/europe-west4/publishers/google/models/gemini-2.5-flash:streamGenerateContent",
    ] {
        assert!(paths.contains(&want), "{want} not in {paths:?}");
    }
}

/// Error shapes the SDK tests cannot see (headers), over plain HTTP: Vertex's 429 carries no
/// `Retry-After` or rate-limit headers; a Claude-on-Vertex body without `anthropic_version` is a
/// 400 `INVALID_ARGUMENT` in Google's shape; a Bedrock error names its exception in
/// `x-amzn-errortype`; without auth configured, the vendor paths accept unsigned requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vendor_error_shapes_over_plain_http() {
    let _g = serial().await;
    let mock = MockProvider::start(MockConfig {
        faults: faults(json!([
            {"kind": "vertex_resource_exhausted", "when": {"models": ["gemini-exhausted"]}},
            {"kind": "rate_limited", "retry_after": 5, "when": {"models": ["gemini-rate-limited"]}},
            {"kind": "cut_mid_stream", "after_deltas": 2, "when": {"models": ["cut-stream"]}},
            {"kind": "bedrock_exception", "exception": "ThrottlingException", "status": 400,
             "message": "Too many tokens per day, please wait before trying again.",
             "when": {"models": ["throttled-400"]}},
        ])),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let base = mock.base_url();
    let vertex = |publisher: &str, model: &str, method: &str| {
        format!(
            "{base}/v1/projects/p/locations/us-central1/publishers/{publisher}/models/{model}:{method}"
        )
    };
    let contents = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});

    let r = http
        .post(vertex("google", "gemini-exhausted", "generateContent"))
        .json(&contents)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let names: Vec<String> = r.headers().keys().map(|k| k.to_string()).collect();
    assert!(
        !names
            .iter()
            .any(|n| n == "retry-after" || n.contains("ratelimit")),
        "Vertex sends no Retry-After / rate-limit headers: {names:?}"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], 429, "{body}");
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");

    // A generic rate limit on a Vertex path: Google's shape, still no Retry-After.
    let r = http
        .post(vertex("google", "gemini-rate-limited", "generateContent"))
        .json(&contents)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(!r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["status"], "RESOURCE_EXHAUSTED", "{body}");

    let r = http
        .post(vertex(
            "anthropic",
            "claude-sonnet-4@20250514",
            "rawPredict",
        ))
        .json(&json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("anthropic_version: Field required"),
        "{body}"
    );

    let r = http
        .post(format!("{base}/model/throttled-400/converse"))
        .json(&json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "the 400 ThrottlingException variant");
    let errortype = r.headers()["x-amzn-errortype"].to_str().unwrap().to_owned();
    assert!(errortype.starts_with("ThrottlingException:"), "{errortype}");
    assert!(r.headers().contains_key("x-amzn-requestid"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!({"message": "Too many tokens per day, please wait before trying again."})
    );

    // Stop sequences end the answer before the token that contains them.
    let r = http
        .post(vertex("google", "gemini-2.5-flash", "generateContent"))
        .json(
            &json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {"stopSequences": ["token3"]}}),
        )
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"],
        answer(3),
        "{body}"
    );
    assert_eq!(body["candidates"][0]["finishReason"], "STOP", "{body}");
    assert_eq!(body["usageMetadata"]["candidatesTokenCount"], 3, "{body}");
    let r = http
        .post(format!(
            "{base}/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse"
        ))
        .json(
            &json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "inferenceConfig": {"stopSequences": ["token2"]}}),
        )
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["stopReason"], "stop_sequence", "{body}");
    assert_eq!(
        body["output"]["message"]["content"][0]["text"],
        answer(2),
        "{body}"
    );

    // cut_mid_stream on ConverseStream: messageStart and 2 whole delta frames, then half a
    // frame and a reset.
    let mut r = http
        .post(format!("{base}/model/cut-stream/converse-stream"))
        .json(&json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut wire = Vec::new();
    let ended_in_error = loop {
        match r.chunk().await {
            Ok(Some(b)) => wire.extend_from_slice(&b),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(ended_in_error, "a cut stream ends with a transport error");
    let (mut whole, mut at) = (0, 0);
    while wire.len() - at >= 4 {
        let len = u32::from_be_bytes(wire[at..at + 4].try_into().unwrap()) as usize;
        if len > wire.len() - at {
            break;
        }
        whole += 1;
        at += len;
    }
    assert_eq!(whole, 3, "messageStart + 2 deltas");
    assert!(at < wire.len(), "a torn frame follows");

    // No aws_auth: an unsigned Converse is served; STS and /token are not.
    let r = http
        .post(format!(
            "{base}/model/anthropic.claude-sonnet-4-20250514-v1%3A0/converse"
        ))
        .json(&json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["stopReason"], "end_turn", "{body}");
    let sts = http.post(format!("{base}/")).send().await.unwrap();
    assert_eq!(sts.status(), 404);
    let token = http.post(format!("{base}/token")).send().await.unwrap();
    assert_eq!(token.status(), 404);
}
