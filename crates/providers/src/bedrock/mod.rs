//! `api: bedrock`: Amazon Bedrock runtime. `region` is the AWS region.
//!
//! **Host** `https://bedrock-runtime.{region}.amazonaws.com` (overridable with
//! `spec.endpoint`). **Model ids** are base ids (`anthropic.claude-sonnet-4-…-v1:0`),
//! cross-region inference profiles (`us.`, `eu.`, `apac.`, `global.` + a base id) or ARNs;
//! the id is one path segment, percent-encoded (`:` → `%3A`, `/` → `%2F`) exactly once, and
//! the signature is computed over that same encoded path, so the signed canonical request
//! and the sent request agree (AWS double-encodes the path in the canonical request of
//! non-S3 services; `aws-sigv4` does that part).
//!
//! **APIs** per model (`models[].bedrockApi`, default [`default_api`]):
//! - `invoke`: `POST /model/{id}/invoke` and `/invoke-with-response-stream`; the body is the
//!   Anthropic Messages request without `model` and `stream`, with `anthropic_version:
//!   bedrock-2023-05-31`; the answer is Anthropic's JSON, the stream is event-stream `chunk`
//!   events whose `bytes` member is the base64 of one Anthropic stream event.
//! - `converse`: `POST /model/{id}/converse` and `/converse-stream`, translated by
//!   [`converse`].
//!
//! Both are in the Anthropic dialect. Streams are checked for the event-stream content type
//! first; exception frames inside a 200 stream become Anthropic `error` events that core's
//! classifier reads (`throttlingException` → capacity, `modelStreamErrorException` →
//! server, `validationException` → request, `serviceUnavailableException` → overload).
//!
//! **Auth**: SigV4 (`aws-sigv4`, signing name `bedrock`) with static keys from the Secret
//! (`credentials.secretRef` = secret access key, `accessKeyIdRef`, optional
//! `sessionTokenRef`); a Bedrock API key (`secretRef` alone, sent as `Authorization:
//! Bearer`, no signature); or, without credentials, IRSA: the web-identity token file
//! exchanged at STS for temporary keys with `AssumeRoleWithWebIdentity`, cached until five
//! minutes before they expire ([`credentials`]). No SDK-style hidden retries.
//!
//! **Errors**: HTTP errors carry `x-amzn-errortype` (core reads it):
//! `ThrottlingException` (429, and the 400 variants) → capacity,
//! `ServiceQuotaExceededException` (400) → policy, `ModelNotReadyException` (429) → overload,
//! not capacity, `ModelStreamErrorException` (424) → server, `ValidationException` (400) →
//! request, `AccessDeniedException` / `UnrecognizedClientException` /
//! `ExpiredTokenException` (403) → auth.

pub mod converse;
pub mod credentials;
pub mod eventstream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use switchyard_api::common::SecretKeyRef;
use switchyard_api::provider::{BedrockModelApi, LLMProviderSpec, ProviderApi};

use crate::adapter::{Adapter, BoxFuture, Call, Prepared, StreamDecoder};
use crate::clock::Clock;
use crate::openai::json_headers;
use crate::upstream::{Operation, ProviderKind, TransportError};
use crate::wire::sse::{SseEvent, SseItem};
use credentials::CredentialSource;
use eventstream::{EventFrames, Frame};

/// `anthropic_version` InvokeModel requires for Anthropic models.
pub const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
/// SigV4 signing name of the Bedrock runtime.
pub const SIGNING_NAME: &str = "bedrock";

/// Whether a model id (base id, inference profile or ARN) names an Anthropic model.
pub fn is_anthropic(model: &str) -> bool {
    let id = model.rsplit('/').next().unwrap_or(model);
    id.starts_with("anthropic.")
        || id
            .split_once('.')
            .is_some_and(|(_, rest)| rest.starts_with("anthropic."))
}

/// The API used for a model without `bedrockApi`: `invoke` for Anthropic models (every
/// Messages feature passes unchanged), `converse` for the rest.
pub fn default_api(model: &str) -> BedrockModelApi {
    if is_anthropic(model) {
        BedrockModelApi::Invoke
    } else {
        BedrockModelApi::Converse
    }
}

/// Characters of a model id kept as they are in the path; everything else (`:` and `/` of
/// versions and ARNs) is percent-encoded, as the AWS SDKs encode the `modelId` label.
const MODEL_ID: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Whether an AWS region name has the shape AWS uses (`us-east-1`, `eu-central-2`,
/// `us-gov-west-1`, `ap-southeast-4`).
pub fn is_region_name(region: &str) -> bool {
    let parts: Vec<&str> = region.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[0].bytes().all(|b| b.is_ascii_lowercase())
        && parts[1..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts[parts.len() - 1].parse::<u8>().is_ok()
}

/// The Bedrock adapter.
#[derive(Debug)]
pub struct Bedrock {
    origin: String,
    region: String,
    /// `models[]` upstream names with an explicit `bedrockApi`.
    apis: Vec<(String, BedrockModelApi)>,
    credentials: Arc<CredentialSource>,
    /// Message ids of translated responses.
    sequence: AtomicU64,
}

impl Bedrock {
    /// The adapter of an `api: bedrock` provider; `secret` resolves the Secret references.
    ///
    /// Errors: no or malformed `region`, an endpoint that is not a URL, keys that do not
    /// resolve, an IRSA setup with no role or token file.
    pub fn from_spec(
        spec: &LLMProviderSpec,
        secret: impl Fn(&SecretKeyRef) -> Result<String, String>,
        http: reqwest::Client,
    ) -> Result<Self, String> {
        let region = spec
            .region
            .clone()
            .ok_or("api bedrock needs region (the AWS region)")?;
        if !is_region_name(&region) {
            return Err(format!(
                "region {region:?} is not an AWS region name (such as us-east-1)"
            ));
        }
        let origin = match &spec.endpoint {
            Some(e) => e.trim_end_matches('/').to_owned(),
            None => format!("https://bedrock-runtime.{region}.amazonaws.com"),
        };
        reqwest::Url::parse(&origin).map_err(|e| format!("invalid endpoint {origin:?}: {e}"))?;
        let credentials = match &spec.credentials {
            Some(c) => match &c.access_key_id_ref {
                Some(key_id_ref) => CredentialSource::fixed(
                    secret(key_id_ref)?,
                    secret(&c.secret_ref)?,
                    c.session_token_ref.as_ref().map(&secret).transpose()?,
                ),
                None => CredentialSource::ApiKey(secret(&c.secret_ref)?),
            },
            None => CredentialSource::web_identity(
                spec.bedrock.clone().unwrap_or_default(),
                &region,
                http,
            )?,
        };
        let apis = spec
            .models
            .iter()
            .filter_map(|m| {
                let api = m.bedrock_api?;
                Some((
                    m.upstream_name.clone().unwrap_or_else(|| m.name.clone()),
                    api,
                ))
            })
            .collect();
        Ok(Bedrock {
            origin,
            region,
            apis,
            credentials: Arc::new(credentials),
            sequence: AtomicU64::new(0),
        })
    }

    /// The runtime API used for `model`.
    pub fn api_for(&self, model: &str) -> BedrockModelApi {
        self.apis
            .iter()
            .find(|(m, _)| m == model)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| default_api(model))
    }

    /// The URL of `model`'s `action` (`invoke`, `converse-stream`, …).
    ///
    /// Errors: [`TransportError::Config`] when the result is not a URL.
    pub fn url(&self, model: &str, action: &str) -> Result<reqwest::Url, TransportError> {
        let id = percent_encoding::utf8_percent_encode(model, MODEL_ID);
        reqwest::Url::parse(&format!("{}/model/{id}/{action}", self.origin))
            .map_err(|e| TransportError::Config(format!("invalid Bedrock URL: {e}")))
    }

    fn body(&self, call: &Call<'_>) -> Result<Bytes, TransportError> {
        let mut v: Value = serde_json::from_slice(&call.body)
            .map_err(|e| TransportError::Config(format!("request body is not JSON: {e}")))?;
        let out = match self.api_for(call.model) {
            BedrockModelApi::Invoke => {
                let obj = v.as_object_mut().ok_or_else(|| {
                    TransportError::Config("request body is not an object".into())
                })?;
                obj.remove("model");
                obj.remove("stream");
                obj.insert(
                    "anthropic_version".to_owned(),
                    Value::String(BEDROCK_ANTHROPIC_VERSION.to_owned()),
                );
                v
            }
            BedrockModelApi::Converse => {
                converse::encode_request(&v).map_err(|e| TransportError::Config(e.to_string()))?
            }
        };
        serde_json::to_vec(&out)
            .map(Bytes::from)
            .map_err(|e| TransportError::Config(e.to_string()))
    }

    fn next_id(&self) -> String {
        format!(
            "msg_bedrock_{:016x}",
            self.sequence.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// Signs `url` + `headers` + `body` with SigV4 at `time` and adds the signature headers
/// (`authorization`, `x-amz-date`, `x-amz-security-token`) to `headers`.
///
/// Errors: [`TransportError::Config`] when the request cannot be signed.
pub fn sign_request(
    url: &reqwest::Url,
    headers: &mut HeaderMap,
    body: &[u8],
    creds: &credentials::Keys,
    region: &str,
    time: SystemTime,
) -> Result<(), TransportError> {
    let identity = aws_credential_types::Credentials::new(
        creds.access_key_id.clone(),
        creds.secret_access_key.clone(),
        creds.session_token.clone(),
        None,
        "switchyard",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SIGNING_NAME)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| TransportError::Config(format!("failed to sign: {e}")))?
        .into();
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new(
        "POST",
        url.as_str(),
        pairs.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| TransportError::Config(format!("failed to sign: {e}")))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| TransportError::Config(format!("failed to sign: {e}")))?
        .into_parts();
    for (name, value) in instructions.headers() {
        let name = HeaderName::try_from(name)
            .map_err(|e| TransportError::Config(format!("failed to sign: {e}")))?;
        let mut value = HeaderValue::try_from(value)
            .map_err(|e| TransportError::Config(format!("failed to sign: {e}")))?;
        if name == http::header::AUTHORIZATION || name.as_str() == "x-amz-security-token" {
            value.set_sensitive(true);
        }
        headers.insert(name, value);
    }
    Ok(())
}

impl Adapter for Bedrock {
    fn api(&self) -> ProviderApi {
        ProviderApi::Bedrock
    }

    fn kind(&self, _model: &str) -> ProviderKind {
        ProviderKind::Anthropic
    }

    fn serves(&self, op: Operation, _model: &str) -> bool {
        op == Operation::Messages
    }

    fn prepare<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Prepared, TransportError>> {
        Box::pin(async move {
            if call.op != Operation::Messages {
                return Err(TransportError::Config(format!(
                    "{:?} is not served by Bedrock",
                    call.op
                )));
            }
            let action = match (self.api_for(call.model), call.stream) {
                (BedrockModelApi::Invoke, false) => "invoke",
                (BedrockModelApi::Invoke, true) => "invoke-with-response-stream",
                (BedrockModelApi::Converse, false) => "converse",
                (BedrockModelApi::Converse, true) => "converse-stream",
            };
            let url = self.url(call.model, action)?;
            let body = self.body(&call)?;
            let mut headers = json_headers(false);
            if call.stream {
                headers.insert(
                    http::header::ACCEPT,
                    HeaderValue::from_static(eventstream::CONTENT_TYPE),
                );
            }
            if let CredentialSource::ApiKey(key) = &*self.credentials {
                // A Bedrock API key replaces SigV4 altogether.
                headers.insert(
                    http::header::AUTHORIZATION,
                    crate::openai::secret_header(&format!("Bearer {key}"), "Bedrock API key")?,
                );
                return Ok(Prepared { url, headers, body });
            }
            let keys = self
                .credentials
                .keys()
                .await
                .map_err(TransportError::Credentials)?;
            let time: SystemTime = Clock::new().wall().into();
            sign_request(&url, &mut headers, &body, &keys, &self.region, time)?;
            Ok(Prepared { url, headers, body })
        })
    }

    fn decode(&self, _op: Operation, model: &str, body: Bytes) -> Result<Bytes, String> {
        match self.api_for(model) {
            BedrockModelApi::Invoke => Ok(body),
            BedrockModelApi::Converse => {
                let v = converse::decode_response(&body, model, &self.next_id())?;
                serde_json::to_vec(&v)
                    .map(Bytes::from)
                    .map_err(|e| e.to_string())
            }
        }
    }

    fn stream_decoder(&self, _op: Operation, model: &str) -> Box<dyn StreamDecoder> {
        let converse = match self.api_for(model) {
            BedrockModelApi::Invoke => None,
            BedrockModelApi::Converse => Some(converse::ConverseStream::new(model, self.next_id())),
        };
        Box::new(BedrockStream {
            frames: EventFrames::new(),
            converse,
        })
    }

    fn accepts_stream(&self, headers: &HeaderMap) -> Result<(), String> {
        let ct = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct.starts_with(eventstream::CONTENT_TYPE) {
            Ok(())
        } else {
            Err(format!(
                "Bedrock stream came back as {ct:?}, not {}",
                eventstream::CONTENT_TYPE
            ))
        }
    }

    fn check_credentials(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match &*self.credentials {
                CredentialSource::ApiKey(_) => Ok(()),
                other => other.keys().await.map(|_| ()),
            }
        })
    }
}

/// Event-stream frames → Anthropic SSE items (Invoke `chunk`s decoded, Converse events
/// translated).
struct BedrockStream {
    frames: EventFrames,
    converse: Option<converse::ConverseStream>,
}

impl StreamDecoder for BedrockStream {
    fn push(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        let mut out = Vec::new();
        for frame in self.frames.push(chunk) {
            if let Some(c) = self.converse.as_mut() {
                out.extend(c.frame(&frame));
                continue;
            }
            match &frame {
                Frame::Event { kind, payload } if kind == "chunk" => {
                    out.push(invoke_chunk(payload));
                }
                Frame::Event { .. } => {}
                Frame::Exception { kind, payload } => {
                    out.push(converse::exception_event(kind, payload));
                }
                Frame::Invalid(why) => out.push(converse::exception_event(
                    "invalidStreamFrame",
                    serde_json::json!({ "message": why }).to_string().as_bytes(),
                )),
            }
        }
        out
    }

    fn finish(&mut self) -> Vec<SseItem> {
        let mut out = Vec::new();
        if let Some(c) = self.converse.as_mut() {
            // `messageStop` without `metadata`: close the message without usage.
            out.extend(c.end(None));
        }
        if self.frames.has_partial() {
            out.push(SseItem::Incomplete(SseEvent::data("")));
        }
        out
    }
}

/// One InvokeModelWithResponseStream `chunk` event: `{"bytes": base64(event JSON)}` → the
/// Anthropic event it carries.
fn invoke_chunk(payload: &[u8]) -> SseItem {
    let decoded = serde_json::from_slice::<Value>(payload)
        .ok()
        .and_then(|v| v.get("bytes").and_then(Value::as_str).map(str::to_owned))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|raw| String::from_utf8(raw).ok());
    match decoded {
        Some(json) => {
            let kind = serde_json::from_str::<Value>(&json)
                .ok()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned));
            SseItem::Event(SseEvent::new(kind.as_deref(), json))
        }
        None => converse::exception_event(
            "invalidStreamFrame",
            br#"{"message":"chunk event without base64 bytes"}"#,
        ),
    }
}

#[cfg(test)]
mod tests;
