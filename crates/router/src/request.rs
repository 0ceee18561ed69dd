//! A client request as the executor sees it: the operation, the parsed body, the caller and
//! the estimate ([`ClientRequest`]), and the error shown to the client in its own dialect
//! ([`ApiError`]). Parsed by the server, consumed by the broker, the executor and the
//! transcription path; it imports nothing above the configuration.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::Value;
use switchyard_api::provider::Modality;
use switchyard_core::quota::{Dimension, RateFigures, Refusal, Scope, Wait};

use crate::config::Tenant;
use crate::wire::{Dialect, anthropic, error_body, openai};

/// Longest project key (affinity header value) accepted, bytes.
pub const MAX_PROJECT_KEY_BYTES: usize = 256;

/// What the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientOp {
    /// `POST /v1/chat/completions` (OpenAI dialect).
    Chat,
    /// `POST /v1/messages` (Anthropic dialect).
    Messages,
    /// `POST /v1/embeddings` (OpenAI dialect).
    Embeddings,
    /// `POST /v1/rerank` (OpenAI-compatible dialect).
    Rerank,
    /// `POST /v1/audio/transcriptions` (OpenAI multipart; the body is the internal
    /// [`crate::wire::transcription::TranscriptionRequest`] as [`ClientBody::Json`]).
    Transcription,
}

impl ClientOp {
    /// The dialect the client speaks.
    pub fn dialect(self) -> Dialect {
        match self {
            ClientOp::Messages => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }
}

/// A parsed client request body.
#[derive(Debug, Clone)]
pub enum ClientBody {
    /// OpenAI chat completion request.
    Chat(Box<openai::ChatRequest>),
    /// Anthropic messages request.
    Messages(Box<anthropic::MessagesRequest>),
    /// Embeddings or rerank request, forwarded with only `model` replaced.
    Json(serde_json::Map<String, Value>),
}

/// The modalities a request needs from a provider's model (DESIGN §3 step 1): embedding and
/// rerank by operation; for chat, text plus image or audio when any message carries such a part.
pub fn required_modalities(op: ClientOp, body: &ClientBody) -> Vec<Modality> {
    match op {
        ClientOp::Embeddings => return vec![Modality::Embedding],
        ClientOp::Rerank => return vec![Modality::Rerank],
        ClientOp::Transcription => return vec![Modality::Transcription],
        ClientOp::Chat | ClientOp::Messages => {}
    }
    let mut needs = vec![Modality::Text];
    let mut add = |m: Modality| {
        if !needs.contains(&m) {
            needs.push(m);
        }
    };
    match body {
        ClientBody::Chat(chat) => {
            for part in chat
                .messages
                .iter()
                .filter_map(|m| match &m.content {
                    Some(openai::MessageContent::Parts(parts)) => Some(parts),
                    _ => None,
                })
                .flatten()
            {
                match part {
                    openai::ContentPart::Known(openai::KnownPart::ImageUrl { .. }) => {
                        add(Modality::Image)
                    }
                    openai::ContentPart::Other(v)
                        if v.get("type").and_then(Value::as_str) == Some("input_audio") =>
                    {
                        add(Modality::Audio);
                    }
                    _ => {}
                }
            }
        }
        ClientBody::Messages(m) => {
            for block in m
                .messages
                .iter()
                .filter_map(|m| match &m.content {
                    anthropic::MessageContent::Blocks(blocks) => Some(blocks),
                    anthropic::MessageContent::Text(_) => None,
                })
                .flatten()
            {
                if let anthropic::ContentBlock::Known(anthropic::Block::Image { .. }) = block {
                    add(Modality::Image);
                }
            }
        }
        ClientBody::Json(_) => {}
    }
    needs
}

/// The `traceparent` header of W3C Trace Context.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
/// The `tracestate` header of W3C Trace Context.
pub const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// A client's `traceparent` and `tracestate` headers as received (the first value of each),
/// for [`crate::telemetry`].
#[derive(Debug, Clone, Default)]
pub struct TraceHeaders {
    /// `traceparent`, when sent.
    pub traceparent: Option<http::HeaderValue>,
    /// `tracestate`, when sent.
    pub tracestate: Option<http::HeaderValue>,
}

impl TraceHeaders {
    /// Takes the trace-context headers of a client request.
    pub fn from_request(headers: &http::HeaderMap) -> Self {
        TraceHeaders {
            traceparent: headers.get(TRACEPARENT).cloned(),
            tracestate: headers.get(TRACESTATE).cloned(),
        }
    }
}

/// One client request, identified and parsed.
#[derive(Debug)]
pub struct ClientRequest {
    /// Operation.
    pub op: ClientOp,
    /// Body.
    pub body: ClientBody,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Whether an OpenAI streaming client asked for the usage chunk itself.
    pub client_wants_usage: bool,
    /// Project key for cache affinity.
    pub project: String,
    /// The authenticated tenant, when authentication is on.
    pub tenant: Option<Arc<Tenant>>,
    /// Request id echoed in `x-request-id`.
    pub request_id: String,
    /// Modalities the provider's model must handle.
    pub modalities: Vec<Modality>,
    /// Input-token estimate: reserved before sending, and charged when a provider reports no
    /// usage.
    pub estimated_input_tokens: u64,
    /// Output tokens reserved: the request's `max_tokens`/`max_completion_tokens`, else the
    /// route's default (0 for embeddings and rerank).
    pub output_allowance: u64,
    /// The whole estimate (raw tokenizer count included, for the route's calibration).
    pub estimate: crate::estimate::Estimate,
    /// Hash of the endpoint and body, to tell a repeated `Idempotency-Key` request from a
    /// different one.
    pub fingerprint: u64,
    /// Parameters dropped by a lossy translation (comma-separated), for the
    /// `x-switchyard-dropped-parameters` response header.
    pub dropped: Arc<std::sync::Mutex<Option<String>>>,
    /// The client's trace context, continued by the request's span or forwarded upstream.
    pub trace: TraceHeaders,
}

/// An error shown to the client in its own dialect.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable reason code (low cardinality; also the metric outcome label).
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// `Retry-After`, when waiting helps.
    pub retry_after: Option<Duration>,
    /// The quota refusal behind this error, when a bucket refused (the request may queue).
    pub quota: Option<Box<Refusal>>,
}

impl ApiError {
    /// An error with no Retry-After.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.to_owned(),
            message: message.into(),
            retry_after: None,
            quota: None,
        }
    }

    /// A 429 for a bucket's refusal: the reason code, `Retry-After` no shorter than the wait
    /// the binding bucket named (one second when a concurrency slot must free first), and, for
    /// the caller's own buckets only, the bucket's figures in the `x-ratelimit-*` headers.
    pub fn quota(refusal: Box<Refusal>) -> Self {
        // `tenant/<ns>/<name>/<limit>`: name the limit and whose it is (own or an ancestor's).
        let limit = refusal.key.rsplit('/').next().unwrap_or(&refusal.key);
        let whose = format!("{} {}", refusal.scope.kind_label(), refusal.scope.name());
        let unit = match refusal.dimension {
            Dimension::SpendMicroUsd => "micro-USD",
            Dimension::Concurrency => "requests in flight",
            d => d.label(),
        };
        if refusal.wait == Wait::Never {
            // Waiting cannot help: a client error, so SDKs do not retry it as a rate limit.
            let hint = if refusal.dimension == Dimension::OutputTokens
                || refusal.dimension == Dimension::TotalTokens
            {
                " (lower max_tokens; when it is unset the route's defaultMaxTokens is reserved)"
            } else {
                ""
            };
            let message = format!(
                "the request needs {} {unit} but limit {limit:?} of {whose} holds at most {}; it can never be admitted{hint}",
                refusal.demanded, refusal.figures.limit
            );
            return ApiError {
                status: StatusCode::BAD_REQUEST,
                code: "request_exceeds_limit".to_owned(),
                message,
                retry_after: None,
                quota: Some(refusal),
            };
        }
        let message = if refusal.scope.is_provider_side() {
            "every provider of this route is at its rate limit; retry after the indicated time"
                .to_owned()
        } else {
            format!(
                "limit {limit:?} of {whose} reached ({} of {} {unit} left, code {}); retry after the indicated time",
                refusal.figures.remaining, refusal.figures.limit, refusal.reason
            )
        };
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: refusal.reason.clone(),
            message,
            retry_after: match refusal.wait {
                Wait::After(d) => Some(d),
                Wait::OnRelease | Wait::Never => Some(Duration::from_secs(1)),
            },
            quota: Some(refusal),
        }
    }

    /// The HTTP response in `dialect`'s error shape.
    pub fn into_response(self, dialect: Dialect) -> Response {
        let body = error_body(
            dialect,
            self.status.as_u16(),
            &self.message,
            Some(&self.code),
        );
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(wait) = self.retry_after {
            // Whole seconds, rounded up: Retry-After is a lower bound.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        if let Some(r) = &self.quota
            && matches!(r.scope, Scope::Tenant(_) | Scope::ApiKey(_))
        {
            // Only the caller's own bucket is shown; provider capacity is shared with other
            // tenants and says nothing about this caller.
            ratelimit_headers(headers, &r.figures);
        }
        response
    }
}

/// Writes `x-ratelimit-limit`, `x-ratelimit-remaining` and `x-ratelimit-reset` (seconds until
/// the bucket is full again or its window resets, rounded up).
pub fn ratelimit_headers(headers: &mut http::HeaderMap, f: &RateFigures) {
    let reset = f.reset_after.as_secs() + u64::from(f.reset_after.subsec_nanos() > 0);
    headers.insert("x-ratelimit-limit", HeaderValue::from(f.limit));
    headers.insert("x-ratelimit-remaining", HeaderValue::from(f.remaining));
    headers.insert("x-ratelimit-reset", HeaderValue::from(reset));
}

/// Header names whose values identify the caller; marked sensitive before any tracing.
pub fn sensitive_headers() -> [http::HeaderName; 3] {
    [
        header::AUTHORIZATION,
        http::HeaderName::from_static("x-api-key"),
        header::PROXY_AUTHORIZATION,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: Value) -> ClientBody {
        ClientBody::Chat(Box::new(serde_json::from_value(json).unwrap()))
    }

    #[test]
    fn required_modalities_image_part_needs_image() {
        let text = chat(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(
            required_modalities(ClientOp::Chat, &text),
            vec![Modality::Text]
        );
        let image = chat(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            ]}]}),
        );
        assert_eq!(
            required_modalities(ClientOp::Chat, &image),
            vec![Modality::Text, Modality::Image]
        );
        let json = ClientBody::Json(serde_json::Map::new());
        assert_eq!(
            required_modalities(ClientOp::Embeddings, &json),
            vec![Modality::Embedding]
        );
    }

    #[test]
    fn api_error_retry_after_rounds_up_whole_seconds() {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "provider_capacity",
            "slow down",
        );
        e.retry_after = Some(Duration::from_millis(2100));
        let r = e.into_response(Dialect::Anthropic);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    }
}
