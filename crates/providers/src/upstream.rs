//! HTTP client for provider APIs: one pooled client per provider around its
//! [`Adapter`](crate::adapter::Adapter) (which builds every request), and a streaming
//! response whose drop closes the upstream call.
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
//!   request was written, which cannot duplicate work upstream; and a 401 from an adapter
//!   with fetched tokens (Vertex) is re-sent once with a fresh token, on the same provider.
//! - **Cancellation**: [`UpstreamBody`] owns the response body; dropping it (e.g. because
//!   the client hung up and the handler future was dropped) drops the connection mid-body,
//!   which closes the TCP connection (HTTP/1.1) or resets the stream (HTTP/2), so the
//!   provider stops generating (field cases 13, 17).
//! - **Credentials** are sent in headers marked sensitive (never logged by hyper/tower
//!   tracing) and never appear in `Debug` output.
//!
//! Endpoints, hosts and auth are the adapters' (`docs/providers.md` lists them per API).

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use switchyard_api::duration;
use switchyard_api::provider::LLMProviderSpec;

use crate::adapter::{Adapter, Call, Prepared, Timeouts};
use crate::secrets::SecretSource;

/// The dialect a chat body is in on its way to an adapter: the two client dialects, which
/// every adapter maps its vendor's shapes onto ([`Adapter::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// OpenAI chat completions.
    OpenAi,
    /// Anthropic messages.
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
    /// `POST /v1/audio/transcriptions` (openai kind; Gemini on Vertex with inline audio).
    /// The body handed to the adapter is the internal [`crate::wire::transcription`] request.
    Transcription,
}

impl Operation {
    /// Every operation, in a fixed order.
    pub const ALL: [Operation; 5] = [
        Operation::ChatCompletions,
        Operation::Embeddings,
        Operation::Rerank,
        Operation::Messages,
        Operation::Transcription,
    ];

    /// The OpenAI-style path of the operation under `/v1`.
    pub fn path(self) -> &'static str {
        match self {
            Operation::ChatCompletions => "/chat/completions",
            Operation::Embeddings => "/embeddings",
            Operation::Rerank => "/rerank",
            Operation::Messages => "/messages",
            Operation::Transcription => "/audio/transcriptions",
        }
    }

    /// Whether an OpenAI- or Anthropic-style server offers the operation.
    pub fn served_by(self, kind: ProviderKind) -> bool {
        match kind {
            ProviderKind::OpenAi => !matches!(self, Operation::Messages),
            ProviderKind::Anthropic => matches!(self, Operation::Messages),
        }
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
    /// Credentials could not be obtained (token endpoint, metadata server or STS failed or
    /// refused): nothing was sent to the model; the provider's auth is broken.
    #[error("failed to obtain provider credentials: {0}")]
    Credentials(String),
}

impl TransportError {
    /// Low-cardinality metric label.
    pub fn label(&self) -> &'static str {
        match self {
            TransportError::Connect(_) => "connect",
            TransportError::Timeout => "timeout",
            TransportError::Other(_) => "transport",
            TransportError::Config(_) => "config",
            TransportError::Credentials(_) => "credentials",
        }
    }

    /// Maps a reqwest failure onto the variants above.
    pub fn from_reqwest(e: reqwest::Error) -> Self {
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

/// `e` and its sources, joined with `: `.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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

/// Pooled HTTP client of one provider with its [`Adapter`]. Cheap to clone (shares the pool,
/// the adapter and its cached tokens).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    adapter: Arc<dyn Adapter>,
    http: reqwest::Client,
    /// One pool per connection shard, built on the shard's first request (see [`enter_shard`]).
    shard_pools: Arc<ShardPools>,
    timeouts: Timeouts,
    /// The last credential problem seen (no token, refused keys, a 401/403 answer), cleared by
    /// the next success; shown as `Ready=False` in status.
    credential_problem: Arc<std::sync::Mutex<Option<String>>>,
}

/// Idle pooled connections are closed after this long: below the typical 120 s idle cut of
/// cloud load balancers, so the pool rarely hands out a connection the far end already closed.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The pooled HTTP client every adapter of one provider shares (model calls and token
/// fetches alike).
///
/// Errors: [`TransportError::Config`] if the TLS backend cannot be initialised.
pub fn http_client(connect_timeout: Duration) -> Result<reqwest::Client, TransportError> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| TransportError::Config(error_chain(&e)))
}

thread_local! {
    static SHARD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Shard pools per provider: more shards than this share pools (index modulo).
const MAX_SHARD_POOLS: usize = 64;

/// Marks the calling thread as connection shard `index` (the router's single-threaded
/// connection runtimes, `switchyard_router::shards`): from then on every [`UpstreamClient`]
/// sends this thread's requests through a connection pool of its own for the shard. A pooled
/// connection is a task on the runtime that opened it, so a pool shared across shards would
/// hand a shard connections whose task runs on another thread, and every request and response
/// on them would cross threads.
pub fn enter_shard(index: usize) {
    SHARD.with(|s| s.set(Some(index)));
}

/// The per-shard pools of one provider, with what they are built from.
#[derive(Debug)]
struct ShardPools {
    connect_timeout: Duration,
    pools: [std::sync::OnceLock<reqwest::Client>; MAX_SHARD_POOLS],
}

impl UpstreamClient {
    /// A client around `adapter`, sending through `http` (see [`http_client`]); on a
    /// connection shard ([`enter_shard`]) through a pool of the shard's own, built like
    /// [`http_client`] with the connect timeout of `timeouts`.
    pub fn new(adapter: Arc<dyn Adapter>, http: reqwest::Client, timeouts: Timeouts) -> Self {
        UpstreamClient {
            adapter,
            http,
            shard_pools: Arc::new(ShardPools {
                connect_timeout: timeouts.connect,
                pools: std::array::from_fn(|_| std::sync::OnceLock::new()),
            }),
            timeouts,
            credential_problem: Arc::default(),
        }
    }

    /// An OpenAI or Anthropic client for `base` with API key `key` (tests, benches, tools).
    ///
    /// Errors: a base URL or key the adapter refuses, or no TLS backend.
    pub fn direct(
        kind: ProviderKind,
        base: &str,
        key: &str,
        timeouts: Timeouts,
    ) -> Result<Self, String> {
        let adapter: Arc<dyn Adapter> = match kind {
            ProviderKind::OpenAi => Arc::new(crate::openai::OpenAi::new(base, key.to_owned())?),
            ProviderKind::Anthropic => {
                Arc::new(crate::anthropic::Anthropic::new(base, key.to_owned())?)
            }
        };
        let http = http_client(timeouts.connect).map_err(|e| e.to_string())?;
        Ok(UpstreamClient::new(adapter, http, timeouts))
    }

    /// The client of one LLMProvider: its adapter ([`crate::adapter::build`]) with the
    /// timeouts of `spec.timeouts` (connect default 5 s, total default 600 s).
    ///
    /// Errors: why the provider cannot be used, for its `Ready` condition.
    pub fn for_provider(
        spec: &LLMProviderSpec,
        namespace: &str,
        secrets: &SecretSource,
    ) -> Result<Self, String> {
        let t = spec.timeouts.clone().unwrap_or_default();
        let timeouts = Timeouts {
            connect: duration::or(t.connect.as_deref(), Duration::from_secs(5)),
            total: duration::or(t.total.as_deref(), Duration::from_secs(600)),
        };
        let http = http_client(timeouts.connect).map_err(|e| e.to_string())?;
        let adapter = crate::adapter::build(spec, namespace, secrets, &http)?;
        Ok(UpstreamClient::new(adapter, http, timeouts))
    }

    /// The adapter.
    pub fn adapter(&self) -> &Arc<dyn Adapter> {
        &self.adapter
    }

    /// The dialect chat bodies for `model` must be in.
    pub fn kind(&self, model: &str) -> ProviderKind {
        self.adapter.kind(model)
    }

    /// Whether `op` is served for `model`.
    pub fn serves(&self, op: Operation, model: &str) -> bool {
        self.adapter.serves(op, model)
    }

    /// Connect and total timeouts.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// Sends `body` (in the dialect of [`Self::kind`], upstream model name set; for OpenAI
    /// streaming, `stream_options.include_usage` forced, see
    /// [`crate::wire::openai::ChatRequest::force_include_usage`]) through the adapter and
    /// returns as soon as the response headers arrive. Any HTTP status is `Ok`; only transport
    /// failures are `Err`. One request is sent, except that a 401 from an adapter with fetched
    /// tokens drops the token and re-sends once with a fresh one (a token revoked or expired
    /// early is not the provider failing).
    pub async fn send(
        &self,
        op: Operation,
        model: &str,
        body: Bytes,
        stream: bool,
    ) -> Result<UpstreamResponse, TransportError> {
        self.send_with_headers(op, model, body, stream, &HeaderMap::new())
            .await
    }

    /// [`Self::send`] with `extra` headers added after the adapter prepared (and, for
    /// Bedrock, signed) the request: W3C `traceparent` / `tracestate`, which SigV4 does not
    /// need signed. An extra header never replaces one the adapter set.
    pub async fn send_with_headers(
        &self,
        op: Operation,
        model: &str,
        body: Bytes,
        stream: bool,
        extra: &HeaderMap,
    ) -> Result<UpstreamResponse, TransportError> {
        let with_extra = |mut p: Prepared| {
            for (name, value) in extra {
                if !p.headers.contains_key(name) {
                    p.headers.insert(name.clone(), value.clone());
                }
            }
            p
        };
        let call = Call {
            op,
            model,
            stream,
            body,
        };
        let prepared = self.noting(self.adapter.prepare(call.clone()).await)?;
        let mut response = self.send_prepared(with_extra(prepared)).await?;
        if response.status == StatusCode::UNAUTHORIZED && self.adapter.unauthorized() {
            drop(response);
            let prepared = self.noting(self.adapter.prepare(call).await)?;
            response = self.send_prepared(with_extra(prepared)).await?;
        }
        match response.status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => self.note(Some(format!(
                "the provider refused our credentials (HTTP {})",
                response.status.as_u16()
            ))),
            s if s.is_success() => self.note(None),
            _ => {}
        }
        Ok(response)
    }

    /// The last credential problem (see the field's docs), if any.
    pub fn credential_problem(&self) -> Option<String> {
        self.credential_problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Obtains credentials now ([`Adapter::check_credentials`]) and records the outcome, so
    /// a key the token endpoint refuses or an STS that refuses the role shows in status before
    /// traffic arrives.
    pub async fn check_credentials(&self) {
        let result = self.adapter.check_credentials().await;
        self.note(result.err());
    }

    fn note(&self, problem: Option<String>) {
        *self
            .credential_problem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = problem;
    }

    fn noting(
        &self,
        prepared: Result<Prepared, TransportError>,
    ) -> Result<Prepared, TransportError> {
        if let Err(TransportError::Credentials(m)) = &prepared {
            self.note(Some(m.clone()));
        }
        prepared
    }

    async fn send_prepared(&self, p: Prepared) -> Result<UpstreamResponse, TransportError> {
        self.send_with_timeout(p, self.timeouts.total).await
    }

    /// Sends a prepared request bounded by `timeout` (body included).
    ///
    /// Errors: transport failures only.
    pub async fn send_with_timeout(
        &self,
        p: Prepared,
        timeout: Duration,
    ) -> Result<UpstreamResponse, TransportError> {
        let response = self
            .pool()
            .post(p.url)
            .headers(p.headers)
            .timeout(timeout)
            .body(p.body)
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

    /// The pool this thread sends through: its shard's ([`enter_shard`]) or the shared one.
    fn pool(&self) -> &reqwest::Client {
        match SHARD.with(std::cell::Cell::get) {
            None => &self.http,
            Some(i) => self.shard_pools.pools[i % MAX_SHARD_POOLS].get_or_init(|| {
                // The shared pool was built with the same settings, so this cannot fail
                // where that did not; if it does, the shared pool still works.
                http_client(self.shard_pools.connect_timeout).unwrap_or_else(|_| self.http.clone())
            }),
        }
    }

    /// Sends one non-streamed request to an API path outside [`Operation`] (`/audio/speech`
    /// on an OpenAI-compatible server), with the provider's credentials and the given
    /// `content_type`, bounded by `timeout`. Used by health probes, which call endpoints the
    /// dispatcher does not route.
    ///
    /// Errors: [`TransportError::Config`] when the adapter has no such paths; else as
    /// [`Self::send`].
    pub async fn send_to_path(
        &self,
        path: &str,
        content_type: HeaderValue,
        body: Bytes,
        timeout: Duration,
    ) -> Result<UpstreamResponse, TransportError> {
        let mut prepared = self.adapter.prepare_path(path, body)?;
        prepared.headers.insert(CONTENT_TYPE, content_type);
        self.send_with_timeout(prepared, timeout).await
    }
}
