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

use crate::cache::{CacheMode, PromptCache};
use crate::clock::unix_secs;
use crate::config::{MockConfig, MockModality};
use crate::errors::{Dialect, ErrorSpec, RateSnapshot, RateWindows, set_request_id};
use crate::fault::{Decision, Fault, FaultSet, FaultState, RequestFacts};
use crate::record::{CallGuard, CallRecord, Recorder, UsageRecord, lock};
use crate::tokens::{self, count_tokens, fnv1a};
use crate::wire::{Answer, ChatApi, Finish, Sse, torn};

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
    /// [`MockError::Bind`] when the address cannot be bound.
    pub async fn start(config: MockConfig) -> Result<MockHandle, MockError> {
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

    fn error(self, spec: ErrorSpec) -> Response {
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

async fn handle(State(shared): State<Arc<Shared>>, req: Request, endpoint: Endpoint) -> Response {
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
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let stream = matches!(endpoint, Endpoint::Chat(_))
        && body.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    let key = api_key(&parts.headers);
    let cfg = &shared.config;
    let project = parts
        .headers
        .get(cfg.project_header.as_str())
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
        modality: endpoint.modality(),
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
    sleep_until(t0 + before_headers).await;

    let served = &ctx.shared.config.modalities;
    if !served.is_empty() && !served.contains(&endpoint.modality()) {
        // The shape of OpenAI's answer to a path it does not route.
        let msg = format!(
            "Invalid URL (POST {}): this server does not serve {:?} requests",
            parts.uri.path(),
            endpoint.modality()
        );
        return ctx.error(ErrorSpec::new(404, msg));
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
    if !cfg.api_keys.is_empty() && !key.as_ref().is_some_and(|k| cfg.api_keys.contains(k)) {
        return ctx.error(ErrorSpec::new(401, "Incorrect API key provided."));
    }
    if !cfg.models.is_empty() && !cfg.models.contains(&ctx.model) {
        let msg = format!(
            "The model `{}` does not exist or you do not have access to it.",
            ctx.model
        );
        return ctx.error(ErrorSpec::new(404, msg));
    }
    match ctx.decision.fault.clone() {
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
        ChatApi::Anthropic => body
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
    Cut(u64),
    HangAfterHeaders,
    KeepAlive(Duration),
}

async fn chat(ctx: Ctx, api: ChatApi) -> Response {
    let cfg = &ctx.shared.config;
    let mut segments = match api {
        ChatApi::OpenAiChat => tokens::openai_chat_segments(&ctx.body),
        ChatApi::Anthropic => tokens::anthropic_segments(&ctx.body),
        ChatApi::Responses => tokens::responses_segments(&ctx.body),
    };
    if api == ChatApi::Anthropic
        && cfg.anthropic_implicit_breakpoint
        && segments.iter().all(|s| s.breakpoint.is_none())
        && let Some(last) = segments.last_mut()
    {
        last.breakpoint = Some(None);
    }
    let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .find_map(|k| ctx.body.get(*k).and_then(Value::as_u64));
    let tool = pick_tool(api, &ctx.body);
    let text_tokens = if tool.is_some() {
        0
    } else {
        max_tokens.map_or(cfg.output_tokens, |m| m.min(cfg.output_tokens))
    };
    let finish = match (&tool, max_tokens) {
        (Some(_), _) => Finish::ToolCall,
        (None, Some(m)) if m < cfg.output_tokens => Finish::Length,
        _ => Finish::Stop,
    };
    let output_tokens = if tool.is_some() {
        TOOL_CALL_TOKENS
    } else {
        text_tokens
    };
    let prompt_estimate: u64 = segments.iter().map(|s| s.tokens).sum();
    let rl = match charge_rate(&ctx, prompt_estimate + output_tokens) {
        Ok(rl) => rl,
        Err(spec) => return ctx.error(*spec),
    };
    let mode = if api == ChatApi::Anthropic {
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
        ChatApi::Anthropic => format!("msg_mock{n:012}"),
        ChatApi::Responses => format!("resp_mock{n:012}"),
    };
    let answer = Answer {
        api,
        id,
        model: ctx.model.clone(),
        created: unix_secs(),
        text_tokens,
        tool,
        finish,
        usage,
        usage_style: cfg.usage_style,
        include_usage: ctx.include_usage,
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
    if ctx.stream {
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
        let body = json_body(ctx, answer, plan, first_at, interval);
        (StatusCode::OK, headers, body).into_response()
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
                sleep_until(first_at).await;
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
                    sleep_until(first_at + interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
                    yield Ok(sse.delta(i));
                    guard.token_sent();
                }
                yield Ok(torn(&sse.delta(n)));
                sleep(CUT_FLUSH).await;
                guard.finish();
                if let Some(a) = &abort {
                    a.0.cancel();
                }
                yield Err(io::Error::other("injected mid-stream cut"));
            }
            StreamPlan::HangAfterHeaders => {}
            StreamPlan::Normal => {
                sleep_until(first_at).await;
                if sse.answer.tool.is_some() {
                    for b in sse.tool_call() {
                        yield Ok(b);
                    }
                    guard.set_tokens(TOOL_CALL_TOKENS);
                } else {
                    for i in 0..sse.answer.text_tokens {
                        sleep_until(first_at + interval * u32::try_from(i).unwrap_or(u32::MAX)).await;
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
                sleep_until(done_at).await;
                yield Ok(first_half(answer.json().to_string()));
                sleep(CUT_FLUSH).await;
                guard.finish();
                if let Some(a) = &abort {
                    a.0.cancel();
                }
                yield Err(io::Error::other("injected mid-body cut"));
            }
            StreamPlan::Normal | StreamPlan::ErrorBeforeContent(_) => {
                sleep_until(done_at).await;
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
    sleep_until(ttft_at).await;
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
            StreamPlan::Normal | StreamPlan::ErrorBeforeContent(_) => {
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
    sleep_until(ttft_at).await;
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
