//! Fault injection: which requests fail, and how.
//!
//! A [`FaultSet`] is an ordered list of [`FaultRule`]s plus two switches (`fail_all`,
//! `error_rate`). For each request the mock evaluates, in order: `fail_all`, `error_rate`, then
//! every rule whose [`Trigger`] matches. Timing modifiers ([`Fault::Latency`],
//! [`Fault::SlowFirstToken`]) accumulate and evaluation continues; the first matching
//! non-modifier fault decides the response and stops evaluation. A rule's counters (`skip`,
//! `next`) advance only for requests that reach it and pass its filters, so
//! `[{next: 1, 429 Retry-After 5}, {next: 1, 429 Retry-After 15}]` answers the first request
//! with the first rule and the second with the second (field case 1).
//!
//! Probabilities draw from a ChaCha8 RNG seeded with [`FaultSet::seed`] whenever a set is
//! installed, so the same request sequence meets the same faults on every run. Time windows
//! (`from`/`until`) are offsets from the moment the set was installed (server start for the
//! configured set, the `POST /admin/faults` call for a runtime one).
//!
//! Rejected alternative: a script of "request n gets fault f" only. It cannot express time
//! windows (field case 2) or availability experiments (error fractions), and rules with `next`
//! already give per-attempt scripts.

use std::time::Duration;

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::config::{MockModality, humantime_serde_compat};

/// The fault set of one mock: switches plus ordered rules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultSet {
    /// Seed of the RNG behind every `probability` and `error_rate` draw.
    pub seed: u64,
    /// When set, every request meets this fault ("fail every request" switch).
    pub fail_all: Option<Fault>,
    /// When set, this fraction of requests (seeded draw) meets its fault.
    pub error_rate: Option<ErrorRate>,
    /// Ordered rules, see the module docs for the evaluation order.
    pub rules: Vec<FaultRule>,
    /// Where rule windows (`from`/`until`) count from.
    pub origin: WindowOrigin,
}

/// Zero point of rule time windows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowOrigin {
    /// When the set was installed (server start, or the `POST /admin/faults` call).
    #[default]
    Installed,
    /// The first request after installation ("times on the mock's clock from the first
    /// request", as the field cases are written).
    FirstRequest,
}

impl FaultSet {
    /// No faults at all.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every request meets `fault`.
    pub fn fail_all(fault: Fault) -> Self {
        Self {
            fail_all: Some(fault),
            ..Self::default()
        }
    }

    /// A seeded fraction (0..=1) of requests meets `fault`.
    pub fn error_rate(fraction: f64, fault: Fault, seed: u64) -> Self {
        Self {
            seed,
            error_rate: Some(ErrorRate { fraction, fault }),
            ..Self::default()
        }
    }

    /// The given rules, evaluated in order, seed 0.
    pub fn rules(rules: impl IntoIterator<Item = FaultRule>) -> Self {
        Self {
            rules: rules.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Appends a rule (builder style).
    #[must_use]
    pub fn with_rule(mut self, rule: FaultRule) -> Self {
        self.rules.push(rule);
        self
    }
}

/// A fraction of requests that fail with one fault (availability experiments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorRate {
    /// Probability in 0..=1 that a request fails.
    pub fraction: f64,
    /// The failure; defaults to a 500.
    #[serde(default = "default_error_fault")]
    pub fault: Fault,
}

fn default_error_fault() -> Fault {
    Fault::ServerError { status: 500 }
}

/// One rule: a fault, when it applies, and an optional extra delay before headers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// What happens (`kind: ...` plus the kind's fields, flattened).
    #[serde(flatten)]
    pub fault: Fault,
    /// Which requests it applies to; the default matches every request.
    #[serde(default)]
    pub when: Trigger,
    /// Extra delay before response headers when this rule fires, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
}

impl FaultRule {
    /// A rule that matches every request.
    pub fn always(fault: Fault) -> Self {
        Self {
            fault,
            when: Trigger::default(),
            delay_ms: 0,
        }
    }

    /// A rule for the next `n` requests that reach it.
    pub fn next(n: u64, fault: Fault) -> Self {
        Self {
            fault,
            when: Trigger {
                next: Some(n),
                ..Trigger::default()
            },
            delay_ms: 0,
        }
    }

    /// A rule active in `[from, until)` after installation.
    pub fn window(from: Duration, until: Duration, fault: Fault) -> Self {
        let when = Trigger {
            from: Some(from),
            until: Some(until),
            ..Trigger::default()
        };
        Self {
            fault,
            when,
            delay_ms: 0,
        }
    }

    /// A rule firing with probability `p` per request.
    pub fn probability(p: f64, fault: Fault) -> Self {
        Self {
            fault,
            when: Trigger {
                probability: Some(p),
                ..Trigger::default()
            },
            delay_ms: 0,
        }
    }

    /// Restricts the rule to the given trigger (builder style).
    #[must_use]
    pub fn when(mut self, when: Trigger) -> Self {
        self.when = when;
        self
    }
}

/// Conditions, all of which must hold, for a rule to fire.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Trigger {
    /// Window start, offset from installation (humantime, e.g. `"0s"`).
    #[serde(
        with = "humantime_serde_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub from: Option<Duration>,
    /// Window end (exclusive), offset from installation.
    #[serde(
        with = "humantime_serde_compat::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub until: Option<Duration>,
    /// Let this many otherwise-matching requests pass first (e.g. "429 on turn 6" = skip 5).
    pub skip: u64,
    /// Fire at most this many times.
    pub next: Option<u64>,
    /// Fire with this probability (seeded) among matching requests.
    pub probability: Option<f64>,
    /// Only these request paths (exact, e.g. `/v1/messages`); empty = all.
    pub paths: Vec<String>,
    /// Only these model names; empty = all.
    pub models: Vec<String>,
    /// Only streaming (`true`) or only non-streaming (`false`) requests.
    pub stream: Option<bool>,
    /// Only requests of these kinds (by endpoint); empty = all. `[transcription, speech]`
    /// with a `server_error` breaks the audio paths while text keeps working (field case 26).
    pub modalities: Vec<MockModality>,
}

/// Errors a 200 stream can carry before its first content token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamError {
    /// Anthropic `overloaded_error`, OpenAI `server_is_overloaded`.
    #[default]
    Overloaded,
    /// OpenAI `insufficient_quota`, Anthropic `billing_error`.
    InsufficientQuota,
    /// Generic server error (`api_error` / `server_error`).
    ServerError,
    /// `rate_limit_error` / `rate_limit_exceeded`.
    RateLimited,
}

/// What a fault does. Serialized with a `kind` tag, e.g. `{kind: rate_limited, retry_after: 5}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// 429 rate limit (`rate_limit_exceeded` / `rate_limit_error`).
    RateLimited {
        /// `Retry-After` in seconds.
        #[serde(default)]
        retry_after: Option<u64>,
        /// Send `Retry-After` as an HTTP-date `retry_after` seconds ahead instead of seconds.
        #[serde(default)]
        http_date: bool,
        /// `retry-after-ms` header value.
        #[serde(default)]
        retry_after_ms: Option<u64>,
        /// Override of `x-ratelimit-reset-requests` (e.g. `"40s"`, `"1m30s"`); for the
        /// Anthropic dialect it is converted into an RFC 3339 `anthropic-ratelimit-requests-reset`.
        #[serde(default)]
        reset_requests: Option<String>,
        /// Override of `x-ratelimit-reset-tokens`.
        #[serde(default)]
        reset_tokens: Option<String>,
    },
    /// 429 whose code says the account is out of quota (`insufficient_quota`), field case 3a.
    InsufficientQuota {
        /// Optional `Retry-After` seconds.
        #[serde(default)]
        retry_after: Option<u64>,
    },
    /// 400 `invalid_request_error` saying the usage limit is reached until `until` (case 3b).
    UsageLimit {
        /// Human date in the message; default "in 14 days" as an RFC 3339 date.
        #[serde(default)]
        until: Option<String>,
    },
    /// 402 payment required ("insufficient credits"), field case 3c.
    PaymentRequired,
    /// 503 service unavailable.
    ServiceUnavailable {
        /// Optional `Retry-After` seconds.
        #[serde(default)]
        retry_after: Option<u64>,
    },
    /// Overloaded (`overloaded_error`), status 529 by default.
    Overloaded {
        /// HTTP status, 529 unless overridden.
        #[serde(default = "default_529")]
        status: u16,
        /// Optional `Retry-After` seconds.
        #[serde(default)]
        retry_after: Option<u64>,
    },
    /// Server error, 500 by default (502/504 allowed).
    ServerError {
        /// HTTP status.
        #[serde(default = "default_500")]
        status: u16,
    },
    /// 400 invalid parameter (field case 3e).
    InvalidParameter {
        /// The offending parameter.
        #[serde(default = "default_param")]
        param: String,
        /// Message; a default names the parameter.
        #[serde(default)]
        message: Option<String>,
    },
    /// Any status with an error body in the request's dialect.
    Status {
        /// HTTP status.
        status: u16,
        /// `error.type`; a default is derived from the status.
        #[serde(default)]
        error_type: Option<String>,
        /// OpenAI `error.code`.
        #[serde(default)]
        code: Option<String>,
        /// `error.message`.
        #[serde(default)]
        message: Option<String>,
        /// Extra response headers.
        #[serde(default)]
        headers: std::collections::BTreeMap<String, String>,
    },
    /// Modifier: extra delay before response headers, in milliseconds.
    Latency {
        /// Delay in milliseconds.
        ms: u64,
    },
    /// Modifier: extra delay before the first content token, in milliseconds.
    SlowFirstToken {
        /// Delay in milliseconds.
        ms: u64,
    },
    /// 200 stream with its preamble (OpenAI role-only chunk; Anthropic `message_start` + `ping`;
    /// Responses `response.created` + `response.in_progress`), then an error event, then the end.
    /// A non-streaming request gets the matching HTTP error instead.
    StreamErrorBeforeContent {
        /// The error carried.
        #[serde(default)]
        error: StreamError,
    },
    /// After `after_deltas` content deltas, one more `data:` line without its blank line, then
    /// the connection is reset (field case 19b).
    CutMidStream {
        /// Complete content deltas sent before the cut.
        after_deltas: u64,
    },
    /// Close the connection (RST) without any response.
    ResetBeforeResponse,
    /// 200 headers, then nothing until the client gives up.
    HangAfterHeaders,
    /// 200 stream with the preamble, then `: keep-alive` comments and empty (role-only or ping)
    /// events every `interval_ms`, never content (field case 21b).
    HangKeepAlive {
        /// Period in milliseconds (default 1000).
        #[serde(default = "default_1000")]
        interval_ms: u64,
    },
    /// Accept the request and never send headers.
    HangNoHeaders,
    /// Normal answer, but report this usage instead of the computed one (case 17c: 0/0).
    ReportUsage {
        /// Reported input (prompt) tokens.
        input_tokens: u64,
        /// Reported output tokens.
        output_tokens: u64,
    },
    /// Normal answer without any usage object (case 15's "no usage at all").
    OmitUsage,
    /// A normal answer that ends evaluation: the "this attempt succeeds" step of a per-attempt
    /// script written as `next: 1` rules in order (the router-equivalence test's scripts).
    Pass,
    /// Vertex AI 429 `RESOURCE_EXHAUSTED` in Google's error shape, without `Retry-After`
    /// (Vertex sends none). `cause` picks which of Vertex's three 429s it is; the messages
    /// are the ones Google documents (cloud.google.com/vertex-ai/generative-ai/docs/error-code-429).
    VertexResourceExhausted {
        /// Which quota framework refused the request.
        #[serde(default)]
        cause: VertexQuotaCause,
        /// Quota metric named by `project_quota` (default
        /// `aiplatform.googleapis.com/generate_content_requests_per_minute_per_project_per_base_model`).
        #[serde(default)]
        quota_metric: Option<String>,
    },
    /// A Bedrock runtime exception as an HTTP error (`x-amzn-errortype` + `{"message"}`).
    BedrockException {
        /// The exception, spelled as AWS does (`ThrottlingException`, ...).
        exception: BedrockExceptionKind,
        /// HTTP status; default the exception's documented one (e.g. 400 for a
        /// `ThrottlingException` variant some accounts see).
        #[serde(default)]
        status: Option<u16>,
        /// Message; default a real Bedrock message for the exception.
        #[serde(default)]
        message: Option<String>,
    },
    /// A 200 Bedrock stream (ConverseStream / InvokeModelWithResponseStream) that, after
    /// `after_deltas` content deltas, carries an exception frame (`:message-type: exception`,
    /// `:exception-type: throttlingException`, ...) and ends. On other streams: the format's
    /// in-stream error after those deltas. A non-streaming request gets the HTTP error.
    BedrockStreamException {
        /// The exception.
        exception: BedrockExceptionKind,
        /// Content deltas sent before the exception frame.
        #[serde(default)]
        after_deltas: u64,
        /// Message; default a real Bedrock message for the exception.
        #[serde(default)]
        message: Option<String>,
    },
}

/// Which of Vertex AI's three kinds of 429 a [`Fault::VertexResourceExhausted`] is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VertexQuotaCause {
    /// Pay-as-you-go shared pool (dynamic shared quota) out of capacity: "Resource exhausted,
    /// please try again later." Transient, not the project's fault.
    #[default]
    SharedCapacity,
    /// The project's own quota for the base model: `Quota exceeded for
    /// aiplatform.googleapis.com/<metric> with base model: <model>. Please submit a quota
    /// increase request.`
    ProjectQuota,
    /// Provisioned Throughput exceeded with overages rejected: "Too many requests. Exceeded
    /// the Provisioned Throughput."
    ProvisionedThroughput,
}

/// Bedrock runtime exceptions (API reference, "Errors" of Converse / InvokeModel and the
/// stream unions of ConverseStream / InvokeModelWithResponseStream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BedrockExceptionKind {
    /// 429 "Too many requests, please wait before trying again."
    ThrottlingException,
    /// 400 account quota exceeded.
    ServiceQuotaExceededException,
    /// 429 the model is not ready (not a capacity signal).
    ModelNotReadyException,
    /// 400 malformed request.
    ValidationException,
    /// 424 the model failed while streaming (`originalStatusCode`, `originalMessage`).
    ModelStreamErrorException,
    /// 424 the model returned an error.
    ModelErrorException,
    /// 408 the model took too long.
    ModelTimeoutException,
    /// 500.
    InternalServerException,
    /// 503 "Bedrock is unable to process your request."
    ServiceUnavailableException,
    /// 403 no access to the model.
    AccessDeniedException,
    /// 404 unknown resource.
    ResourceNotFoundException,
}

impl BedrockExceptionKind {
    /// The name on the wire (`x-amzn-errortype` before the ':').
    pub fn name(self) -> &'static str {
        match self {
            Self::ThrottlingException => "ThrottlingException",
            Self::ServiceQuotaExceededException => "ServiceQuotaExceededException",
            Self::ModelNotReadyException => "ModelNotReadyException",
            Self::ValidationException => "ValidationException",
            Self::ModelStreamErrorException => "ModelStreamErrorException",
            Self::ModelErrorException => "ModelErrorException",
            Self::ModelTimeoutException => "ModelTimeoutException",
            Self::InternalServerException => "InternalServerException",
            Self::ServiceUnavailableException => "ServiceUnavailableException",
            Self::AccessDeniedException => "AccessDeniedException",
            Self::ResourceNotFoundException => "ResourceNotFoundException",
        }
    }

    /// Documented HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Self::ThrottlingException | Self::ModelNotReadyException => 429,
            Self::ServiceQuotaExceededException | Self::ValidationException => 400,
            Self::ModelStreamErrorException | Self::ModelErrorException => 424,
            Self::ModelTimeoutException => 408,
            Self::InternalServerException => 500,
            Self::ServiceUnavailableException => 503,
            Self::AccessDeniedException => 403,
            Self::ResourceNotFoundException => 404,
        }
    }

    /// A message as Bedrock words it.
    pub fn default_message(self) -> &'static str {
        match self {
            Self::ThrottlingException => "Too many requests, please wait before trying again.",
            Self::ServiceQuotaExceededException => {
                "Your request exceeded the service quota for your account. Request a quota \
                 increase in Service Quotas."
            }
            Self::ModelNotReadyException => {
                "Model is not ready for inference. Wait and try your request again."
            }
            Self::ValidationException => {
                "Malformed input request, please reformat your input \
                 and try again."
            }
            Self::ModelStreamErrorException => {
                "The model encountered an error while streaming the response."
            }
            Self::ModelErrorException => "The model returned an error.",
            Self::ModelTimeoutException => "Model has timed out in processing the request.",
            Self::InternalServerException => "The server encountered an internal error.",
            Self::ServiceUnavailableException => "Bedrock is unable to process your request.",
            Self::AccessDeniedException => {
                "You don't have access to the model with the specified model ID."
            }
            Self::ResourceNotFoundException => "The requested resource could not be found.",
        }
    }

    /// The member name inside a stream union (`throttlingException`), which botocore reports
    /// as the error code of an `EventStreamError`.
    pub fn stream_member(self) -> String {
        let name = self.name();
        let mut out = String::with_capacity(name.len());
        let mut chars = name.chars();
        if let Some(c) = chars.next() {
            out.push(c.to_ascii_lowercase());
        }
        out.extend(chars);
        out
    }
}

fn default_529() -> u16 {
    529
}
fn default_500() -> u16 {
    500
}
fn default_1000() -> u64 {
    1000
}
fn default_param() -> String {
    "temperature".to_owned()
}

impl Fault {
    /// Short label recorded in [`crate::CallRecord::fault`].
    pub fn label(&self) -> &'static str {
        match self {
            Self::RateLimited { .. } => "rate_limited",
            Self::InsufficientQuota { .. } => "insufficient_quota",
            Self::UsageLimit { .. } => "usage_limit",
            Self::PaymentRequired => "payment_required",
            Self::ServiceUnavailable { .. } => "service_unavailable",
            Self::Overloaded { .. } => "overloaded",
            Self::ServerError { .. } => "server_error",
            Self::InvalidParameter { .. } => "invalid_parameter",
            Self::Status { .. } => "status",
            Self::Latency { .. } => "latency",
            Self::SlowFirstToken { .. } => "slow_first_token",
            Self::StreamErrorBeforeContent { .. } => "stream_error_before_content",
            Self::CutMidStream { .. } => "cut_mid_stream",
            Self::ResetBeforeResponse => "reset_before_response",
            Self::HangAfterHeaders => "hang_after_headers",
            Self::HangKeepAlive { .. } => "hang_keep_alive",
            Self::HangNoHeaders => "hang_no_headers",
            Self::ReportUsage { .. } => "report_usage",
            Self::OmitUsage => "omit_usage",
            Self::Pass => "pass",
            Self::VertexResourceExhausted { .. } => "vertex_resource_exhausted",
            Self::BedrockException { .. } => "bedrock_exception",
            Self::BedrockStreamException { .. } => "bedrock_stream_exception",
        }
    }

    fn is_modifier(&self) -> bool {
        matches!(self, Self::Latency { .. } | Self::SlowFirstToken { .. })
    }
}

/// The facts about a request that triggers look at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestFacts<'a> {
    pub(crate) path: &'a str,
    pub(crate) model: &'a str,
    pub(crate) stream: bool,
    pub(crate) modality: MockModality,
}

/// Outcome of evaluating the fault set for one request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Decision {
    /// Extra delay before headers.
    pub(crate) delay: Duration,
    /// Extra delay before the first content token.
    pub(crate) extra_ttft: Duration,
    /// The deciding fault, if any.
    pub(crate) fault: Option<Fault>,
    /// Labels of every fault that applied (modifiers included), for the call record.
    pub(crate) labels: Vec<&'static str>,
    /// A [`Fault::Pass`] rule fired: answer normally, evaluate no further rule.
    pub(crate) passed: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct RuleCounters {
    seen: u64,
    fired: u64,
}

/// A fault set plus its runtime counters and RNG.
#[derive(Debug)]
pub(crate) struct FaultState {
    set: FaultSet,
    counters: Vec<RuleCounters>,
    rng: ChaCha8Rng,
    /// Mock-clock offset windows count from; `None` until the first request when the origin is
    /// [`WindowOrigin::FirstRequest`].
    installed_at: Option<Duration>,
}

impl FaultState {
    pub(crate) fn new(set: FaultSet, installed_at: Duration) -> Self {
        let set_origin = set.origin;
        let counters = vec![RuleCounters::default(); set.rules.len()];
        let rng = ChaCha8Rng::seed_from_u64(set.seed);
        Self {
            set,
            counters,
            rng,
            installed_at: match set_origin {
                WindowOrigin::Installed => Some(installed_at),
                WindowOrigin::FirstRequest => None,
            },
        }
    }

    pub(crate) fn set(&self) -> &FaultSet {
        &self.set
    }

    /// Evaluates the set for a request arriving at mock-clock offset `now`.
    pub(crate) fn decide(&mut self, facts: RequestFacts<'_>, now: Duration) -> Decision {
        let mut decision = Decision::default();
        if let Some(f) = &self.set.fail_all {
            apply(&mut decision, f.clone(), 0);
            if decision.fault.is_some() {
                return decision;
            }
        }
        if let Some(rate) = &self.set.error_rate {
            let p = rate.fraction.clamp(0.0, 1.0);
            if self.rng.random_bool(p) {
                apply(&mut decision, rate.fault.clone(), 0);
                if decision.fault.is_some() {
                    return decision;
                }
            }
        }
        let origin = *self.installed_at.get_or_insert(now);
        let since = now.saturating_sub(origin);
        for (rule, counters) in self.set.rules.iter().zip(self.counters.iter_mut()) {
            let t = &rule.when;
            let in_window = t.from.is_none_or(|f| since >= f) && t.until.is_none_or(|u| since < u);
            let filtered = in_window
                && (t.paths.is_empty() || t.paths.iter().any(|p| p == facts.path))
                && (t.models.is_empty() || t.models.iter().any(|m| m == facts.model))
                && t.stream.is_none_or(|s| s == facts.stream)
                && (t.modalities.is_empty() || t.modalities.contains(&facts.modality));
            if !filtered {
                continue;
            }
            counters.seen += 1;
            if counters.seen <= t.skip || t.next.is_some_and(|n| counters.fired >= n) {
                continue;
            }
            if let Some(p) = t.probability
                && !self.rng.random_bool(p.clamp(0.0, 1.0))
            {
                continue;
            }
            counters.fired += 1;
            apply(&mut decision, rule.fault.clone(), rule.delay_ms);
            if decision.fault.is_some() || decision.passed {
                break;
            }
        }
        decision
    }
}

fn apply(decision: &mut Decision, fault: Fault, delay_ms: u64) {
    decision.delay += Duration::from_millis(delay_ms);
    decision.labels.push(fault.label());
    match fault {
        Fault::Latency { ms } => decision.delay += Duration::from_millis(ms),
        Fault::SlowFirstToken { ms } => decision.extra_ttft += Duration::from_millis(ms),
        Fault::Pass => decision.passed = true,
        other => {
            debug_assert!(!other.is_modifier());
            decision.fault = Some(other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FACTS: RequestFacts<'static> = RequestFacts {
        path: "/v1/chat/completions",
        model: "m",
        stream: false,
        modality: MockModality::Text,
    };

    fn ra(secs: u64) -> Fault {
        Fault::RateLimited {
            retry_after: Some(secs),
            http_date: false,
            retry_after_ms: None,
            reset_requests: None,
            reset_tokens: None,
        }
    }

    #[test]
    fn decide_next_rules_in_sequence_apply_one_per_request() {
        let set = FaultSet::rules([FaultRule::next(1, ra(5)), FaultRule::next(1, ra(15))]);
        let mut st = FaultState::new(set, Duration::ZERO);
        let got: Vec<_> = (0..3)
            .map(|_| st.decide(FACTS, Duration::ZERO).fault)
            .collect();
        assert_eq!(got, vec![Some(ra(5)), Some(ra(15)), None]);
    }

    #[test]
    fn decide_pass_rule_answers_normally_and_stops_evaluation() {
        // Script: pass, 429, then (script used up) the always-500 rule.
        let mut st = FaultState::new(
            FaultSet::rules([
                FaultRule::next(1, Fault::Pass),
                FaultRule::next(1, ra(5)),
                FaultRule::always(Fault::ServerError { status: 500 }),
            ]),
            Duration::ZERO,
        );
        let first = st.decide(FACTS, Duration::ZERO);
        assert!(first.fault.is_none() && first.passed, "{first:?}");
        assert_eq!(first.labels, vec!["pass"]);
        assert_eq!(st.decide(FACTS, Duration::ZERO).fault, Some(ra(5)));
        assert_eq!(
            st.decide(FACTS, Duration::ZERO).fault,
            Some(Fault::ServerError { status: 500 })
        );
    }

    #[test]
    fn decide_window_only_inside_window_fires() {
        let set = FaultSet::rules([FaultRule::window(
            Duration::from_secs(0),
            Duration::from_secs(20),
            Fault::ServerError { status: 500 },
        )]);
        let mut st = FaultState::new(set, Duration::from_secs(10));
        assert!(st.decide(FACTS, Duration::from_secs(29)).fault.is_some());
        assert!(st.decide(FACTS, Duration::from_secs(30)).fault.is_none());
    }

    #[test]
    fn decide_first_request_origin_starts_window_at_first_request() {
        let mut set = FaultSet::rules([FaultRule::window(
            Duration::ZERO,
            Duration::from_secs(20),
            Fault::ServerError { status: 500 },
        )]);
        set.origin = WindowOrigin::FirstRequest;
        let mut st = FaultState::new(set, Duration::ZERO);
        assert!(st.decide(FACTS, Duration::from_secs(100)).fault.is_some());
        assert!(st.decide(FACTS, Duration::from_secs(119)).fault.is_some());
        assert!(st.decide(FACTS, Duration::from_secs(120)).fault.is_none());
    }

    #[test]
    fn decide_skip_lets_first_requests_pass() {
        let rule = FaultRule::next(1, ra(1)).when(Trigger {
            skip: 5,
            next: Some(1),
            ..Trigger::default()
        });
        let mut st = FaultState::new(FaultSet::rules([rule]), Duration::ZERO);
        let hits: Vec<bool> = (0..8)
            .map(|_| st.decide(FACTS, Duration::ZERO).fault.is_some())
            .collect();
        assert_eq!(
            hits,
            vec![false, false, false, false, false, true, false, false]
        );
    }

    #[test]
    fn decide_error_rate_same_seed_same_sequence() {
        let run = || {
            let mut st = FaultState::new(
                FaultSet::error_rate(0.3, Fault::ServerError { status: 500 }, 42),
                Duration::ZERO,
            );
            (0..1000)
                .map(|_| st.decide(FACTS, Duration::ZERO).fault.is_some())
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let failures = a.iter().filter(|x| **x).count();
        assert!((240..=360).contains(&failures), "failures {failures}");
    }

    #[test]
    fn decide_modifiers_accumulate_with_deciding_fault() {
        let set = FaultSet::rules([
            FaultRule::always(Fault::Latency { ms: 100 }),
            FaultRule::always(Fault::SlowFirstToken { ms: 50 }),
            FaultRule::always(Fault::PaymentRequired),
            FaultRule::always(Fault::Latency { ms: 1000 }),
        ]);
        let mut st = FaultState::new(set, Duration::ZERO);
        let d = st.decide(FACTS, Duration::ZERO);
        assert_eq!(d.delay, Duration::from_millis(100));
        assert_eq!(d.extra_ttft, Duration::from_millis(50));
        assert_eq!(d.fault, Some(Fault::PaymentRequired));
    }

    #[test]
    fn fault_rule_yaml_typo_is_rejected() {
        let bad = "rules:\n  - kind: rate_limited\n    retry_afer: 5\n";
        assert!(serde_yaml::from_str::<FaultSet>(bad).is_err());
        let bad_when = "rules:\n  - kind: server_error\n    when: { nxt: 1 }\n";
        assert!(serde_yaml::from_str::<FaultSet>(bad_when).is_err());
    }

    #[test]
    fn fault_set_yaml_round_trips_kinds_and_triggers() {
        let yaml = r#"
seed: 7
rules:
  - kind: rate_limited
    retry_after: 15
    http_date: true
    when: { next: 1 }
  - kind: cut_mid_stream
    after_deltas: 20
    when: { from: 0s, until: 20s, paths: [/v1/messages] }
  - kind: hang_keep_alive
"#;
        let set: FaultSet = serde_yaml::from_str(yaml).unwrap();
        assert_eq!(set.rules.len(), 3);
        assert_eq!(set.rules[1].when.until, Some(Duration::from_secs(20)));
        assert_eq!(
            set.rules[2].fault,
            Fault::HangKeepAlive { interval_ms: 1000 }
        );
        let back: FaultSet = serde_yaml::from_str(&serde_yaml::to_string(&set).unwrap()).unwrap();
        assert_eq!(back, set);
    }
}
