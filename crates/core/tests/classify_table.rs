//! Table tests: every vendor error shape → class, retry hint, code, pause.

// Test helpers fail loudly on bad fixtures; clippy exempts only `#[test]` fns themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::json;
use switchyard_core::classify::{
    Classification, ErrorClass, MAX_MESSAGE_BYTES, POLICY_MAX_PAUSE, POLICY_MIN_PAUSE,
    TransportFailure, classify_response, classify_stream_error, classify_stream_error_at,
    classify_transport,
};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// One response and what the classifier must say about it.
struct Row {
    name: &'static str,
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
    class: ErrorClass,
    retry_after: Option<Duration>,
    code: Option<&'static str>,
}

fn row(
    name: &'static str,
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    body: serde_json::Value,
    class: ErrorClass,
    retry_after: Option<Duration>,
    code: Option<&'static str>,
) -> Row {
    Row {
        name,
        status,
        headers,
        body: body.to_string(),
        class,
        retry_after,
        code,
    }
}

fn run(row: &Row) -> Classification {
    classify_response(
        StatusCode::from_u16(row.status).unwrap(),
        &headers(&row.headers),
        row.body.as_bytes(),
        now(),
    )
}

fn check(rows: &[Row]) {
    for r in rows {
        let c = run(r);
        assert_eq!(c.class, r.class, "class of {:?}: {c:?}", r.name);
        assert_eq!(
            c.retry_after, r.retry_after,
            "retry_after of {:?}: {c:?}",
            r.name
        );
        assert_eq!(c.code.as_deref(), r.code, "code of {:?}: {c:?}", r.name);
        match c.class {
            ErrorClass::Policy => {
                let p = c.pause.expect("policy always pauses");
                assert!(
                    p >= POLICY_MIN_PAUSE && p <= POLICY_MAX_PAUSE,
                    "{:?}: {p:?}",
                    r.name
                );
            }
            ErrorClass::Capacity | ErrorClass::Overload => {
                assert_eq!(c.pause, c.retry_after, "pause of {:?}", r.name)
            }
            _ => assert_eq!(c.pause, None, "pause of {:?}", r.name),
        }
    }
}

fn openai(message: &str, ty: &str, code: Option<&str>) -> serde_json::Value {
    json!({"error": {"message": message, "type": ty, "param": null, "code": code}})
}

fn anthropic(ty: &str, message: &str) -> serde_json::Value {
    json!({"type": "error", "error": {"type": ty, "message": message}})
}

fn gemini(code: u16, status: &str, message: &str, details: serde_json::Value) -> serde_json::Value {
    json!({"error": {"code": code, "message": message, "status": status, "details": details}})
}

#[test]
fn classify_openai_shapes_table() {
    use ErrorClass::*;
    check(&[
        row(
            "rate limit with hint",
            429,
            vec![
                ("retry-after", "20"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "20s"),
            ],
            openai(
                "Rate limit reached for gpt-4o on requests per min (RPM): Limit 3, Used 3. Please try again in 20s.",
                "requests",
                Some("rate_limit_exceeded"),
            ),
            Capacity,
            Some(secs(20)),
            Some("rate_limit_exceeded"),
        ),
        row(
            "rate limit upsell wording is not exhaustion",
            429,
            vec![],
            openai(
                "Rate limit reached on tokens per min (TPM). Please try again in 6s. Add a payment method at https://platform.openai.com/account/billing to increase your rate limit.",
                "tokens",
                Some("rate_limit_exceeded"),
            ),
            Capacity,
            Some(secs(6)),
            Some("rate_limit_exceeded"),
        ),
        row(
            "daily limit is exhaustion",
            429,
            vec![],
            openai(
                "Rate limit reached for gpt-4 on requests per day (RPD): Limit 200, Used 200. Please try again in 7m12s.",
                "requests",
                Some("rate_limit_exceeded"),
            ),
            Policy,
            Some(secs(432)),
            Some("rate_limit_exceeded"),
        ),
        row(
            "insufficient quota",
            429,
            vec![],
            openai(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                Some("insufficient_quota"),
            ),
            Policy,
            None,
            Some("insufficient_quota"),
        ),
        row(
            "server overloaded",
            503,
            vec![],
            openai(
                "The server is overloaded.",
                "server_error",
                Some("server_is_overloaded"),
            ),
            Overload,
            None,
            Some("server_is_overloaded"),
        ),
        row(
            "server error",
            500,
            vec![],
            openai("The server had an error", "server_error", None),
            Server,
            None,
            Some("server_error"),
        ),
        row(
            "invalid api key",
            401,
            vec![],
            openai(
                "Incorrect API key provided: sk-***.",
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
            Auth,
            None,
            Some("invalid_api_key"),
        ),
        row(
            "invalid parameter",
            400,
            vec![],
            openai(
                "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 7 instead.",
                "invalid_request_error",
                Some("decimal_above_max_value"),
            ),
            Request,
            None,
            Some("decimal_above_max_value"),
        ),
        row(
            "context length",
            400,
            vec![],
            openai(
                "This model's maximum context length is 128000 tokens.",
                "invalid_request_error",
                Some("context_length_exceeded"),
            ),
            Request,
            None,
            Some("context_length_exceeded"),
        ),
        row(
            "model not found",
            404,
            vec![],
            openai(
                "The model does not exist",
                "invalid_request_error",
                Some("model_not_found"),
            ),
            Request,
            None,
            Some("model_not_found"),
        ),
        row(
            "billing hard limit",
            400,
            vec![],
            openai(
                "Billing hard limit has been reached",
                "invalid_request_error",
                Some("billing_hard_limit_reached"),
            ),
            Policy,
            None,
            Some("billing_hard_limit_reached"),
        ),
        row(
            "message hint beats a full-bucket reset header",
            429,
            vec![
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ],
            openai(
                "Rate limit reached on tokens per min (TPM). Please try again in 20ms.",
                "tokens",
                Some("rate_limit_exceeded"),
            ),
            Capacity,
            Some(Duration::from_millis(20)),
            Some("rate_limit_exceeded"),
        ),
        row(
            "retry-after-ms only",
            429,
            vec![("retry-after-ms", "1500")],
            openai("slow down", "requests", Some("rate_limit_exceeded")),
            Capacity,
            Some(Duration::from_millis(1500)),
            Some("rate_limit_exceeded"),
        ),
    ]);
}

#[test]
fn classify_anthropic_shapes_table() {
    use ErrorClass::*;
    let now_plus_14d = "You have reached your specified API usage limits. You will regain access on 2026-12-14 at 09:00 UTC.";
    check(&[
        row(
            "overloaded 529",
            529,
            vec![],
            anthropic("overloaded_error", "Overloaded"),
            Overload,
            None,
            Some("overloaded_error"),
        ),
        row(
            "rate limit with retry-after",
            429,
            vec![
                ("retry-after", "15"),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2026-11-30T09:00:12Z"),
            ],
            anthropic(
                "rate_limit_error",
                "This request would exceed the rate limit for your organization of 50,000 input tokens per minute.",
            ),
            Capacity,
            Some(secs(15)),
            Some("rate_limit_error"),
        ),
        row(
            "api error",
            500,
            vec![],
            anthropic("api_error", "Internal server error"),
            Server,
            None,
            Some("api_error"),
        ),
        row(
            "authentication",
            401,
            vec![],
            anthropic("authentication_error", "invalid x-api-key"),
            Auth,
            None,
            Some("authentication_error"),
        ),
        row(
            "permission",
            403,
            vec![],
            anthropic(
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            ),
            Auth,
            None,
            Some("permission_error"),
        ),
        row(
            "invalid request",
            400,
            vec![],
            anthropic("invalid_request_error", "max_tokens: field required"),
            Request,
            None,
            Some("invalid_request_error"),
        ),
        row(
            "thinking budget wording is not exhaustion",
            400,
            vec![],
            anthropic(
                "invalid_request_error",
                "thinking.budget_tokens: Input should be greater than or equal to 1024",
            ),
            Request,
            None,
            Some("invalid_request_error"),
        ),
        row(
            "not found",
            404,
            vec![],
            anthropic("not_found_error", "model: claude-x"),
            Request,
            None,
            Some("not_found_error"),
        ),
        row(
            "too large",
            413,
            vec![],
            anthropic(
                "request_too_large",
                "Request exceeds the maximum allowed number of bytes.",
            ),
            Request,
            None,
            Some("request_too_large"),
        ),
        row(
            "billing",
            400,
            vec![],
            anthropic("billing_error", "Your credit balance is too low."),
            Policy,
            None,
            Some("billing_error"),
        ),
        row(
            "credit balance under invalid_request_error",
            400,
            vec![],
            anthropic(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
            ),
            Policy,
            None,
            Some("invalid_request_error"),
        ),
        row(
            "usage limit until a date",
            400,
            vec![],
            anthropic("invalid_request_error", now_plus_14d),
            Policy,
            Some(secs(14 * 24 * 3600)),
            Some("invalid_request_error"),
        ),
    ]);
}

#[test]
fn classify_gemini_vertex_shapes_table() {
    use ErrorClass::*;
    let retry =
        |d: &str| json!({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": d});
    let quota = |id: &str| {
        json!({"@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", "quotaId": id}]})
    };
    let upsell = "You exceeded your current quota, please check your plan and billing details.";
    check(&[
        row(
            "per-minute quota with retry delay",
            429,
            vec![],
            gemini(
                429,
                "RESOURCE_EXHAUSTED",
                upsell,
                json!([
                    quota("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"),
                    retry("30s")
                ]),
            ),
            Capacity,
            Some(secs(30)),
            Some("RESOURCE_EXHAUSTED"),
        ),
        row(
            "per-day quota is exhaustion",
            429,
            vec![],
            gemini(
                429,
                "RESOURCE_EXHAUSTED",
                upsell,
                json!([
                    quota("GenerateRequestsPerDayPerProjectPerModel-FreeTier"),
                    retry("1.5s")
                ]),
            ),
            Policy,
            Some(Duration::from_millis(1500)),
            Some("RESOURCE_EXHAUSTED"),
        ),
        row(
            "vertex plain resource exhausted",
            429,
            vec![],
            gemini(
                429,
                "RESOURCE_EXHAUSTED",
                "Resource exhausted. Please try again later.",
                json!([]),
            ),
            Capacity,
            None,
            Some("RESOURCE_EXHAUSTED"),
        ),
        row(
            "unavailable",
            503,
            vec![],
            gemini(
                503,
                "UNAVAILABLE",
                "The model is overloaded. Please try again later.",
                json!([]),
            ),
            Overload,
            None,
            Some("UNAVAILABLE"),
        ),
        row(
            "invalid argument",
            400,
            vec![],
            gemini(
                400,
                "INVALID_ARGUMENT",
                "Invalid JSON payload received.",
                json!([]),
            ),
            Request,
            None,
            Some("INVALID_ARGUMENT"),
        ),
        row(
            "permission denied",
            403,
            vec![],
            gemini(
                403,
                "PERMISSION_DENIED",
                "Permission denied on resource project x.",
                json!([]),
            ),
            Auth,
            None,
            Some("PERMISSION_DENIED"),
        ),
        row(
            "unauthenticated",
            401,
            vec![],
            gemini(
                401,
                "UNAUTHENTICATED",
                "Request had invalid authentication credentials.",
                json!([]),
            ),
            Auth,
            None,
            Some("UNAUTHENTICATED"),
        ),
        row(
            "internal",
            500,
            vec![],
            gemini(
                500,
                "INTERNAL",
                "An internal error has occurred.",
                json!([]),
            ),
            Server,
            None,
            Some("INTERNAL"),
        ),
        row(
            "deadline exceeded",
            504,
            vec![],
            gemini(
                504,
                "DEADLINE_EXCEEDED",
                "Deadline expired before operation could complete.",
                json!([]),
            ),
            Timeout,
            None,
            Some("DEADLINE_EXCEEDED"),
        ),
        row(
            "not found",
            404,
            vec![],
            gemini(404, "NOT_FOUND", "models/x is not found", json!([])),
            Request,
            None,
            Some("NOT_FOUND"),
        ),
        row(
            "array-wrapped body",
            429,
            vec![],
            json!([{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "x", "details": [retry("9s")]}}]),
            Capacity,
            Some(secs(9)),
            Some("RESOURCE_EXHAUSTED"),
        ),
    ]);
}

#[test]
fn classify_bedrock_shapes_table() {
    use ErrorClass::*;
    let ty = |name: &'static str| vec![("x-amzn-errortype", name)];
    let msg = |m: &str| json!({"message": m});
    check(&[
        row(
            "throttling",
            429,
            ty("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            msg("Too many requests, please wait before trying again."),
            Capacity,
            None,
            Some("ThrottlingException"),
        ),
        row(
            "throttling per day",
            429,
            ty("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            msg("Too many tokens per day, please wait before trying again."),
            Policy,
            None,
            Some("ThrottlingException"),
        ),
        row(
            "service quota",
            400,
            ty("ServiceQuotaExceededException:http://x/"),
            msg("Your request exceeds the service quota for your account."),
            Policy,
            None,
            Some("ServiceQuotaExceededException"),
        ),
        row(
            "model not ready",
            429,
            ty("ModelNotReadyException:http://x/"),
            msg("Model is not ready to serve inference requests."),
            Overload,
            None,
            Some("ModelNotReadyException"),
        ),
        row(
            "service unavailable",
            503,
            ty("ServiceUnavailableException:http://x/"),
            msg("Service unavailable."),
            Overload,
            None,
            Some("ServiceUnavailableException"),
        ),
        row(
            "validation",
            400,
            ty("ValidationException:http://x/"),
            msg("Malformed input request."),
            Request,
            None,
            Some("ValidationException"),
        ),
        row(
            "access denied",
            403,
            ty("AccessDeniedException:http://x/"),
            msg("You don't have access to the model."),
            Auth,
            None,
            Some("AccessDeniedException"),
        ),
        row(
            "model timeout",
            408,
            ty("ModelTimeoutException:http://x/"),
            msg("Model timed out."),
            Timeout,
            None,
            Some("ModelTimeoutException"),
        ),
        row(
            "internal",
            500,
            ty("InternalServerException:http://x/"),
            msg("Internal error."),
            Server,
            None,
            Some("InternalServerException"),
        ),
        row(
            "type only in the body",
            429,
            vec![],
            json!({"__type": "com.amazon.coral.service#ThrottlingException", "Message": "Rate exceeded"}),
            Capacity,
            None,
            Some("ThrottlingException"),
        ),
    ]);
}

#[test]
fn classify_status_fallback_table() {
    use ErrorClass::*;
    let rows: &[(u16, ErrorClass)] = &[
        (400, Request),
        (401, Auth),
        (402, Policy),
        (403, Auth),
        (404, Request),
        (408, Timeout),
        (413, Request),
        (422, Request),
        (429, Capacity),
        (500, Server),
        (502, Server),
        (503, Overload),
        (504, Server),
        (529, Overload),
        (302, Server),
    ];
    for (status, class) in rows {
        for body in [
            &b""[..],
            b"<html>Bad Gateway</html>",
            b"\x00\xff garbage",
            b"{\"unrelated\":1}",
        ] {
            let c = classify_response(
                StatusCode::from_u16(*status).unwrap(),
                &HeaderMap::new(),
                body,
                now(),
            );
            assert_eq!(c.class, *class, "status {status} body {body:?}");
            assert_eq!(c.code, None, "status {status}");
        }
    }
}

#[test]
fn classify_402_insufficient_credits_is_policy_with_long_pause() {
    let c = classify_response(
        StatusCode::PAYMENT_REQUIRED,
        &HeaderMap::new(),
        br#"{"error":{"message":"Insufficient credits","code":402}}"#,
        now(),
    );
    assert_eq!(c.class, ErrorClass::Policy);
    assert_eq!(c.pause, Some(POLICY_MIN_PAUSE));
    assert_eq!(c.message.as_deref(), Some("Insufficient credits"));
}

#[test]
fn classify_request_tag_on_5xx_defers_to_status() {
    let c = classify_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &HeaderMap::new(),
        openai("upstream busy", "invalid_request_error", None)
            .to_string()
            .as_bytes(),
        now(),
    );
    assert_eq!(c.class, ErrorClass::Overload);
}

#[test]
fn classify_long_retry_after_on_503_is_policy() {
    let c = classify_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &headers(&[("retry-after", "7200")]),
        b"",
        now(),
    );
    assert_eq!(c.class, ErrorClass::Policy);
    assert_eq!(c.retry_after, Some(secs(7200)));
    assert_eq!(c.pause, Some(secs(7200)));
}

#[test]
fn classify_plain_text_body_kept_as_message() {
    let c = classify_response(
        StatusCode::BAD_GATEWAY,
        &HeaderMap::new(),
        b"upstream connect error\n",
        now(),
    );
    assert_eq!(c.class, ErrorClass::Server);
    assert_eq!(c.message.as_deref(), Some("upstream connect error"));
}

#[test]
fn classify_long_message_bounded_at_char_boundary() {
    let long = "é".repeat(MAX_MESSAGE_BYTES);
    let c = classify_response(
        StatusCode::BAD_REQUEST,
        &HeaderMap::new(),
        openai(&long, "invalid_request_error", None)
            .to_string()
            .as_bytes(),
        now(),
    );
    let m = c.message.unwrap();
    assert!(m.len() <= MAX_MESSAGE_BYTES && m.len() >= MAX_MESSAGE_BYTES - 1);
    assert!(m.chars().all(|ch| ch == 'é'));
}

#[test]
fn stream_error_table_anthropic_openai_gemini() {
    use ErrorClass::*;
    let rows = vec![
        (
            "anthropic overloaded",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            Overload,
            Some("overloaded_error"),
        ),
        (
            "anthropic api error",
            json!({"type": "error", "error": {"type": "api_error", "message": "Internal"}}),
            Server,
            Some("api_error"),
        ),
        (
            "responses failed overloaded",
            json!({"type": "response.failed", "sequence_number": 3, "response": {"id": "resp_1", "status": "failed",
                "error": {"code": "server_is_overloaded", "message": "The server is overloaded."}}}),
            Overload,
            Some("server_is_overloaded"),
        ),
        (
            "responses failed quota",
            json!({"type": "response.failed", "response": {"status": "failed",
                "error": {"code": "insufficient_quota", "message": "You exceeded your current quota."}}}),
            Policy,
            Some("insufficient_quota"),
        ),
        (
            "responses error event",
            json!({"type": "error", "code": "server_is_overloaded", "message": "overloaded", "param": null, "sequence_number": 2}),
            Overload,
            Some("server_is_overloaded"),
        ),
        (
            "chat completions chunk error",
            json!({"error": {"message": "The server had an error", "type": "server_error", "code": null}}),
            Server,
            Some("server_error"),
        ),
        (
            "gemini unavailable",
            json!({"error": {"code": 503, "status": "UNAVAILABLE", "message": "overloaded"}}),
            Overload,
            Some("UNAVAILABLE"),
        ),
        (
            "responses failed invalid prompt",
            json!({"type": "response.failed", "response": {"status": "failed",
                "error": {"code": "invalid_prompt", "message": "Invalid prompt: flagged."}}}),
            Request,
            Some("invalid_prompt"),
        ),
        (
            "responses failed image too large",
            json!({"type": "response.failed", "response": {"error": {"code": "image_too_large", "message": "x"}}}),
            Request,
            Some("image_too_large"),
        ),
        ("unknown shape", json!({"weird": true}), Server, None),
        ("null", json!(null), Server, None),
    ];
    for (name, payload, class, code) in rows {
        let c = classify_stream_error(&payload);
        assert_eq!(c.class, class, "{name}: {c:?}");
        assert_eq!(c.code.as_deref(), code, "{name}");
    }
}

#[test]
fn stream_error_at_resolves_reset_date() {
    let payload = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": "usage limit reached until 2026-12-01T09:00:00Z"}});
    let c = classify_stream_error_at(&payload, now());
    assert_eq!(c.class, ErrorClass::Policy);
    assert_eq!(c.retry_after, Some(secs(24 * 3600)));
    assert_eq!(c.pause, Some(POLICY_MAX_PAUSE));
    let without_clock = classify_stream_error(&payload);
    assert_eq!(without_clock.pause, Some(POLICY_MIN_PAUSE));
}

#[test]
fn transport_table_maps_to_connect_timeout_deadline() {
    use ErrorClass::*;
    let rows = [
        (TransportFailure::Connect, Connect, "connect_error"),
        (TransportFailure::ConnectTimeout, Connect, "connect_timeout"),
        (
            TransportFailure::ConnectionReset,
            Connect,
            "connection_reset",
        ),
        (
            TransportFailure::ResponseTimeout,
            Timeout,
            "response_timeout",
        ),
        (
            TransportFailure::FirstTokenTimeout,
            Timeout,
            "first_token_timeout",
        ),
        (TransportFailure::StreamIdle, Timeout, "stream_idle_timeout"),
        (
            TransportFailure::RequestDeadline,
            Deadline,
            "deadline_exceeded",
        ),
    ];
    for (kind, class, code) in rows {
        let c = classify_transport(kind);
        assert_eq!(c.class, class, "{kind:?}");
        assert_eq!(c.code.as_deref(), Some(code));
        assert_eq!(c.pause, None);
    }
}

#[test]
fn error_class_policy_table() {
    use ErrorClass::*;
    // (class, provider_side, retry_elsewhere, retry_same_provider, label)
    let rows = [
        (Capacity, true, true, true, "capacity"),
        (Overload, true, true, true, "overload"),
        (Timeout, true, true, false, "timeout"),
        (Connect, true, true, true, "connect"),
        (Server, true, true, true, "server"),
        (Auth, true, true, false, "auth"),
        (Policy, true, true, false, "policy"),
        (Request, false, false, false, "request"),
        (Deadline, false, false, false, "deadline"),
    ];
    assert_eq!(rows.len(), ErrorClass::ALL.len());
    for (class, side, elsewhere, same, label) in rows {
        assert_eq!(class.is_provider_side(), side, "{class:?}");
        assert_eq!(class.retry_elsewhere(), elsewhere, "{class:?}");
        assert_eq!(class.retry_same_provider(), same, "{class:?}");
        assert_eq!(class.metric_label(), label);
        assert_eq!(class.to_string(), label);
        assert_eq!(serde_json::to_value(class).unwrap(), json!(label));
    }
}

#[test]
fn classify_openai_compatible_shapes_table() {
    use ErrorClass::*;
    check(&[
        row(
            "azure rate limit with string code and retry phrase",
            429,
            vec![],
            json!({"error": {"code": "429", "message": "Requests to the ChatCompletions_Create Operation have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds."}}),
            Capacity,
            Some(secs(6)),
            Some("429"),
        ),
        row(
            "azure content filter",
            400,
            vec![],
            json!({"error": {"code": "content_filter", "message": "The response was filtered", "status": 400}}),
            Request,
            None,
            Some("content_filter"),
        ),
        row(
            "groq tokens per day",
            429,
            vec![],
            openai(
                "Rate limit reached on tokens per day (TPD): Limit 500000, Used 499000. Please try again in 5m46s.",
                "tokens",
                Some("rate_limit_exceeded"),
            ),
            Policy,
            Some(secs(346)),
            Some("rate_limit_exceeded"),
        ),
        row(
            "vllm object error",
            400,
            vec![],
            json!({"object": "error", "message": "max_tokens is too large", "type": "BadRequestError", "param": null, "code": 400}),
            Request,
            None,
            Some("BadRequestError"),
        ),
        row(
            "mistral object error",
            429,
            vec![],
            json!({"object": "error", "message": "Requests rate limit exceeded", "type": "rate_limit_error", "param": null, "code": "1300"}),
            Capacity,
            None,
            Some("1300"),
        ),
        row(
            "deepseek insufficient balance",
            402,
            vec![],
            json!({"error": {"message": "Insufficient Balance", "type": "unknown_error"}}),
            Policy,
            None,
            Some("unknown_error"),
        ),
        row(
            "plain string error",
            429,
            vec![],
            json!({"error": "Too many requests"}),
            Capacity,
            None,
            None,
        ),
        row(
            "fastapi detail",
            503,
            vec![("retry-after", "3")],
            json!({"detail": "Service temporarily overloaded"}),
            Overload,
            Some(secs(3)),
            None,
        ),
    ]);
}

#[test]
fn stream_error_bedrock_exception_events() {
    let rows = [
        (
            json!({"throttlingException": {"message": "Too many requests"}}),
            ErrorClass::Capacity,
            "throttlingException",
        ),
        (
            json!({"modelStreamErrorException": {"message": "boom", "originalStatusCode": 500}}),
            ErrorClass::Server,
            "modelStreamErrorException",
        ),
        (
            json!({"serviceUnavailableException": {"message": "busy"}}),
            ErrorClass::Overload,
            "serviceUnavailableException",
        ),
        (
            json!({"validationException": {"message": "bad input"}}),
            ErrorClass::Request,
            "validationException",
        ),
        (
            json!({"internalServerException": {"message": "oops"}}),
            ErrorClass::Server,
            "internalServerException",
        ),
    ];
    for (payload, class, code) in rows {
        let c = classify_stream_error(&payload);
        assert_eq!(c.class, class, "{payload}");
        assert_eq!(c.code.as_deref(), Some(code));
        assert!(c.message.is_some());
    }
}
