//! Error bodies and rate-limit headers in each vendor dialect.
//!
//! OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.
//! Anthropic shape: `{"type": "error", "error": {"type", "message"}, "request_id"}` with types
//! `invalid_request_error` (400), `authentication_error` (401), `billing_error` (402),
//! `not_found_error` (404), `rate_limit_error` (429), `api_error` (500), `overloaded_error`
//! (503/529).
//! Google shape (Vertex AI): `{"error": {"code", "message", "status"}}` with canonical status
//! names (`RESOURCE_EXHAUSTED` for 429, `INVALID_ARGUMENT` for 400, `UNAUTHENTICATED` for 401, ...)
//! and no rate-limit or `Retry-After` headers (a fault's `retry_after` is dropped there).
//! AWS shape (Bedrock, restJson1): `{"message"}` plus `x-amzn-errortype: <Exception>:<namespace>`
//! (botocore takes the code from that header, the message from the body) and `x-amzn-requestid`.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::clock::{go_duration, http_date_in, parse_go_duration, rfc3339_in};
use crate::fault::{BedrockExceptionKind, Fault, StreamError, VertexQuotaCause};

/// Which vendor's conventions a response follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    OpenAi,
    Anthropic,
    Google,
    Aws,
}

/// A vendor-neutral error, rendered per dialect.
#[derive(Debug, Clone)]
pub(crate) struct ErrorSpec {
    pub(crate) status: u16,
    pub(crate) openai_type: String,
    pub(crate) openai_code: Option<String>,
    pub(crate) param: Option<String>,
    pub(crate) anthropic_type: String,
    pub(crate) message: String,
    pub(crate) headers: Vec<(String, String)>,
    /// Reset overrides (`x-ratelimit-reset-*` text) for the rate-limit headers.
    pub(crate) reset_requests: Option<String>,
    pub(crate) reset_tokens: Option<String>,
    /// Google canonical status override (`RESOURCE_EXHAUSTED`, ...); default from the status.
    pub(crate) google_status: Option<String>,
    /// AWS exception name override (`ThrottlingException`, ...); default from the status.
    pub(crate) aws_type: Option<String>,
}

/// Google's canonical code name for an HTTP status (google.rpc.Code mapping).
pub(crate) fn google_status_for(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        503 | 529 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// The Bedrock runtime exception a status maps to when a fault names none.
pub(crate) fn aws_type_for(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "ValidationException",
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelStreamErrorException",
        429 => "ThrottlingException",
        503 | 529 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

fn anthropic_type_for(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

fn openai_type_for(status: u16) -> &'static str {
    match status {
        400 | 404 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "insufficient_quota",
        429 => "requests",
        _ => "server_error",
    }
}

impl ErrorSpec {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            openai_type: openai_type_for(status).to_owned(),
            openai_code: None,
            param: None,
            anthropic_type: anthropic_type_for(status).to_owned(),
            message: message.into(),
            headers: Vec::new(),
            reset_requests: None,
            reset_tokens: None,
            google_status: None,
            aws_type: None,
        }
    }

    /// Sets the AWS exception name (builder style).
    pub(crate) fn aws(mut self, exception: &str) -> Self {
        self.aws_type = Some(exception.to_owned());
        self
    }

    /// The AWS exception name this error is sent as.
    pub(crate) fn aws_exception(&self) -> String {
        self.aws_type
            .clone()
            .unwrap_or_else(|| aws_type_for(self.status).to_owned())
    }

    fn code(mut self, code: &str) -> Self {
        self.openai_code = Some(code.to_owned());
        self
    }

    fn header(mut self, name: &str, value: String) -> Self {
        self.headers.push((name.to_owned(), value));
        self
    }

    fn retry_after(self, secs: Option<u64>) -> Self {
        match secs {
            Some(s) => self.header("retry-after", s.to_string()),
            None => self,
        }
    }

    /// The error a status-kind fault answers with; `None` for faults that are not plain errors.
    pub(crate) fn for_fault(fault: &Fault) -> Option<Self> {
        Some(match fault {
            Fault::RateLimited {
                retry_after,
                http_date,
                retry_after_ms,
                reset_requests,
                reset_tokens,
            } => {
                let mut e = Self::new(
                    429,
                    "Rate limit reached for requests. Please try again later.",
                )
                .code("rate_limit_exceeded");
                if let Some(s) = retry_after {
                    let v = if *http_date {
                        http_date_in(Duration::from_secs(*s))
                    } else {
                        s.to_string()
                    };
                    e = e.header("retry-after", v);
                }
                if let Some(ms) = retry_after_ms {
                    e = e.header("retry-after-ms", ms.to_string());
                }
                e.reset_requests.clone_from(reset_requests);
                e.reset_tokens.clone_from(reset_tokens);
                e
            }
            Fault::InsufficientQuota { retry_after } => {
                let mut e = Self::new(
                    429,
                    "You exceeded your current quota, please check your plan and billing details.",
                )
                .code("insufficient_quota")
                .retry_after(*retry_after);
                e.openai_type = "insufficient_quota".to_owned();
                e.anthropic_type = "billing_error".to_owned();
                e
            }
            Fault::UsageLimit { until } => {
                let until = until
                    .clone()
                    .unwrap_or_else(|| rfc3339_in(Duration::from_secs(14 * 86_400)));
                Self::new(
                    400,
                    format!(
                        "You have reached your specified API usage limits. You will regain \
                         access on {until}."
                    ),
                )
            }
            Fault::PaymentRequired => {
                Self::new(402, "Insufficient credits: your credit balance is too low.")
                    .code("insufficient_quota")
            }
            Fault::ServiceUnavailable { retry_after } => {
                Self::new(503, "The service is temporarily unavailable. Please retry.")
                    .code("service_unavailable")
                    .retry_after(*retry_after)
            }
            Fault::Overloaded {
                status,
                retry_after,
            } => {
                let mut e = Self::new(*status, "Overloaded")
                    .code("server_is_overloaded")
                    .retry_after(*retry_after);
                e.anthropic_type = "overloaded_error".to_owned();
                e
            }
            Fault::ServerError { status } => Self::new(
                *status,
                "The server had an error while processing your request.",
            ),
            Fault::InvalidParameter { param, message } => {
                let mut e = Self::new(
                    400,
                    message
                        .clone()
                        .unwrap_or_else(|| format!("Invalid value for '{param}'.")),
                )
                .code("invalid_value");
                e.param = Some(param.clone());
                e
            }
            Fault::Status {
                status,
                error_type,
                code,
                message,
                headers,
            } => {
                let mut e = Self::new(
                    *status,
                    message
                        .clone()
                        .unwrap_or_else(|| format!("injected status {status}")),
                );
                if let Some(t) = error_type {
                    e.openai_type.clone_from(t);
                    e.anthropic_type.clone_from(t);
                }
                e.openai_code.clone_from(code);
                e.headers
                    .extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
                e
            }
            Fault::VertexResourceExhausted {
                cause,
                quota_metric,
            } => {
                let message = match cause {
                    VertexQuotaCause::SharedCapacity => {
                        "Resource exhausted, please try again later. Please refer to \
                         https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 \
                         for more details."
                            .to_owned()
                    }
                    VertexQuotaCause::ProjectQuota => format!(
                        "Quota exceeded for {} with base model: {{model}}. Please submit a quota \
                         increase request. \
                         https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.",
                        quota_metric.as_deref().unwrap_or(
                            "aiplatform.googleapis.com/\
                             generate_content_requests_per_minute_per_project_per_base_model"
                        )
                    ),
                    VertexQuotaCause::ProvisionedThroughput => {
                        "Too many requests. Exceeded the Provisioned Throughput.".to_owned()
                    }
                };
                let mut e = Self::new(429, message).code("rate_limit_exceeded");
                e.google_status = Some("RESOURCE_EXHAUSTED".to_owned());
                e
            }
            Fault::BedrockException {
                exception,
                status,
                message,
            } => Self::bedrock(*exception, *status, message.as_deref()),
            Fault::BedrockStreamException {
                exception, message, ..
            } => Self::bedrock(*exception, None, message.as_deref()),
            _ => return None,
        })
    }

    /// A Bedrock exception as an error spec (also used for the in-stream exception frame).
    pub(crate) fn bedrock(
        exception: BedrockExceptionKind,
        status: Option<u16>,
        message: Option<&str>,
    ) -> Self {
        let mut e = Self::new(
            status.unwrap_or_else(|| exception.status()),
            message.unwrap_or_else(|| exception.default_message()),
        );
        e.aws_type = Some(exception.name().to_owned());
        e
    }

    /// The error carried inside a stream (and its HTTP equivalent for non-streaming calls).
    pub(crate) fn for_stream_error(e: StreamError) -> Self {
        match e {
            StreamError::Overloaded => {
                let mut s = Self::new(529, "Overloaded").code("server_is_overloaded");
                s.openai_type = "server_error".to_owned();
                s
            }
            StreamError::InsufficientQuota => {
                Self::for_fault(&Fault::InsufficientQuota { retry_after: None })
                    .unwrap_or_else(|| Self::new(429, "insufficient quota"))
            }
            StreamError::ServerError => Self::new(500, "Internal server error"),
            StreamError::RateLimited => {
                Self::new(429, "Rate limit reached.").code("rate_limit_exceeded")
            }
        }
    }

    /// JSON body in the dialect.
    pub(crate) fn body(&self, dialect: Dialect, request_id: &str) -> Value {
        match dialect {
            Dialect::OpenAi => json!({"error": {
                "message": self.message, "type": self.openai_type,
                "param": self.param, "code": self.openai_code}}),
            Dialect::Anthropic => json!({"type": "error",
                "error": {"type": self.anthropic_type, "message": self.message},
                "request_id": request_id}),
            Dialect::Google => json!({"error": {"code": self.status, "message": self.message,
                "status": self.google_status.clone()
                    .unwrap_or_else(|| google_status_for(self.status).to_owned())}}),
            Dialect::Aws => json!({"message": self.message}),
        }
    }

    /// Complete HTTP response: status, JSON body, fault headers and rate-limit headers.
    pub(crate) fn into_response(
        self,
        dialect: Dialect,
        request_id: &str,
        rl: &RateSnapshot,
    ) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut headers = HeaderMap::new();
        let mut snap = rl.clone();
        if self.status == 429 {
            // A 429 from a rate limit says so in its headers: nothing left until the reset.
            snap.remaining_requests = 0;
            if let Some(d) = self.reset_requests.as_deref().and_then(parse_go_duration) {
                snap.reset_requests = d;
            }
            if let Some(d) = self.reset_tokens.as_deref().and_then(parse_go_duration) {
                snap.reset_tokens = d;
            }
        }
        snap.apply(
            dialect,
            &mut headers,
            self.reset_requests.as_deref(),
            self.reset_tokens.as_deref(),
        );
        set_request_id(&mut headers, dialect, request_id);
        for (k, v) in &self.headers {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::try_from(v)) {
                headers.insert(k, v);
            }
        }
        if dialect == Dialect::Google {
            // Vertex AI never says when to come back, whatever the fault asked for.
            headers.remove("retry-after");
            headers.remove("retry-after-ms");
        }
        if dialect == Dialect::Aws {
            // botocore reads the code from this header (the part before ':').
            let name = self.aws_exception();
            // Auth refusals come from AWS's front door, model errors from Bedrock itself.
            let namespace = match name.as_str() {
                "MissingAuthenticationTokenException"
                | "IncompleteSignatureException"
                | "InvalidSignatureException"
                | "UnrecognizedClientException"
                | "ExpiredTokenException" => "com.amazon.coral.service",
                _ => "com.amazon.bedrock",
            };
            let v = format!("{name}:http://internal.amazon.com/coral/{namespace}/");
            if let Ok(v) = HeaderValue::try_from(v) {
                headers.insert(HeaderName::from_static("x-amzn-errortype"), v);
            }
        }
        let body = self.body(dialect, request_id);
        (status, headers, axum::Json(body)).into_response()
    }
}

pub(crate) fn set_request_id(headers: &mut HeaderMap, dialect: Dialect, id: &str) {
    let name = match dialect {
        Dialect::OpenAi => "x-request-id",
        Dialect::Anthropic => "request-id",
        Dialect::Google => "x-goog-request-id",
        Dialect::Aws => "x-amzn-requestid",
    };
    if let Ok(v) = HeaderValue::try_from(id) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// Rate-limit state at one response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RateSnapshot {
    pub(crate) limit_requests: u64,
    pub(crate) remaining_requests: u64,
    pub(crate) reset_requests: Duration,
    pub(crate) limit_tokens: u64,
    pub(crate) remaining_tokens: u64,
    pub(crate) reset_tokens: Duration,
}

impl RateSnapshot {
    /// Writes `x-ratelimit-*` (OpenAI, Go durations) or `anthropic-ratelimit-*` (RFC 3339).
    pub(crate) fn apply(
        &self,
        dialect: Dialect,
        headers: &mut HeaderMap,
        reset_requests_text: Option<&str>,
        reset_tokens_text: Option<&str>,
    ) {
        let mut put = |name: &str, value: String| {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.insert(k, v);
            }
        };
        match dialect {
            Dialect::OpenAi => {
                put(
                    "x-ratelimit-limit-requests",
                    self.limit_requests.to_string(),
                );
                put(
                    "x-ratelimit-remaining-requests",
                    self.remaining_requests.to_string(),
                );
                put(
                    "x-ratelimit-reset-requests",
                    reset_requests_text
                        .map_or_else(|| go_duration(self.reset_requests), str::to_owned),
                );
                put("x-ratelimit-limit-tokens", self.limit_tokens.to_string());
                put(
                    "x-ratelimit-remaining-tokens",
                    self.remaining_tokens.to_string(),
                );
                put(
                    "x-ratelimit-reset-tokens",
                    reset_tokens_text.map_or_else(|| go_duration(self.reset_tokens), str::to_owned),
                );
            }
            // Vertex AI and Bedrock advertise no rate-limit state in headers.
            Dialect::Google | Dialect::Aws => {}
            Dialect::Anthropic => {
                put(
                    "anthropic-ratelimit-requests-limit",
                    self.limit_requests.to_string(),
                );
                put(
                    "anthropic-ratelimit-requests-remaining",
                    self.remaining_requests.to_string(),
                );
                put(
                    "anthropic-ratelimit-requests-reset",
                    rfc3339_in(self.reset_requests),
                );
                for dim in ["tokens", "input-tokens", "output-tokens"] {
                    put(
                        &format!("anthropic-ratelimit-{dim}-limit"),
                        self.limit_tokens.to_string(),
                    );
                    put(
                        &format!("anthropic-ratelimit-{dim}-remaining"),
                        self.remaining_tokens.to_string(),
                    );
                    put(
                        &format!("anthropic-ratelimit-{dim}-reset"),
                        rfc3339_in(self.reset_tokens),
                    );
                }
            }
        }
    }
}

/// Fixed one-minute windows of requests and tokens.
#[derive(Debug, Default)]
pub(crate) struct RateWindows {
    window: u64,
    requests: u64,
    tokens: u64,
}

const WINDOW: Duration = Duration::from_secs(60);

impl RateWindows {
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    fn roll(&mut self, now: Duration) -> Duration {
        let w = now.as_secs() / WINDOW.as_secs();
        if w != self.window {
            self.window = w;
            self.requests = 0;
            self.tokens = 0;
        }
        WINDOW * u32::try_from(w + 1).unwrap_or(u32::MAX) - now
    }

    /// Whether a request of `tokens` fits now (without charging it).
    pub(crate) fn fits(&mut self, now: Duration, tokens: u64, rpm: u64, tpm: u64) -> bool {
        self.roll(now);
        self.requests < rpm && self.tokens.saturating_add(tokens) <= tpm
    }

    /// Charges a request and returns the snapshot to advertise.
    pub(crate) fn charge(
        &mut self,
        now: Duration,
        tokens: u64,
        rpm: u64,
        tpm: u64,
    ) -> RateSnapshot {
        self.roll(now);
        self.requests += 1;
        self.tokens = self.tokens.saturating_add(tokens);
        self.snapshot(now, rpm, tpm)
    }

    pub(crate) fn snapshot(&mut self, now: Duration, rpm: u64, tpm: u64) -> RateSnapshot {
        let reset = self.roll(now);
        RateSnapshot {
            limit_requests: rpm,
            remaining_requests: rpm.saturating_sub(self.requests),
            reset_requests: reset,
            limit_tokens: tpm,
            remaining_tokens: tpm.saturating_sub(self.tokens),
            reset_tokens: reset,
        }
    }
}
