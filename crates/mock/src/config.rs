//! Mock provider configuration: one [`MockConfig`] per mock, loadable from YAML or JSON.
//!
//! Durations are humantime strings (`"250ms"`, `"5m"`, `"1h"`) or plain integers read as
//! milliseconds for the `*_ms` fields. Every field has a default, so `{}` is a valid config.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::{AwsAuthConfig, GoogleAuthConfig};
use crate::fault::FaultSet;

/// How usage is spelled on the OpenAI-compatible chat endpoint.
///
/// `gemini` replaces `usage` with Gemini's `usageMetadata { promptTokenCount,
/// cachedContentTokenCount, candidatesTokenCount, totalTokenCount }` (prompt count includes
/// the cached tokens, as Gemini reports them); field case 16 needs all three vendor shapes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageStyle {
    /// `usage { prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens }`.
    #[default]
    Openai,
    /// `usageMetadata { promptTokenCount, cachedContentTokenCount, candidatesTokenCount, totalTokenCount }`.
    Gemini,
}

/// A kind of traffic the mock serves, by endpoint (for `modalities` and fault triggers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MockModality {
    /// `/v1/chat/completions`, `/v1/messages`, `/v1/responses`.
    Text,
    /// `/v1/embeddings`.
    Embedding,
    /// `/v1/rerank` (and its aliases).
    Rerank,
    /// `/v1/audio/transcriptions` (speech to text).
    Transcription,
    /// `/v1/audio/speech` (text to speech).
    Speech,
}

/// Provider-side rate limits the mock advertises in its headers and, if `enforce`, applies.
///
/// Windows are fixed one-minute windows starting at the mock's epoch; the reset headers give the
/// time left in the current window (`x-ratelimit-reset-*` as Go-style `6m0s`, Anthropic
/// `anthropic-ratelimit-*-reset` as an RFC 3339 instant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests per minute (`x-ratelimit-limit-requests`).
    pub requests_per_minute: u64,
    /// Tokens (input + output) per minute (`x-ratelimit-limit-tokens`).
    pub tokens_per_minute: u64,
    /// When true a request over either limit gets a 429 with `Retry-After` = window remainder.
    pub enforce: bool,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            requests_per_minute: 10_000,
            tokens_per_minute: 2_000_000,
            enforce: false,
        }
    }
}

/// Configuration of one mock provider instance.
///
/// Timing model (all measured from the arrival of the request): response headers at
/// `latency_ms` (+ fault delays); first content token at `max(latency_ms, ttft_ms)`; then one
/// token every `1 / tokens_per_sec` seconds (`0` = no pacing). A non-streaming answer is sent
/// when the equivalent stream would have finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MockConfig {
    /// Name shown in logs and in `/admin/stats`.
    pub name: String,
    /// Address to bind; `None` = `127.0.0.1:0` (an ephemeral port).
    pub listen: Option<SocketAddr>,
    /// Models served; empty accepts any model name. Others get 404 `model_not_found`.
    pub models: Vec<String>,
    /// Accepted API keys (`Authorization: Bearer` or `x-api-key`); empty accepts anything.
    pub api_keys: Vec<String>,
    /// Tokens in a full answer (`token0 token1 ...`); capped by the request's `max_tokens`.
    pub output_tokens: u64,
    /// Streaming pace in tokens per second; `0` sends all tokens at once.
    pub tokens_per_sec: f64,
    /// Delay before response headers, in milliseconds.
    pub latency_ms: u64,
    /// Time from request arrival to first content token, in milliseconds.
    pub ttft_ms: u64,
    /// Default prompt-cache lifetime (refreshed on every hit). Anthropic blocks may ask for
    /// `ttl: "1h"` / `"5m"` in their `cache_control`.
    #[serde(with = "humantime_serde_compat")]
    pub cache_ttl: Duration,
    /// Smallest prefix (tokens) the automatic (OpenAI-style) cache stores or reports; the real
    /// OpenAI floor is 1024, the default 0 keeps small test prompts cacheable.
    pub cache_min_tokens: u64,
    /// Usage shape on `/v1/chat/completions`.
    pub usage_style: UsageStyle,
    /// Anthropic endpoint: treat a request without any `cache_control` as if its last block had
    /// one (default false, as the real API caches only at explicit breakpoints). Useful when
    /// clients speak OpenAI format through a router that does not add breakpoints.
    pub anthropic_implicit_breakpoint: bool,
    /// Embedding vector length when the request gives no `dimensions`.
    pub embedding_dimensions: usize,
    /// Header whose value is recorded as the call's project (field cases 13, 22).
    pub project_header: String,
    /// Advertised (and optionally enforced) provider rate limits.
    pub rate_limits: RateLimitConfig,
    /// Call records kept (oldest dropped first) so a long-running mock stays bounded;
    /// `call_count` still counts every call.
    pub record_limit: usize,
    /// Faults active from start; replaced at runtime by `POST /admin/faults`.
    pub faults: FaultSet,
    /// Kinds of traffic served; empty serves all. Endpoints of other kinds answer 404 in the
    /// OpenAI dialect, as a speech-only or embeddings-only server does (field case 26).
    pub modalities: Vec<MockModality>,
    /// Voices `/v1/audio/speech` accepts; empty accepts any. A request without a voice is
    /// always refused (400): the mock, like some real servers, has no default voice.
    pub voices: Vec<String>,
    /// Refuse (400 `invalid_request_error`, param `max_tokens`) a `max_tokens` on embeddings,
    /// rerank and audio requests, as strict servers do with parameters their endpoint does
    /// not take (field case 26).
    pub reject_max_tokens: bool,
    /// Check SigV4 on the Bedrock paths and serve the STS mock (`POST /`); `None` accepts any
    /// (or no) signature and serves no STS.
    pub aws_auth: Option<AwsAuthConfig>,
    /// Check Google OAuth2 bearer tokens on the Vertex paths and serve `POST /token` and the
    /// metadata token endpoint; `None` accepts any (or no) token and serves neither.
    pub google_auth: Option<GoogleAuthConfig>,
    /// Gemini `usageMetadata.thoughtsTokenCount` reported per answer (0 = field omitted).
    pub gemini_thoughts_tokens: u64,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            name: "mock".to_owned(),
            listen: None,
            models: Vec::new(),
            api_keys: Vec::new(),
            output_tokens: 16,
            tokens_per_sec: 0.0,
            latency_ms: 0,
            ttft_ms: 0,
            cache_ttl: Duration::from_secs(300),
            cache_min_tokens: 0,
            usage_style: UsageStyle::Openai,
            anthropic_implicit_breakpoint: false,
            embedding_dimensions: 8,
            project_header: "x-project-id".to_owned(),
            rate_limits: RateLimitConfig::default(),
            record_limit: 100_000,
            faults: FaultSet::default(),
            modalities: Vec::new(),
            voices: Vec::new(),
            reject_max_tokens: false,
            aws_auth: None,
            google_auth: None,
            gemini_thoughts_tokens: 0,
        }
    }
}

/// A config file: either one mock or several (`mocks: [...]`, or a bare YAML list).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ConfigFile {
    /// `mocks:` list form.
    Many {
        /// The mocks, each with its own `listen` and `name`.
        mocks: Vec<MockConfig>,
    },
    /// Bare list form.
    List(Vec<MockConfig>),
    /// A single mock.
    One(Box<MockConfig>),
}

impl ConfigFile {
    /// Parses YAML (JSON is YAML too).
    ///
    /// # Errors
    /// The YAML error, with its position, when the text does not match the schema.
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }

    /// The mocks described, in file order.
    pub fn into_mocks(self) -> Vec<MockConfig> {
        match self {
            Self::Many { mocks } | Self::List(mocks) => mocks,
            Self::One(one) => vec![*one],
        }
    }
}

/// Serde for `Duration` as a humantime string (`"5m"`) or integer seconds.
pub(crate) mod humantime_serde_compat {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Secs(u64),
        Text(String),
    }

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Secs(s) => Ok(Duration::from_secs(s)),
            Repr::Text(t) => humantime::parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }

    /// Same, for `Option<Duration>`.
    pub(crate) mod option {
        use std::time::Duration;

        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            #[derive(Deserialize)]
            struct Wrap(#[serde(with = "super")] Duration);
            Ok(Option::<Wrap>::deserialize(d)?.map(|w| w.0))
        }
    }
}
