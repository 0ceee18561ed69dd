//! The client API (axum): OpenAI- and Anthropic-compatible endpoints, authentication, the
//! operational endpoints, and one error mapping in the client's dialect (STYLE pattern 9).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;

use switchyard_api::policy::ServiceType;

use crate::app::{App, ServeOptions};
use crate::dispatch::dispatch;
use crate::request::{ApiError, ClientBody, ClientOp, ClientRequest, sensitive_headers};
use crate::status;
use crate::wire::{Dialect, anthropic, openai};

pub use crate::request::MAX_PROJECT_KEY_BYTES;

/// The HTTP router: client API plus `/status`, `/metrics`, `/healthz`, `/readyz`, and the
/// live view under `/ui` when [`crate::app::ServeOptions::ui`] is on.
///
/// Layers, outermost first: panic catcher (a bug answers 500, it does not drop the
/// connection), credential headers marked sensitive before anything could log them.
pub fn router(app: Arc<App>) -> Router {
    let view = if app.serve.ui {
        crate::ui::routes()
    } else {
        Router::new()
    };
    Router::new()
        .merge(view)
        .route("/v1/chat/completions", post(chat))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(responses))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank))
        .route("/v1/audio/transcriptions", post(transcriptions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/status", get(status_handler))
        .route("/metrics", get(metrics_handler))
        .route(
            switchyard_api::outcomes::OUTCOMES_PATH,
            get(crate::outcomes::handler),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read by the handlers with their own limit, so a 413 has the client's
        // error shape; axum's default limit would answer in plain text.
        .layer(DefaultBodyLimit::disable())
        .layer(SetSensitiveRequestHeadersLayer::new(sensitive_headers()))
        .layer(axum::middleware::from_fn(catch_panics))
        .with_state(app)
}

/// The outermost layer: a panic in a handler answers 500 in the dialect of the endpoint
/// (Anthropic's error shape on `/v1/messages`, OpenAI's elsewhere) instead of dropping the
/// connection. tower-http's `CatchPanicLayer` cannot see the request, so it always answered in
/// OpenAI's shape (issue 12 item 7).
async fn catch_panics(request: Request, next: axum::middleware::Next) -> Response {
    use futures::FutureExt as _;
    let dialect = if request.uri().path().starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    match std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(_) => {
            tracing::error!("a request handler panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .into_response(dialect)
        }
    }
}

async fn not_found(request: Request) -> Response {
    let dialect = if request.uri().path().starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no such endpoint: {}", request.uri().path()),
    )
    .into_response(dialect)
}

async fn method_not_allowed(request: Request) -> Response {
    let dialect = if request.uri().path().starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response(dialect)
}

/// Ready once a configuration is installed and, when it counts tokens, the tokenizer's
/// vocabulary is loaded (the first such request would otherwise pay the load).
async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.ready.load(std::sync::atomic::Ordering::Relaxed)
        && (!app.runtime.live().table.needs_tokens || crate::estimate::is_loaded())
    {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn metrics_handler(State(app): State<Arc<App>>) -> Response {
    let live = app.runtime.live();
    for (p, s) in live.table.providers.iter().zip(&live.providers) {
        let label = crate::metrics::ProviderLabel {
            provider: p.key.clone(),
        };
        app.metrics
            .availability
            .get_or_create(&label)
            .set(s.availability());
        app.metrics
            .flap_penalty
            .get_or_create(&label)
            .set(s.flap().penalty);
        let open = !matches!(
            crate::state::lock(&s.breaker).state(app.clock.now()),
            switchyard_core::breaker::BreakerState::Closed
        );
        app.metrics
            .circuit_open
            .get_or_create(&label)
            .set(i64::from(open));
        let now = app.clock.now();
        let scopes: Vec<&str> = p.pause_scopes.iter().map(String::as_str).collect();
        let paused = crate::state::lock(&app.runtime.pauses)
            .paused_until(&scopes, now)
            .map_or(0.0, |until| until.saturating_since(now).as_secs_f64());
        app.metrics.paused_seconds.get_or_create(&label).set(paused);
    }
    for (r, s) in live.table.routes.iter().zip(&live.routes) {
        for (name, w) in r.provider_names.iter().zip(s.weights.load().iter()) {
            let label = crate::metrics::RouteProvider {
                route: r.key.clone(),
                provider: format!("{}/{name}", r.namespace),
            };
            app.metrics.weight.get_or_create(&label).set(*w);
        }
    }
    let store = app.broker.store();
    app.metrics
        .reservations_in_flight
        .set(i64::try_from(store.in_flight()).unwrap_or(i64::MAX));
    app.metrics
        .replay_pending
        .set(i64::try_from(store.replay_pending()).unwrap_or(i64::MAX));
    let mode = store.mode();
    for m in [
        switchyard_store::StoreMode::InProcess,
        switchyard_store::StoreMode::Redis,
        switchyard_store::StoreMode::LocalFallback,
    ] {
        app.metrics
            .store_mode
            .get_or_create(&crate::metrics::StoreModeLabel {
                mode: m.label().to_owned(),
            })
            .set(i64::from(m == mode));
    }
    app.metrics
        .tokenizer_loaded
        .set(i64::from(crate::estimate::is_loaded()));
    let mut response = app.metrics.encode().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

async fn status_handler(State(app): State<Arc<App>>) -> Response {
    let usage = status::tenant_usage(&app).await;
    axum::Json(status::snapshot_with_usage(&app, &usage)).into_response()
}

/// The caller's tenant (`None` when anonymous access is allowed and no key was sent), or the
/// 401 every client endpoint answers for a missing or unknown key.
fn authenticate(
    app: &App,
    table: &crate::config::RoutingTable,
    headers: &HeaderMap,
) -> Result<Option<Arc<crate::config::Tenant>>, ApiError> {
    match api_key(headers) {
        Some(key) => match table.tenant_for_key(key) {
            Some(t) => Ok(Some(t.clone())),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "the API key is not valid",
            )),
        },
        None if !app.serve.allow_anonymous => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_api_key",
            "an API key is required: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
        )),
        None => Ok(None),
    }
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let live = app.runtime.live();
    let dialect = if headers.contains_key("anthropic-version") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    // The model list is part of the client API: same authentication as the other endpoints.
    if let Err(e) = authenticate(&app, &live.table, &headers) {
        return e.into_response(dialect);
    }
    let mut names: Vec<&String> = live.table.by_model.keys().collect();
    names.sort();
    if headers.contains_key("anthropic-version") {
        let data: Vec<Value> = names
            .iter()
            .map(|n| json!({"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"}))
            .collect();
        let first = names.first().map(|n| n.as_str());
        let last = names.last().map(|n| n.as_str());
        return axum::Json(
            json!({"data": data, "has_more": false, "first_id": first, "last_id": last}),
        )
        .into_response();
    }
    let data: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": 0, "owned_by": "switchyard"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: the model object (OpenAI shape; Anthropic's with an
/// `anthropic-version` header) for a model or alias a route serves, else 404 in the client's
/// error shape (`model_not_found`).
async fn model(
    State(app): State<Arc<App>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let live = app.runtime.live();
    let dialect = if headers.contains_key("anthropic-version") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    if let Err(e) = authenticate(&app, &live.table, &headers) {
        return e.into_response(dialect);
    }
    if !live.table.by_model.contains_key(&id) {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("the model {:?} does not exist", shown(&id)),
        )
        .into_response(dialect);
    }
    let body = match dialect {
        Dialect::Anthropic => {
            json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
        }
        Dialect::OpenAi => {
            json!({"id": id, "object": "model", "created": 0, "owned_by": "switchyard"})
        }
    };
    axum::Json(body).into_response()
}

/// Anthropic `POST /v1/messages/count_tokens`: `{"input_tokens": N}` for a Messages request
/// body (no `max_tokens` needed), counted by the router's own estimator (o200k tokenizer,
/// corrected by the route's learned ratio of provider-reported to estimated input tokens,
/// `crate::estimate`) — the figure the router reserves quota with. Answered locally, not
/// forwarded: the route may end on a provider without a count endpoint (OpenAI-compatible,
/// Bedrock), and a count must not use a provider's capacity. The vocabulary is loaded on
/// first use when the configuration counts no tokens otherwise (about a second, on the
/// blocking pool). Errors: 401, 400 (body), 404 (unknown model), 413, all in Anthropic's shape.
async fn count_tokens(State(app): State<Arc<App>>, request: Request) -> Response {
    let dialect = Dialect::Anthropic;
    let (parts, body) = request.into_parts();
    let live = app.runtime.live();
    let tenant = match authenticate(&app, &live.table, &parts.headers) {
        Ok(t) => t,
        Err(e) => return e.into_response(dialect),
    };
    let bytes = match read_body(
        &parts.headers,
        Body::new(body),
        app.max_body_bytes,
        app.serve.body_read_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => return e.into_response(dialect),
    };
    let invalid = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", m);
    let mut map: serde_json::Map<String, Value> = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => {
            return invalid(format!("the request body is not valid: {e}")).into_response(dialect);
        }
    };
    // A count request has no output cap; the Messages type requires one.
    map.entry("max_tokens").or_insert(json!(1));
    let r: anthropic::MessagesRequest = match serde_json::from_value(Value::Object(map)) {
        Ok(r) => r,
        Err(e) => {
            return invalid(format!("the request body is not valid: {e}")).into_response(dialect);
        }
    };
    let Some(&route_index) = live.table.by_model.get(&r.model) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("the model {:?} does not exist", shown(&r.model)),
        )
        .into_response(dialect);
    };
    let route = &live.table.routes[route_index];
    if let Some(t) = &tenant
        && !t.may_use(&route.name)
    {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "route_not_allowed",
            format!("this API key may not use the model {:?}", shown(&r.model)),
        )
        .into_response(dialect);
    }
    let params = crate::estimate::EstimateParams {
        default_output_tokens: 0,
        pricing: crate::wire::usage::Pricing::default(),
        ratio: app.calibrations.ratio(&route.key),
    };
    // Always off the runtime: the first count may load the vocabulary.
    let internal = || {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error while counting tokens",
        )
        .into_response(dialect)
    };
    let Ok(_permit) = app.estimators.acquire().await else {
        return internal();
    };
    let counted = tokio::task::spawn_blocking(move || {
        crate::estimate::estimate_anthropic_messages(&r, &params).input_tokens
    })
    .await;
    match counted {
        Ok(n) => axum::Json(json!({"input_tokens": n})).into_response(),
        Err(_) => internal(),
    }
}

/// Largest chat answer read back for translation into a Response object, bytes.
pub const MAX_TRANSLATED_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// OpenAI `POST /v1/responses` (`crate::responses`): the body is translated into a chat
/// completions request, which is then handled exactly as one sent to `/v1/chat/completions`
/// (authentication, routing, sticky chain, reservations, failover, idempotency, the
/// provider's dialect); the answer comes back as a Response object or, streamed, as the
/// Responses API's typed events. What cannot be honoured is refused with a 400
/// `invalid_request_error` naming the parameter, before anything is sent.
async fn responses(State(app): State<Arc<App>>, request: Request) -> Response {
    let dialect = Dialect::OpenAi;
    let rid = request_id(request.headers());
    let with_id = |mut r: Response| {
        if let Ok(v) = HeaderValue::from_str(&rid) {
            r.headers_mut().insert("x-request-id", v);
        }
        r
    };
    let (mut parts, body) = request.into_parts();
    {
        let live = app.runtime.live();
        if let Err(e) = authenticate(&app, &live.table, &parts.headers) {
            return with_id(e.into_response(dialect));
        }
    }
    let bytes = match read_body(
        &parts.headers,
        Body::new(body),
        app.max_body_bytes,
        app.serve.body_read_timeout,
    )
    .await
    {
        Ok(b) => b,
        Err(e) => return with_id(e.into_response(dialect)),
    };
    let map: serde_json::Map<String, Value> = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => {
            let e = ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("the request body is not valid: {e}"),
            );
            return with_id(e.into_response(dialect));
        }
    };
    let (chat, echo) = match crate::responses::to_chat(&map) {
        Ok(t) => t,
        Err(refusal) => {
            let mut r = (StatusCode::BAD_REQUEST, axum::Json(refusal.body())).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return with_id(r);
        }
    };
    drop(map);
    let chat_bytes = serde_json::to_vec(&chat).unwrap_or_default();
    drop(chat);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(chat_bytes.len()));
    // The chat request keeps this request's id (a generated one included).
    if let Ok(v) = HeaderValue::from_str(&rid) {
        parts.headers.insert("x-request-id", v);
    }
    let chat_request = Request::from_parts(parts, Body::from(chat_bytes));
    let response = handle(app, ClientOp::Chat, chat_request).await;
    if !response.status().is_success() {
        return response;
    }
    let response_id = crate::responses::new_id("resp_");
    let is_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if is_stream {
        let translator = crate::responses::StreamTranslator::new(echo, response_id);
        return Response::from_parts(parts, Body::from_stream(translate_stream(body, translator)));
    }
    let bad_gateway = |m: &str| {
        with_id(
            ApiError::new(StatusCode::BAD_GATEWAY, "upstream_invalid_response", m)
                .into_response(dialect),
        )
    };
    let Ok(bytes) = axum::body::to_bytes(body, MAX_TRANSLATED_RESPONSE_BYTES).await else {
        return bad_gateway("the provider's answer could not be read for translation");
    };
    let Ok(chat) = serde_json::from_slice::<Value>(&bytes) else {
        return bad_gateway("the provider's answer is not valid JSON");
    };
    let object = crate::responses::from_chat(&chat, &echo, &response_id);
    let body = serde_json::to_vec(&object).unwrap_or_default();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}

/// The chat SSE body translated event by event. After the terminal event the rest of the
/// chat stream is still read to its end (so the dispatcher settles it as complete, not as a
/// client that hung up); a broken chat stream ends with `response.failed`.
fn translate_stream(
    body: Body,
    translator: crate::responses::StreamTranslator,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::convert::Infallible>> {
    use futures::StreamExt as _;
    let upstream = body.into_data_stream();
    futures::stream::unfold(Some((upstream, translator)), |state| async move {
        let (mut upstream, mut tr) = state?;
        loop {
            match upstream.next().await {
                Some(Ok(chunk)) => {
                    if tr.is_finished() {
                        continue;
                    }
                    let out = tr.push(&chunk);
                    if !out.is_empty() {
                        return Some((Ok(bytes::Bytes::from(out)), Some((upstream, tr))));
                    }
                }
                Some(Err(_)) | None => {
                    let out = tr.finish();
                    if out.is_empty() {
                        return None;
                    }
                    return Some((Ok(bytes::Bytes::from(out)), None));
                }
            }
        }
    })
}

async fn chat(State(app): State<Arc<App>>, request: Request) -> Response {
    handle(app, ClientOp::Chat, request).await
}

async fn messages(State(app): State<Arc<App>>, request: Request) -> Response {
    handle(app, ClientOp::Messages, request).await
}

async fn embeddings(State(app): State<Arc<App>>, request: Request) -> Response {
    handle(app, ClientOp::Embeddings, request).await
}

async fn rerank(State(app): State<Arc<App>>, request: Request) -> Response {
    handle(app, ClientOp::Rerank, request).await
}

async fn transcriptions(State(app): State<Arc<App>>, request: Request) -> Response {
    handle(app, ClientOp::Transcription, request).await
}

/// A fresh request id: 128 random bits in hex.
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()))
}

fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        // The auth scheme is case-insensitive (RFC 9110 §11.1): `Bearer`, `bearer`, `BEARER`.
        let (scheme, token) = v.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| token.trim());
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

async fn handle(app: Arc<App>, op: ClientOp, request: Request) -> Response {
    let dialect = op.dialect();
    let rid = request_id(request.headers());
    let with_id = |mut r: Response| {
        if let Ok(v) = HeaderValue::from_str(&rid) {
            r.headers_mut().insert("x-request-id", v);
        }
        r
    };
    let idempotency_key = request
        .headers()
        .get(crate::idempotency::HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match prepare(&app, op, request, rid.clone()).await {
        Ok((route, req)) => match idempotency_key {
            None => dispatch(app, route, req).await,
            Some(key) if key.is_empty() || key.len() > crate::idempotency::MAX_KEY_BYTES => {
                let e = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!(
                        "the Idempotency-Key header must hold 1 to {} bytes",
                        crate::idempotency::MAX_KEY_BYTES
                    ),
                );
                with_id(e.into_response(dialect))
            }
            Some(key) => {
                let tenant = req
                    .tenant
                    .as_ref()
                    .map_or_else(|| "anonymous".to_owned(), |t| t.key.clone());
                let streamed = req.stream;
                match app.idempotency.claim(&tenant, &key, req.fingerprint).await {
                    crate::idempotency::Claim::Reused => {
                        let e = ApiError::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "idempotency_key_reused",
                            "this Idempotency-Key was used for a different request (endpoint or body)",
                        );
                        with_id(e.into_response(dialect))
                    }
                    crate::idempotency::Claim::Replay(r) => with_id(r),
                    crate::idempotency::Claim::Conflict => {
                        let e = ApiError::new(
                            StatusCode::CONFLICT,
                            "idempotency_key_in_use",
                            "a request with this Idempotency-Key is in flight or was a stream; it is not sent again",
                        );
                        with_id(e.into_response(dialect))
                    }
                    crate::idempotency::Claim::Run(permit) => {
                        let app2 = app.clone();
                        let response = dispatch(app, route, req).await;
                        app2.idempotency.finish(permit, response, streamed).await
                    }
                }
            }
        },
        Err(e) => {
            app.metrics
                .requests
                .get_or_create(&crate::metrics::RouteOutcome {
                    route: String::new(),
                    outcome: e.code.clone(),
                })
                .inc();
            with_id(e.into_response(dialect))
        }
    }
}

/// Step 1 of the request path: authenticate, read and parse the body, find the route.
async fn prepare(
    app: &App,
    op: ClientOp,
    request: Request,
    request_id: String,
) -> Result<(usize, ClientRequest), ApiError> {
    let (parts, body) = request.into_parts();
    let live = app.runtime.live();
    let tenant = authenticate(app, &live.table, &parts.headers)?;
    let bytes = read_body(
        &parts.headers,
        Body::new(body),
        app.max_body_bytes,
        app.serve.body_read_timeout,
    )
    .await?;
    let invalid = |e: serde_json::Error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("the request body is not valid: {e}"),
        )
    };
    let mut audio_seconds = 0.0;
    let (body, model, stream, client_wants_usage) = match op {
        ClientOp::Chat => {
            let r: openai::ChatRequest = serde_json::from_slice(&bytes).map_err(invalid)?;
            let wants = r.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
            let (model, stream) = (r.model.clone(), r.is_stream());
            (ClientBody::Chat(Box::new(r)), model, stream, wants)
        }
        ClientOp::Messages => {
            let r: anthropic::MessagesRequest = serde_json::from_slice(&bytes).map_err(invalid)?;
            let (model, stream) = (r.model.clone(), r.is_stream());
            (ClientBody::Messages(Box::new(r)), model, stream, true)
        }
        ClientOp::Embeddings | ClientOp::Rerank => {
            let v: serde_json::Map<String, Value> =
                serde_json::from_slice(&bytes).map_err(invalid)?;
            let model = match v.get("model") {
                Some(Value::String(m)) => m.clone(),
                Some(_) => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_request",
                        "the request body is not valid: `model` must be a string",
                    ));
                }
                None => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_request",
                        "the request body is not valid: missing field `model`",
                    ));
                }
            };
            (ClientBody::Json(v), model, false, false)
        }
        ClientOp::Transcription => {
            let content_type = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            let (v, seconds) = crate::transcription::parse(content_type, bytes.clone()).await?;
            audio_seconds = seconds;
            let model = v
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            (ClientBody::Json(v), model, false, false)
        }
    };
    let Some(&route_index) = live.table.by_model.get(&model) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("the model {:?} does not exist", shown(&model)),
        ));
    };
    let route = &live.table.routes[route_index];
    let endpoint_fits = matches!(
        (op, route.service_type),
        (ClientOp::Chat | ClientOp::Messages, ServiceType::Chat)
            | (ClientOp::Embeddings, ServiceType::Embedding)
            | (ClientOp::Rerank, ServiceType::Rerank)
            | (ClientOp::Transcription, ServiceType::Transcription)
    );
    if !endpoint_fits {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "wrong_endpoint_for_model",
            format!(
                "the model {model:?} is a {} model and is not served on this endpoint",
                match route.service_type {
                    ServiceType::Chat => "chat",
                    ServiceType::Embedding => "embedding",
                    ServiceType::Rerank => "rerank",
                    ServiceType::Transcription => "transcription",
                }
            ),
        ));
    }
    check_body(&body)?;
    // A limit that cannot be built is never silently dropped: the route or tenant declaring
    // it takes no traffic until it is fixed (issue 12 item 8).
    let unenforceable = route
        .limit_problems
        .first()
        .or_else(|| tenant.as_ref().and_then(|t| t.limit_problems.first()));
    if let Some(problem) = unenforceable {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "quota_config_invalid",
            format!(
                "a configured limit cannot be enforced ({problem}); the request is refused until the configuration is fixed"
            ),
        ));
    }
    if let Some(t) = &tenant
        && !t.may_use(&route.name)
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "route_not_allowed",
            format!("this API key may not use the model {model:?}"),
        ));
    }
    let project_header = parts
        .headers
        .get(route.affinity_header.as_str())
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty());
    // Project keys are held in the pin cache; a bound keeps one request from pinning kilobytes.
    if project_header.is_some_and(|v| v.len() > MAX_PROJECT_KEY_BYTES) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "the {} header is longer than {MAX_PROJECT_KEY_BYTES} bytes",
                route.affinity_header
            ),
        ));
    }
    let project = project_header
        .map(str::to_owned)
        .or_else(|| tenant.as_ref().map(|t| t.key.clone()))
        .unwrap_or_else(|| "anonymous".to_owned());
    let modalities = crate::request::required_modalities(op, &body);
    // Estimate (step 2): tokenizer count, corrected by the route's learned ratio; the output
    // allowance from the request or the route's default. Spend is priced per provider.
    let params = crate::estimate::EstimateParams {
        default_output_tokens: u64::from(route.default_max_tokens),
        pricing: crate::wire::usage::Pricing::default(),
        ratio: app.calibrations.ratio(&route.key),
    };
    let (body, estimate) = if !live.table.needs_tokens {
        // Nothing configured counts tokens: no tokenizer walk (and no vocabulary in memory).
        (body, crate::estimate::Estimate::default())
    } else if op == ClientOp::Transcription {
        // Audio is estimated from its duration, not walked by the tokenizer.
        let prompt = match &body {
            ClientBody::Json(map) => map.get("prompt").and_then(Value::as_str),
            _ => None,
        };
        let estimate = crate::transcription::estimate(audio_seconds, prompt);
        (body, estimate)
    } else {
        estimate_off_runtime(app, op, body, bytes.len(), params).await?
    };
    let estimated_input_tokens = estimate.input_tokens;
    let output_allowance = estimate.output_tokens;
    Ok((
        route_index,
        ClientRequest {
            op,
            body,
            stream,
            client_wants_usage,
            project,
            tenant,
            request_id,
            modalities,
            estimated_input_tokens,
            output_allowance,
            estimate,
            fingerprint: xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, op as u64),
            dropped: Default::default(),
            trace: crate::request::TraceHeaders::from_request(&parts.headers),
        },
    ))
}

/// Reads a request body with its three distinct failures (issue 12 item 3): 413 only when it
/// is larger than `max` (a `Content-Length` above it is refused before reading), 400 when the
/// framing is broken (a bad chunk size, a body shorter than its `Content-Length`), 408 when
/// it stops arriving for `timeout` in all.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max: usize,
    timeout: Duration,
) -> Result<bytes::Bytes, ApiError> {
    use futures::StreamExt as _;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the request body exceeds {max} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request body did not arrive within {} s",
                        timeout.as_secs_f64()
                    ),
                ));
            }
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Ok(chunk))) => {
                if buf.len().saturating_add(chunk.len()) > max {
                    return Err(too_large());
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(Some(Err(e))) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("the request body is malformed: {e}"),
                ));
            }
        }
    }
}

/// Bodies up to this size are estimated on the handler's task (≤ ~20 µs per 4 KB); larger ones
/// on tokio's blocking pool, so that tokenizing up to [`crate::estimate::EXACT_BUDGET_BYTES`]
/// of text never holds a runtime worker that other connections (and `/healthz`) need.
pub const INLINE_ESTIMATE_MAX_BYTES: usize = 64 * 1024;

/// Step 2 of the request path, off the runtime for large bodies: at most
/// [`App::estimators`] estimates run on the blocking pool at once (one per core), the others
/// wait for a permit without holding a thread.
async fn estimate_off_runtime(
    app: &App,
    op: ClientOp,
    body: ClientBody,
    body_bytes: usize,
    params: crate::estimate::EstimateParams,
) -> Result<(ClientBody, crate::estimate::Estimate), ApiError> {
    if body_bytes <= INLINE_ESTIMATE_MAX_BYTES {
        let estimate = estimate_body(op, &body, body_bytes, &params);
        return Ok((body, estimate));
    }
    let internal = || {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error while estimating the request",
        )
    };
    let _permit = app.estimators.acquire().await.map_err(|_| internal())?;
    tokio::task::spawn_blocking(move || {
        let estimate = estimate_body(op, &body, body_bytes, &params);
        (body, estimate)
    })
    .await
    .map_err(|_| internal())
}

/// The estimate of a parsed body (tokenizer walk; rerank: about four bytes per token).
fn estimate_body(
    op: ClientOp,
    body: &ClientBody,
    body_bytes: usize,
    params: &crate::estimate::EstimateParams,
) -> crate::estimate::Estimate {
    match body {
        ClientBody::Chat(r) => crate::estimate::estimate_openai_chat(r, params),
        ClientBody::Messages(r) => crate::estimate::estimate_anthropic_messages(r, params),
        ClientBody::Json(map) => {
            match serde_json::from_value::<openai::EmbeddingsRequest>(Value::Object(map.clone())) {
                Ok(e) if op == ClientOp::Embeddings => {
                    crate::estimate::estimate_openai_embeddings(&e, params)
                }
                // Rerank: no tokenizer walk; about four bytes per token.
                _ => {
                    let raw = u64::try_from(body_bytes / 4).unwrap_or(u64::MAX);
                    crate::estimate::Estimate {
                        raw_input_tokens: raw,
                        input_tokens: raw,
                        ..Default::default()
                    }
                }
            }
        }
    }
}

/// A client-supplied name as echoed in an error message: at most 256 bytes (cut at a
/// character boundary, marked with `…`), so a megabyte of model name is not sent back.
fn shown(name: &str) -> std::borrow::Cow<'_, str> {
    const MAX: usize = 256;
    if name.len() <= MAX {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut cut = MAX;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &name[..cut]))
}

/// Largest output cap (`max_tokens`, `max_completion_tokens`) forwarded: above every current
/// model's output limit (128 k), far below values that would saturate a reservation.
pub const MAX_OUTPUT_TOKENS: u64 = 1_000_000;
/// Largest `n` (choices) forwarded: OpenAI's own limit.
pub const MAX_CHOICES: u32 = 128;
/// Largest embeddings `dimensions` forwarded (text-embedding-3-large has 3072).
pub const MAX_EMBEDDING_DIMENSIONS: u64 = 65_536;

/// Rejects what the providers' own APIs would reject before anything is sent: an empty
/// conversation, an output cap of zero or out of range, `n` or `dimensions` out of range.
fn check_body(body: &ClientBody) -> Result<(), ApiError> {
    let invalid = |m: &str| Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", m));
    match body {
        ClientBody::Chat(r) => {
            if r.messages.is_empty() {
                return invalid("`messages` must contain at least one message");
            }
            if r.output_cap() == Some(0) {
                return invalid("`max_tokens` / `max_completion_tokens` must be at least 1");
            }
            if r.output_cap().is_some_and(|c| c > MAX_OUTPUT_TOKENS) {
                return invalid(&format!(
                    "`max_tokens` / `max_completion_tokens` must be at most {MAX_OUTPUT_TOKENS}"
                ));
            }
            if r.n.is_some_and(|n| !(1..=MAX_CHOICES).contains(&n)) {
                return invalid(&format!("`n` must be from 1 to {MAX_CHOICES}"));
            }
        }
        ClientBody::Messages(r) => {
            if r.messages.is_empty() {
                return invalid("`messages` must contain at least one message");
            }
            if r.max_tokens == 0 {
                return invalid("`max_tokens` must be at least 1");
            }
            if r.max_tokens > MAX_OUTPUT_TOKENS {
                return invalid(&format!("`max_tokens` must be at most {MAX_OUTPUT_TOKENS}"));
            }
        }
        ClientBody::Json(map) => {
            if let Some(d) = map.get("dimensions").filter(|d| !d.is_null())
                && !d
                    .as_u64()
                    .is_some_and(|d| (1..=MAX_EMBEDDING_DIMENSIONS).contains(&d))
            {
                return invalid(&format!(
                    "`dimensions` must be an integer from 1 to {MAX_EMBEDDING_DIMENSIONS}"
                ));
            }
        }
    }
    Ok(())
}

/// Loads the tokenizer's vocabulary on the blocking pool when the current configuration
/// needs token estimates and it is not loaded yet (`/readyz` waits for it). Idempotent; called
/// at start and after every configuration change.
pub fn warm_if_needed(app: &App) {
    if app.runtime.live().table.needs_tokens && !crate::estimate::is_loaded() {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(crate::estimate::warm_up)),
            // Outside a runtime (a synchronous caller): load it here.
            Err(_) => crate::estimate::warm_up(),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves.
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let pump = tokio::spawn(app.broker.clone().run_pump(app.clock));
    let signals = tokio::spawn(crate::signals::run(app.clone()));
    let sampler = app
        .serve
        .ui
        .then(|| tokio::spawn(crate::ui::run_sampler(app.clone())));
    // Load the tokenizer's vocabulary now rather than in the first request that needs it,
    // and only when the configuration counts tokens (a later configuration that does loads
    // it in `warm_if_needed`); ready after.
    warm_if_needed(&app);
    let options = app.serve.clone();
    let served = accept_loop(listener, router(app), &options, shutdown).await;
    pump.abort();
    signals.abort();
    if let Some(s) = sampler {
        s.abort();
    }
    served
}

/// The HTTP/1.1 server (hyper) with the connection-level protections of [`ServeOptions`]
/// (connections on [`ServeOptions::io_threads`] shards, see [`crate::shards`]):
/// at most `max_connections` at once (further clients wait in the listen backlog), a deadline
/// for the request head (which hyper also applies to the wait for the next request on a
/// keep-alive connection, so it is the idle timeout as well), and a graceful stop: on
/// `shutdown` no new connection is accepted, idle ones close, and in-flight requests finish.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    options: &ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(tokio::sync::Semaphore::new(options.max_connections.max(1)));
    let shards = match options.io_threads {
        0 => None,
        n => Some(crate::shards::Shards::start(n)?),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        while conns.try_join_next().is_some() {}
        let permit = tokio::select! {
            () = &mut shutdown => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "failed to accept a client connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Without TCP_NODELAY a streamed response, written in several small writes, waits for
        // the client's delayed ACK (40 ms on Linux) after its first write (docs/benchmarks.md).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "failed to set TCP_NODELAY on a client connection");
        }
        // The accepted socket is registered with the reactor of the runtime that accepted it.
        // A connection served on a shard must be registered with the shard's own reactor:
        // otherwise every readiness event of the client socket is seen by the shared runtime's
        // I/O driver, which then wakes the shard through its eventfd (a thread hop and two
        // context switches per event; 7.7 % of the router's samples in the 2026-12-07 profile,
        // docs/profile.md). `into_std` deregisters it; `from_std` on the shard registers it there.
        let stream = if shards.is_none() {
            ClientSocket::Registered(stream)
        } else {
            match stream.into_std() {
                Ok(std) => ClientSocket::Detached(std),
                Err(e) => {
                    tracing::warn!(error = %e, "failed to detach a client connection from the acceptor");
                    continue;
                }
            }
        };
        let app = app.clone();
        let mut stop = stop_rx.clone();
        let header_timeout = options.header_read_timeout;
        let connection = async move {
            let _permit = permit;
            let stream = match stream.register() {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "failed to register a client connection on its shard");
                    return;
                }
            };
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let mut app = app.clone();
                    async move { tower::Service::call(&mut app, request.map(Body::new)).await }
                });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            // hyper's own answers to unparseable heads (400, 414, 431) get a JSON body.
            let io = crate::protocol_errors::JsonProtocolErrors::new(stream);
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "client connection ended with an error");
                    }
                    return;
                }
                _ = stop.wait_for(|s| *s) => {}
            }
            conn.as_mut().graceful_shutdown();
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        };
        match &shards {
            Some(shards) => conns.spawn_on(connection, shards.next()),
            None => conns.spawn(connection),
        };
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
    drop(shards);
    Ok(())
}

/// An accepted client socket on its way to the runtime that serves it.
enum ClientSocket {
    /// Registered with the accepting runtime's reactor, served there (no shards).
    Registered(tokio::net::TcpStream),
    /// Deregistered (non-blocking, as `into_std` leaves it), to be registered by the shard.
    Detached(std::net::TcpStream),
}

impl ClientSocket {
    /// The socket registered with the current runtime's reactor.
    ///
    /// # Errors
    /// The reactor refused the registration (e.g. out of memory for the epoll entry).
    fn register(self) -> std::io::Result<tokio::net::TcpStream> {
        match self {
            ClientSocket::Registered(stream) => Ok(stream),
            ClientSocket::Detached(std) => tokio::net::TcpStream::from_std(std),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn call(router: Router, path: &str) -> (StatusCode, Value) {
        let request = axum::http::Request::post(path).body(Body::empty()).unwrap();
        let response = tower::ServiceExt::oneshot(router, request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_panic_answers_500_in_the_endpoints_dialect() {
        async fn boom() -> &'static str {
            panic!("handler bug")
        }
        let router = Router::new()
            .route("/v1/messages", post(boom))
            .route("/v1/chat/completions", post(boom))
            .layer(axum::middleware::from_fn(catch_panics));
        let (status, body) = call(router.clone(), "/v1/messages").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["type"], json!("error"), "{body}");
        assert_eq!(body["error"]["type"], json!("api_error"), "{body}");
        let (status, body) = call(router, "/v1/chat/completions").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["code"], json!("internal"), "{body}");
    }

    #[test]
    fn shown_cuts_long_names_at_a_character_boundary() {
        assert_eq!(shown("gpt-4o"), "gpt-4o");
        let long = "é".repeat(200);
        let cut = shown(&long);
        assert!(cut.len() <= 256 + "…".len());
        assert!(cut.ends_with('…'));
    }
}
