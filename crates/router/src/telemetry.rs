//! The request path's OpenTelemetry spans and W3C trace-context propagation.
//!
//! Two spans per request, both on the target [`TARGET`] so that only an OpenTelemetry layer
//! sees them (the log layer filters the target out, and with no exporter configured no layer
//! is interested: the spans are disabled at their call sites and cost a cached interest check):
//!
//! - the **request** span (`SpanKind::Server`, named `"{operation} {model}"`), child of the
//!   client's `traceparent` when it sent one, carrying the GenAI semantic conventions
//!   (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.provider.name`,
//!   `gen_ai.response.model`, `gen_ai.usage.input_tokens` / `output_tokens`,
//!   `gen_ai.usage.cache_read.input_tokens` / `cache_creation.input_tokens`,
//!   `gen_ai.response.finish_reasons`) and ours (`switchyard.route`, `switchyard.tenant`,
//!   `switchyard.attempts`, `switchyard.outcome`);
//! - one **attempt** span per upstream attempt (`SpanKind::Client`), with the provider's
//!   conventions (`gen_ai.provider.name`, the upstream `gen_ai.request.model`),
//!   `switchyard.provider`, `switchyard.chain.position` (0 = the chain's head),
//!   `switchyard.attempt` (1-based), `switchyard.reservation.wait_ms` and, when it failed,
//!   `switchyard.reason` and `error.type`. Its context is sent to the provider as
//!   `traceparent` / `tracestate`. The served attempt's usage, response model and finish
//!   reasons are recorded once, on the request span (only one attempt per request can be
//!   served, and every attribute costs the router CPU twice: recorded here, encoded at export).
//!
//! Prompts, completions and keys are never recorded. With tracing off, a client's
//! `traceparent` and `tracestate` are forwarded to the provider unchanged, as a proxy that
//! does not take part in the trace would.
//!
//! The conventions are OpenTelemetry's "Semantic conventions for generative AI systems"
//! (`gen_ai.*`, development status) and the W3C Trace Context recommendation.

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::config::{ProviderConfig, Route};
use crate::request::{ClientOp, ClientRequest, TRACEPARENT, TRACESTATE, TraceHeaders};
use crate::wire::usage::NormalizedUsage;
use switchyard_api::provider::ProviderApi;

/// The `tracing` target of the spans meant for OpenTelemetry only.
pub const TARGET: &str = "switchyard::otel";

/// Whether an OpenTelemetry layer is installed ([`enable_export`]). Until it is, the request
/// path opens no span on [`TARGET`]: with the logs' per-layer filter alone such a span is still
/// created (the registry allocates it and every `record` on it is visited), and the finish
/// reasons were parsed for it, about 2 % of the router's samples in the 2026-12-07 profile
/// (docs/profile.md).
static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Declares that a layer exporting [`TARGET`]'s spans is installed; called once at start by
/// whoever installs it, before any request.
pub fn enable_export() {
    EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn exporting() -> bool {
    EXPORTING.load(std::sync::atomic::Ordering::Relaxed)
}

/// The spans of one request: the request span and the current attempt's span (both
/// [`Span::none`] when nothing exports traces).
#[derive(Debug, Clone)]
pub struct Spans {
    /// The request span.
    pub request: Span,
    /// The attempt span.
    pub attempt: Span,
}

impl Spans {
    /// Spans that record nothing.
    pub fn none() -> Self {
        Spans {
            request: Span::none(),
            attempt: Span::none(),
        }
    }

    /// Records a successful attempt's usage and finish reasons on the request span.
    pub fn succeeded(&self, usage: Option<&NormalizedUsage>, finish_reasons: &[String]) {
        let span = &self.request;
        if span.is_disabled() {
            return;
        }
        if let Some(u) = usage {
            span.record("gen_ai.usage.input_tokens", int(u.input_total()));
            span.record("gen_ai.usage.output_tokens", int(u.output));
            span.record("gen_ai.usage.cache_read.input_tokens", int(u.cache_read));
            span.record(
                "gen_ai.usage.cache_creation.input_tokens",
                int(u.cache_write),
            );
        }
        if !finish_reasons.is_empty() {
            let reasons: Vec<opentelemetry::StringValue> =
                finish_reasons.iter().map(|r| r.clone().into()).collect();
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(reasons.into()),
            );
        }
    }
}

/// A count as a signed OTLP integer. tracing-opentelemetry exports `u64` fields as their
/// `Debug` strings, which backends do not aggregate as numbers; counts here never reach
/// `i64::MAX`, and one that did would be clamped.
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The GenAI `gen_ai.operation.name` of a client operation.
pub fn operation_name(op: ClientOp) -> &'static str {
    match op {
        ClientOp::Chat | ClientOp::Messages => "chat",
        ClientOp::Embeddings => "embeddings",
        ClientOp::Rerank => "rerank",
        ClientOp::Transcription => "transcription",
    }
}

/// The GenAI `gen_ai.provider.name` of a provider's protocol.
pub fn provider_name(api: &ProviderApi) -> &'static str {
    match api {
        ProviderApi::Openai => "openai",
        ProviderApi::Anthropic => "anthropic",
        ProviderApi::Vertex => "gcp.vertex_ai",
        ProviderApi::Bedrock => "aws.bedrock",
    }
}

/// Opens the request span (see the module docs), child of the client's trace context;
/// [`Span::none`] unless [`enable_export`] was called.
pub fn request_span(route: &Route, req: &ClientRequest) -> Span {
    if !exporting() {
        return Span::none();
    }
    let operation = operation_name(req.op);
    let span = tracing::info_span!(
        target: TARGET,
        "gen_ai.request",
        otel.name = format!("{operation} {}", route.model),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = operation,
        gen_ai.request.model = route.model.as_str(),
        gen_ai.provider.name = tracing::field::Empty,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.usage.cache_read.input_tokens = tracing::field::Empty,
        gen_ai.usage.cache_creation.input_tokens = tracing::field::Empty,
        switchyard.route = route.key.as_str(),
        switchyard.tenant = req.tenant.as_ref().map_or("anonymous", |t| t.key.as_str()),
        switchyard.stream = req.stream,
        switchyard.request_id = req.request_id.as_str(),
        switchyard.attempts = tracing::field::Empty,
        switchyard.outcome = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    if !span.is_disabled() && req.trace.traceparent.is_some() {
        let parent = TraceContextPropagator::new().extract(&Headers(&req.trace));
        // A span that already started cannot be re-parented; this one has not.
        let _ = span.set_parent(parent);
    }
    span
}

/// Records how the request ended on its span: `outcome` is `success` or the error code.
pub fn request_finished(
    span: &Span,
    provider: Option<&ProviderConfig>,
    attempts: u32,
    status: u16,
    outcome: &str,
) {
    if span.is_disabled() {
        return;
    }
    span.record("switchyard.attempts", i64::from(attempts));
    span.record("switchyard.outcome", outcome);
    span.record("http.response.status_code", i64::from(status));
    if let Some(p) = provider {
        span.record("gen_ai.provider.name", provider_name(&p.api));
    }
    if outcome != "success" {
        span.record("error.type", outcome);
        span.record("otel.status_code", "ERROR");
    }
}

/// What an attempt span is opened with.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts<'a> {
    /// The provider tried.
    pub provider: &'a ProviderConfig,
    /// The model name sent upstream.
    pub upstream_model: &'a str,
    /// Position in the request's chain, 0 = its head.
    pub position: usize,
    /// 1-based attempt number.
    pub attempt: u32,
    /// Time spent reserving capacity before this attempt, milliseconds.
    pub reservation_wait_ms: u64,
}

/// Opens an attempt span under `request` (disabled when `request` is).
pub fn attempt_span(request: &Span, op: ClientOp, facts: AttemptFacts<'_>) -> Span {
    if request.is_disabled() {
        return Span::none();
    }
    let operation = operation_name(op);
    tracing::info_span!(
        target: TARGET,
        parent: request,
        "gen_ai.attempt",
        otel.name = format!("{operation} {}", facts.upstream_model),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = operation,
        gen_ai.provider.name = provider_name(&facts.provider.api),
        gen_ai.request.model = facts.upstream_model,
        switchyard.provider = facts.provider.key.as_str(),
        switchyard.chain.position = int(facts.position as u64),
        switchyard.attempt = i64::from(facts.attempt),
        switchyard.reservation.wait_ms = int(facts.reservation_wait_ms),
        switchyard.reason = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    )
}

/// Records a failed attempt: its error class, the provider's code when it gave one, and the
/// HTTP status when there was a response.
pub fn attempt_failed(span: &Span, class: &str, code: Option<&str>, status: Option<u16>) {
    if span.is_disabled() {
        return;
    }
    match code {
        Some(code) => span.record("switchyard.reason", format!("{class}/{code}")),
        None => span.record("switchyard.reason", class),
    };
    span.record("error.type", class);
    span.record("otel.status_code", "ERROR");
    if let Some(s) = status {
        span.record("http.response.status_code", i64::from(s));
    }
}

/// Records the model that answered on the request span.
pub fn response_model(spans: &Spans, model: &str) {
    spans.request.record("gen_ai.response.model", model);
}

/// The trace-context headers to send upstream for an attempt: the attempt span's context when
/// it is exported, else the client's own headers unchanged (empty when it sent none).
pub fn upstream_headers(attempt: &Span, client: &TraceHeaders) -> HeaderMap {
    let mut out = HeaderMap::new();
    if attempt.is_disabled() {
        if let Some(v) = &client.traceparent {
            out.insert(TRACEPARENT, v.clone());
            if let Some(s) = &client.tracestate {
                out.insert(TRACESTATE, s.clone());
            }
        }
        return out;
    }
    TraceContextPropagator::new().inject_context(&attempt.context(), &mut HeaderInjector(&mut out));
    out
}

/// Finish reasons of a non-streamed answer in the client's dialect (`choices[].finish_reason`
/// for OpenAI, `stop_reason` for Anthropic); empty when there are none. Called only when the
/// span is exported; it deserializes into the two fields it needs (serde skips the rest
/// without building a JSON tree), one linear pass over the body.
pub fn finish_reasons(op: ClientOp, body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Choice {
        finish_reason: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(default)]
        choices: Vec<Choice>,
        stop_reason: Option<String>,
    }
    let Ok(answer) = serde_json::from_slice::<Answer>(body) else {
        return Vec::new();
    };
    match op {
        ClientOp::Messages => answer.stop_reason.into_iter().collect(),
        _ => answer
            .choices
            .into_iter()
            .filter_map(|c| c.finish_reason)
            .collect(),
    }
}

struct Headers<'a>(&'a TraceHeaders);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let v = match key {
            "traceparent" => self.0.traceparent.as_ref(),
            "tracestate" => self.0.tracestate.as_ref(),
            _ => None,
        };
        v.and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_exporter_the_clients_trace_context_is_forwarded_unchanged() {
        let mut h = HeaderMap::new();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        let client = TraceHeaders::from_request(&h);
        let out = upstream_headers(&Span::none(), &client);
        assert_eq!(out.get(TRACEPARENT).unwrap(), tp);
        assert_eq!(out.get(TRACESTATE).unwrap(), "vendor=1");
        let none = upstream_headers(&Span::none(), &TraceHeaders::default());
        assert!(none.is_empty());
    }

    #[test]
    fn finish_reasons_are_read_in_the_clients_dialect() {
        let chat = br#"{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}"#;
        assert_eq!(finish_reasons(ClientOp::Chat, chat), ["stop", "length"]);
        let messages = br#"{"stop_reason":"end_turn"}"#;
        assert_eq!(finish_reasons(ClientOp::Messages, messages), ["end_turn"]);
        assert!(finish_reasons(ClientOp::Chat, b"not json").is_empty());
    }
}
