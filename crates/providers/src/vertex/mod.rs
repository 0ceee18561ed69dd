//! `api: vertex`: Google Vertex AI, for Claude (publisher `anthropic`) and Gemini (publisher
//! `google`) models. `region` is the Vertex location.
//!
//! **Hosts** (overridable with `spec.endpoint` for private endpoints and tests): location
//! `global` → `aiplatform.googleapis.com`; the multi-regions `us` and `eu` →
//! `aiplatform.us.rep.googleapis.com` / `aiplatform.eu.rep.googleapis.com`; a region →
//! `{region}-aiplatform.googleapis.com`. Paths:
//! `/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{model}:{method}`.
//!
//! **Claude** (model ids starting `claude`): methods `rawPredict` and `streamRawPredict`; the
//! body is the Anthropic Messages request without `model` and with `anthropic_version:
//! vertex-2023-10-16`; responses and stream events are Anthropic's own, so this adapter is in
//! the Anthropic dialect for them and decodes nothing.
//!
//! **Gemini** (every other model id): methods `generateContent` and
//! `streamGenerateContent?alt=sse`; the adapter is in the OpenAI dialect and translates
//! requests, responses and streams with [`gemini`] (usage from `usageMetadata`:
//! `promptTokenCount` includes `cachedContentTokenCount`, `thoughtsTokenCount` is separate,
//! streamed usage is cumulative, so the last value counts).
//!
//! **Transcription** (Gemini only): the internal request of
//! [`crate::wire::transcription`] becomes a `generateContent` call with the audio as
//! `inlineData` and a verbatim-transcript instruction ([`gemini::encode_transcription`]); the
//! answer is decoded to OpenAI's `{"text", "usage"}` ([`gemini::decode_transcription`]).
//!
//! **Auth**: [`auth::TokenSource`] (service-account key from the Secret, else the metadata
//! server); `Authorization: Bearer`, marked sensitive. A 401 drops the token and the client
//! re-sends once ([`crate::upstream::UpstreamClient::send`]).
//!
//! **429s**: Vertex sends no `Retry-After`, and three different things answer 429
//! `RESOURCE_EXHAUSTED`; [`classify_429`] tells them apart in the reason code:
//! - `vertex_shared_quota_exhausted` — the shared pay-as-you-go pool of the region is busy
//!   ("Resource exhausted, please try again later", dynamic shared quota): capacity, no
//!   hint, so the pause is the router's capped exponential backoff (another region or
//!   provider usually has room right away);
//! - `vertex_project_quota_exceeded` — this project's per-minute quota ("Quota exceeded for
//!   aiplatform.googleapis.com/…"): capacity until the next minute boundary, which is given as
//!   the retry hint (quotas are counted per minute); a per-day quota is policy (core's rule);
//! - `vertex_provisioned_throughput_exceeded` — provisioned throughput used up and overflow
//!   not allowed: capacity with the backoff pause.

pub mod auth;
pub mod gemini;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Timelike, Utc};
use http::StatusCode;
use http::header::{AUTHORIZATION, HeaderMap};
use serde_json::Value;
use switchyard_api::common::SecretKeyRef;
use switchyard_api::provider::{LLMProviderSpec, ProviderApi};
use switchyard_core::classify::{Classification, ErrorClass, classify_response};

use crate::adapter::{Adapter, BoxFuture, Call, Prepared, StreamDecoder};
use crate::clock::Clock;
use crate::openai::{json_headers, secret_header};
use crate::upstream::{Operation, ProviderKind, TransportError};
use crate::wire::sse::SseItem;

/// `anthropic_version` Claude on Vertex requires in the body.
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// The Vertex AI adapter.
#[derive(Debug)]
pub struct Vertex {
    /// `https://{host}/v1/projects/{project}/locations/{location}/publishers/`.
    base: String,
    tokens: Arc<auth::TokenSource>,
}

/// The Vertex host of a location.
pub fn host(location: &str) -> String {
    match location {
        "global" => "aiplatform.googleapis.com".to_owned(),
        "us" | "eu" => format!("aiplatform.{location}.rep.googleapis.com"),
        region => format!("{region}-aiplatform.googleapis.com"),
    }
}

/// Whether `location` has the shape of a Vertex location: `global`, `us`, `eu`, or a
/// region name such as `us-east5`, `europe-west4`, `asia-northeast1`.
pub fn is_location_name(location: &str) -> bool {
    if matches!(location, "global" | "us" | "eu") {
        return true;
    }
    let Some((area, rest)) = location.split_once('-') else {
        return false;
    };
    let digits = rest.trim_start_matches(|c: char| c.is_ascii_lowercase());
    !area.is_empty()
        && area.bytes().all(|b| b.is_ascii_lowercase())
        && rest.len() > digits.len()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a Vertex model id is Claude (publisher `anthropic`) rather than a Google model.
pub fn is_claude(model: &str) -> bool {
    model.starts_with("claude")
}

impl Vertex {
    /// The adapter of an `api: vertex` provider; `secret` resolves the Secret references.
    ///
    /// Errors: no `vertex.projectId` or `region`, an endpoint that is not a URL, a key that
    /// does not resolve or parse.
    pub fn from_spec(
        spec: &LLMProviderSpec,
        secret: impl Fn(&SecretKeyRef) -> Result<String, String>,
        http: reqwest::Client,
    ) -> Result<Self, String> {
        let vertex = spec
            .vertex
            .as_ref()
            .ok_or("api vertex needs vertex.projectId")?;
        let location = spec
            .region
            .as_deref()
            .ok_or("api vertex needs region (the Vertex location, e.g. us-east5 or global)")?;
        let origin = match &spec.endpoint {
            Some(e) => e.trim_end_matches('/').to_owned(),
            None => format!("https://{}", host(location)),
        };
        reqwest::Url::parse(&origin).map_err(|e| format!("invalid endpoint {origin:?}: {e}"))?;
        let tokens = match &spec.credentials {
            Some(c) => {
                let json = secret(&c.secret_ref)?;
                auth::TokenSource::from_key(&json, vertex.token_url.as_deref(), http)?
            }
            None => auth::TokenSource::metadata(vertex.metadata_url.as_deref(), http),
        };
        Ok(Vertex {
            base: format!(
                "{origin}/v1/projects/{}/locations/{location}/publishers/",
                vertex.project_id
            ),
            tokens: Arc::new(tokens),
        })
    }

    /// The URL of `model`'s `method` (the publisher follows from the model id).
    pub fn url(&self, model: &str, method: &str) -> Result<reqwest::Url, TransportError> {
        let publisher = if is_claude(model) {
            "anthropic"
        } else {
            "google"
        };
        let model = percent_encoding::utf8_percent_encode(model, MODEL_ID);
        reqwest::Url::parse(&format!("{}{publisher}/models/{model}:{method}", self.base))
            .map_err(|e| TransportError::Config(format!("invalid Vertex URL: {e}")))
    }

    fn body(&self, call: &Call<'_>) -> Result<Bytes, TransportError> {
        let mut v: Value = serde_json::from_slice(&call.body)
            .map_err(|e| TransportError::Config(format!("request body is not JSON: {e}")))?;
        let out = if is_claude(call.model) {
            let obj = v
                .as_object_mut()
                .ok_or_else(|| TransportError::Config("request body is not an object".into()))?;
            obj.remove("model");
            obj.insert(
                "anthropic_version".to_owned(),
                Value::String(VERTEX_ANTHROPIC_VERSION.to_owned()),
            );
            v
        } else {
            gemini::encode_request(&v).map_err(|e| TransportError::Config(e.to_string()))?
        };
        serde_json::to_vec(&out)
            .map(Bytes::from)
            .map_err(|e| TransportError::Config(e.to_string()))
    }
}

/// The Gemini `generateContent` body of an internal transcription request (audio inline,
/// [`gemini::encode_transcription`]); `temperature` from the request when set.
fn transcription_body(body: &[u8]) -> Result<Bytes, TransportError> {
    let r: crate::wire::transcription::TranscriptionRequest = serde_json::from_slice(body)
        .map_err(|e| TransportError::Config(format!("transcription body does not parse: {e}")))?;
    let mut v = gemini::encode_transcription(
        &r.audio_base64,
        &r.mime_type,
        r.language.as_deref(),
        r.prompt.as_deref(),
    );
    if let Some(t) = r.temperature
        && let Some(config) = v.get_mut("generationConfig").and_then(Value::as_object_mut)
    {
        config.insert("temperature".to_owned(), Value::from(t));
    }
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(|e| TransportError::Config(e.to_string()))
}

/// Characters of a model id left as they are in the path (ids are `[a-z0-9.@-]`).
const MODEL_ID: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'@');

impl Adapter for Vertex {
    fn api(&self) -> ProviderApi {
        ProviderApi::Vertex
    }

    fn kind(&self, model: &str) -> ProviderKind {
        if is_claude(model) {
            ProviderKind::Anthropic
        } else {
            ProviderKind::OpenAi
        }
    }

    fn serves(&self, op: Operation, model: &str) -> bool {
        match op {
            Operation::Messages => is_claude(model),
            Operation::ChatCompletions | Operation::Transcription => !is_claude(model),
            Operation::Embeddings | Operation::Rerank => false,
        }
    }

    fn prepare<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Prepared, TransportError>> {
        Box::pin(async move {
            if !self.serves(call.op, call.model) {
                return Err(TransportError::Config(format!(
                    "{:?} of model {} is not served by Vertex",
                    call.op, call.model
                )));
            }
            let method = match (is_claude(call.model), call.stream) {
                (true, false) => "rawPredict",
                (true, true) => "streamRawPredict",
                (false, false) => "generateContent",
                (false, true) => "streamGenerateContent",
            };
            let mut url = self.url(call.model, method)?;
            if method == "streamGenerateContent" {
                url.set_query(Some("alt=sse"));
            }
            let body = if call.op == Operation::Transcription {
                transcription_body(&call.body)?
            } else {
                self.body(&call)?
            };
            let token = self
                .tokens
                .token()
                .await
                .map_err(TransportError::Credentials)?;
            let mut headers = json_headers(call.stream);
            headers.insert(
                AUTHORIZATION,
                secret_header(&format!("Bearer {token}"), "access token")?,
            );
            Ok(Prepared { url, headers, body })
        })
    }

    fn decode(&self, op: Operation, model: &str, body: Bytes) -> Result<Bytes, String> {
        if is_claude(model) {
            return Ok(body);
        }
        let created = u64::try_from(Clock::new().wall().timestamp()).unwrap_or(0);
        let out = if op == Operation::Transcription {
            let (text, (input, output)) =
                gemini::decode_transcription(&body).map_err(|e| e.to_string())?;
            serde_json::json!({"text": text, "usage": {"type": "tokens", "input_tokens": input, "output_tokens": output, "total_tokens": input + output}})
        } else {
            gemini::decode_response(&body, model, created).map_err(|e| e.to_string())?
        };
        serde_json::to_vec(&out)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    }

    fn stream_decoder(&self, _op: Operation, model: &str) -> Box<dyn StreamDecoder> {
        if is_claude(model) {
            return Box::new(crate::wire::sse::SseParser::new());
        }
        let created = u64::try_from(Clock::new().wall().timestamp()).unwrap_or(0);
        Box::new(GeminiDecoder(gemini::GeminiStream::new(
            model, created, true,
        )))
    }

    fn classify(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Classification {
        let c = classify_response(status, headers, body, now);
        if status == StatusCode::TOO_MANY_REQUESTS {
            classify_429(c, body, now)
        } else {
            c
        }
    }

    fn unauthorized(&self) -> bool {
        self.tokens.invalidate();
        true
    }

    fn check_credentials(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move { self.tokens.token().await.map(|_| ()) })
    }
}

struct GeminiDecoder(gemini::GeminiStream);

impl StreamDecoder for GeminiDecoder {
    fn push(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        self.0.push(chunk)
    }

    fn finish(&mut self) -> Vec<SseItem> {
        self.0.finish()
    }
}

/// Tells the three kinds of Vertex 429 apart (module docs) in `c.code`, and gives the
/// per-minute project quota its retry hint (the next minute boundary, at least 1 s). A
/// classification core already made policy (a per-day quota) keeps its class.
pub fn classify_429(mut c: Classification, body: &[u8], now: DateTime<Utc>) -> Classification {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.pointer("/0/error/message"))
                .and_then(Value::as_str)
                .map(str::to_ascii_lowercase)
        })
        .unwrap_or_default();
    let code = if message.contains("provisioned throughput") {
        "vertex_provisioned_throughput_exceeded"
    } else if message.contains("quota exceeded") {
        if c.class == ErrorClass::Capacity && c.retry_after.is_none() {
            let into_minute = u64::from(now.second());
            let wait = Duration::from_secs((60 - into_minute).max(1));
            c.retry_after = Some(wait);
            c.pause = Some(wait);
        }
        "vertex_project_quota_exceeded"
    } else {
        "vertex_shared_quota_exhausted"
    };
    c.code = Some(code.to_owned());
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_names_are_checked() {
        for ok in [
            "global",
            "us",
            "eu",
            "us-east5",
            "europe-west4",
            "asia-northeast1",
        ] {
            assert!(is_location_name(ok), "{ok}");
        }
        for bad in ["us-east-1", "useast5", "us-", "US-EAST5", "eu-west"] {
            assert!(!is_location_name(bad), "{bad}");
        }
    }

    #[test]
    fn transcription_body_is_gemini_with_inline_audio() {
        let internal = crate::wire::transcription::TranscriptionRequest {
            model: "gemini-2.5-flash".into(),
            audio_base64: "UklGRg==".into(),
            mime_type: "audio/wav".into(),
            file_name: "a.wav".into(),
            language: Some("ja".into()),
            prompt: None,
            response_format: None,
            temperature: Some(0.3),
        };
        let body = transcription_body(&internal.to_json().unwrap()).unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        let parts = &v["contents"][0]["parts"];
        assert_eq!(parts[1]["inlineData"]["mimeType"], "audio/wav");
        assert_eq!(parts[1]["inlineData"]["data"], "UklGRg==");
        assert!(parts[0]["text"].as_str().unwrap().contains("`ja`"));
        assert_eq!(v["generationConfig"]["temperature"], 0.3);
        assert!(v.get("model").is_none());
        assert!(matches!(
            transcription_body(b"{}"),
            Err(TransportError::Config(_))
        ));
    }

    #[test]
    fn host_follows_location_kind() {
        assert_eq!(host("global"), "aiplatform.googleapis.com");
        assert_eq!(host("us"), "aiplatform.us.rep.googleapis.com");
        assert_eq!(host("eu"), "aiplatform.eu.rep.googleapis.com");
        assert_eq!(host("us-east5"), "us-east5-aiplatform.googleapis.com");
        assert_eq!(
            host("europe-west4"),
            "europe-west4-aiplatform.googleapis.com"
        );
    }

    fn adapter(location: &str, endpoint: Option<&str>) -> Vertex {
        let mut spec = serde_json::json!({
            "api": "vertex", "region": location, "vertex": {"projectId": "proj-1"},
            "models": [{"name": "m"}]
        });
        if let Some(e) = endpoint {
            spec["endpoint"] = serde_json::json!(e);
        }
        let spec: LLMProviderSpec = serde_json::from_value(spec).unwrap();
        Vertex::from_spec(&spec, |_| Ok(String::new()), reqwest::Client::new()).unwrap()
    }

    #[test]
    fn url_per_host_form_and_publisher() {
        for (location, host) in [
            ("global", "aiplatform.googleapis.com"),
            ("us", "aiplatform.us.rep.googleapis.com"),
            ("eu", "aiplatform.eu.rep.googleapis.com"),
            ("us-east5", "us-east5-aiplatform.googleapis.com"),
        ] {
            let a = adapter(location, None);
            let u = a.url("claude-sonnet-4@20250514", "rawPredict").unwrap();
            assert_eq!(
                u.as_str(),
                format!(
                    "https://{host}/v1/projects/proj-1/locations/{location}/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict"
                )
            );
            let u = a.url("gemini-2.5-flash", "streamGenerateContent").unwrap();
            assert_eq!(
                u.as_str(),
                format!(
                    "https://{host}/v1/projects/proj-1/locations/{location}/publishers/google/models/gemini-2.5-flash:streamGenerateContent"
                )
            );
        }
        let a = adapter("europe-west4", Some("http://127.0.0.1:9/"));
        assert_eq!(
            a.url("gemini-2.5-pro", "generateContent").unwrap().as_str(),
            "http://127.0.0.1:9/v1/projects/proj-1/locations/europe-west4/publishers/google/models/gemini-2.5-pro:generateContent"
        );
        assert_eq!(a.kind("claude-x"), ProviderKind::Anthropic);
        assert_eq!(a.kind("gemini-x"), ProviderKind::OpenAi);
        assert!(a.serves(Operation::Messages, "claude-x"));
        assert!(!a.serves(Operation::ChatCompletions, "claude-x"));
        assert!(a.serves(Operation::ChatCompletions, "gemini-x"));
    }

    #[test]
    fn bad_service_account_keys_name_the_problem() {
        let spec: LLMProviderSpec = serde_json::from_value(serde_json::json!({
            "api": "vertex", "region": "us-east5", "vertex": {"projectId": "proj-1"},
            "credentials": {"secretRef": {"name": "sa", "key": "key.json"}},
            "models": [{"name": "m"}]
        }))
        .unwrap();
        let build = |key: &str| {
            let key = key.to_owned();
            Vertex::from_spec(&spec, move |_| Ok(key.clone()), reqwest::Client::new()).unwrap_err()
        };
        assert!(build("{not json").contains("not a JSON key file"));
        assert!(
            build(r#"{"type": "authorized_user", "client_email": "a", "private_key": "b"}"#)
                .contains("a service_account key is needed")
        );
        let e = build(
            r#"{"type": "service_account", "client_email": "a@b", "private_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}"#,
        );
        assert!(e.contains("not an RSA private key"), "{e}");
        assert!(
            !e.contains("AAAA"),
            "the key's contents are never quoted: {e}"
        );
    }

    fn classified(body: &str, at_second: u32) -> Classification {
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0)
            .unwrap()
            .with_second(at_second)
            .unwrap();
        let c = classify_response(
            StatusCode::TOO_MANY_REQUESTS,
            &HeaderMap::new(),
            body.as_bytes(),
            now,
        );
        classify_429(c, body.as_bytes(), now)
    }

    #[test]
    fn classify_429_tells_the_three_kinds_apart() {
        let shared = classified(
            r#"{"error":{"code":429,"message":"Resource exhausted, please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.","status":"RESOURCE_EXHAUSTED"}}"#,
            10,
        );
        assert_eq!(shared.class, ErrorClass::Capacity);
        assert_eq!(
            shared.code.as_deref(),
            Some("vertex_shared_quota_exhausted")
        );
        assert_eq!(shared.retry_after, None);

        let project = classified(
            r#"{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: claude-sonnet-4. Please submit a quota increase request.","status":"RESOURCE_EXHAUSTED"}}"#,
            45,
        );
        assert_eq!(project.class, ErrorClass::Capacity);
        assert_eq!(
            project.code.as_deref(),
            Some("vertex_project_quota_exceeded")
        );
        assert_eq!(project.retry_after, Some(Duration::from_secs(15)));

        let pt = classified(
            r#"{"error":{"code":429,"message":"Provisioned throughput limit exceeded for the project.","status":"RESOURCE_EXHAUSTED"}}"#,
            0,
        );
        assert_eq!(pt.class, ErrorClass::Capacity);
        assert_eq!(
            pt.code.as_deref(),
            Some("vertex_provisioned_throughput_exceeded")
        );
    }
}
