//! HTTP client for provider APIs: one pooled client per provider, request building per
//! provider kind, and a streaming response whose drop closes the upstream call.
//!
//! - **Pooling**: one [`reqwest::Client`] (hyper connection pool, HTTP/1.1 and HTTP/2 over
//!   rustls) per provider, because the connect timeout is a per-client setting in reqwest and
//!   providers differ in it; connections are per host anyway, so nothing is lost by
//!   splitting.
//! - **Timeouts**: `connect_timeout` bounds the TCP + TLS handshake; `total_timeout` bounds
//!   the whole exchange including reading the body (a stream longer than that is cut with
//!   [`TransportError::Timeout`]). Time to first token is the dispatcher's deadline, not this
//!   module's, because it depends on the route.
//! - **No hidden retries** (DESIGN §4.4): redirects are not followed (a POST re-sent
//!   elsewhere is a retry the dispatcher did not decide) and nothing here re-sends. The one
//!   re-send hyper does on its own is for a pooled connection found closed *before* the
//!   request was written, which cannot duplicate work upstream.
//! - **Cancellation**: [`UpstreamBody`] owns the response body; dropping it (e.g. because
//!   the client hung up and the handler future was dropped) drops the connection mid-body,
//!   which closes the TCP connection (HTTP/1.1) or resets the stream (HTTP/2), so the
//!   provider stops generating (field cases 13, 17).
//! - **Credentials** are sent in headers marked sensitive (never logged by hyper/tower
//!   tracing) and never appear in `Debug` output.
//!
//! Endpoints: `openai` kind → `{base}/v1/chat/completions`, `/v1/embeddings`, `/v1/rerank`,
//! `Authorization: Bearer <key>`; `anthropic` kind → `{base}/v1/messages`, `x-api-key` and
//! `anthropic-version`. A base URL that already ends in `/v1` is not doubled.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::StatusCode;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::wire::anthropic::API_VERSION;

/// Wire protocol of a provider (LLMProvider `spec.api`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI and OpenAI-compatible servers.
    OpenAi,
    /// Anthropic Messages API.
    Anthropic,
}

/// What is being called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `POST /v1/chat/completions` (openai kind).
    ChatCompletions,
    /// `POST /v1/embeddings` (openai kind).
    Embeddings,
    /// `POST /v1/rerank` (openai kind; Cohere/Jina-compatible servers).
    Rerank,
    /// `POST /v1/messages` (anthropic kind).
    Messages,
}

impl Operation {
    /// Every operation, in a fixed order.
    pub const ALL: [Operation; 4] = [
        Operation::ChatCompletions,
        Operation::Embeddings,
        Operation::Rerank,
        Operation::Messages,
    ];

    fn path(self) -> &'static str {
        match self {
            Operation::ChatCompletions => "/chat/completions",
            Operation::Embeddings => "/embeddings",
            Operation::Rerank => "/rerank",
            Operation::Messages => "/messages",
        }
    }

    fn served_by(self, kind: ProviderKind) -> bool {
        match kind {
            ProviderKind::OpenAi => !matches!(self, Operation::Messages),
            ProviderKind::Anthropic => matches!(self, Operation::Messages),
        }
    }
}

/// Connection settings of one provider.
#[derive(Clone)]
pub struct ProviderEndpoint {
    /// Wire protocol.
    pub kind: ProviderKind,
    /// Base URL, e.g. `https://api.anthropic.com` (a trailing `/v1` is accepted).
    pub base_url: String,
    /// API key (sent as Bearer token or `x-api-key`).
    pub api_key: String,
    /// `anthropic-version` header value (anthropic kind); defaults to [`API_VERSION`].
    pub anthropic_version: String,
    /// Bound on TCP connect + TLS handshake.
    pub connect_timeout: Duration,
    /// Bound on the whole exchange, body included.
    pub total_timeout: Duration,
    /// Extra headers sent on every request (e.g. `anthropic-beta`, an org id).
    pub extra_headers: HeaderMap,
}

impl ProviderEndpoint {
    /// Endpoint with the default `anthropic-version`, 10 s connect and 600 s total timeouts.
    pub fn new(
        kind: ProviderKind,
        base_url: impl Into<String>,
        api_key: impl Into<String>,
    ) -> Self {
        ProviderEndpoint {
            kind,
            base_url: base_url.into(),
            api_key: api_key.into(),
            anthropic_version: API_VERSION.to_owned(),
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(600),
            extra_headers: HeaderMap::new(),
        }
    }
}

impl fmt::Debug for ProviderEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderEndpoint")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("anthropic_version", &self.anthropic_version)
            .field("connect_timeout", &self.connect_timeout)
            .field("total_timeout", &self.total_timeout)
            .finish_non_exhaustive()
    }
}

/// A failure to get (or finish reading) a response. HTTP error statuses are *not* transport
/// errors: they come back as an [`UpstreamResponse`] for the dispatcher to classify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// TCP connect or TLS handshake failed (refused, DNS, certificate).
    #[error("failed to connect to provider: {0}")]
    Connect(String),
    /// Connect or total timeout elapsed.
    #[error("provider request timed out")]
    Timeout,
    /// Any other I/O or protocol failure (connection reset mid-body, HTTP/2 error).
    #[error("failed to exchange with provider: {0}")]
    Other(String),
    /// The request could not be built (bad base URL or header value, operation not served by
    /// this provider kind): a configuration error, not a provider fault.
    #[error("invalid upstream request: {0}")]
    Config(String),
}

impl TransportError {
    /// Low-cardinality metric label.
    pub fn label(&self) -> &'static str {
        match self {
            TransportError::Connect(_) => "connect",
            TransportError::Timeout => "timeout",
            TransportError::Other(_) => "transport",
            TransportError::Config(_) => "config",
        }
    }

    fn from_reqwest(e: reqwest::Error) -> Self {
        // A connect timeout is both; it counts as a timeout (same error class, DESIGN §4.4).
        if e.is_timeout() {
            TransportError::Timeout
        } else if e.is_connect() {
            TransportError::Connect(error_chain(&e))
        } else if e.is_builder() {
            TransportError::Config(error_chain(&e))
        } else {
            TransportError::Other(error_chain(&e))
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Response status, headers and the body as a byte stream.
#[derive(Debug)]
pub struct UpstreamResponse {
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers (rate-limit headers, `retry-after`, `request-id`, ...).
    pub headers: HeaderMap,
    /// Body; dropping it cancels the upstream call.
    pub body: UpstreamBody,
}

impl UpstreamResponse {
    /// Reads the whole body, failing with [`TransportError::Other`] past `limit` bytes.
    pub async fn collect(self, limit: usize) -> Result<Bytes, TransportError> {
        let mut body = self.body;
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            if buf.len() + chunk.len() > limit {
                return Err(TransportError::Other(format!(
                    "response body exceeds {limit} bytes"
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    }
}

/// Response body stream. Dropping it before the end closes the upstream connection.
pub struct UpstreamBody {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, TransportError>> + Send>>,
}

impl UpstreamBody {
    /// A body from any byte stream (used by tests and mock transports).
    pub fn from_stream(
        s: impl Stream<Item = Result<Bytes, TransportError>> + Send + 'static,
    ) -> Self {
        UpstreamBody { inner: Box::pin(s) }
    }
}

impl fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UpstreamBody")
    }
}

impl Stream for UpstreamBody {
    type Item = Result<Bytes, TransportError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// Pooled HTTP client of one provider. Cheap to clone (shares the pool).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    endpoint: Arc<ProviderEndpoint>,
    http: reqwest::Client,
    /// Parsed URL of each operation this provider serves (by [`Operation::ALL`] position),
    /// built once: formatting and re-parsing it per request showed in profiles.
    urls: Arc<[Option<reqwest::Url>; 4]>,
}

/// Idle pooled connections are closed after this long: below the typical 120 s idle cut of
/// cloud load balancers, so the pool rarely hands out a connection the far end already closed.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

impl UpstreamClient {
    /// Builds the client (and its connection pool) for `endpoint`.
    ///
    /// Errors: [`TransportError::Config`] if the TLS backend cannot be initialised.
    pub fn new(endpoint: ProviderEndpoint) -> Result<Self, TransportError> {
        let http = reqwest::Client::builder()
            .connect_timeout(endpoint.connect_timeout)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| TransportError::Config(error_chain(&e)))?;
        let mut client = UpstreamClient {
            endpoint: Arc::new(endpoint),
            http,
            urls: Arc::new([None, None, None, None]),
        };
        let urls = Operation::ALL.map(|op| {
            client
                .url(op)
                .ok()
                .and_then(|u| reqwest::Url::parse(&u).ok())
        });
        client.urls = Arc::new(urls);
        Ok(client)
    }

    /// The provider's settings.
    pub fn endpoint(&self) -> &ProviderEndpoint {
        &self.endpoint
    }

    /// Full URL of `op` on this provider.
    ///
    /// Errors: [`TransportError::Config`] when the provider kind does not serve `op`.
    pub fn url(&self, op: Operation) -> Result<String, TransportError> {
        if !op.served_by(self.endpoint.kind) {
            return Err(TransportError::Config(format!(
                "{op:?} is not served by a {:?} provider",
                self.endpoint.kind
            )));
        }
        let base = self.endpoint.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        Ok(format!("{base}/v1{}", op.path()))
    }

    /// Headers of every request to this provider: content type, `accept` (SSE when
    /// `stream`), credentials (marked sensitive), version, extra headers.
    ///
    /// Errors: [`TransportError::Config`] when the key or version is not a valid header value.
    pub fn headers(&self, stream: bool) -> Result<HeaderMap, TransportError> {
        let ep = &self.endpoint;
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            ACCEPT,
            HeaderValue::from_static(if stream {
                "text/event-stream"
            } else {
                "application/json"
            }),
        );
        let bad =
            |what: &str| TransportError::Config(format!("{what} is not a valid header value"));
        match ep.kind {
            ProviderKind::OpenAi => {
                let mut v = HeaderValue::try_from(format!("Bearer {}", ep.api_key))
                    .map_err(|_| bad("api key"))?;
                v.set_sensitive(true);
                h.insert(AUTHORIZATION, v);
            }
            ProviderKind::Anthropic => {
                let mut v =
                    HeaderValue::try_from(ep.api_key.as_str()).map_err(|_| bad("api key"))?;
                v.set_sensitive(true);
                h.insert(HeaderName::from_static("x-api-key"), v);
                h.insert(
                    HeaderName::from_static("anthropic-version"),
                    HeaderValue::try_from(ep.anthropic_version.as_str())
                        .map_err(|_| bad("anthropic-version"))?,
                );
            }
        }
        for (name, value) in &ep.extra_headers {
            h.insert(name.clone(), value.clone());
        }
        Ok(h)
    }

    /// Sends `body` (already in the provider's dialect, upstream model name set; for OpenAI
    /// streaming, `stream_options.include_usage` forced, see
    /// [`crate::wire::openai::ChatRequest::force_include_usage`]) and returns as soon as the
    /// response headers arrive. Any HTTP status is `Ok`; only transport failures are `Err`.
    /// Exactly one request is sent.
    pub async fn send(
        &self,
        op: Operation,
        body: Bytes,
        stream: bool,
    ) -> Result<UpstreamResponse, TransportError> {
        let position = Operation::ALL.iter().position(|o| *o == op);
        let url = match position.and_then(|i| self.urls[i].clone()) {
            Some(url) => url,
            None => reqwest::Url::parse(&self.url(op)?)
                .map_err(|e| TransportError::Config(format!("invalid provider URL: {e}")))?,
        };
        let request = self
            .http
            .post(url)
            .headers(self.headers(stream)?)
            .timeout(self.endpoint.total_timeout)
            .body(body);
        let response = request.send().await.map_err(TransportError::from_reqwest)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = UpstreamBody::from_stream(
            response
                .bytes_stream()
                .map(|r| r.map_err(TransportError::from_reqwest)),
        );
        Ok(UpstreamResponse {
            status,
            headers,
            body,
        })
    }
}

impl UpstreamClient {
    /// Full URL of an arbitrary API path of this provider (`/audio/speech` →
    /// `{base}/v1/audio/speech`), for requests outside [`Operation`] such as health probes.
    pub fn url_for_path(&self, path: &str) -> String {
        let base = self.endpoint.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1{path}")
    }

    /// Sends one non-streamed request to `path` (see [`Self::url_for_path`]) with this
    /// provider's credentials and extra headers and the given `content_type` (JSON or a
    /// multipart upload), bounded by `timeout` instead of the provider's total timeout. Used
    /// by health probes (`crate::probe`), which call endpoints the dispatcher does not route.
    /// Any HTTP status is `Ok`; only transport failures are `Err`. Exactly one request is sent.
    ///
    /// Errors: as [`Self::send`].
    pub async fn send_to_path(
        &self,
        path: &str,
        content_type: HeaderValue,
        body: Bytes,
        timeout: Duration,
    ) -> Result<UpstreamResponse, TransportError> {
        let url = reqwest::Url::parse(&self.url_for_path(path))
            .map_err(|e| TransportError::Config(format!("invalid provider URL: {e}")))?;
        let mut headers = self.headers(false)?;
        headers.insert(CONTENT_TYPE, content_type);
        let response = self
            .http
            .post(url)
            .headers(headers)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(TransportError::from_reqwest)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = UpstreamBody::from_stream(
            response
                .bytes_stream()
                .map(|r| r.map_err(TransportError::from_reqwest)),
        );
        Ok(UpstreamResponse {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(kind: ProviderKind, base: &str) -> UpstreamClient {
        UpstreamClient::new(ProviderEndpoint::new(kind, base, "sk-test")).unwrap()
    }

    #[test]
    fn url_base_with_or_without_v1_is_not_doubled() {
        let c = client(ProviderKind::OpenAi, "https://api.example.invalid/v1/");
        assert_eq!(
            c.url(Operation::ChatCompletions).unwrap(),
            "https://api.example.invalid/v1/chat/completions"
        );
        let c = client(ProviderKind::Anthropic, "https://api.example.invalid");
        assert_eq!(
            c.url(Operation::Messages).unwrap(),
            "https://api.example.invalid/v1/messages"
        );
    }

    #[test]
    fn url_operation_of_other_kind_is_config_error() {
        let c = client(ProviderKind::Anthropic, "https://a.invalid");
        assert!(matches!(
            c.url(Operation::Embeddings),
            Err(TransportError::Config(_))
        ));
    }

    #[test]
    fn headers_mark_credentials_sensitive() {
        let h = client(ProviderKind::OpenAi, "https://a.invalid")
            .headers(true)
            .unwrap();
        assert_eq!(h[AUTHORIZATION], "Bearer sk-test");
        assert!(h[AUTHORIZATION].is_sensitive());
        assert_eq!(h[ACCEPT], "text/event-stream");
        let h = client(ProviderKind::Anthropic, "https://a.invalid")
            .headers(false)
            .unwrap();
        assert!(h["x-api-key"].is_sensitive());
        assert_eq!(h["anthropic-version"], API_VERSION);
        assert!(h.get(AUTHORIZATION).is_none());
    }

    #[test]
    fn debug_redacts_api_key() {
        let ep = ProviderEndpoint::new(ProviderKind::OpenAi, "https://a.invalid", "sk-secret");
        assert!(!format!("{ep:?}").contains("sk-secret"));
    }
}
