//! The HTTP server: routes, per-connection serving (so a fault can reset its own connection),
//! the request prologue shared by every endpoint, and the [`MockHandle`] test API.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::auth::GoogleKeys;
use crate::cache::{CacheMode, PromptCache};
use crate::clock::unix_secs;
use crate::config::{MockConfig, MockModality};
use crate::errors::{Dialect, ErrorSpec, RateSnapshot, RateWindows, set_request_id};
use crate::fault::{Decision, Fault, FaultSet, FaultState, RequestFacts};
use crate::record::{CallGuard, CallRecord, Recorder, UsageRecord, lock};
use crate::tokens::{self, count_tokens, fnv1a};
use crate::vertex::VendorRoute;
use crate::wire::{Answer, ChatApi, Finish, Sse, token_text};

/// Output tokens a tool call reports (name plus `{}` arguments, by convention).
const TOOL_CALL_TOKENS: u64 = 8;

/// Pause between the torn last line of a cut stream and the reset, so the bytes leave the
/// socket before the RST discards the send buffer.
const CUT_FLUSH: Duration = Duration::from_millis(50);

/// Errors starting a mock.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    /// The listen address could not be bound.
    #[error("failed to bind {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// OS error.
        source: io::Error,
    },
    /// The config cannot be served (e.g. an unreadable service-account public key).
    #[error("invalid mock config: {0}")]
    Config(String),
}

/// Mutable state of one mock, behind one short-held lock.
#[derive(Debug)]
struct State_ {
    faults: FaultState,
    cache: PromptCache,
    rate: RateWindows,
}

#[derive(Debug)]
struct Shared {
    config: MockConfig,
    /// Public keys of `google_auth.service_accounts`, loaded at start.
    google_keys: Option<GoogleKeys>,
    recorder: Recorder,
    state: Mutex<State_>,
    ids: AtomicU64,
}

impl Shared {
    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn set_faults(&self, set: FaultSet) {
        let now = self.recorder.now();
        lock(&self.state).faults = FaultState::new(set, now);
    }

    fn reset(&self) {
        self.recorder.reset();
        let mut st = lock(&self.state);
        st.faults = FaultState::new(self.config.faults.clone(), Duration::ZERO);
        st.cache.clear();
        st.rate.clear();
    }

    fn stats(&self) -> Stats {
        let calls = self.recorder.calls();
        let mut by_status = BTreeMap::new();
        for c in &calls {
            *by_status.entry(c.status).or_insert(0_usize) += 1;
        }
        Stats {
            name: self.config.name.clone(),
            calls: self.recorder.count(),
            by_status,
            cancelled: calls.iter().filter(|c| c.cancelled_at.is_some()).count(),
            in_flight: calls.iter().filter(|c| c.finished_at.is_none()).count(),
            faults: lock(&self.state).faults.set().clone(),
        }
    }
}

/// Aggregate view served at `GET /admin/stats`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Mock name.
    pub name: String,
    /// Requests since start or reset (including records dropped by `record_limit`).
    pub calls: usize,
    /// Count per HTTP status (0 = no headers sent), over the retained records.
    pub by_status: BTreeMap<u16, usize>,
    /// Calls the client abandoned before the mock finished.
    pub cancelled: usize,
    /// Calls still being answered.
    pub in_flight: usize,
    /// The active fault set.
    pub faults: FaultSet,
}

/// Entry point: `MockProvider::start(config)`.
#[derive(Debug)]
pub struct MockProvider;

impl MockProvider {
    /// Binds `config.listen` (or `127.0.0.1:0`) and serves until the handle shuts down or is
    /// dropped. HTTP/1.1 only (what the vendor SDKs speak to a plain-HTTP base URL).
    ///
    /// # Errors
    /// [`MockError::Bind`] when the address cannot be bound; [`MockError::Config`] when a
    /// `google_auth` public key cannot be loaded.
    pub async fn start(config: MockConfig) -> Result<MockHandle, MockError> {
        let google_keys = match &config.google_auth {
            Some(g) => Some(g.load_keys().map_err(MockError::Config)?),
            None => None,
        };
        let addr = config
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| MockError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| MockError::Bind { addr, source })?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State_ {
                faults: FaultState::new(config.faults.clone(), Duration::ZERO),
                cache: PromptCache::default(),
                rate: RateWindows::default(),
            }),
            recorder: Recorder::new(config.record_limit),
            ids: AtomicU64::new(1),
            google_keys,
            config,
        });
        let token = CancellationToken::new();
        let app = router(shared.clone());
        let task = tokio::spawn(accept_loop(listener, app, token.clone()));
        tracing::info!(name = %shared.config.name, %addr, "mock provider listening");
        Ok(MockHandle {
            addr,
            shared,
            token,
            task: Some(task),
        })
    }
}

/// A running mock. Dropping it stops the server (connections are reset).
#[derive(Debug)]
pub struct MockHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    token: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MockHandle {
    /// Bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>` — the Anthropic SDK base URL; OpenAI SDKs want
    /// [`Self::openai_base_url`].
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:<port>/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The mock's name from its config.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// Every retained request record (the last `record_limit`), in arrival order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.shared.recorder.calls()
    }

    /// Number of requests since start or reset.
    pub fn call_count(&self) -> usize {
        self.shared.recorder.count()
    }

    /// Replaces the fault set (fresh counters, RNG reseeded, windows restart now).
    pub fn set_faults(&self, faults: FaultSet) {
        self.shared.set_faults(faults);
    }

    /// Clears calls, cache and rate windows, restores the configured faults, restarts the clock.
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Aggregate counts.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Polls the call log every 10 ms until `pred` holds or `timeout` passes; returns whether
    /// it held. For assertions such as "cancellation recorded within 1 s".
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&[CallRecord]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if pred(&self.calls()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops accepting, resets open connections and waits for the accept loop to end.
    pub async fn shutdown(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// Per-connection reset switch, handed to handlers as a request extension.
#[derive(Debug, Clone)]
struct ConnAbort(CancellationToken);

async fn accept_loop(listener: TcpListener, app: Router, token: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = token.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                conns.spawn(serve_conn(stream, app.clone(), token.child_token()));
            }
            Err(e) => {
                // Typically EMFILE; back off instead of spinning.
                tracing::warn!(error = %e, "mock accept failed");
                sleep(Duration::from_millis(10)).await;
            }
        }
    }
    conns.shutdown().await;
}

async fn serve_conn(stream: TcpStream, app: Router, token: CancellationToken) {
    let _ = stream.set_nodelay(true);
    // A duplicate descriptor lets us set SO_LINGER=0 at abort time, so dropping the connection
    // sends RST (a real reset) instead of an orderly FIN.
    let (stream, dup) = match stream.into_std().and_then(|s| {
        let d = s.try_clone()?;
        Ok((TcpStream::from_std(s)?, d))
    }) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(error = %e, "mock connection setup failed");
            return;
        }
    };
    let abort = ConnAbort(token.clone());
    let svc = tower::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(abort.clone());
        let mut app = app.clone();
        async move { app.call(req.map(Body::new)).await }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(
        hyper_util::rt::TokioIo::new(stream),
        hyper_util::service::TowerToHyperService::new(svc),
    );
    tokio::select! {
        _ = conn => {}
        () = token.cancelled() => {
            let _ = socket2::SockRef::from(&dup).set_linger(Some(Duration::ZERO));
        }
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let chat = |api| move |st, req| handle(st, req, Endpoint::Chat(api));
    Router::new()
        .route("/v1/chat/completions", post(chat(ChatApi::OpenAiChat)))
        .route("/chat/completions", post(chat(ChatApi::OpenAiChat)))
        .route("/v1/messages", post(chat(ChatApi::Anthropic)))
        .route("/v1/responses", post(chat(ChatApi::Responses)))
        .route("/responses", post(chat(ChatApi::Responses)))
        .route(
            "/v1/embeddings",
            post(|st, req| handle(st, req, Endpoint::Embeddings)),
        )
        .route(
            "/embeddings",
            post(|st, req| handle(st, req, Endpoint::Embeddings)),
        )
        .route(
            "/v1/rerank",
            post(|st, req| handle(st, req, Endpoint::Rerank)),
        )
        .route(
            "/v2/rerank",
            post(|st, req| handle(st, req, Endpoint::Rerank)),
        )
        .route("/rerank", post(|st, req| handle(st, req, Endpoint::Rerank)))
        .route(
            "/v1/audio/transcriptions",
            post(|st, req| handle(st, req, Endpoint::Transcription)),
        )
        .route(
            "/audio/transcriptions",
            post(|st, req| handle(st, req, Endpoint::Transcription)),
        )
        .route(
            "/v1/audio/speech",
            post(|st, req| handle(st, req, Endpoint::Speech)),
        )
        .route(
            "/audio/speech",
            post(|st, req| handle(st, req, Endpoint::Speech)),
        )
        .route(
            "/v1/projects/{*rest}",
            post(|st, req| vendor(st, req, Family::Vertex)),
        )
        .route(
            "/v1beta1/projects/{*rest}",
            post(|st, req| vendor(st, req, Family::Vertex)),
        )
        .route(
            "/model/{*rest}",
            post(|st, req| vendor(st, req, Family::Bedrock)),
        )
        .route("/token", post(google_token))
        .route("/computeMetadata/v1/{*rest}", get(gce_metadata))
        .route("/", post(sts))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/admin/faults",
            post(admin_set_faults).get(admin_get_faults),
        )
        .route("/admin/stats", get(admin_stats))
        .route("/admin/calls", get(admin_calls))
        .route("/admin/reset", post(admin_reset))
        .with_state(shared)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat(ChatApi),
    Embeddings,
    Rerank,
    Transcription,
    Speech,
}

impl Endpoint {
    fn modality(self) -> MockModality {
        match self {
            Self::Chat(_) => MockModality::Text,
            Self::Embeddings => MockModality::Embedding,
            Self::Rerank => MockModality::Rerank,
            Self::Transcription => MockModality::Transcription,
            Self::Speech => MockModality::Speech,
        }
    }

    fn dialect(self) -> Dialect {
        match self {
            Self::Chat(ChatApi::Anthropic) => Dialect::Anthropic,
            Self::Chat(ChatApi::VertexClaude | ChatApi::Gemini) => Dialect::Google,
            Self::Chat(ChatApi::Converse | ChatApi::BedrockInvoke) => Dialect::Aws,
            _ => Dialect::OpenAi,
        }
    }
}

/// What every endpoint needs after the common prologue.
struct Ctx {
    shared: Arc<Shared>,
    guard: CallGuard,
    decision: Decision,
    t0: Instant,
    dialect: Dialect,
    request_id: String,
    model: String,
    stream: bool,
    include_usage: bool,
    body: Value,
    abort: Option<ConnAbort>,
}

impl Ctx {
    fn rate_snapshot(&self) -> RateSnapshot {
        let now = self.shared.recorder.now();
        let rl = &self.shared.config.rate_limits;
        lock(&self.shared.state)
            .rate
            .snapshot(now, rl.requests_per_minute, rl.tokens_per_minute)
    }

    fn error(self, mut spec: ErrorSpec) -> Response {
        spec.message = spec.message.replace("{model}", &self.model);
        let rl = self.rate_snapshot();
        self.guard.set_status(spec.status);
        let resp = spec.into_response(self.dialect, &self.request_id, &rl);
        self.guard.finish();
        resp
    }
}

fn api_key(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let other = ["x-api-key", "x-goog-api-key", "api-key"]
        .iter()
        .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()));
    bearer.or(other).map(str::to_owned)
}

async fn handle(st: State<Arc<Shared>>, req: Request, endpoint: Endpoint) -> Response {
    handle_route(st, req, endpoint, None).await
}

/// The vendor families whose paths carry the model and the stream switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Vertex,
    Bedrock,
}

/// Vertex AI and Bedrock paths: parse the path, then the common handler.
async fn vendor(State(shared): State<Arc<Shared>>, req: Request, family: Family) -> Response {
    let path = req.uri().path().to_owned();
    let parsed = match family {
        Family::Vertex => crate::vertex::parse_path(&path, req.uri().query()),
        Family::Bedrock => crate::bedrock::parse_path(&path),
    };
    match parsed {
        Ok(route) => handle_route(State(shared), req, Endpoint::Chat(route.api), Some(route)).await,
        Err(message) => {
            let (dialect, spec) = match family {
                Family::Vertex => (Dialect::Google, ErrorSpec::new(404, message)),
                Family::Bedrock => (
                    Dialect::Aws,
                    ErrorSpec::new(404, message).aws("UnknownOperationException"),
                ),
            };
            let id = format!("req_{:016x}", fnv1a(&shared.next_id().to_le_bytes(), 7));
            spec.into_response(dialect, &id, &RateSnapshot::default())
        }
    }
}

async fn handle_route(
    State(shared): State<Arc<Shared>>,
    req: Request,
    endpoint: Endpoint,
    route: Option<VendorRoute>,
) -> Response {
    let (parts, body) = req.into_parts();
    let abort = parts.extensions.get::<ConnAbort>().cloned();
    let t0 = Instant::now();
    let dialect = endpoint.dialect();
    let request_id = format!("req_{:016x}", fnv1a(&shared.next_id().to_le_bytes(), 7));
    let bytes = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    let parsed: Option<Value> = if endpoint == Endpoint::Transcription {
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        crate::audio::multipart_fields(content_type, &bytes)
    } else {
        serde_json::from_slice(&bytes).ok()
    };
    let body = parsed.clone().unwrap_or(Value::Null);
    let model = match &route {
        Some(r) => r.model.clone(),
        None => body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    };
    let stream = match &route {
        Some(r) => r.stream,
        None => {
            matches!(endpoint, Endpoint::Chat(_))
                && body.get("stream").and_then(Value::as_bool) == Some(true)
        }
    };
    let modality = if endpoint == Endpoint::Chat(ChatApi::Gemini) && crate::vertex::has_audio(&body)
    {
        MockModality::Transcription
    } else {
        endpoint.modality()
    };
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    // A SigV4 request's "key" is its access key id (recorded as key_suffix like an API key).
    let key = api_key(&parts.headers).or_else(|| {
        parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::auth::parse_sigv4)
            .map(|s| s.access_key_id)
    });
    let cfg = &shared.config;
    let project = parts
        .headers
        .get(cfg.project_header.as_str())
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let traceparent = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let guard = shared.recorder.start(CallRecord {
        seq: 0,
        at: Duration::ZERO,
        path: parts.uri.path().to_owned(),
        model: model.clone(),
        stream,
        status: 0,
        include_usage_requested: include_usage,
        project,
        key_suffix: key.as_deref().map(|k| {
            let n = k.chars().count();
            k.chars().skip(n.saturating_sub(4)).collect()
        }),
        traceparent,
        fault: Vec::new(),
        cancelled_at: None,
        tokens_streamed: 0,
        usage: None,
        finished_at: None,
    });
    let facts = RequestFacts {
        path: parts.uri.path(),
        model: &model,
        stream,
        modality,
    };
    let now = shared.recorder.now();
    let decision = lock(&shared.state).faults.decide(facts, now);
    guard.add_fault_labels(&decision.labels);
    tracing::debug!(
        mock = %shared.config.name,
        path = parts.uri.path(),
        model = %model,
        stream,
        faults = ?decision.labels,
        "mock request"
    );
    let ctx = Ctx {
        shared: shared.clone(),
        guard,
        t0,
        dialect,
        request_id,
        model,
        stream,
        include_usage,
        body,
        abort,
        decision,
    };
    let before_headers = Duration::from_millis(ctx.shared.config.latency_ms) + ctx.decision.delay;
    wait_until(t0 + before_headers).await;

    let served = &ctx.shared.config.modalities;
    if !served.is_empty() && !served.contains(&modality) {
        // The shape of OpenAI's answer to a path it does not route.
        let msg = format!(
            "Invalid URL (POST {}): this server does not serve {:?} requests",
            parts.uri.path(),
            modality
        );
        return ctx.error(ErrorSpec::new(404, msg));
    }
    // Vendor auth comes first, as the real services check it before reading the body.
    match (ctx.dialect, &ctx.shared.config) {
        (
            Dialect::Google,
            MockConfig {
                google_auth: Some(g),
                ..
            },
        ) => {
            if let Err(e) = g.verify_bearer(&parts.headers) {
                return ctx.error(ErrorSpec::new(e.status, e.message));
            }
        }
        (
            Dialect::Aws,
            MockConfig {
                aws_auth: Some(a), ..
            },
        ) => {
            let pq = parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
            if let Err(e) = a.verify(parts.method.as_str(), &pq, &parts.headers, &bytes) {
                return ctx.error(ErrorSpec::new(e.status, e.message).aws(e.code));
            }
        }
        _ => {}
    }
    if parsed.is_none() {
        if endpoint == Endpoint::Transcription {
            return ctx.error(ErrorSpec::new(
                400,
                "Expected a multipart/form-data body with a 'file' and a 'model' field.",
            ));
        }
        return ctx.error(ErrorSpec::new(
            400,
            "We could not parse the JSON body of your request.",
        ));
    }
    let cfg = &ctx.shared.config;
    if route.is_none()
        && !cfg.api_keys.is_empty()
        && !key.as_ref().is_some_and(|k| cfg.api_keys.contains(k))
    {
        return ctx.error(ErrorSpec::new(401, "Incorrect API key provided."));
    }
    if route.is_some() {
        let base = crate::bedrock::base_model_id(&ctx.model);
        if !cfg.models.is_empty() && !cfg.models.iter().any(|m| m == &ctx.model || m == base) {
            let spec = if ctx.dialect == Dialect::Aws {
                ErrorSpec::new(400, "The provided model identifier is invalid.")
            } else {
                ErrorSpec::new(
                    404,
                    format!(
                        "Publisher Model `{}` not found.",
                        parts.uri.path().rsplit_once(':').map_or("", |(p, _)| p)
                    ),
                )
            };
            return ctx.error(spec);
        }
        let checked = match endpoint {
            Endpoint::Chat(ChatApi::VertexClaude) => crate::vertex::check_claude_body(&ctx.body),
            Endpoint::Chat(ChatApi::BedrockInvoke) => crate::bedrock::check_invoke_body(&ctx.body),
            Endpoint::Chat(ChatApi::Converse) => crate::bedrock::check_converse_body(&ctx.body),
            _ => Ok(()),
        };
        if let Err(message) = checked {
            return ctx.error(ErrorSpec::new(400, message));
        }
    } else if !cfg.models.is_empty() && !cfg.models.contains(&ctx.model) {
        let msg = format!(
            "The model `{}` does not exist or you do not have access to it.",
            ctx.model
        );
        return ctx.error(ErrorSpec::new(404, msg));
    }
    match ctx.decision.fault.clone() {
        Some(Fault::BedrockStreamException { .. }) if ctx.stream => {}
        Some(f) if ErrorSpec::for_fault(&f).is_some() => {
            let spec = ErrorSpec::for_fault(&f).unwrap_or_else(|| ErrorSpec::new(500, "fault"));
            return ctx.error(spec);
        }
        Some(Fault::ResetBeforeResponse) => {
            let Ctx { guard, abort, .. } = ctx;
            guard.finish();
            if let Some(a) = abort {
                a.0.cancel();
            }
            return std::future::pending::<Response>().await;
        }
        Some(Fault::HangNoHeaders) => {
            // The guard stays alive in this future; the client giving up drops it.
            let _ctx = ctx;
            return std::future::pending::<Response>().await;
        }
        Some(Fault::StreamErrorBeforeContent { error }) if !ctx.stream => {
            return ctx.error(ErrorSpec::for_stream_error(error));
        }
        _ => {}
    }
    if ctx.shared.config.reject_max_tokens
        && !matches!(endpoint, Endpoint::Chat(_))
        && ctx.body.get("max_tokens").is_some()
    {
        let mut spec = ErrorSpec::new(400, "Unrecognized request argument supplied: max_tokens");
        spec.param = Some("max_tokens".to_owned());
        return ctx.error(spec);
    }
    match endpoint {
        Endpoint::Chat(api) => chat(ctx, api).await,
        Endpoint::Embeddings => embeddings(ctx).await,
        Endpoint::Rerank => rerank(ctx).await,
        Endpoint::Transcription => transcription(ctx).await,
        Endpoint::Speech => speech(ctx).await,
    }
}

/// Charges the rate windows, or answers 429 when enforcement is on and the request does not fit.
fn charge_rate(ctx: &Ctx, tokens: u64) -> Result<RateSnapshot, Box<ErrorSpec>> {
    let now = ctx.shared.recorder.now();
    let rl = &ctx.shared.config.rate_limits;
    let mut st = lock(&ctx.shared.state);
    if rl.enforce
        && !st
            .rate
            .fits(now, tokens, rl.requests_per_minute, rl.tokens_per_minute)
    {
        let snap = st
            .rate
            .snapshot(now, rl.requests_per_minute, rl.tokens_per_minute);
        let secs =
            snap.reset_requests.as_secs() + u64::from(snap.reset_requests.subsec_nanos() > 0);
        let fault = Fault::RateLimited {
            retry_after: Some(secs.max(1)),
            http_date: false,
            retry_after_ms: None,
            reset_requests: None,
            reset_tokens: None,
        };
        return Err(Box::new(
            ErrorSpec::for_fault(&fault).unwrap_or_else(|| ErrorSpec::new(429, "rate")),
        ));
    }
    Ok(st
        .rate
        .charge(now, tokens, rl.requests_per_minute, rl.tokens_per_minute))
}

/// Picks the tool to call: tools present, `tool_choice` not `"none"`, and the last message is
/// not a tool result (so an agent loop ends after one call). A named choice wins.
fn pick_tool(api: ChatApi, body: &Value) -> Option<String> {
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())?;
    let choice = body.get("tool_choice");
    let choice_type =
        choice.and_then(|c| c.as_str().or_else(|| c.get("type").and_then(Value::as_str)));
    if choice_type == Some("none") {
        return None;
    }
    let named = choice.and_then(|c| {
        c.pointer("/function/name")
            .or_else(|| c.get("name"))
            .and_then(Value::as_str)
    });
    let last_is_result = match api {
        ChatApi::OpenAiChat => {
            body.get("messages")
                .and_then(Value::as_array)
                .and_then(|m| m.last())
                .and_then(|m| m.get("role"))
                .and_then(Value::as_str)
                == Some("tool")
        }
        // Vendor APIs pick their tools in crate::vertex / crate::bedrock; Anthropic bodies on
        // Vertex and Bedrock come here as ChatApi::Anthropic.
        ChatApi::Anthropic
        | ChatApi::VertexClaude
        | ChatApi::BedrockInvoke
        | ChatApi::Gemini
        | ChatApi::Converse => body
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_array)
            .is_some_and(|blocks| {
                blocks
                    .iter()
                    .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            }),
        ChatApi::Responses => {
            body.get("input")
                .and_then(Value::as_array)
                .and_then(|m| m.last())
                .and_then(|m| m.get("type"))
                .and_then(Value::as_str)
                == Some("function_call_output")
        }
    };
    if last_is_result {
        return None;
    }
    let first = tools.first().and_then(|t| {
        t.pointer("/function/name")
            .or_else(|| t.get("name"))
            .and_then(Value::as_str)
    });
    named.or(first).map(str::to_owned)
}

enum StreamPlan {
    Normal,
    ErrorBeforeContent(ErrorSpec),
    /// Content deltas, then an in-stream error (a Bedrock exception frame).
    ErrorAfter(u64, ErrorSpec),
    Cut(u64),
    HangAfterHeaders,
    KeepAlive(Duration),
}

async fn chat(ctx: Ctx, api: ChatApi) -> Response {
    let cfg = &ctx.shared.config;
    let mut segments = match api {
        ChatApi::OpenAiChat => tokens::openai_chat_segments(&ctx.body),
        ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => {
            tokens::anthropic_segments(&ctx.body)
        }
        ChatApi::Responses => tokens::responses_segments(&ctx.body),
        ChatApi::Gemini => crate::vertex::gemini_segments(&ctx.body),
        ChatApi::Converse => crate::bedrock::converse_segments(&ctx.body),
    };
    if api.is_anthropic()
        && cfg.anthropic_implicit_breakpoint
        && segments.iter().all(|s| s.breakpoint.is_none())
        && let Some(last) = segments.last_mut()
    {
        last.breakpoint = Some(None);
    }
    let max_tokens = match api {
        ChatApi::Gemini => crate::vertex::gemini_max_tokens(&ctx.body),
        ChatApi::Converse => crate::bedrock::converse_max_tokens(&ctx.body),
        _ => ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| ctx.body.get(*k).and_then(Value::as_u64)),
    };
    let tool = match api {
        ChatApi::Gemini => crate::vertex::gemini_tool(&ctx.body),
        ChatApi::Converse => crate::bedrock::converse_tool(&ctx.body),
        ChatApi::VertexClaude | ChatApi::BedrockInvoke => pick_tool(ChatApi::Anthropic, &ctx.body),
        _ => pick_tool(api, &ctx.body),
    };
    let mut text_tokens = if tool.is_some() {
        0
    } else {
        max_tokens.map_or(cfg.output_tokens, |m| m.min(cfg.output_tokens))
    };
    let mut finish = match (&tool, max_tokens) {
        (Some(_), _) => Finish::ToolCall,
        (None, Some(m)) if m < cfg.output_tokens => Finish::Length,
        _ => Finish::Stop,
    };
    // Stop sequences (vendor routes only, so the older endpoints keep their behaviour).
    let stops = match api {
        ChatApi::Gemini => crate::vertex::gemini_stop_sequences(&ctx.body),
        ChatApi::Converse | ChatApi::VertexClaude | ChatApi::BedrockInvoke => {
            crate::bedrock::stop_sequences(&ctx.body)
        }
        _ => Vec::new(),
    };
    if tool.is_none()
        && let Some(cut) = stop_cut(text_tokens, &stops)
    {
        text_tokens = cut;
        finish = Finish::StopSequence;
    }
    let json_text = if api == ChatApi::Gemini && tool.is_none() {
        crate::vertex::gemini_json_text(&ctx.body, text_tokens)
    } else {
        None
    };
    let output_tokens = match (&tool, &json_text) {
        (Some(_), _) => TOOL_CALL_TOKENS,
        (None, Some(t)) => {
            // JSON mode: one chunk holds the whole text.
            text_tokens = 1;
            crate::vertex::json_text_tokens(t)
        }
        (None, None) => text_tokens,
    };
    let prompt_estimate: u64 = segments.iter().map(|s| s.tokens).sum();
    let rl = match charge_rate(&ctx, prompt_estimate + output_tokens) {
        Ok(rl) => rl,
        Err(spec) => return ctx.error(*spec),
    };
    let mode = if api.is_anthropic() || api == ChatApi::Converse {
        CacheMode::Explicit
    } else {
        CacheMode::Automatic
    };
    let cache = lock(&ctx.shared.state).cache.account(
        &ctx.model,
        &segments,
        mode,
        cfg.cache_ttl,
        cfg.cache_min_tokens,
        Instant::now(),
    );
    let mut usage = Some(UsageRecord {
        prompt_tokens: cache.total,
        cached_tokens: cache.read,
        cache_creation_tokens: cache.written,
        output_tokens,
    });
    match &ctx.decision.fault {
        Some(Fault::ReportUsage {
            input_tokens,
            output_tokens,
        }) => {
            usage = Some(UsageRecord {
                prompt_tokens: *input_tokens,
                cached_tokens: 0,
                cache_creation_tokens: 0,
                output_tokens: *output_tokens,
            });
        }
        Some(Fault::OmitUsage) => usage = None,
        _ => {}
    }
    let n = ctx.shared.next_id();
    let id = match api {
        ChatApi::OpenAiChat => format!("chatcmpl-mock{n:012}"),
        ChatApi::Anthropic | ChatApi::VertexClaude | ChatApi::BedrockInvoke => {
            format!("msg_mock{n:012}")
        }
        ChatApi::Responses => format!("resp_mock{n:012}"),
        ChatApi::Gemini => format!("mock{n:012}"),
        ChatApi::Converse => format!("converse{n:012}"),
    };
    let model = if api.is_event_stream() {
        crate::bedrock::base_model_id(&ctx.model).to_owned()
    } else {
        ctx.model.clone()
    };
    let ttft = Duration::from_millis(cfg.ttft_ms) + ctx.decision.extra_ttft;
    let answer = Answer {
        api,
        id,
        model,
        created: unix_secs(),
        text_tokens,
        tool,
        finish,
        usage,
        usage_style: cfg.usage_style,
        include_usage: ctx.include_usage,
        thoughts_tokens: if api == ChatApi::Gemini {
            cfg.gemini_thoughts_tokens
        } else {
            0
        },
        json_text,
        t0: ctx.t0,
        uses_cache: api == ChatApi::Converse && crate::bedrock::converse_uses_cache(&ctx.body),
        first_byte_ms: u64::try_from(ttft.max(Duration::from_millis(cfg.latency_ms)).as_millis())
            .unwrap_or(u64::MAX),
    };
    let interval = if cfg.tokens_per_sec > 0.0 {
        Duration::from_secs_f64(1.0 / cfg.tokens_per_sec)
    } else {
        Duration::ZERO
    };
    let first_at =
        (ctx.t0 + Duration::from_millis(cfg.ttft_ms) + ctx.decision.extra_ttft).max(Instant::now());
    let plan = match ctx.decision.fault.clone() {
        Some(Fault::StreamErrorBeforeContent { error }) => {
            StreamPlan::ErrorBeforeContent(ErrorSpec::for_stream_error(error))
        }
        Some(Fault::CutMidStream { after_deltas }) => StreamPlan::Cut(after_deltas),
        Some(f @ Fault::BedrockStreamException { after_deltas, .. }) => StreamPlan::ErrorAfter(
            after_deltas,
            ErrorSpec::for_fault(&f).unwrap_or_else(|| ErrorSpec::new(500, "stream exception")),
        ),
        Some(Fault::HangAfterHeaders) => StreamPlan::HangAfterHeaders,
        Some(Fault::HangKeepAlive { interval_ms }) => {
            StreamPlan::KeepAlive(Duration::from_millis(interval_ms.max(1)))
        }
        _ => StreamPlan::Normal,
    };
    let mut headers = HeaderMap::new();
    rl.apply(ctx.dialect, &mut headers, None, None);
    set_request_id(&mut headers, ctx.dialect, &ctx.request_id);
    ctx.guard.set_status(200);
    if ctx.stream && api.is_event_stream() {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::eventstream::CONTENT_TYPE),
        );
        if api == ChatApi::BedrockInvoke {
            headers.insert(
                "x-amzn-bedrock-content-type",
                HeaderValue::from_static("application/json"),
            );
        }
        let body = sse_body(ctx, Sse::new(answer), plan, first_at, interval);
        (StatusCode::OK, headers, body).into_response()
    } else if ctx.stream {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let body = sse_body(ctx, Sse::new(answer), plan, first_at, interval);
        (StatusCode::OK, headers, body).into_response()
    } else {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if api == ChatApi::BedrockInvoke {
            bedrock_invoke_headers(&mut headers, &answer, first_at, interval, ctx.t0);
        }
        let body = json_body(ctx, answer, plan, first_at, interval);
        (StatusCode::OK, headers, body).into_response()
    }
}

/// The first token index at which the answer would contain one of `stops`; `None` when none
/// occurs within `tokens`.
fn stop_cut(tokens: u64, stops: &[String]) -> Option<u64> {
    if stops.iter().all(String::is_empty) {
        return None;
    }
    let mut text = String::new();
    for i in 0..tokens {
        text.push_str(&token_text(i));
        if stops
            .iter()
            .any(|s| !s.is_empty() && text.contains(s.as_str()))
        {
            return Some(i);
        }
    }
    None
}

/// InvokeModel's usage headers (`X-Amzn-Bedrock-*`), known before the body is sent.
fn bedrock_invoke_headers(
    headers: &mut HeaderMap,
    answer: &Answer,
    first_at: Instant,
    interval: Duration,
    t0: Instant,
) {
    let done_at = first_at
        + interval * u32::try_from(answer.text_tokens.saturating_sub(1)).unwrap_or(u32::MAX);
    let latency = done_at.saturating_duration_since(t0).as_millis();
    let u = answer.usage.unwrap_or_default();
    let values = [
        (
            "x-amzn-bedrock-input-token-count",
            u.prompt_tokens
                .saturating_sub(u.cached_tokens + u.cache_creation_tokens),
        ),
        ("x-amzn-bedrock-output-token-count", u.output_tokens),
        (
            "x-amzn-bedrock-invocation-latency",
            u64::try_from(latency).unwrap_or(u64::MAX),
        ),
        (
            "x-amzn-bedrock-cache-read-input-token-count",
            u.cached_tokens,
        ),
        (
            "x-amzn-bedrock-cache-write-input-token-count",
            u.cache_creation_tokens,
        ),
    ];
    for (name, value) in values {
        if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
            headers.insert(name, v);
        }
    }
}

fn sse_body(
    ctx: Ctx,
    mut sse: Sse,
    plan: StreamPlan,
    first_at: Instant,
    interval: Duration,
) -> Body {
    let Ctx {
        mut guard, abort, ..
    } = ctx;
    let stream = async_stream::stream! {
        if matches!(plan, StreamPlan::HangAfterHeaders) {
            std::future::pending::<()>().await;
        }
        let for_error = matches!(plan, StreamPlan::ErrorBeforeContent(_));
        for b in sse.preamble(for_error) {
            yield Ok::<Bytes, io::Error>(b);
        }
        match plan {
            StreamPlan::ErrorBeforeContent(spec) => {
                wait_until(first_at).await;
                for b in sse.error(&spec) {
                    yield Ok(b);
                }
                guard.finish();
            }
            StreamPlan::KeepAlive(every) => loop {
                sleep(every).await;
                for b in sse.keep_alive() {
                    yield Ok(b);
                }
            },
            StreamPlan::Cut(after) => {
                let n = sse.answer.text_tokens.min(after);
                for i in 0..n {
                    wait_until(first_at + interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
                    yield Ok(sse.delta(i));
                    guard.token_sent();
                }
                yield Ok(sse.torn_delta(n));
                sleep(CUT_FLUSH).await;
                guard.finish();
                if let Some(a) = &abort {
                    a.0.cancel();
                }
                yield Err(io::Error::other("injected mid-stream cut"));
            }
            StreamPlan::ErrorAfter(after, spec) => {
                wait_until(first_at).await;
                let n = sse.answer.text_tokens.min(after);
                for i in 0..n {
                    wait_until(first_at + interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
                    yield Ok(sse.delta(i));
                    guard.token_sent();
                }
                for b in sse.error(&spec) {
                    yield Ok(b);
                }
                guard.finish();
            }
            StreamPlan::HangAfterHeaders => {}
            StreamPlan::Normal => {
                wait_until(first_at).await;
                if sse.answer.tool.is_some() {
                    for b in sse.tool_call() {
                        yield Ok(b);
                    }
                    guard.set_tokens(TOOL_CALL_TOKENS);
                } else {
                    for i in 0..sse.answer.text_tokens {
                        wait_until(first_at + interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
                        yield Ok(sse.delta(i));
                        guard.token_sent();
                    }
                }
                let (last, usage) = sse.finish();
                for b in last {
                    yield Ok(b);
                }
                if let Some(u) = usage {
                    guard.usage_sent(u);
                }
                guard.finish();
            }
        }
    };
    Body::from_stream(stream)
}

fn json_body(
    ctx: Ctx,
    answer: Answer,
    plan: StreamPlan,
    first_at: Instant,
    interval: Duration,
) -> Body {
    let Ctx {
        mut guard, abort, ..
    } = ctx;
    let done_at = first_at
        + interval * u32::try_from(answer.text_tokens.saturating_sub(1)).unwrap_or(u32::MAX);
    let stream = async_stream::stream! {
        match plan {
            StreamPlan::HangAfterHeaders => std::future::pending::<()>().await,
            StreamPlan::KeepAlive(every) => loop {
                // Leading whitespace is valid JSON and keeps a proxy's idle timer busy.
                sleep(every).await;
                yield Ok::<Bytes, io::Error>(Bytes::from_static(b"\n"));
            },
            StreamPlan::Cut(_) => {
                wait_until(done_at).await;
                yield Ok(first_half(answer.json().to_string()));
                sleep(CUT_FLUSH).await;
                guard.finish();
                if let Some(a) = &abort {
                    a.0.cancel();
                }
                yield Err(io::Error::other("injected mid-body cut"));
            }
            StreamPlan::Normal | StreamPlan::ErrorBeforeContent(_) | StreamPlan::ErrorAfter(..) => {
                wait_until(done_at).await;
                if let Some(u) = answer.usage {
                    guard.usage_sent(u);
                }
                guard.set_tokens(answer.usage.map_or(answer.text_tokens, |u| u.output_tokens));
                guard.finish();
                yield Ok(Bytes::from(answer.json().to_string()));
            }
        }
    };
    Body::from_stream(stream)
}

/// The first half of a body's bytes (a byte cut may split a UTF-8 character: it is a torn body).
fn first_half(text: String) -> Bytes {
    let bytes = Bytes::from(text.into_bytes());
    bytes.slice(..bytes.len() / 2)
}

/// Deterministic unit vector for `text`: splitmix64 from an FNV seed, centred, L2-normalised.
fn embed(model: &str, text: &str, dims: usize) -> Vec<f32> {
    let mut state = fnv1a(text.as_bytes(), fnv1a(model.as_bytes(), 0));
    let mut v: Vec<f32> = (0..dims)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

async fn finish_simple(ctx: Ctx, tokens: u64, body: Value) -> Response {
    let rl = match charge_rate(&ctx, tokens) {
        Ok(rl) => rl,
        Err(spec) => return ctx.error(*spec),
    };
    let ttft_at =
        ctx.t0 + Duration::from_millis(ctx.shared.config.ttft_ms) + ctx.decision.extra_ttft;
    wait_until(ttft_at).await;
    let mut headers = HeaderMap::new();
    rl.apply(ctx.dialect, &mut headers, None, None);
    set_request_id(&mut headers, ctx.dialect, &ctx.request_id);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let plan = match ctx.decision.fault {
        Some(Fault::CutMidStream { .. }) => StreamPlan::Cut(0),
        Some(Fault::HangAfterHeaders) => StreamPlan::HangAfterHeaders,
        Some(Fault::HangKeepAlive { interval_ms }) => {
            StreamPlan::KeepAlive(Duration::from_millis(interval_ms.max(1)))
        }
        _ => StreamPlan::Normal,
    };
    ctx.guard.set_status(200);
    let Ctx { guard, abort, .. } = ctx;
    let stream = async_stream::stream! {
        match plan {
            StreamPlan::HangAfterHeaders => std::future::pending::<()>().await,
            StreamPlan::KeepAlive(every) => loop {
                sleep(every).await;
                yield Ok::<Bytes, io::Error>(Bytes::from_static(b"\n"));
            },
            StreamPlan::Cut(_) => {
                yield Ok(first_half(body.to_string()));
                sleep(CUT_FLUSH).await;
                guard.finish();
                if let Some(a) = &abort {
                    a.0.cancel();
                }
                yield Err(io::Error::other("injected mid-body cut"));
            }
            StreamPlan::Normal | StreamPlan::ErrorBeforeContent(_) | StreamPlan::ErrorAfter(..) => {
                guard.usage_sent(UsageRecord { prompt_tokens: tokens, ..UsageRecord::default() });
                guard.finish();
                yield Ok(Bytes::from(body.to_string()));
            }
        }
    };
    (StatusCode::OK, headers, Body::from_stream(stream)).into_response()
}

/// Most `dimensions` the mock computes per embedding.
pub(crate) const MAX_EMBEDDING_DIMENSIONS: usize = 8192;
/// Most inputs in one embeddings request (OpenAI's limit).
pub(crate) const MAX_EMBEDDING_INPUTS: usize = 2048;

async fn embeddings(ctx: Ctx) -> Response {
    use base64::Engine as _;
    let texts = tokens::input_texts(ctx.body.get("input"));
    if texts.is_empty() {
        let mut spec = ErrorSpec::new(400, "'input' is a required property and must not be empty.");
        spec.param = Some("input".to_owned());
        return ctx.error(spec);
    }
    // Client sizes are bounded before anything is allocated (`dimensions: 4294967296` once
    // drove the mock to 12 GB): OpenAI's own limits are 2048 inputs and a few thousand
    // dimensions.
    if texts.len() > MAX_EMBEDDING_INPUTS {
        let mut spec = ErrorSpec::new(
            400,
            format!("'input' must have at most {MAX_EMBEDDING_INPUTS} items."),
        );
        spec.param = Some("input".to_owned());
        return ctx.error(spec);
    }
    let dims = match ctx.body.get("dimensions") {
        None | Some(Value::Null) => ctx.shared.config.embedding_dimensions.max(1),
        Some(v) => match v.as_u64() {
            Some(d) if (1..=MAX_EMBEDDING_DIMENSIONS as u64).contains(&d) => d as usize,
            _ => {
                let mut spec = ErrorSpec::new(
                    400,
                    format!(
                        "'dimensions' must be an integer from 1 to {MAX_EMBEDDING_DIMENSIONS}."
                    ),
                );
                spec.param = Some("dimensions".to_owned());
                return ctx.error(spec);
            }
        },
    };
    let base64 = ctx.body.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = embed(&ctx.model, t, dims);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let tokens: u64 = texts.iter().map(|t| count_tokens(t)).sum();
    let body = json!({"object": "list", "data": data, "model": ctx.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}});
    finish_simple(ctx, tokens, body).await
}

/// `/v1/audio/transcriptions`: the mock's audio carries no speech, so the text is empty; the
/// upload must still carry a non-empty `file` part.
async fn transcription(ctx: Ctx) -> Response {
    let file_bytes = ctx
        .body
        .get("file_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if file_bytes == 0 {
        let mut spec = ErrorSpec::new(400, "'file' is a required field and must not be empty.");
        spec.param = Some("file".to_owned());
        return ctx.error(spec);
    }
    // Billed like Whisper-style APIs by audio length; a token per KiB keeps the rate windows moving.
    let tokens = file_bytes.div_ceil(1024);
    finish_simple(ctx, tokens, json!({"text": ""})).await
}

/// `/v1/audio/speech`: checks `input` and `voice` and answers a short silent WAV.
async fn speech(ctx: Ctx) -> Response {
    let input = ctx.body.get("input").and_then(Value::as_str).unwrap_or("");
    if input.is_empty() {
        let mut spec = ErrorSpec::new(400, "'input' is a required property and must not be empty.");
        spec.param = Some("input".to_owned());
        return ctx.error(spec);
    }
    let voices = &ctx.shared.config.voices;
    match ctx.body.get("voice").and_then(Value::as_str) {
        None | Some("") => {
            let mut spec = ErrorSpec::new(400, "'voice' is a required property.");
            spec.param = Some("voice".to_owned());
            return ctx.error(spec);
        }
        Some(v) if !voices.is_empty() && !voices.iter().any(|known| known == v) => {
            let mut spec = ErrorSpec::new(
                400,
                format!(
                    "Unknown voice '{v}'; expected one of: {}.",
                    voices.join(", ")
                ),
            );
            spec.param = Some("voice".to_owned());
            return ctx.error(spec);
        }
        Some(_) => {}
    }
    let tokens = count_tokens(input);
    let rl = match charge_rate(&ctx, tokens) {
        Ok(rl) => rl,
        Err(spec) => return ctx.error(*spec),
    };
    let ttft_at =
        ctx.t0 + Duration::from_millis(ctx.shared.config.ttft_ms) + ctx.decision.extra_ttft;
    wait_until(ttft_at).await;
    let mut headers = HeaderMap::new();
    rl.apply(ctx.dialect, &mut headers, None, None);
    set_request_id(&mut headers, ctx.dialect, &ctx.request_id);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("audio/wav"));
    ctx.guard.set_status(200);
    ctx.guard.usage_sent(UsageRecord {
        prompt_tokens: tokens,
        ..UsageRecord::default()
    });
    ctx.guard.finish();
    // A tenth of a second per input token, capped at 2 s.
    let millis = (tokens * 100).min(2_000);
    let wav = crate::audio::silent_wav(u32::try_from(millis).unwrap_or(2_000));
    (StatusCode::OK, headers, Body::from(wav)).into_response()
}

/// Relevance: share of query words found in the document (0..1) scaled to 0.05..0.95, plus a
/// tiny hash term so ties are broken deterministically.
fn relevance(query: &str, doc: &str) -> f64 {
    let doc_words: std::collections::HashSet<String> =
        doc.split_whitespace().map(str::to_lowercase).collect();
    let q: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    let hits = q.iter().filter(|w| doc_words.contains(*w)).count();
    let overlap = if q.is_empty() {
        0.0
    } else {
        hits as f64 / q.len() as f64
    };
    let jitter = (fnv1a(doc.as_bytes(), fnv1a(query.as_bytes(), 0)) % 1000) as f64 / 1e6;
    0.05 + 0.9 * overlap + jitter
}

async fn rerank(ctx: Ctx) -> Response {
    let query = ctx
        .body
        .get("query")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let docs = tokens::input_texts(ctx.body.get("documents"));
    if docs.is_empty() || query.is_empty() {
        return ctx.error(ErrorSpec::new(400, "'query' and 'documents' are required."));
    }
    let top_n = ctx
        .body
        .get("top_n")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(docs.len());
    let return_docs = ctx
        .body
        .get("return_documents")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut scored: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| (i, relevance(&query, d)))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.truncate(top_n);
    let results: Vec<Value> = scored
        .iter()
        .map(|(i, s)| {
            let mut r = json!({"index": i, "relevance_score": s});
            if return_docs && let Some(obj) = r.as_object_mut() {
                obj.insert("document".to_owned(), json!({"text": docs[*i]}));
            }
            r
        })
        .collect();
    let q = count_tokens(&query);
    let tokens: u64 = docs.iter().map(|d| q + count_tokens(d)).sum();
    let id = format!("rerank-mock{:012}", ctx.shared.next_id());
    let body = json!({"id": id, "model": ctx.model, "results": results,
        "usage": {"total_tokens": tokens},
        "meta": {"billed_units": {"search_units": 1}}});
    finish_simple(ctx, tokens, body).await
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let data: Vec<Value> = shared
        .config
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "switchyard-mock"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn admin_set_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    match serde_json::from_slice::<FaultSet>(&body) {
        Ok(set) => {
            shared.set_faults(set);
            axum::Json(shared.stats().faults).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn admin_get_faults(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(shared.stats().faults).into_response()
}

async fn admin_stats(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(shared.stats()).into_response()
}

async fn admin_calls(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(shared.recorder.calls()).into_response()
}

async fn admin_reset(State(shared): State<Arc<Shared>>) -> Response {
    shared.reset();
    StatusCode::NO_CONTENT.into_response()
}

/// Records an auth-endpoint call (token, metadata, STS) with its status.
fn record_auth_call(shared: &Shared, path: &str, status: u16) {
    let guard = shared.recorder.start(CallRecord {
        seq: 0,
        at: Duration::ZERO,
        path: path.to_owned(),
        model: String::new(),
        stream: false,
        status,
        include_usage_requested: false,
        project: None,
        key_suffix: None,
        traceparent: None,
        fault: Vec::new(),
        cancelled_at: None,
        tokens_streamed: 0,
        usage: None,
        finished_at: None,
    });
    guard.finish();
}

fn status_of(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// `POST /token`: Google's OAuth2 token endpoint (JWT-bearer grant), see [`crate::auth`].
async fn google_token(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let (Some(cfg), Some(keys)) = (&shared.config.google_auth, &shared.google_keys) else {
        record_auth_call(&shared, "/token", 404);
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": "not_found",
                "error_description": "this mock has no google_auth configured"})),
        )
            .into_response();
    };
    let (status, answer) = cfg.token_endpoint(keys, &crate::auth::form(&body));
    record_auth_call(&shared, "/token", status);
    let mut headers = HeaderMap::new();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (status_of(status), headers, axum::Json(answer)).into_response()
}

/// `GET /computeMetadata/v1/...`: the GCE/GKE metadata server's token, email and project id.
async fn gce_metadata(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let flavor = req
        .headers()
        .get("metadata-flavor")
        .and_then(|v| v.to_str().ok());
    let mut headers = HeaderMap::new();
    headers.insert("metadata-flavor", HeaderValue::from_static("Google"));
    let Some(cfg) = shared
        .config
        .google_auth
        .as_ref()
        .filter(|g| g.metadata_server)
    else {
        record_auth_call(&shared, &path, 404);
        return (StatusCode::NOT_FOUND, headers, "Not Found\n").into_response();
    };
    if flavor != Some("Google") {
        record_auth_call(&shared, &path, 403);
        return (
            StatusCode::FORBIDDEN,
            headers,
            "Missing required header: Metadata-Flavor: Google\n",
        )
            .into_response();
    }
    let rest = path.trim_start_matches("/computeMetadata/v1/");
    // Accounts are addressed as `default` or by email (google-auth does both).
    let account = rest
        .strip_prefix("instance/service-accounts/")
        .and_then(|r| r.split_once('/'))
        .filter(|(name, _)| *name == "default" || *name == cfg.metadata_email);
    let answer = match (rest, account) {
        (_, Some((_, "token"))) => axum::Json(cfg.metadata_token()).into_response(),
        (_, Some((_, "email"))) => cfg.metadata_email.clone().into_response(),
        (_, Some((_, ""))) => axum::Json(json!({
            "aliases": ["default"],
            "email": cfg.metadata_email,
            "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
        }))
        .into_response(),
        ("project/project-id", _) => cfg.project_id.clone().into_response(),
        _ => {
            record_auth_call(&shared, &path, 404);
            return (StatusCode::NOT_FOUND, headers, "Not Found\n").into_response();
        }
    };
    record_auth_call(&shared, &path, 200);
    (headers, answer).into_response()
}

/// `POST /`: the STS mock (`Action=AssumeRoleWithWebIdentity`), see [`crate::auth`].
async fn sts(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/xml"));
    let Some(cfg) = &shared.config.aws_auth else {
        record_auth_call(&shared, "/", 404);
        return (
            StatusCode::NOT_FOUND,
            "this mock has no aws_auth configured\n",
        )
            .into_response();
    };
    let (status, xml) = cfg.sts(&crate::auth::form(&body), shared.next_id());
    record_auth_call(&shared, "/", status);
    (status_of(status), headers, xml).into_response()
}

/// Waits until `at` unless it has passed. Tokio rounds every timer up to its next 1 ms tick, so
/// a mock configured with no latency would still add up to a millisecond per wait (headers,
/// first token, each chunk); the load benchmark's baseline must answer in microseconds
/// (issue 16).
async fn wait_until(at: Instant) {
    if Instant::now() < at {
        sleep_until(at).await;
    }
}
