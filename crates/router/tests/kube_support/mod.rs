//! A fake Kubernetes API server at the HTTP level, enough for kube-runtime reflectors: list
//! and watch of LLMProviders, RoutingPolicies, TenantQuotas (group `switchyard.dev`) and
//! Secrets, namespaced or across namespaces, with a global `resourceVersion`, `generation`
//! that moves on spec changes only, status writes that do not move it, and watch events
//! (`ADDED`, `MODIFIED`, `DELETED`) streamed as newline-delimited JSON from the requested
//! version on.
//!
//! Faults: [`FakeApi::set_down`] answers every request with 503 and ends every open watch
//! (the API server is away); [`Endpoint::drop_events`] keeps one client's watches open but
//! silent (lost notifications; only a re-list repairs them). Each router gets its own
//! [`Endpoint`] (listener) on the same state, so faults can target one replica.
//!
//! Also: mock-provider-backed routers in Kubernetes mode and small request helpers.

#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use switchyard_router::kube_source::{KubeRouter, Options};
use tokio::time::Instant;

/// Namespace every test object lives in.
pub(crate) const NS: &str = "team-a";
/// Header carrying the project key.
pub(crate) const PROJECT: &str = "x-project-id";
/// Public model name of the chat routes.
pub(crate) const MODEL: &str = "chat-model";

#[derive(Debug, Default)]
struct Inner {
    rv: u64,
    uid: u64,
    /// (plural, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    /// Every event: (resourceVersion, plural, namespace, type, object).
    log: Vec<(u64, String, String, &'static str, Value)>,
}

#[derive(Debug)]
struct ApiState {
    inner: Mutex<Inner>,
    version: tokio::sync::watch::Sender<u64>,
    down: AtomicBool,
    /// Requests seen, by `METHOD path?watch`, for assertions.
    requests: Mutex<Vec<String>>,
}

/// The fake API server's shared state; listeners are added with [`FakeApi::endpoint`].
#[derive(Debug, Clone)]
pub(crate) struct FakeApi {
    state: Arc<ApiState>,
}

/// One listener on the fake API server.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    drop_events: Arc<AtomicBool>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// Keeps this listener's watches open but silent (events are lost for its client).
    pub(crate) fn drop_events(&self, on: bool) {
        self.drop_events.store(on, Ordering::SeqCst);
    }

    /// List requests (not watches) this listener answered so far.
    pub(crate) fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// A kube client pointed at this listener.
    pub(crate) fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        switchyard_router::kube_source::client(config).unwrap()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Ctx {
    api: FakeApi,
    drop_events: Arc<AtomicBool>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
}

fn kind_of(plural: &str) -> (&'static str, &'static str) {
    match plural {
        "llmproviders" => ("switchyard.dev/v1alpha1", "LLMProvider"),
        "routingpolicies" => ("switchyard.dev/v1alpha1", "RoutingPolicy"),
        "tenantquotas" => ("switchyard.dev/v1alpha1", "TenantQuota"),
        _ => ("v1", "Secret"),
    }
}

impl FakeApi {
    /// An empty API server.
    pub(crate) fn new() -> Self {
        let (version, _) = tokio::sync::watch::channel(0);
        FakeApi {
            state: Arc::new(ApiState {
                inner: Mutex::new(Inner::default()),
                version,
                down: AtomicBool::new(false),
                requests: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A new listener on loopback serving this state.
    pub(crate) async fn endpoint(&self) -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let drop_events = Arc::new(AtomicBool::new(false));
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ctx = Ctx {
            api: self.clone(),
            drop_events: drop_events.clone(),
            lists: lists.clone(),
        };
        let app = axum::Router::new().fallback(handle).with_state(ctx);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Endpoint {
            url: format!("http://{addr}"),
            drop_events,
            lists,
            task,
        }
    }

    /// Takes the API server away (503 everywhere, open watches end) or brings it back.
    pub(crate) fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
        self.state.version.send_modify(|v| *v += 0);
    }

    /// Requests seen so far (`GET /path [watch]`).
    pub(crate) fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Creates or replaces an object's spec (and data, for Secrets), keeping its status; the
    /// generation moves when the spec changed.
    pub(crate) fn apply(&self, plural: &str, name: &str, mut body: Value) {
        let (api_version, kind) = kind_of(plural);
        let mut inner = self.state.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        let key = (plural.to_owned(), NS.to_owned(), name.to_owned());
        let previous = inner.objects.get(&key).cloned();
        let (uid, generation, kind_of_event) = match &previous {
            Some(p) => {
                let same = p.get("spec") == body.get("spec") && p.get("data") == body.get("data");
                let g = p["metadata"]["generation"].as_i64().unwrap_or(1);
                (
                    p["metadata"]["uid"].as_str().unwrap().to_owned(),
                    if same { g } else { g + 1 },
                    "MODIFIED",
                )
            }
            None => {
                inner.uid += 1;
                (format!("uid-{}", inner.uid), 1, "ADDED")
            }
        };
        body["apiVersion"] = api_version.into();
        body["kind"] = kind.into();
        body["metadata"] = json!({
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": rv.to_string(),
            "generation": generation,
            "creationTimestamp": "2026-11-30T10:00:00Z",
        });
        if let Some(status) = previous.as_ref().and_then(|p| p.get("status"))
            && body.get("status").is_none()
        {
            body["status"] = status.clone();
        }
        inner.objects.insert(key, body.clone());
        inner
            .log
            .push((rv, plural.to_owned(), NS.to_owned(), kind_of_event, body));
        drop(inner);
        self.state.version.send_modify(|v| *v = rv);
    }

    /// Writes an object's status (the status subresource): the generation stays.
    pub(crate) fn set_status(&self, plural: &str, name: &str, status: Value) {
        let mut inner = self.state.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        let key = (plural.to_owned(), NS.to_owned(), name.to_owned());
        let object = inner.objects.get_mut(&key).expect("object exists");
        object["status"] = status;
        object["metadata"]["resourceVersion"] = rv.to_string().into();
        let object = object.clone();
        inner
            .log
            .push((rv, plural.to_owned(), NS.to_owned(), "MODIFIED", object));
        drop(inner);
        self.state.version.send_modify(|v| *v = rv);
    }

    /// Deletes an object.
    pub(crate) fn delete(&self, plural: &str, name: &str) {
        let mut inner = self.state.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        let key = (plural.to_owned(), NS.to_owned(), name.to_owned());
        if let Some(mut object) = inner.objects.remove(&key) {
            object["metadata"]["resourceVersion"] = rv.to_string().into();
            inner
                .log
                .push((rv, plural.to_owned(), NS.to_owned(), "DELETED", object));
        }
        drop(inner);
        self.state.version.send_modify(|v| *v = rv);
    }
}

/// `(plural, namespace filter)` of a list/watch path.
fn parse_path(path: &str) -> Option<(String, Option<String>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "secrets"] => {
            Some(("secrets".to_owned(), Some((*ns).to_owned())))
        }
        ["api", "v1", "secrets"] => Some(("secrets".to_owned(), None)),
        [
            "apis",
            "switchyard.dev",
            "v1alpha1",
            "namespaces",
            ns,
            plural,
        ] => Some(((*plural).to_owned(), Some((*ns).to_owned()))),
        ["apis", "switchyard.dev", "v1alpha1", plural] => Some(((*plural).to_owned(), None)),
        _ => None,
    }
}

fn status_body(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

async fn handle(
    State(ctx): State<Ctx>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    ctx.api.state.requests.lock().unwrap().push(format!(
        "GET {}{}",
        uri.path(),
        if watch { " watch" } else { "" }
    ));
    if ctx.api.state.down.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(status_body(503, "ServiceUnavailable")),
        )
            .into_response();
    }
    let Some((plural, ns)) = parse_path(uri.path()) else {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(status_body(404, "NotFound")),
        )
            .into_response();
    };
    let matches = move |p: &str, n: &str| p == plural && ns.as_deref().is_none_or(|ns| ns == n);
    if !watch {
        ctx.lists.fetch_add(1, Ordering::SeqCst);
        let inner = ctx.api.state.inner.lock().unwrap();
        let items: Vec<Value> = inner
            .objects
            .iter()
            .filter(|((p, n, _), _)| matches(p, n))
            .map(|(_, o)| o.clone())
            .collect();
        let (api_version, kind) = kind_of(
            parse_path(uri.path())
                .map(|(p, _)| p)
                .as_deref()
                .unwrap_or(""),
        );
        return axum::Json(json!({
            "apiVersion": api_version,
            "kind": format!("{kind}List"),
            "metadata": {"resourceVersion": inner.rv.to_string()},
            "items": items,
        }))
        .into_response();
    }
    let since: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = Duration::from_secs(
        query
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(290),
    );
    let state = ctx.api.state.clone();
    let drop_events = ctx.drop_events.clone();
    let stream = async_stream::stream! {
        let mut rx = state.version.subscribe();
        let end = Instant::now() + timeout;
        let mut sent = since;
        loop {
            if state.down.load(Ordering::SeqCst) {
                break;
            }
            let events: Vec<(u64, String)> = {
                let inner = state.inner.lock().unwrap();
                inner
                    .log
                    .iter()
                    .filter(|(rv, p, n, _, _)| *rv > sent && matches(p, n))
                    .map(|(rv, _, _, t, o)| (*rv, format!("{}\n", json!({"type": t, "object": o}))))
                    .collect()
            };
            for (rv, line) in events {
                sent = rv;
                if !drop_events.load(Ordering::SeqCst) {
                    yield Ok::<Bytes, std::io::Error>(Bytes::from(line));
                }
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { break },
                () = tokio::time::sleep_until(end) => break,
            }
        }
    };
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Standard base64 (RFC 4648, padded), for Secret `data`.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A Secret with one key.
pub(crate) fn secret(key: &str, value: &str) -> Value {
    json!({"type": "Opaque", "data": {key: base64(value.as_bytes())}})
}

/// An OpenAI-compatible LLMProvider at `endpoint` serving [`MODEL`] (text and audio),
/// credentials from Secret `<name>-key`, key `apiKey`.
pub(crate) fn provider(name: &str, endpoint: &str) -> Value {
    json!({"spec": {
        "api": "openai",
        "endpoint": endpoint,
        "credentials": {"secretRef": {"name": format!("{name}-key"), "key": "apiKey"}},
        "models": [{"name": MODEL, "modalities": ["text", "audio"]}],
        "circuitBreaker": {"consecutiveFailures": 1000},
        "healthCheck": {"enabled": true, "interval": "10s"},
    }})
}

/// A chat RoutingPolicy for [`MODEL`] over `providers` in priority order.
pub(crate) fn policy(providers: &[&str]) -> Value {
    json!({"spec": {
        "model": MODEL,
        "serviceType": "chat",
        "providers": providers.iter().map(|p| json!({"name": p})).collect::<Vec<_>>(),
        "affinity": {"header": PROJECT},
    }})
}

/// Mock providers by name, each with its own upstream key `sk-<name>`.
pub(crate) struct Mocks {
    pub(crate) handles: BTreeMap<String, switchyard_mock::MockHandle>,
}

impl Mocks {
    /// Starts one mock per name and declares each (Secret + LLMProvider) on `api`.
    pub(crate) async fn start(api: &FakeApi, names: &[&str]) -> Mocks {
        let mut handles = BTreeMap::new();
        for name in names {
            let handle = start_mock(name).await;
            declare(api, name, &handle);
            handles.insert((*name).to_owned(), handle);
        }
        Mocks { handles }
    }

    /// Upstream calls a mock received.
    pub(crate) fn calls(&self, name: &str) -> usize {
        self.handles[name].call_count()
    }
}

/// One mock provider that accepts only `sk-<name>`.
pub(crate) async fn start_mock(name: &str) -> switchyard_mock::MockHandle {
    switchyard_mock::MockProvider::start(switchyard_mock::MockConfig {
        name: name.to_owned(),
        api_keys: vec![format!("sk-{name}")],
        output_tokens: 4,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Declares the Secret and LLMProvider of a mock.
pub(crate) fn declare(api: &FakeApi, name: &str, handle: &switchyard_mock::MockHandle) {
    api.apply(
        "secrets",
        &format!("{name}-key"),
        secret("apiKey", &format!("sk-{name}")),
    );
    api.apply("llmproviders", name, provider(name, &handle.base_url()));
}

/// Router options with fast resync and debounce for tests, keys required (the default).
pub(crate) fn options(resync: Duration) -> Options {
    let mut o = Options::new(Some(NS.to_owned()), "127.0.0.1:0".parse().unwrap());
    o.resync = resync;
    o.debounce = Duration::from_millis(50);
    o
}

/// Starts a router on `endpoint` and waits until it is ready. It serves requests without a
/// key (`--allow-anonymous`): these tests are about the reflectors and the routing, and send
/// no key; authentication has its own test with the default options.
pub(crate) async fn router(endpoint: &Endpoint, resync: Duration) -> KubeRouter {
    let mut o = options(resync);
    o.serve.allow_anonymous = true;
    router_with(endpoint, o).await
}

/// Starts a router with `options` on `endpoint` and waits until it is ready.
pub(crate) async fn router_with(endpoint: &Endpoint, options: Options) -> KubeRouter {
    let router = KubeRouter::start(endpoint.client(), options).await.unwrap();
    let url = format!("http://{}/readyz", router.addr);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        assert!(Instant::now() < deadline, "router not ready within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    router
}

/// One chat request; returns (HTTP status, provider that served it).
pub(crate) async fn chat(router: &KubeRouter, project: &str, audio: bool) -> (u16, Option<String>) {
    let content = if audio {
        json!([{"type": "text", "text": "hi"},
               {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])
    } else {
        json!("hello there")
    };
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", router.addr))
        .header(PROJECT, project)
        .json(
            &json!({"model": MODEL, "messages": [{"role": "user", "content": content}],
                      "max_tokens": 8}),
        )
        .send()
        .await
        .unwrap();
    let provider = response
        .headers()
        .get("x-switchyard-provider")
        .and_then(|v| v.to_str().ok())
        // `namespace/name`; the tests name providers without their namespace.
        .map(|v| v.rsplit('/').next().unwrap_or(v).to_owned());
    let status = response.status().as_u16();
    let _ = response.bytes().await;
    (status, provider)
}

/// Providers serving `n` distinct projects' first requests, counted by name.
pub(crate) async fn spread(router: &KubeRouter, tag: &str, n: usize) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for i in 0..n {
        let (status, provider) = chat(router, &format!("{tag}-{i}"), false).await;
        assert_eq!(status, 200, "request {i} failed");
        *out.entry(provider.unwrap_or_default()).or_default() += 1;
    }
    out
}

/// `GET /status` as JSON.
pub(crate) async fn status(router: &KubeRouter) -> Value {
    reqwest::get(format!("http://{}/status", router.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The value of an unlabelled or labelled sample in `/metrics` (first line starting with
/// `prefix`).
pub(crate) async fn metric(router: &KubeRouter, prefix: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://{}/metrics", router.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `check` every 50 ms until it holds or `within` passes.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
