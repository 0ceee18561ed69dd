//! The upstream client against a local HTTP server: request shape per provider kind, error
//! statuses passed through, transport failures classified, one request per send, and
//! cancellation on drop.

// Test helpers outside #[test] fns are not covered by clippy.toml allow-*-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use switchyard_router::upstream::{Operation, ProviderKind, TransportError, UpstreamClient};
use switchyard_router::wire::sse::{SseItem, parse_stream};
use tokio::sync::mpsc;

#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>,
    hits: Arc<AtomicUsize>,
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn record(State(seen): State<Seen>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    seen.hits.fetch_add(1, Ordering::SeqCst);
    seen.requests
        .lock()
        .unwrap()
        .push((uri.path().to_owned(), headers, body));
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        "{\"ok\":true}",
    )
        .into_response()
}

fn client_with(kind: ProviderKind, addr: SocketAddr, total: Duration) -> UpstreamClient {
    UpstreamClient::direct(
        kind,
        &format!("http://{addr}"),
        "sk-test-123",
        switchyard_providers::adapter::Timeouts {
            connect: Duration::from_secs(2),
            total,
        },
    )
    .unwrap()
}

fn client(kind: ProviderKind, addr: SocketAddr) -> UpstreamClient {
    client_with(kind, addr, Duration::from_secs(10))
}

#[tokio::test]
async fn send_openai_chat_uses_bearer_auth_and_v1_path() {
    let seen = Seen::default();
    let app = Router::new()
        .fallback(post(record))
        .with_state(seen.clone());
    let addr = serve(app).await;
    let client = client(ProviderKind::OpenAi, addr);
    let body = Bytes::from_static(b"{\"model\":\"m\",\"messages\":[]}");
    let resp = client
        .send(Operation::ChatCompletions, "m", body.clone(), true)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(resp.collect(1024).await.unwrap(), "{\"ok\":true}");
    let reqs = seen.requests.lock().unwrap();
    let (path, headers, got) = &reqs[0];
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(headers["authorization"], "Bearer sk-test-123");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["accept"], "text/event-stream");
    assert!(headers.get("x-api-key").is_none());
    assert_eq!(got, &body);
}

#[tokio::test]
async fn send_openai_embeddings_and_rerank_use_their_paths() {
    let seen = Seen::default();
    let app = Router::new()
        .fallback(post(record))
        .with_state(seen.clone());
    let addr = serve(app).await;
    let client = client(ProviderKind::OpenAi, addr);
    for op in [Operation::Embeddings, Operation::Rerank] {
        client
            .send(op, "m", Bytes::from_static(b"{}"), false)
            .await
            .unwrap();
    }
    let paths: Vec<String> = seen
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(paths, vec!["/v1/embeddings", "/v1/rerank"]);
}

#[tokio::test]
async fn send_anthropic_messages_uses_api_key_and_version_headers() {
    let seen = Seen::default();
    let app = Router::new()
        .fallback(post(record))
        .with_state(seen.clone());
    let addr = serve(app).await;
    let client = client(ProviderKind::Anthropic, addr);
    client
        .send(Operation::Messages, "m", Bytes::from_static(b"{}"), false)
        .await
        .unwrap();
    let reqs = seen.requests.lock().unwrap();
    let (path, headers, _) = &reqs[0];
    assert_eq!(path, "/v1/messages");
    assert_eq!(headers["x-api-key"], "sk-test-123");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert!(headers.get("authorization").is_none());
}

#[tokio::test]
async fn send_error_status_is_returned_once_with_headers_not_retried() {
    let seen = Seen::default();
    let app = Router::new()
        .fallback(post(|State(seen): State<Seen>| async move {
            seen.hits.fetch_add(1, Ordering::SeqCst);
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "15")],
                "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"slow\"}}",
            )
        }))
        .with_state(seen.clone());
    let addr = serve(app).await;
    let client = client(ProviderKind::Anthropic, addr);
    let resp = client
        .send(Operation::Messages, "m", Bytes::from_static(b"{}"), false)
        .await
        .unwrap();
    assert_eq!(resp.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers["retry-after"], "15");
    assert_eq!(seen.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn send_closed_port_is_connect_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = client(ProviderKind::OpenAi, addr);
    let err = client
        .send(
            Operation::ChatCompletions,
            "m",
            Bytes::from_static(b"{}"),
            false,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, TransportError::Connect(_)), "{err:?}");
    assert_eq!(err.label(), "connect");
}

#[tokio::test]
async fn send_slow_provider_past_total_timeout_is_timeout_error() {
    let app = Router::new().fallback(post(|| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        "late"
    }));
    let addr = serve(app).await;
    let client = client_with(ProviderKind::OpenAi, addr, Duration::from_millis(200));
    let err = client
        .send(
            Operation::ChatCompletions,
            "m",
            Bytes::from_static(b"{}"),
            false,
        )
        .await
        .unwrap_err();
    assert_eq!(err, TransportError::Timeout);
}

/// Signals when the server-side body stream is dropped (the connection went away).
struct DropSignal(mpsc::UnboundedSender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

#[tokio::test]
async fn dropping_response_body_closes_upstream_stream() {
    let (tx, mut dropped) = mpsc::unbounded_channel::<()>();
    let app = Router::new().fallback(post(move || {
        let guard = DropSignal(tx.clone());
        async move {
            // An endless SSE stream: one content delta every 20 ms until the peer goes away.
            let body = futures::stream::unfold(guard, |guard| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let chunk = Bytes::from_static(
                    b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
                );
                Some((Ok::<_, std::io::Error>(chunk), guard))
            });
            ([("content-type", "text/event-stream")], Body::from_stream(body))
        }
    }));
    let addr = serve(app).await;
    let client = client(ProviderKind::Anthropic, addr);
    let resp = client
        .send(Operation::Messages, "m", Bytes::from_static(b"{}"), true)
        .await
        .unwrap();
    let mut events = Box::pin(parse_stream(resp.body));
    for _ in 0..3 {
        let item = events.next().await.unwrap().unwrap();
        assert!(matches!(item, SseItem::Event(_)));
    }
    drop(events);
    let closed = tokio::time::timeout(Duration::from_secs(5), dropped.recv()).await;
    assert!(
        closed.is_ok(),
        "upstream stream still running 5 s after the client dropped it"
    );
}

/// Peer ports of the connections requests arrived on, in arrival order.
async fn serve_recording_peers() -> (SocketAddr, Arc<Mutex<Vec<u16>>>) {
    use axum::extract::ConnectInfo;
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = peers.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(peer.port());
                ([("content-type", "application/json")], "{}")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    (addr, peers)
}

/// Sends one chat request through `client` and reads its body to the end.
async fn send_one(client: &UpstreamClient) {
    let r = client
        .send(
            Operation::ChatCompletions,
            "m",
            Bytes::from_static(b"{}"),
            false,
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let mut body = r.body;
    while body.next().await.is_some() {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_shard_sends_through_a_pool_of_its_own() {
    let (addr, peers) = serve_recording_peers().await;
    let client = client(ProviderKind::OpenAi, addr);
    // Twice from the shared runtime: one pooled connection, reused.
    send_one(&client).await;
    send_one(&client).await;
    // Twice from a thread marked as shard 0 with a runtime of its own, as the router's
    // connection shards are: a connection of the shard's, reused too.
    let on_shard = client.clone();
    tokio::task::spawn_blocking(move || {
        switchyard_router::upstream::enter_shard(0);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            send_one(&on_shard).await;
            send_one(&on_shard).await;
        });
    })
    .await
    .unwrap();
    // And the shared pool's connection is still the one the shared runtime uses.
    send_one(&client).await;
    let peers = peers.lock().unwrap().clone();
    assert_eq!(peers.len(), 5);
    assert_eq!(peers[0], peers[1], "the shared pool reuses its connection");
    assert_eq!(peers[2], peers[3], "the shard's pool reuses its connection");
    assert_ne!(peers[0], peers[2], "the shard got a connection of its own");
    assert_eq!(peers[4], peers[0], "the shared pool kept its connection");
}
