//! The adapter boundary: everything that differs between vendor APIs, behind one trait.
//!
//! The dispatcher speaks two dialects, OpenAI chat and Anthropic messages ([`ProviderKind`]),
//! and translates between them ([`crate::wire::translate`]). An [`Adapter`] takes a body in
//! one of those dialects and owns the rest of the way to one vendor API and back:
//!
//! | step | what the adapter decides |
//! |---|---|
//! | dialect | [`Adapter::kind`]: the dialect the body must be in for a model (Gemini on Vertex wants OpenAI chat, Claude on Vertex or Bedrock wants Anthropic messages) |
//! | operations | [`Adapter::serves`]: which operations exist on this API |
//! | request | [`Adapter::prepare`]: URL and host for the region, auth headers or signature (tokens fetched, cached and refreshed here), the body in the vendor's shape |
//! | response | [`Adapter::decode`]: the vendor's JSON back to the dialect's JSON (usage normalised into the dialect's usage members) |
//! | stream | [`Adapter::stream_decoder`]: the vendor's framing (SSE, AWS event stream) to SSE items in the dialect; exception frames become the dialect's error events |
//! | errors | [`Adapter::classify`]: the vendor's error shapes handed to core's classifier, refined where the vendor needs it |
//! | credentials | [`Adapter::unauthorized`]: a 401 drops cached tokens so the one re-send gets fresh ones |
//!
//! Adding a provider API is one module here implementing the trait plus one arm in
//! [`build`]. The dispatcher and the health probes use adapters only through
//! [`crate::upstream::UpstreamClient`], which holds one.
//!
//! Rejected: an enum of vendors matched in the dispatcher (every new vendor touches every
//! match), and a third internal dialect (both client dialects already exist and translate
//! into each other; a vendor needs only a mapping to the closer one).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{HeaderMap, StatusCode};
use switchyard_api::provider::{LLMProviderSpec, ProviderApi};
use switchyard_core::classify::{Classification, classify_response};

use crate::secrets::SecretSource;
use crate::upstream::{Operation, ProviderKind, TransportError};
use crate::wire::sse::{SseItem, SseParser};

/// A boxed future, for the async steps of a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One call as the dispatcher or a probe asks for it.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// What is called.
    pub op: Operation,
    /// Upstream model name (a Bedrock model id, inference profile or ARN; a Vertex model id).
    pub model: &'a str,
    /// Whether the response is streamed.
    pub stream: bool,
    /// Body in the dialect [`Adapter::kind`] named for `model` (the `model` member set), or the
    /// JSON of an embeddings/rerank call.
    pub body: Bytes,
}

/// A request ready to send: the HTTP client adds nothing but its own timeouts.
#[derive(Debug)]
pub struct Prepared {
    /// Full URL.
    pub url: reqwest::Url,
    /// Every header, credentials marked sensitive.
    pub headers: HeaderMap,
    /// Body bytes exactly as signed.
    pub body: Bytes,
}

/// Turns a vendor's streamed body into SSE items of the adapter's dialect.
pub trait StreamDecoder: Send {
    /// Feeds one chunk of the body; returns the items completed by it, in order.
    fn push(&mut self, chunk: &[u8]) -> Vec<SseItem>;
    /// The body ended: a partial frame left over, if any (as [`SseItem::Incomplete`]), and
    /// whatever the vendor's framing still owes (for example a usage chunk held back).
    fn finish(&mut self) -> Vec<SseItem>;
}

impl StreamDecoder for SseParser {
    fn push(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        SseParser::push(self, chunk)
    }

    fn finish(&mut self) -> Vec<SseItem> {
        SseParser::finish(self).into_iter().collect()
    }
}

/// One vendor API. See the module docs for the contract of each step.
pub trait Adapter: Send + Sync + fmt::Debug {
    /// The `spec.api` this adapter speaks.
    fn api(&self) -> ProviderApi;

    /// The dialect chat bodies for upstream model `model` must be in.
    fn kind(&self, model: &str) -> ProviderKind;

    /// Whether `op` exists on this API (chat operations are served in the dialect of
    /// [`Self::kind`] only: `ChatCompletions` for OpenAI, `Messages` for Anthropic).
    fn serves(&self, op: Operation, model: &str) -> bool;

    /// Builds the request. Errors: [`TransportError::Config`] for settings that cannot work
    /// (bad URL, unusable key), [`TransportError::Credentials`] when credentials could not be
    /// obtained (token endpoint down, STS refused); neither sends anything to the model.
    fn prepare<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Prepared, TransportError>>;

    /// A whole (non-streamed, 2xx) response body in the dialect of [`Self::kind`].
    ///
    /// Errors: a message when the vendor's body does not parse.
    fn decode(&self, _op: Operation, _model: &str, body: Bytes) -> Result<Bytes, String> {
        Ok(body)
    }

    /// The decoder of a streamed 2xx body.
    fn stream_decoder(&self, _op: Operation, _model: &str) -> Box<dyn StreamDecoder> {
        Box::new(SseParser::new())
    }

    /// Whether a 2xx streamed answer has the framing this adapter decodes (Bedrock checks for
    /// the event-stream content type before reading a frame).
    ///
    /// Errors: what came back instead.
    fn accepts_stream(&self, _headers: &HeaderMap) -> Result<(), String> {
        Ok(())
    }

    /// Classifies a non-2xx answer.
    fn classify(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Classification {
        classify_response(status, headers, body, now)
    }

    /// The provider answered 401: forget cached tokens. Returns whether one re-send with
    /// fresh credentials can help (true only for adapters that fetch tokens).
    fn unauthorized(&self) -> bool {
        false
    }

    /// A request to an API path outside [`Operation`] (health probes of speech and
    /// transcription on OpenAI-compatible servers), credentials included; the caller sets the
    /// content type.
    ///
    /// Errors: [`TransportError::Config`] for adapters without such paths.
    fn prepare_path(&self, path: &str, _body: Bytes) -> Result<Prepared, TransportError> {
        Err(TransportError::Config(format!(
            "{path} is not offered by {:?} providers",
            self.api()
        )))
    }

    /// Obtains credentials now (fetching a token, assuming a role), so a configuration that
    /// cannot work is reported before traffic arrives. `Ok` for static keys.
    fn check_credentials(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// Connection settings shared by every adapter of a provider.
#[derive(Debug, Clone)]
pub struct Timeouts {
    /// TCP connect + TLS handshake.
    pub connect: Duration,
    /// The whole exchange, body included.
    pub total: Duration,
}

/// The checks of a provider's settings that need no Secret values and no network, shared by
/// the router (through [`build`]) and the operator's validation, so both give the same
/// verdict.
///
/// Errors: what is wrong, naming the field.
pub fn check_spec(spec: &LLMProviderSpec) -> Result<(), String> {
    if let Some(e) = &spec.endpoint {
        reqwest::Url::parse(e).map_err(|err| format!("spec.endpoint {e:?} is not a URL: {err}"))?;
    }
    match spec.api {
        ProviderApi::Openai | ProviderApi::Anthropic => {
            if spec.endpoint.is_none() {
                return Err(format!("spec.endpoint is required for api {:?}", spec.api));
            }
        }
        ProviderApi::Vertex => {
            let region = spec.region.as_deref().ok_or(
                "spec.region is required for api vertex (the location: global, us, eu or a region such as us-east5)",
            )?;
            if !crate::vertex::is_location_name(region) {
                return Err(format!(
                    "spec.region {region:?} is not a Vertex location (global, us, eu, or a region such as us-east5)"
                ));
            }
            if spec.vertex.is_none() {
                return Err("spec.vertex.projectId is required for api vertex".to_owned());
            }
        }
        ProviderApi::Bedrock => {
            let region = spec
                .region
                .as_deref()
                .ok_or("spec.region is required for api bedrock (the AWS region)")?;
            if !crate::bedrock::is_region_name(region) {
                return Err(format!(
                    "spec.region {region:?} is not an AWS region name (such as us-east-1)"
                ));
            }
        }
    }
    Ok(())
}

/// Builds the adapter of one LLMProvider, resolving its credentials through `secrets`.
///
/// Errors: a message naming what is wrong (an API this build has no adapter for, a Secret
/// that does not resolve, a service-account key that does not parse, a region missing); the
/// provider is then not usable and its `Ready` condition carries the message.
pub fn build(
    spec: &LLMProviderSpec,
    namespace: &str,
    secrets: &SecretSource,
    http: &reqwest::Client,
) -> Result<Arc<dyn Adapter>, String> {
    check_spec(spec)?;
    let secret = |r: &switchyard_api::common::SecretKeyRef| secrets.resolve_in(namespace, r);
    match spec.api {
        ProviderApi::Openai | ProviderApi::Anthropic => {
            let key = match &spec.credentials {
                Some(c) => secret(&c.secret_ref)?,
                None => String::new(),
            };
            let endpoint = spec
                .endpoint
                .clone()
                .ok_or_else(|| "endpoint is required for this api".to_owned())?;
            if spec.api == ProviderApi::Openai {
                Ok(Arc::new(crate::openai::OpenAi::new(&endpoint, key)?))
            } else {
                Ok(Arc::new(crate::anthropic::Anthropic::new(&endpoint, key)?))
            }
        }
        ProviderApi::Vertex => Ok(Arc::new(crate::vertex::Vertex::from_spec(
            spec,
            |r| secret(r),
            http.clone(),
        )?)),
        ProviderApi::Bedrock => Ok(Arc::new(crate::bedrock::Bedrock::from_spec(
            spec,
            |r| secret(r),
            http.clone(),
        )?)),
    }
}
