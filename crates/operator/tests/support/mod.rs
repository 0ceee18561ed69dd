//! Test support: a fake Kubernetes API server and fake router replicas, both axum on loopback.
//!
//! The fake API server (STYLE pattern 6) keeps objects in memory and answers the calls the
//! operator makes the way the real one does: list and watch of a collection (watch events as
//! JSON lines, held open), get, `PATCH .../status` (the apply body's `status` replaces the
//! stored one, the resourceVersion moves, a `MODIFIED` event goes out), `POST` into a
//! collection (Events). Every request is recorded (method, path, query, JSON body) for the
//! tests to assert on. Tests change objects with [`FakeApi::put`], which bumps
//! `metadata.generation` when the spec changes, as the API server does.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// One request the fake API server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Option<Value>,
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<String, Value>,
    rv: u64,
    log: Vec<Recorded>,
    created: u64,
    /// Field manager owning `spec.holderIdentity` of a Lease, by object path (server-side
    /// apply's conflict rule, the one leader election relies on).
    holders: BTreeMap<String, String>,
    /// Collection paths whose list and watch are refused with 403 (an RBAC gap).
    forbidden: std::collections::BTreeSet<String>,
    /// Collection paths whose list answers only after a delay (a slow first sync).
    slow: BTreeMap<String, std::time::Duration>,
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<(String, String, Value)>,
}

/// A fake API server on loopback.
pub struct FakeApi {
    pub addr: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The REST path of an object (`apiVersion`, `kind`, namespace, name).
pub fn object_path(value: &Value) -> String {
    let api_version = value["apiVersion"].as_str().unwrap();
    let kind = value["kind"].as_str().unwrap();
    let ns = value["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = value["metadata"]["name"].as_str().unwrap();
    let plural = match kind {
        "LLMProvider" => "llmproviders",
        "RoutingPolicy" => "routingpolicies",
        "TenantQuota" => "tenantquotas",
        "Secret" => "secrets",
        "EndpointSlice" => "endpointslices",
        other => panic!("fake API: unknown kind {other}"),
    };
    let prefix = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    format!("{prefix}/namespaces/{ns}/{plural}/{name}")
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(p, _)| p)
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message": format!("{what} not found"),"reason":"NotFound","code":404}),
        ),
    )
        .into_response()
}

fn conflict(reason: &str, code: u16, message: &str) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        axum::Json(
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
            "message": message,"reason": reason,"code": code}),
        ),
    )
        .into_response()
}

fn query_value<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then_some(v)
    })
}

fn matches_labels(obj: &Value, selector: Option<&str>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let selector = selector.replace("%3D", "=").replace("%2F", "/");
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return true;
        };
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

async fn handle(
    State(s): State<Shared>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok()
    };
    let watch = query_value(&query, "watch") == Some("true");
    {
        let mut inner = s.inner.lock().unwrap();
        inner.log.push(Recorded {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            body: json_body.clone(),
        });
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/namespaces/ns/plural = 5 segments; /apis/g/v/namespaces/ns/plural = 6.
    let collection_len = if segments.first() == Some(&"api") {
        5
    } else {
        6
    };
    let is_collection = segments.len() == collection_len;
    let is_object = segments.len() == collection_len + 1;
    let is_status = segments.len() == collection_len + 2 && segments.last() == Some(&"status");
    let selector = query_value(&query, "labelSelector").map(str::to_owned);

    if method == Method::GET && is_collection && s.inner.lock().unwrap().forbidden.contains(&path) {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(json!({"kind":"Status","apiVersion":"v1","metadata":{},
                "status":"Failure","reason":"Forbidden","code":403,
                "message": format!("secrets is forbidden: User \"system:serviceaccount:{NS}:switchyard\" cannot list resource \"secrets\" in API group \"\" in the namespace \"{NS}\"")})),
        )
            .into_response();
    }
    let delay = (!watch)
        .then(|| s.inner.lock().unwrap().slow.get(&path).copied())
        .flatten();
    if method == Method::GET
        && is_collection
        && let Some(delay) = delay
    {
        tokio::time::sleep(delay).await;
    }
    if method == Method::GET && is_collection && watch {
        let mut rx = s.events.subscribe();
        let collection = path.clone();
        let stream = async_stream(move |tx| async move {
            loop {
                match rx.recv().await {
                    Ok((coll, kind, obj)) if coll == collection => {
                        let line = format!("{}\n", json!({"type": kind, "object": obj}));
                        if tx.send(Ok(Bytes::from(line))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        return Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap();
    }
    if method == Method::GET && is_collection {
        let inner = s.inner.lock().unwrap();
        let items: Vec<Value> = inner
            .objects
            .iter()
            .filter(|(p, o)| parent(p) == path && matches_labels(o, selector.as_deref()))
            .map(|(_, o)| o.clone())
            .collect();
        return axum::Json(json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": inner.rv.to_string()},
            "items": items,
        }))
        .into_response();
    }
    if method == Method::GET && is_object {
        let inner = s.inner.lock().unwrap();
        return match inner.objects.get(&path) {
            Some(o) => axum::Json(o.clone()).into_response(),
            None => not_found(&path),
        };
    }
    if method == Method::PATCH && is_status {
        let object_path = parent(&path).to_owned();
        let mut inner = s.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        let Some(obj) = inner.objects.get_mut(&object_path) else {
            return not_found(&object_path);
        };
        if let Some(status) = json_body.as_ref().and_then(|b| b.get("status")) {
            obj["status"] = status.clone();
        }
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let obj = obj.clone();
        let _ = s.events.send((
            parent(&object_path).to_owned(),
            "MODIFIED".into(),
            obj.clone(),
        ));
        return axum::Json(obj).into_response();
    }
    if method == Method::POST && is_collection {
        let mut inner = s.inner.lock().unwrap();
        inner.created += 1;
        let mut obj = json_body.unwrap_or(json!({}));
        if obj["metadata"]["name"].is_null() {
            obj["metadata"]["name"] = json!(format!("created-{}", inner.created));
        }
        if path.ends_with("/leases") {
            let object_path = format!("{path}/{}", obj["metadata"]["name"].as_str().unwrap());
            if inner.objects.contains_key(&object_path) {
                return conflict("AlreadyExists", 409, "lease already exists");
            }
            inner.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            inner.objects.insert(object_path, obj.clone());
        }
        return (StatusCode::CREATED, axum::Json(obj)).into_response();
    }
    if method == Method::PATCH && is_object && path.contains("/leases/") {
        let apply = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("apply-patch"));
        let manager = query_value(&query, "fieldManager").unwrap_or("").to_owned();
        let body = json_body.unwrap_or(json!({}));
        let mut inner = s.inner.lock().unwrap();
        let Some(mut obj) = inner.objects.get(&path).cloned() else {
            return not_found(&path);
        };
        let wanted_holder = body["spec"]["holderIdentity"].clone();
        let current_holder = obj["spec"]["holderIdentity"].clone();
        if apply
            && wanted_holder.is_string()
            && current_holder.is_string()
            && wanted_holder != current_holder
            && inner
                .holders
                .get(&path)
                .is_some_and(|owner| *owner != manager)
        {
            return conflict(
                "Conflict",
                409,
                "Apply failed with 1 conflict: conflict with another manager over .spec.holderIdentity",
            );
        }
        if let Some(spec) = body["spec"].as_object() {
            for (k, v) in spec {
                if v.is_null() {
                    if let Some(m) = obj["spec"].as_object_mut() {
                        m.remove(k);
                    }
                    if k == "holderIdentity" {
                        inner.holders.remove(&path);
                    }
                } else {
                    obj["spec"][k] = v.clone();
                    if k == "holderIdentity" {
                        inner.holders.insert(path.clone(), manager.clone());
                    }
                }
            }
        }
        inner.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        inner.objects.insert(path.clone(), obj.clone());
        return axum::Json(obj).into_response();
    }
    not_found(&format!("{method} {path}"))
}

/// A body stream fed by a task through a channel.
fn async_stream<F, Fut>(
    f: F,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(f(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item, rx))
    })
}

impl FakeApi {
    /// Starts an empty fake API server.
    pub async fn start() -> FakeApi {
        let (events, _) = broadcast::channel(1024);
        let shared = Shared {
            inner: Arc::new(Mutex::new(Inner::default())),
            events,
        };
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeApi { addr, shared, task }
    }

    /// Refuses (`true`) or allows again the list and watch of a collection path, such as
    /// `/api/v1/namespaces/{NS}/secrets`, with 403 Forbidden.
    pub fn forbid(&self, collection: &str, refused: bool) {
        let mut inner = self.shared.inner.lock().unwrap();
        if refused {
            inner.forbidden.insert(collection.to_owned());
        } else {
            inner.forbidden.remove(collection);
        }
    }

    /// Delays every list (not watch) of a collection path by `delay`.
    pub fn slow_list(&self, collection: &str, delay: std::time::Duration) {
        self.shared
            .inner
            .lock()
            .unwrap()
            .slow
            .insert(collection.to_owned(), delay);
    }

    /// A kube client talking to this server, default namespace `default`.
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        config.default_namespace = "default".into();
        kube::Client::try_from(config).unwrap()
    }

    /// Creates or replaces an object (as `kubectl apply` would): resourceVersion moves,
    /// generation starts at 1 and grows when the spec changes; status is kept.
    pub fn put(&self, mut value: Value) {
        let path = object_path(&value);
        let mut inner = self.shared.inner.lock().unwrap();
        inner.rv += 1;
        let rv = inner.rv;
        let previous = inner.objects.get(&path).cloned();
        let generation = match &previous {
            None => 1,
            Some(p) if p["spec"] != value["spec"] => {
                p["metadata"]["generation"].as_i64().unwrap_or(1) + 1
            }
            Some(p) => p["metadata"]["generation"].as_i64().unwrap_or(1),
        };
        let meta = &mut value["metadata"];
        if meta["namespace"].is_null() {
            meta["namespace"] = json!("default");
        }
        meta["resourceVersion"] = json!(rv.to_string());
        meta["generation"] = json!(generation);
        meta["uid"] = json!(format!("uid-{}", path.replace('/', "-")));
        if let Some(p) = &previous
            && value.get("status").is_none()
            && let Some(status) = p.get("status")
        {
            value["status"] = status.clone();
        }
        inner.objects.insert(path.clone(), value.clone());
        let kind = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let _ = self
            .shared
            .events
            .send((parent(&path).to_owned(), kind.into(), value));
    }

    /// The stored object at `path`.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.shared.inner.lock().unwrap().objects.get(path).cloned()
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Recorded> {
        self.shared.inner.lock().unwrap().log.clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_log(&self) {
        self.shared.inner.lock().unwrap().log.clear();
    }

    /// Requests other than reads (GET): what the operator wrote.
    pub fn writes(&self) -> Vec<Recorded> {
        self.log()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Status patches to `object_path` so far.
    pub fn status_patches(&self, object_path: &str) -> Vec<Recorded> {
        let want = format!("{object_path}/status");
        self.log()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path == want)
            .collect()
    }

    /// Waits until `check` holds for the stored object at `path`, up to `limit`.
    pub async fn wait_for(
        &self,
        path: &str,
        limit: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(v) = self.get(path)
                && check(&v)
            {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "timed out after {limit:?} waiting on {path}; object is {}",
                    serde_json::to_string_pretty(&self.get(path)).unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// The condition of `type_` in an object's status.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

// ---------------------------------------------------------------------------------------------
// Manifests
// ---------------------------------------------------------------------------------------------

pub const NS: &str = "team-a";

/// An LLMProvider serving `model`, with credentials in Secret `secret` (key `api-key`).
pub fn provider(name: &str, model: &str, secret: Option<&str>) -> Value {
    let mut spec = json!({
        "api": "openai",
        "endpoint": format!("https://{name}.example.com"),
        "region": "us-east-1",
        "models": [{"name": model}],
    });
    if let Some(secret) = secret {
        spec["credentials"] = json!({"secretRef": {"name": secret, "key": "api-key"}});
    }
    json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
}

/// A chat RoutingPolicy for `model` over `providers` in priority order.
pub fn policy(name: &str, model: &str, providers: &[&str]) -> Value {
    json!({
        "apiVersion": "switchyard.dev/v1alpha1", "kind": "RoutingPolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "model": model,
            "serviceType": "chat",
            "providers": providers.iter().map(|p| json!({"name": p})).collect::<Vec<_>>(),
        },
    })
}

/// A Secret with the given keys (values are placeholders).
pub fn secret(name: &str, keys: &[&str]) -> Value {
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|k| ((*k).to_owned(), json!("c2VjcmV0")))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": data,
    })
}

/// An EndpointSlice of Service `service` with ready endpoints at `addresses`, port `port`.
pub fn endpoint_slice(service: &str, addresses: &[&str], port: u16) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abc"), "namespace": NS,
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": addresses.iter().map(|a| json!({"addresses": [a], "conditions": {"ready": true}})).collect::<Vec<_>>(),
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    })
}

// ---------------------------------------------------------------------------------------------
// Fake routers
// ---------------------------------------------------------------------------------------------

/// A fake router replica serving a mutable `OutcomeReport` on `GET /outcomes`.
pub struct FakeRouter {
    pub addr: SocketAddr,
    report: Arc<Mutex<Value>>,
    down: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRouter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeRouter {
    /// Starts a replica named `replica` that started at `started_at` (RFC 3339) with no counters.
    pub async fn start(replica: &str, started_at: &str) -> FakeRouter {
        let report = Arc::new(Mutex::new(
            json!({"replica": replica, "startedAt": started_at, "providers": {}}),
        ));
        let shared = report.clone();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let is_down = down.clone();
        let app = Router::new().route(
            "/outcomes",
            axum::routing::get(move || {
                let r = shared.lock().unwrap().clone();
                let down = is_down.load(std::sync::atomic::Ordering::Relaxed);
                async move {
                    if down {
                        StatusCode::SERVICE_UNAVAILABLE.into_response()
                    } else {
                        axum::Json(r).into_response()
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeRouter {
            addr,
            report,
            down,
            task,
        }
    }

    /// Base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets one provider's cumulative counters.
    pub fn set(&self, provider: &str, successes: u64, errors: &[(&str, u64)]) {
        let errors: serde_json::Map<String, Value> = errors
            .iter()
            .map(|(c, n)| ((*c).to_owned(), json!(n)))
            .collect();
        self.report.lock().unwrap()["providers"][provider] =
            json!({"successes": successes, "errors": errors});
    }

    /// Makes the replica answer 503 (down) or serve again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::Relaxed);
    }

    /// Simulates a restart: new start time, counters cleared.
    pub fn restart(&self, started_at: &str) {
        let mut r = self.report.lock().unwrap();
        r["startedAt"] = json!(started_at);
        r["providers"] = json!({});
    }
}
