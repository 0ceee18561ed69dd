//! `Idempotency-Key`: a retried request is not sent upstream twice (issue 5, item 6).
//!
//! A client that times out and retries would otherwise pay twice and may act on two different
//! answers. With an `Idempotency-Key` header the router keeps, per tenant and key:
//! - while the first request is in flight, a marker: a second request with the same key waits
//!   for the first to finish and receives its answer (non-streaming), or is refused with 409
//!   `idempotency_key_in_use` (a stream cannot be replayed);
//! - after a successful non-streaming answer, the answer itself for a configurable time (the
//!   replay carries `x-switchyard-idempotent-replay: true`); after a stream, a marker for the
//!   same time (later requests with the key get 409); failed requests are forgotten, so the
//!   client may retry them with the same key.
//! - a fingerprint of the request (endpoint and body): the same key on a different request is
//!   refused with 422 `idempotency_key_reused` instead of being answered with another
//!   request's answer.
//!
//! Entries live in a bounded LRU (oldest evicted first) in each process. With Redis configured
//! ([`Idempotency::share_through`], issue 14) a key claimed here is also claimed in Redis, so
//! a retry that lands on another replica finds it: it waits while the first is in flight
//! anywhere (polling every 50 ms, at most [`SHARED_IN_FLIGHT`]), then replays the stored answer
//! or gets the same 409/422 as on one replica. Answers are stored in Redis for the replay time,
//! at most [`MAX_STORED_BYTES`] each; an in-flight marker expires after [`SHARED_IN_FLIGHT`],
//! so a replica that died mid-request holds the key no longer. While Redis is unreachable each
//! replica falls back to its own table (a retry elsewhere may then be sent again).
//! Keys are scoped by tenant, so one tenant's key never matches another's. Stored answers are
//! held in memory; the bound on entries and the per-answer size cap keep that in check.
//! Compared with the IETF draft "The Idempotency-Key HTTP Header Field": same header, same
//! in-flight conflict (409), same 422 for a key reused with another payload.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::watch;

use crate::state::lock;

/// Header carrying the client's key.
pub const HEADER: &str = "idempotency-key";

/// Longest accepted key, bytes.
pub const MAX_KEY_BYTES: usize = 256;

/// Largest answer kept for replay, bytes (larger answers are served but not kept).
pub const MAX_STORED_BYTES: usize = 1024 * 1024;

/// Entries kept at most.
const CAPACITY: usize = 10_000;

/// How long an in-flight marker lives in Redis, and how long a twin waits for it at most.
pub const SHARED_IN_FLIGHT: Duration = Duration::from_secs(300);

/// How often a twin looks again at a key in flight on another replica.
const SHARED_POLL: Duration = Duration::from_millis(50);

/// A stored answer.
#[derive(Debug, Clone)]
pub struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Stored {
    /// The replay response.
    pub fn replay(&self) -> Response {
        let mut r = Response::new(Body::from(self.body.clone()));
        *r.status_mut() = self.status;
        *r.headers_mut() = self.headers.clone();
        r.headers_mut().insert(
            "x-switchyard-idempotent-replay",
            HeaderValue::from_static("true"),
        );
        r
    }
}

#[derive(Debug)]
enum Entry {
    /// The first request is running; `None` until it finishes (dropped sender: it failed).
    InFlight(u64, watch::Receiver<Option<Arc<Stored>>>),
    /// Its answer, until `expires`.
    Done(u64, Arc<Stored>, tokio::time::Instant),
    /// It was a stream (started or served): nothing to replay, and not to be sent again.
    Streamed(u64, tokio::time::Instant),
}

impl Entry {
    fn fingerprint(&self) -> u64 {
        match self {
            Entry::InFlight(f, _) | Entry::Done(f, _, _) | Entry::Streamed(f, _) => *f,
        }
    }
}

/// What to do with a request carrying a key.
#[derive(Debug)]
pub enum Claim {
    /// First with this key: run it, then call [`Idempotency::finish`].
    Run(Permit),
    /// Answer with this replay.
    Replay(Response),
    /// Another request with this key is streaming or failed while we waited: 409.
    Conflict,
    /// The key was used for a different request (endpoint or body): 422.
    Reused,
}

/// Held by the request that runs; dropping it unfinished (the client went away) forgets the
/// key, and a twin waiting on it gets 409.
#[derive(Debug)]
pub struct Permit {
    table: Arc<Idempotency>,
    key: (String, String),
    fingerprint: u64,
    tx: watch::Sender<Option<Arc<Stored>>>,
    /// The key's name in the shared store, when it was claimed there too.
    shared: Option<String>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        // After `finish` stored an answer the entry is `Done` and this does nothing.
        self.table.forget(&self.key);
        if let (Some(key), Some(store)) = (self.shared.take(), self.table.shared.get().cloned())
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let owner = self.table.owner.clone();
            handle.spawn(async move { store.idempotency_forget(&key, &owner).await });
        }
    }
}

/// Where a claim stands after the local table was consulted.
enum Local {
    Answer(Claim),
    Run(Permit),
    Wait(watch::Receiver<Option<Arc<Stored>>>),
}

/// The per-process table of idempotency keys.
#[derive(Debug)]
pub struct Idempotency {
    entries: Mutex<lru::LruCache<(String, String), Entry>>,
    /// Replay time in milliseconds (settable after start, e.g. from a flag).
    ttl_ms: std::sync::atomic::AtomicU64,
    /// The store shared with the other replicas, when there is one.
    shared: std::sync::OnceLock<switchyard_store::QuotaStore>,
    /// This process's id as a key's owner in the shared store.
    owner: String,
}

impl Idempotency {
    /// A table keeping successful answers for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        let cap = NonZeroUsize::new(CAPACITY).unwrap_or(NonZeroUsize::MIN);
        Idempotency {
            entries: Mutex::new(lru::LruCache::new(cap)),
            ttl_ms: std::sync::atomic::AtomicU64::new(millis(ttl)),
            shared: std::sync::OnceLock::new(),
            owner: format!("{:016x}", rand::random::<u64>()),
        }
    }

    /// Shares keys, in-flight markers and answers with the other replicas through `store`
    /// (a Redis store; the in-process store shares nothing). Set once, at start.
    pub fn share_through(&self, store: switchyard_store::QuotaStore) {
        let _ = self.shared.set(store);
    }

    /// Changes how long completed answers are replayed (entries already stored keep theirs).
    pub fn set_ttl(&self, ttl: Duration) {
        self.ttl_ms
            .store(millis(ttl), std::sync::atomic::Ordering::Relaxed);
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Claims `key` for `tenant`, waiting for an in-flight twin to finish.
    /// `fingerprint` identifies the request (endpoint and body): the same key with another
    /// request is refused ([`Claim::Reused`]) rather than answered with the first's answer.
    pub async fn claim(self: &Arc<Self>, tenant: &str, key: &str, fingerprint: u64) -> Claim {
        let k = (tenant.to_owned(), key.to_owned());
        let local = {
            let mut entries = lock(&self.entries);
            let now = tokio::time::Instant::now();
            let live = |e: &Entry| match e {
                Entry::Done(_, _, expires) | Entry::Streamed(_, expires) => *expires > now,
                Entry::InFlight(_, rx) => rx.has_changed().is_ok(),
            };
            match entries.get(&k) {
                Some(e) if live(e) && e.fingerprint() != fingerprint => {
                    Local::Answer(Claim::Reused)
                }
                Some(Entry::Done(_, stored, expires)) if *expires > now => {
                    Local::Answer(Claim::Replay(stored.replay()))
                }
                Some(Entry::Streamed(_, expires)) if *expires > now => {
                    Local::Answer(Claim::Conflict)
                }
                Some(Entry::InFlight(_, rx)) if rx.has_changed().is_ok() => Local::Wait(rx.clone()),
                _ => {
                    let (tx, rx) = watch::channel(None);
                    entries.put(k.clone(), Entry::InFlight(fingerprint, rx));
                    Local::Run(Permit {
                        table: self.clone(),
                        key: k,
                        fingerprint,
                        tx,
                        shared: None,
                    })
                }
            }
        };
        let mut rx = match local {
            Local::Answer(c) => return c,
            Local::Run(permit) => return self.claim_shared(permit).await,
            Local::Wait(rx) => rx,
        };
        // The twin finishes with an answer (replay it) or without one (conflict: the client
        // decides whether to retry).
        match rx.wait_for(Option::is_some).await {
            Ok(v) => match v.as_ref() {
                Some(stored) => Claim::Replay(stored.replay()),
                None => Claim::Conflict,
            },
            Err(_) => Claim::Conflict,
        }
    }

    /// Claims the key in the shared store too (first here, now across replicas): runs when it
    /// is free there (or there is no shared store, or it fails), replays or refuses as the
    /// other replica's request decided, and waits while that request is in flight.
    async fn claim_shared(&self, mut permit: Permit) -> Claim {
        let Some(store) = self.shared.get() else {
            return Claim::Run(permit);
        };
        let name = format!("{}/{}", permit.key.0, permit.key.1);
        let give_up = tokio::time::Instant::now() + SHARED_IN_FLIGHT;
        loop {
            let claim = store
                .idempotency_claim(&name, permit.fingerprint, &self.owner, SHARED_IN_FLIGHT)
                .await;
            match claim {
                Some(switchyard_store::SharedClaim::Run) => {
                    permit.shared = Some(name);
                    return Claim::Run(permit);
                }
                None => return Claim::Run(permit),
                Some(switchyard_store::SharedClaim::Reused) => return Claim::Reused,
                Some(switchyard_store::SharedClaim::Streamed) => return Claim::Conflict,
                Some(switchyard_store::SharedClaim::Done {
                    status,
                    headers,
                    body,
                }) => {
                    let stored = Arc::new(Stored {
                        status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
                        headers: decode_headers(&headers),
                        body: Bytes::from(body),
                    });
                    // Twins waiting here get the same answer.
                    lock(&self.entries).put(
                        permit.key.clone(),
                        Entry::Done(
                            permit.fingerprint,
                            stored.clone(),
                            tokio::time::Instant::now() + self.ttl(),
                        ),
                    );
                    let _ = permit.tx.send(Some(stored.clone()));
                    return Claim::Replay(stored.replay());
                }
                Some(switchyard_store::SharedClaim::InFlight) => {
                    if tokio::time::Instant::now() >= give_up {
                        return Claim::Conflict;
                    }
                    tokio::time::sleep(SHARED_POLL).await;
                }
            }
        }
    }

    /// Finishes a claimed request: keeps a successful non-streamed answer for replay (the
    /// response is rebuilt from the collected body); forgets the key otherwise.
    pub async fn finish(&self, mut permit: Permit, response: Response, streamed: bool) -> Response {
        if !response.status().is_success() {
            return response; // dropping the permit forgets the key
        }
        if streamed {
            // A stream cannot be replayed; the key stays taken so it is not sent again.
            lock(&self.entries).put(
                permit.key.clone(),
                Entry::Streamed(permit.fingerprint, tokio::time::Instant::now() + self.ttl()),
            );
            if let (Some(name), Some(store)) = (permit.shared.take(), self.shared.get()) {
                store
                    .idempotency_streamed(&name, &self.owner, self.ttl())
                    .await;
            }
            return response;
        }
        let (parts, body) = response.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_STORED_BYTES).await else {
            // Too large to keep (the body is consumed): report it as a server error rather
            // than sending a truncated answer.
            let mut r = Response::new(Body::from("answer too large to keep for idempotent replay"));
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            return r;
        };
        let stored = Arc::new(Stored {
            status: parts.status,
            headers: parts.headers.clone(),
            body: bytes.clone(),
        });
        lock(&self.entries).put(
            permit.key.clone(),
            Entry::Done(
                permit.fingerprint,
                stored.clone(),
                tokio::time::Instant::now() + self.ttl(),
            ),
        );
        if let (Some(name), Some(store)) = (permit.shared.take(), self.shared.get()) {
            let headers = encode_headers(&stored.headers);
            if !store
                .idempotency_done(
                    &name,
                    &self.owner,
                    self.ttl(),
                    stored.status.as_u16(),
                    &headers,
                    &stored.body,
                )
                .await
            {
                // Not stored (Redis away, or the marker expired): free the key rather than
                // leave other replicas waiting on it.
                store.idempotency_forget(&name, &self.owner).await;
            }
        }
        let _ = permit.tx.send(Some(stored));
        Response::from_parts(parts, Body::from(bytes))
    }

    fn forget(&self, key: &(String, String)) {
        let mut entries = lock(&self.entries);
        if matches!(entries.peek(key), Some(Entry::InFlight(..))) {
            entries.pop(key);
        }
    }
}

/// Headers of a stored answer as JSON `[[name, value], …]` (values that are not text are left
/// out: the router's own answers carry none).
fn encode_headers(h: &HeaderMap) -> Vec<u8> {
    let pairs: Vec<(&str, &str)> = h
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    serde_json::to_vec(&pairs).unwrap_or_default()
}

fn decode_headers(raw: &[u8]) -> HeaderMap {
    let pairs: Vec<(String, String)> = serde_json::from_slice(raw).unwrap_or_default();
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            h.append(k, v);
        }
    }
    h
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &'static str) -> Response {
        Response::new(Body::from(body))
    }

    async fn text(r: Response) -> String {
        let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn idempotency_completed_answer_replayed_per_tenant() {
        let table = Arc::new(Idempotency::new(Duration::from_secs(60)));
        let Claim::Run(permit) = table.claim("t1", "k", 7).await else {
            panic!("first claim runs");
        };
        let served = table.finish(permit, ok("answer"), false).await;
        assert_eq!(text(served).await, "answer");
        let Claim::Replay(r) = table.claim("t1", "k", 7).await else {
            panic!("second claim replays");
        };
        assert_eq!(r.headers()["x-switchyard-idempotent-replay"], "true");
        assert_eq!(text(r).await, "answer");
        assert!(matches!(table.claim("t2", "k", 7).await, Claim::Run(_)));
    }

    #[tokio::test]
    async fn idempotency_twin_waits_for_the_first_then_replays() {
        let table = Arc::new(Idempotency::new(Duration::from_secs(60)));
        let Claim::Run(permit) = table.claim("t", "k", 7).await else {
            panic!("first claim runs");
        };
        let twin = {
            let table = table.clone();
            tokio::spawn(async move { table.claim("t", "k", 7).await })
        };
        tokio::task::yield_now().await;
        table.finish(permit, ok("once"), false).await;
        let Claim::Replay(r) = twin.await.unwrap() else {
            panic!("twin replays");
        };
        assert_eq!(text(r).await, "once");
    }

    #[tokio::test]
    async fn idempotency_failed_request_forgotten_stream_keeps_key() {
        let table = Arc::new(Idempotency::new(Duration::from_secs(60)));
        let Claim::Run(permit) = table.claim("t", "k", 7).await else {
            panic!()
        };
        let mut failed = ok("no");
        *failed.status_mut() = StatusCode::BAD_GATEWAY;
        table.finish(permit, failed, false).await;
        let Claim::Run(permit) = table.claim("t", "k", 7).await else {
            panic!("a failed request may be retried with its key");
        };
        table.finish(permit, ok("stream"), true).await;
        assert!(matches!(table.claim("t", "k", 7).await, Claim::Conflict));
    }

    #[tokio::test]
    async fn idempotency_key_reused_for_another_request_is_refused() {
        let table = Arc::new(Idempotency::new(Duration::from_secs(60)));
        let Claim::Run(permit) = table.claim("t", "k", 1).await else {
            panic!()
        };
        table.finish(permit, ok("a"), false).await;
        assert!(matches!(table.claim("t", "k", 2).await, Claim::Reused));
        assert!(matches!(table.claim("t", "k", 1).await, Claim::Replay(_)));
    }

    #[tokio::test]
    async fn idempotency_abandoned_request_frees_its_key_and_twin_gets_conflict() {
        let table = Arc::new(Idempotency::new(Duration::from_secs(60)));
        let Claim::Run(permit) = table.claim("t", "k", 7).await else {
            panic!()
        };
        let twin = {
            let table = table.clone();
            tokio::spawn(async move { table.claim("t", "k", 7).await })
        };
        tokio::task::yield_now().await;
        drop(permit);
        assert!(matches!(twin.await.unwrap(), Claim::Conflict));
        assert!(matches!(table.claim("t", "k", 7).await, Claim::Run(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn idempotency_answer_expires_after_ttl() {
        let table = Arc::new(Idempotency::new(Duration::from_secs(10)));
        let Claim::Run(permit) = table.claim("t", "k", 7).await else {
            panic!()
        };
        table.finish(permit, ok("a"), false).await;
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(matches!(table.claim("t", "k", 7).await, Claim::Run(_)));
    }
}
