//! Error classification: what a failed attempt means for retries, pauses and availability.
//!
//! DESIGN §4.4 defines nine classes; this module maps every failure the router can observe onto
//! one of them, together with the provider's retry hint and a suggested pause for the provider
//! scope:
//!
//! * [`classify_response`]: a non-2xx HTTP response (status, headers, body);
//! * [`classify_stream_error`]: an error event inside a 200 SSE stream (field case 18);
//! * [`classify_transport`]: a failure with no response (connect error, timeouts, deadline).
//!
//! # Algorithm
//! 1. **Vendor tag.** Parse the body as JSON (garbage is fine: it just yields no tag) and pick the
//!    most specific machine-readable tag: Bedrock's `x-amzn-errortype` header (or `__type`),
//!    OpenAI's `error.code` then `error.type`, Anthropic's `error.type`, Gemini/Vertex's
//!    `error.status`, OpenAI-compatible servers' top-level `code`/`type` (`"object":"error"`),
//!    Bedrock stream exception events (`{"throttlingException":{…}}`). Tags map to classes
//!    through one table ([`class_for_tag`]); the vendors' tag names do not collide, so one table
//!    serves all.
//! 2. **Status fallback.** No known tag → the HTTP status decides (429 capacity; 503/529
//!    overload; 500/502/504 server; 408 timeout; 401/403 auth; 402 policy; other 4xx request;
//!    everything else server). A tag that blames the client (request) on a 429/5xx is overruled
//!    by the status, because misreading a transient fault as the client's returns an error that
//!    another provider would have served.
//! 3. **Exhaustion.** A capacity, overload, request or auth answer becomes **policy** (long-term
//!    exhaustion: not retried on that provider, long pause) when any of these holds:
//!    * a retry hint of at least [`EXHAUSTION_HINT`] (1 h) on a capacity/overload answer
//!      (field case 3d, `Retry-After: 1209600`);
//!    * Gemini/Vertex `QuotaFailure` naming a per-day quota;
//!    * wording of account exhaustion in the message ("usage limit", "credit balance",
//!      "billing", "per day", "insufficient quota" … see [`EXHAUSTION_PHRASES`]; field case 3b:
//!      a 400 `invalid_request_error` saying the usage limit is reached until a date).
//!
//!    Transient answers often carry upsell text: Gemini's per-minute 429s say "check your plan
//!    and billing details", OpenAI's free-tier `rate_limit_exceeded` says "add a payment
//!    method … /account/billing". So when a structured tag already says transient (a
//!    per-minute `QuotaFailure`, or a capacity/overload tag such as `rate_limit_exceeded`,
//!    `ThrottlingException`), only per-day wording ("per day", "daily", "(RPD)", "(TPD)")
//!    turns it into policy; the full phrase list applies to bare statuses and to request/auth
//!    answers.
//! 4. **Hints and pause.** `retry_after` is the longest explicit hint (`retry-after`,
//!    `retry-after-ms`, Gemini `RetryInfo`, "try again in 20s"), else the longest credible
//!    vendor reset header (see [`crate::retry_after`], "Combining"); for policy answers a reset
//!    date in the message ("until 2026-12-14") counts too.
//!    `pause` is the suggested pause for the provider scope: the hint for capacity/overload;
//!    for policy, the hint clamped to [[`POLICY_MIN_PAUSE`], [`POLICY_MAX_PAUSE`]] (10 min to
//!    24 h); nothing for other classes (the breaker and availability controller handle them).
//!
//! # Policy on what counts against a provider
//! [`ErrorClass::is_provider_side`] is true for capacity, overload, timeout, connect, server,
//! auth **and policy**: an exhausted account is a fault of that provider leg, not of the
//! client, and letting the availability controller see it moves sticky chains (and their
//! prompt caches) to the provider that can actually serve, instead of re-pinning projects to a
//! provider that will be skipped for hours. Request and deadline errors never count (field
//! case 3e: "P-A availability unchanged").
//!
//! Sources: DESIGN §4.4; seed 001 (classify before retrying; Retry-After is a lower bound);
//! field cases 3 and 18; vendor error references (OpenAI, Anthropic, Google RPC status,
//! Bedrock runtime exceptions). Rejected: status-only classification (a 400 can be exhaustion,
//! a 200 stream can carry an overload), and a per-vendor classifier trait (the shapes are data,
//! one table is shorter and easier to test).

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::retry_after::{
    explicit_retry_after, rate_limit_reset, reset_date_in_message, retry_hint_from_body,
};

/// A retry hint at least this long on a 429/503 means exhaustion, not a transient limit: no
/// interactive request waits an hour, and windows that long are daily/monthly quotas.
pub const EXHAUSTION_HINT: Duration = Duration::from_secs(3600);

/// Shortest pause after a policy (exhaustion) answer: 10 minutes. Long enough that a quota
/// that will not come back soon costs at most one probing call per 10 min per scope (field
/// case 3: ≥ 10 min), short enough that a topped-up account returns within a coffee break.
pub const POLICY_MIN_PAUSE: Duration = Duration::from_secs(600);

/// Longest pause after a policy answer: 24 hours, even when the provider names a date weeks
/// away (case 3b, 3d). Pauses live in memory and a daily probe notices a credit top-up.
pub const POLICY_MAX_PAUSE: Duration = Duration::from_secs(24 * 3600);

/// Longest message we keep from a provider body (bytes, cut at a char boundary). Messages go to
/// the client and to logs; a provider echoing a whole prompt back must not blow either up.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Lower-case phrases that mark account exhaustion (policy) in a provider message.
///
/// Chosen to be specific: "quota exceeded" alone is *not* here, because Vertex says it for
/// per-minute limits; "budget" alone is not, because Anthropic's `budget_tokens` errors are
/// plain request errors.
pub const EXHAUSTION_PHRASES: &[&str] = &[
    "insufficient_quota",
    "insufficient quota",
    "exceeded your current quota",
    "usage limit",
    "spend limit",
    "spending limit",
    "spend cap",
    "budget exceeded",
    "exceeded your budget",
    "billing",
    "credit balance",
    "insufficient credit",
    "insufficient funds",
    "out of credit",
    "no credits",
    "credits exhausted",
    "payment required",
    "regain access",
    "per day",
    "per_day",
    "perday",
    "daily limit",
    "daily quota",
    "monthly limit",
    "monthly quota",
    "has been disabled",
    "has been deactivated",
    "account is not active",
    "suspended",
];

/// Day-scoped phrases: the only wording that still counts when Gemini sent a structured
/// `QuotaFailure` (see module docs, step 3).
const DAILY_PHRASES: &[&str] = &["per day", "per_day", "perday", "daily"];

/// The error classes of DESIGN §4.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// A transient rate limit (429 and vendor equivalents): retryable, pause per hint.
    Capacity,
    /// The provider is overloaded (503, 529, `overloaded_error`, `server_is_overloaded`).
    Overload,
    /// The provider did not answer in time (read/response/first-token timeout, 408).
    Timeout,
    /// We could not reach the provider (DNS, refused, TLS, reset before a response).
    Connect,
    /// The provider failed (500, 502, 504, internal errors, unknown failures).
    Server,
    /// The provider refused our credentials (401, 403): the provider is misconfigured.
    Auth,
    /// Long-term exhaustion or a disabled account on that provider (daily quota, spend cap,
    /// billing, credits, 402): not retryable there; pause the scope for a long time.
    Policy,
    /// The client's request is wrong (400, 404, 413, 422): returned as is, never retried.
    Request,
    /// The request's own deadline ran out: nothing more can be tried.
    Deadline,
}

impl ErrorClass {
    /// Every class, in declaration order (for metric pre-registration and tests).
    pub const ALL: [ErrorClass; 9] = [
        ErrorClass::Capacity,
        ErrorClass::Overload,
        ErrorClass::Timeout,
        ErrorClass::Connect,
        ErrorClass::Server,
        ErrorClass::Auth,
        ErrorClass::Policy,
        ErrorClass::Request,
        ErrorClass::Deadline,
    ];

    /// Whether the availability controller and circuit breaker count this failure against the
    /// provider (DESIGN §4.1: capacity, overload, timeout/connect, server, auth; plus policy, see
    /// module docs). Request and deadline errors are never the provider's fault.
    pub const fn is_provider_side(self) -> bool {
        !matches!(self, ErrorClass::Request | ErrorClass::Deadline)
    }

    /// Whether the request may move down its chain to another provider. True for every
    /// provider-side class; false for request (another provider would refuse it too) and
    /// deadline (no time left).
    pub const fn retry_elsewhere(self) -> bool {
        self.is_provider_side()
    }

    /// Whether retrying the *same* provider (after waiting) can help, subject to the policy's
    /// same-provider allowance. True for transient classes: capacity, overload, server, and
    /// connect (nothing reached the provider). False for timeout (the provider already spent
    /// the attempt's time budget; another provider is the better bet, field case 21), auth
    /// (credentials will not fix themselves), policy, request and deadline.
    pub const fn retry_same_provider(self) -> bool {
        matches!(
            self,
            ErrorClass::Capacity | ErrorClass::Overload | ErrorClass::Server | ErrorClass::Connect
        )
    }

    /// Low-cardinality snake_case label for metrics and logs (`outcome_class="capacity"`).
    pub const fn metric_label(self) -> &'static str {
        match self {
            ErrorClass::Capacity => "capacity",
            ErrorClass::Overload => "overload",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connect => "connect",
            ErrorClass::Server => "server",
            ErrorClass::Auth => "auth",
            ErrorClass::Policy => "policy",
            ErrorClass::Request => "request",
            ErrorClass::Deadline => "deadline",
        }
    }
}

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.metric_label())
    }
}

/// The verdict on one failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The class (DESIGN §4.4).
    pub class: ErrorClass,
    /// The provider's own hint of when to come back (longest credible one, capped at
    /// [`crate::retry_after::MAX_RETRY_HINT`]); a lower bound, never shortened. `None` for
    /// request errors and when the provider gave none.
    pub retry_after: Option<Duration>,
    /// Suggested pause for the provider scope (provider or quota group), see module docs.
    /// `None` means "no pause of our own"; the caller may still apply a default cooldown
    /// (see [`crate::pause::PausePolicy`]).
    pub pause: Option<Duration>,
    /// The vendor's machine-readable code as sent (`insufficient_quota`, `overloaded_error`,
    /// `RESOURCE_EXHAUSTED`, `ThrottlingException`), or ours for transport failures
    /// (`connect_timeout`). Unbounded cardinality: for logs, not metric labels.
    pub code: Option<String>,
    /// The provider's human-readable message, at most [`MAX_MESSAGE_BYTES`].
    pub message: Option<String>,
}

impl Classification {
    /// A bare classification of `class` with no hint, pause, code or message.
    pub const fn new(class: ErrorClass) -> Self {
        Classification {
            class,
            retry_after: None,
            pause: None,
            code: None,
            message: None,
        }
    }

    /// True for policy answers: the provider's account is exhausted or disabled.
    pub const fn is_exhausted(&self) -> bool {
        matches!(self.class, ErrorClass::Policy)
    }
}

/// A failure with no HTTP response to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportFailure {
    /// DNS failure, connection refused, TLS handshake failure: the request never left.
    Connect,
    /// The connection was not established in time.
    ConnectTimeout,
    /// The connection broke (reset, unexpected EOF) before a complete response arrived.
    ConnectionReset,
    /// Connected, but no response headers within the response timeout.
    ResponseTimeout,
    /// Response started, but no content token within the policy's first-token timeout
    /// (keep-alives and role-only deltas do not count; field case 21).
    FirstTokenTimeout,
    /// A stream stalled between tokens for longer than the idle timeout.
    StreamIdle,
    /// The request's own deadline passed.
    RequestDeadline,
}

/// Classifies a failure that produced no response.
///
/// Connect-level failures → [`ErrorClass::Connect`] (nothing reached the provider, so a
/// same-provider retry is safe); timeouts of a started attempt, including the first-token
/// timeout → [`ErrorClass::Timeout`] (provider-side: a provider that never produces a token
/// must lose availability); the request deadline → [`ErrorClass::Deadline`]. `code` is the
/// snake_case name of the failure (`first_token_timeout`) so logs can tell them apart.
///
/// Note: field case 21 says the first-token switch "is logged as deadline class". We keep it
/// provider-side (`timeout`) because DESIGN §4.1 counts timeouts against availability and the
/// deadline class does not count; the `code` carries `first_token_timeout` for the log line.
pub fn classify_transport(kind: TransportFailure) -> Classification {
    let (class, code) = match kind {
        TransportFailure::Connect => (ErrorClass::Connect, "connect_error"),
        TransportFailure::ConnectTimeout => (ErrorClass::Connect, "connect_timeout"),
        TransportFailure::ConnectionReset => (ErrorClass::Connect, "connection_reset"),
        TransportFailure::ResponseTimeout => (ErrorClass::Timeout, "response_timeout"),
        TransportFailure::FirstTokenTimeout => (ErrorClass::Timeout, "first_token_timeout"),
        TransportFailure::StreamIdle => (ErrorClass::Timeout, "stream_idle_timeout"),
        TransportFailure::RequestDeadline => (ErrorClass::Deadline, "deadline_exceeded"),
    };
    Classification {
        code: Some(code.to_owned()),
        ..Classification::new(class)
    }
}

/// Classifies a non-2xx provider response. See the module docs for the algorithm.
///
/// `body` may be anything (JSON of any vendor, HTML from a proxy, empty, binary): unparsable
/// bodies fall back to the status. `now_wall` is the wall-clock arrival time, used for
/// HTTP-date and timestamp hints. Never panics.
pub fn classify_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    now_wall: DateTime<Utc>,
) -> Classification {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let mut facts = json.as_ref().map(extract).unwrap_or_default();
    // Bedrock's header names the exception most precisely ("ThrottlingException:http://…").
    if let Some(kind) = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(':').next().unwrap_or(v).trim())
        .filter(|v| !v.is_empty())
    {
        facts.tags.insert(0, tag(kind));
    }
    if facts.message.is_none() && json.is_none() {
        facts.message = plain_text_message(body);
    }
    // Explicit hints (headers and body) first; vendor resets only when there is none
    // (`crate::retry_after` module docs, "Combining").
    let explicit = max_opt(
        explicit_retry_after(headers, now_wall),
        json.as_ref().and_then(retry_hint_from_body),
    );
    let hint = explicit.or_else(|| rate_limit_reset(headers, now_wall));
    decide(Some(status.as_u16()), facts, hint, Some(now_wall))
}

/// Classifies an error event delivered inside a 200 SSE stream (field case 18), given the
/// event's parsed `data:` payload:
///
/// * Anthropic `event: error` → `{"type":"error","error":{"type":"overloaded_error",…}}`;
/// * OpenAI Responses `response.failed` → `{"type":"response.failed","response":{"error":
///   {"code":"server_is_overloaded"|"insufficient_quota",…}}}`, and the `error` event
///   `{"type":"error","code":…,"message":…}`;
/// * OpenAI Chat chunk `{"error":{"message","type","code"}}`;
/// * Gemini `{"error":{"code":503,"status":"UNAVAILABLE",…}}` (also inside an array).
///
/// Unknown payloads are [`ErrorClass::Server`]: a stream that fails is the provider's fault.
/// Reset dates in messages are not resolved (no wall clock here); policy pauses then use
/// [`POLICY_MIN_PAUSE`]. Use [`classify_stream_error_at`] to resolve them.
pub fn classify_stream_error(payload: &Value) -> Classification {
    classify_stream(payload, None)
}

/// [`classify_stream_error`] with the wall-clock arrival time, so a policy message naming a
/// reset date ("until 2026-12-14") lengthens the pause as it does for HTTP responses.
pub fn classify_stream_error_at(payload: &Value, now_wall: DateTime<Utc>) -> Classification {
    classify_stream(payload, Some(now_wall))
}

fn classify_stream(payload: &Value, now_wall: Option<DateTime<Utc>>) -> Classification {
    let facts = extract(payload);
    let status = facts.embedded_status;
    let hint = retry_hint_from_body(payload);
    decide(status, facts, hint, now_wall)
}

/// Maps a vendor tag (case-insensitive) to a class: OpenAI `error.code`/`error.type`,
/// Anthropic `error.type`, Gemini `error.status`, Bedrock exception names. `None` for tags we
/// do not know (the HTTP status then decides).
pub fn class_for_tag(tag: &str) -> Option<ErrorClass> {
    let t = tag.trim().to_ascii_lowercase();
    let class = match t.as_str() {
        "rate_limit_exceeded"
        | "rate_limit_error"
        | "ratelimiterror"
        | "rate_limit"
        | "too_many_requests"
        | "throttlingexception"
        | "throttling"
        | "toomanyrequestsexception"
        | "resource_exhausted" => ErrorClass::Capacity,
        "insufficient_quota"
        | "billing_error"
        | "billing_hard_limit_reached"
        | "billing_not_active"
        | "access_terminated"
        | "account_deactivated"
        | "servicequotaexceededexception"
        | "quota_exhausted"
        | "credits_exhausted" => ErrorClass::Policy,
        "overloaded_error"
        | "overloaded"
        | "server_is_overloaded"
        | "engine_overloaded"
        | "unavailable"
        | "service_unavailable"
        | "serviceunavailableexception"
        | "modelnotreadyexception"
        | "slow_down" => ErrorClass::Overload,
        "api_error"
        | "server_error"
        | "internal_error"
        | "internal"
        | "unknown"
        | "data_loss"
        | "internalserverexception"
        | "internalfailure"
        | "modelerrorexception"
        | "modelstreamerrorexception" => ErrorClass::Server,
        "timeout"
        | "timeout_error"
        | "deadline_exceeded"
        | "modeltimeoutexception"
        | "vector_store_timeout"
        | "requesttimeout" => ErrorClass::Timeout,
        "authentication_error"
        | "permission_error"
        | "invalid_api_key"
        | "incorrect_api_key"
        | "invalid_organization"
        | "unauthenticated"
        | "permission_denied"
        | "accessdeniedexception"
        | "unrecognizedclientexception"
        | "invalidsignatureexception"
        | "expiredtokenexception" => ErrorClass::Auth,
        "invalid_request_error"
        | "not_found_error"
        | "request_too_large"
        | "invalid_argument"
        | "failed_precondition"
        | "out_of_range"
        | "not_found"
        | "invalid_value"
        | "context_length_exceeded"
        | "model_not_found"
        | "unsupported_parameter"
        | "unsupported_value"
        | "string_above_max_length"
        | "validationexception"
        | "resourcenotfoundexception"
        | "validation_error"
        | "bad_request"
        | "badrequesterror"
        | "unprocessable_entity"
        | "missing_required_parameter"
        | "unknown_parameter"
        | "invalid_type"
        | "decimal_above_max_value"
        | "decimal_below_min_value"
        | "integer_above_max_value"
        | "integer_below_min_value"
        | "invalid_prompt"
        | "content_filter"
        | "content_policy_violation"
        | "image_content_policy_violation"
        | "invalid_image"
        | "invalid_image_format"
        | "invalid_image_mode"
        | "invalid_image_url"
        | "invalid_base64_image"
        | "image_too_large"
        | "image_too_small"
        | "image_parse_error"
        | "image_file_too_large"
        | "image_file_not_found"
        | "empty_image_file"
        | "failed_to_download_image"
        | "unsupported_image_media_type" => ErrorClass::Request,
        _ => return None,
    };
    Some(class)
}

/// The class an HTTP status implies when no vendor tag is known (DESIGN §4.4).
pub fn class_for_status(status: u16) -> ErrorClass {
    match status {
        429 => ErrorClass::Capacity,
        503 | 529 => ErrorClass::Overload,
        408 => ErrorClass::Timeout,
        401 | 403 | 407 => ErrorClass::Auth,
        402 => ErrorClass::Policy,
        400..=499 => ErrorClass::Request,
        _ => ErrorClass::Server,
    }
}

/// Whether `message` reads like account exhaustion ([`EXHAUSTION_PHRASES`]).
pub fn mentions_exhaustion(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    EXHAUSTION_PHRASES.iter().any(|p| lower.contains(p))
}

/// Whether `message` names a per-day limit ([`DAILY_PHRASES`], OpenAI's `(RPD)`/`(TPD)`).
fn mentions_daily_limit(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    DAILY_PHRASES.iter().any(|p| lower.contains(p))
        || lower.contains("(rpd)")
        || lower.contains("(tpd)")
}

/// What a Gemini/Vertex `QuotaFailure` says about the quota that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuotaScope {
    /// A per-day (or longer) quota: exhaustion.
    Daily,
    /// A per-minute or otherwise short quota: transient.
    Short,
}

/// Everything the classifier reads out of a body, vendor-neutral.
#[derive(Debug, Default)]
struct Facts {
    /// Machine-readable tags, most specific first.
    tags: Vec<String>,
    message: Option<String>,
    quota_scope: Option<QuotaScope>,
    /// An HTTP status written in the body (Gemini `error.code`), used for stream errors.
    embedded_status: Option<u16>,
}

fn extract(root: &Value) -> Facts {
    let mut facts = Facts::default();
    let v = match root {
        Value::Array(items) => match items.first() {
            Some(first) => first,
            None => return facts,
        },
        other => other,
    };
    // OpenAI Responses `response.failed` nests the error under `response`.
    let error = v
        .get("error")
        .or_else(|| v.get("response").and_then(|r| r.get("error")))
        .filter(|e| !e.is_null());
    let push_tag = |facts: &mut Facts, t: Option<&Value>| {
        if let Some(s) = t
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            facts.tags.push(tag(s));
        }
    };
    match error {
        Some(Value::Object(e)) => {
            push_tag(&mut facts, e.get("code").filter(|c| c.is_string()));
            push_tag(&mut facts, e.get("status"));
            push_tag(&mut facts, e.get("type"));
            facts.message = e.get("message").and_then(Value::as_str).map(bounded);
            if let Some(code) = e.get("code").and_then(Value::as_u64) {
                facts.embedded_status = u16::try_from(code).ok();
            }
            facts.quota_scope = gemini_quota_scope(e.get("details"));
        }
        Some(Value::String(s)) => facts.message = Some(bounded(s)),
        _ => {}
    }
    // OpenAI Responses `error` event: {"type":"error","code":…,"message":…}; Bedrock JSON
    // bodies: {"message":…} or {"Message":…} with `__type`.
    push_tag(&mut facts, v.get("code").filter(|c| c.is_string()));
    if let Some(t) = v.get("__type").and_then(Value::as_str) {
        let name = t.rsplit('#').next().unwrap_or(t);
        facts.tags.insert(0, tag(name));
    }
    // OpenAI-compatible servers (vLLM, Mistral): {"object":"error","type":…,"code":…}.
    if v.get("object").and_then(Value::as_str) == Some("error") {
        push_tag(&mut facts, v.get("type"));
    }
    // Bedrock stream exception events, decoded by the adapter: {"throttlingException":
    // {"message":…}}.
    if let Some(obj) = v.as_object() {
        for (key, inner) in obj {
            if key.to_ascii_lowercase().ends_with("exception") && inner.is_object() {
                facts.tags.insert(0, tag(key));
                if facts.message.is_none() {
                    facts.message = inner.get("message").and_then(Value::as_str).map(bounded);
                }
            }
        }
    }
    if facts.message.is_none() {
        facts.message = ["message", "Message", "detail"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str))
            .map(bounded);
    }
    facts
}

/// Reads `QuotaFailure.violations[].quotaId` / `quotaMetric` (and `ErrorInfo.metadata`) for a
/// per-day marker. `None` when no quota detail is present.
fn gemini_quota_scope(details: Option<&Value>) -> Option<QuotaScope> {
    let details = details?.as_array()?;
    let mut scope = None;
    for d in details {
        let ty = d.get("@type").and_then(Value::as_str).unwrap_or("");
        let mut texts: Vec<&str> = Vec::new();
        if ty.ends_with("google.rpc.QuotaFailure") {
            for violation in d
                .get("violations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                for key in ["quotaId", "quotaMetric", "subject", "description"] {
                    texts.extend(violation.get(key).and_then(Value::as_str));
                }
            }
        } else if ty.ends_with("google.rpc.ErrorInfo") {
            if let Some(meta) = d.get("metadata").and_then(Value::as_object) {
                texts.extend(meta.values().filter_map(Value::as_str));
            }
        } else {
            continue;
        }
        if texts.is_empty() {
            continue;
        }
        let daily = texts.iter().any(|t| mentions_daily_limit(t));
        if daily {
            return Some(QuotaScope::Daily);
        }
        scope = Some(QuotaScope::Short);
    }
    scope
}

fn decide(
    status: Option<u16>,
    facts: Facts,
    hint: Option<Duration>,
    now_wall: Option<DateTime<Utc>>,
) -> Classification {
    let tagged = facts
        .tags
        .iter()
        .find_map(|t| class_for_tag(t).map(|c| (c, t)));
    let status_class = status.map(class_for_status);
    let mut class = match (tagged, status_class) {
        (Some((ErrorClass::Request, _)), Some(s))
            if status.is_some_and(|s| s == 429 || s >= 500) =>
        {
            s
        }
        (Some((c, _)), _) => c,
        (None, Some(s)) => s,
        (None, None) => ErrorClass::Server,
    };
    // The most specific tag, known or not (`decimal_above_max_value` beats its type).
    let code = facts.tags.first().cloned();

    if matches!(
        class,
        ErrorClass::Capacity | ErrorClass::Overload | ErrorClass::Request | ErrorClass::Auth
    ) {
        let long_hint = matches!(class, ErrorClass::Capacity | ErrorClass::Overload)
            && hint.is_some_and(|h| h >= EXHAUSTION_HINT);
        let message = facts.message.as_deref().unwrap_or("");
        // A structured transient tag (Gemini short quota, OpenAI `rate_limit_exceeded`,
        // Bedrock `ThrottlingException`) often comes with generic upsell wording ("check your
        // plan and billing details", "add a payment method"): then only day wording counts.
        let structured_transient = facts.quota_scope == Some(QuotaScope::Short)
            || tagged
                .is_some_and(|(c, _)| matches!(c, ErrorClass::Capacity | ErrorClass::Overload));
        let worded = match facts.quota_scope {
            Some(QuotaScope::Daily) => true,
            _ if structured_transient => mentions_daily_limit(message),
            _ => mentions_exhaustion(message),
        };
        if long_hint || worded {
            class = ErrorClass::Policy;
        }
    }

    let mut retry_after = hint;
    if class == ErrorClass::Policy {
        let dated = match (now_wall, facts.message.as_deref()) {
            (Some(now), Some(m)) => reset_date_in_message(m, now),
            _ => None,
        };
        retry_after = max_opt(retry_after, dated);
    }
    let pause = match class {
        ErrorClass::Capacity | ErrorClass::Overload => retry_after,
        ErrorClass::Policy => Some(
            retry_after
                .unwrap_or(POLICY_MIN_PAUSE)
                .clamp(POLICY_MIN_PAUSE, POLICY_MAX_PAUSE),
        ),
        _ => None,
    };
    if class == ErrorClass::Request {
        retry_after = None;
    }
    Classification {
        class,
        retry_after,
        pause,
        code,
        message: facts.message,
    }
}

fn max_opt(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Cuts `s` to at most [`MAX_MESSAGE_BYTES`] at a char boundary.
fn bounded(s: &str) -> String {
    truncate(s, MAX_MESSAGE_BYTES)
}

/// Longest vendor tag we keep (bytes). Real tags are short identifiers.
const MAX_TAG_BYTES: usize = 128;

fn tag(s: &str) -> String {
    truncate(s, MAX_TAG_BYTES)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// A short plain-text body (a proxy's "upstream connect error") as the message; binary or
/// empty bodies give none.
fn plain_text_message(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?.trim();
    if text.is_empty() || text.starts_with('<') {
        return None;
    }
    Some(bounded(text))
}
