//! Quota stores for the rate-limit broker (DESIGN §3 steps 6 and 8, §4.7; issue 5; seed 001):
//! where reservations made by [`switchyard_core::quota`] rules live.
//!
//! **Backends.** [`QuotaStore::in_process`] wraps a core [`Ledger`](switchyard_core::quota::Ledger)
//! in a mutex (one router). [`QuotaStore::redis`] keeps the buckets in Redis for several router
//! replicas: a Lua script checks every bucket of a reservation and debits all or none, another
//! credits back at settlement exactly what the reservation record says was debited (`EVALSHA`).
//! Reservations and settlements waiting at the same time travel together, one script call
//! per batch (group commit; see `remote.rs`), so a loaded store pays the call and the shared
//! bucket reads once per batch instead of once per item. Scripts read Redis's own clock (`TIME`) so replicas agree on
//! refill; fixed-window boundaries (reset time, time zone, DST) are computed in Rust by core's
//! [`Rule::window_at`](switchyard_core::quota::Rule::window_at) and passed in.
//!
//! **Same semantics in both.** Amounts per bucket come from core
//! ([`BucketSpec::demand_amount`], [`BucketSpec::usage_amount`]), reason codes from
//! [`BucketSpec::reason_code`], the binding bucket is chosen by the same ranking (never > the
//! longest time wait > on release; the first listed wins ties), token levels are exact
//! integers (unit-ticks, see below), overruns put a bucket in debt, a credit for a closed
//! window is dropped and an overrun is charged to the current one, an aborted request without
//! usage keeps its estimate, and concurrency is freed on every exit. Differences from core:
//! Redis measures time in microseconds (core: nanoseconds), so a wait can be up to 1 µs longer;
//! a token bucket whose `capacity × period_µs` exceeds 2^53 refills in coarser ticks (the
//! smallest power of ten of microseconds that keeps Lua's doubles exact, e.g. 0.1 s for
//! 10^10 units a day); amounts above 2^53 lose precision; reservation expiry (TTL) has
//! millisecond resolution; window boundaries follow the caller's wall clock, so replicas
//! must agree on the time within a window (a lagging replica never reopens a closed window).
//!
//! **Owned reservations (issue 14).** Every Redis reservation carries an id chosen before its
//! script is sent. If the caller's future is dropped mid-call, or the call fails or times out,
//! a guard cancels that id (at once on a task, or queued for replay while Redis is away). A
//! cancel leaves a tombstone for the reservation's TTL that the reservation script checks, so
//! a cancel that reaches Redis before its reservation (a reconnect, a frozen server) still
//! wins: nothing is debited.
//!
//! **Abandoned reservations.** A reservation record is a string with a TTL. Its concurrency
//! slots are members of a sorted set scored by expiry, pruned on every check, and *leased*:
//! each lapses [`RedisOptions::slot_lease`] (default 4 s) after it was last renewed, and the
//! owning store renews all its live slots every quarter lease in one script per 512 slots
//! (only while the record exists, never past its expiry). So a replica that dies (`kill -9`)
//! frees its slots within one lease; its estimates stay charged (as core's
//! [`Ledger::expire`](switchyard_core::quota::Ledger::expire)). A [`Ticket`] dropped without
//! being settled is released with its estimate kept (field case 13).
//!
//! **Outage fallback and its bound (field case 10).** When a Redis call fails or exceeds the
//! op timeout (default 50 ms), the store switches to [`StoreMode::LocalFallback`]: it serves
//! from a local ledger whose capacities are `⌈C / s⌉` (`s` = [`RedisOptions::local_share`],
//! normally the replica count), logs once per transition, probes Redis in the background and
//! switches back when it answers. With `R` replicas, a fixed window of capacity `C` admits
//! at most `C` with Redis; in a window spent wholly in the outage, at most
//! `R · ⌈C / s⌉` (= `C + R − 1` at most when `s = R`); in a window in which the mode changes,
//! at most `C + R · ⌈C / s⌉` (≤ `2C + R − 1` when `s = R`), because neither side sees what the
//! other admitted. Token buckets: over any interval `t` the outage part admits at most
//! `R · ⌈C / s⌉ · (1 + t / P)`. Concurrency: at most `R · ⌈L / s⌉` local slots plus the Redis
//! slots still held when the outage began. Tickets issued by Redis and settled during the
//! outage are queued (at most 100,000, oldest dropped first) and replayed in order when Redis
//! answers again, before the store switches back; fallback tickets settle against the local
//! ledger even after Redis returns. A reservation that timed out may still be applied by a
//! slow or frozen Redis: a cancel of its id is queued with the replays, so it is credited back
//! and its slot freed as soon as Redis is back.
//!
//! **Shared signals (field case 8).** Retry-After pauses and open breakers are deadlines in one
//! Redis hash that only ever move later (a shorter pause never shortens a longer one, field
//! case 7), announced on a pub/sub channel. Every replica subscribes; a restarted one loads
//! them with [`QuotaStore::load_signals`]. The in-process store uses a local broadcast so
//! callers have one code path.
//!
//! **Alternatives rejected.** `WATCH`/`MULTI` optimistic transactions need a read round trip
//! and retry under contention; one script is atomic in one round trip. GCRA (one theoretical
//! arrival time per bucket, as redis-cell does) gives the same admissions for a token bucket but
//! reads worse for credits, debts and header corrections. A Redis-side sliding log costs memory
//! per request. Failing closed during an outage would turn a cache outage into a full outage;
//! failing open would drop every limit; a per-replica share keeps a stated bound.

mod local;
mod remote;
mod signals;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use smallvec::SmallVec;
use switchyard_core::quota::{
    BucketId, BucketSpec, Demand, RateFigures, Refusal, ReservationId, Usage, Wait,
};
use tokio::sync::watch;

pub use signals::{Signal, SignalKind};

use local::{LocalBook, Settle, Tightest, wall_now};
use remote::{Ask, Remote, Reply};
use signals::LocalSignals;

/// Where reservations are served from (for the `quota_store_mode` metric and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreMode {
    /// The in-process ledger (one router).
    InProcess,
    /// Redis, shared by every replica.
    Redis,
    /// Redis is unreachable: local buckets holding this replica's share of each limit.
    LocalFallback,
}

impl StoreMode {
    /// Metric label: `in_process`, `redis`, `local_fallback`.
    pub const fn label(self) -> &'static str {
        match self {
            StoreMode::InProcess => "in_process",
            StoreMode::Redis => "redis",
            StoreMode::LocalFallback => "local_fallback",
        }
    }
}

/// Errors of the Redis store. Reservations never return these: a failing Redis switches the
/// store to [`StoreMode::LocalFallback`] instead.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The URL could not be parsed.
    #[error("invalid redis url: {0}")]
    Url(#[source] redis::RedisError),
    /// The first connection failed.
    #[error("failed to connect to redis: {0}")]
    Connect(#[source] redis::RedisError),
    /// A command failed.
    #[error("redis command failed: {0}")]
    Redis(#[source] redis::RedisError),
    /// No answer within the op timeout.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// A script answered something this version does not understand.
    #[error("unexpected redis reply: {0}")]
    Reply(String),
}

/// Options of [`QuotaStore::redis`].
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://host:port/db` (or `rediss://`, `unix://`).
    pub url: String,
    /// Key prefix; all keys go under the hash tag `{prefix}` so each script touches one slot.
    pub key_prefix: String,
    /// Longest wait for one Redis operation before falling back (default 50 ms).
    pub op_timeout: Duration,
    /// Share of each limit a replica may use alone during an outage: capacities become
    /// `⌈C / local_share⌉` (normally the replica count; default 1).
    pub local_share: u32,
    /// How often to probe Redis during an outage (default 1 s).
    pub probe_interval: Duration,
    /// Longest wait for the first connection and subscription (default 2 s).
    pub connect_timeout: Duration,
    /// How long a concurrency slot stays taken without renewal (default 4 s). The owning
    /// replica renews its live slots every quarter of this, so the slots of a replica that
    /// died come back within one lease instead of at the reservation's expiry.
    pub slot_lease: Duration,
}

impl RedisOptions {
    /// Defaults for `url`: prefix `switchyard`, op timeout 50 ms, share 1, probe every 1 s.
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            key_prefix: "switchyard".into(),
            op_timeout: Duration::from_millis(50),
            local_share: 1,
            probe_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            slot_lease: DEFAULT_SLOT_LEASE,
        }
    }
}

/// Default [`RedisOptions::slot_lease`].
pub const DEFAULT_SLOT_LEASE: Duration = Duration::from_secs(4);

/// Settlements and cancels waiting for Redis to come back, at most (the oldest are dropped
/// beyond, counted in [`QuotaStore::replay_dropped`]; their reservations expire by TTL).
const REPLAY_CAP: usize = 100_000;

/// Concurrency slots renewed per script call (one round trip each).
const RENEW_BATCH: usize = 512;

/// A settlement or cancel that could not reach Redis, replayed when it answers again.
#[derive(Debug)]
struct Replay {
    id: String,
    /// Every bucket of the reservation and the units really used (`None` keeps the estimate).
    charges: SmallVec<[(Arc<BucketSpec>, Option<u64>); 6]>,
    /// Non-zero for a cancel of a reservation whose answer never arrived: the id is marked
    /// cancelled this long, so a reservation that Redis runs even later debits nothing.
    tombstone: Duration,
}

/// What the configured Redis persists ([`QuotaStore::persistence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persistence {
    /// RDB snapshots are scheduled (`CONFIG GET save` is not empty).
    pub snapshots: bool,
    /// The append-only file is on (`CONFIG GET appendonly` is `yes`).
    pub append_only: bool,
}

impl Persistence {
    /// Whether a restart keeps bucket levels (either mechanism is on; a snapshot may still
    /// lose the writes since the last one).
    pub fn persists(self) -> bool {
        self.snapshots || self.append_only
    }
}

/// What the shared store knows about an `Idempotency-Key` ([`QuotaStore::idempotency_claim`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedClaim {
    /// The key was free and is now taken by the caller: run the request.
    Run,
    /// The key is held for another request (another fingerprint).
    Reused,
    /// A request with this key is running on some replica.
    InFlight,
    /// A request with this key was a stream: not to be sent again.
    Streamed,
    /// The stored answer: HTTP status, headers as the caller encoded them, body.
    Done {
        /// HTTP status code.
        status: u16,
        /// The caller's encoding of the headers (opaque here).
        headers: Vec<u8>,
        /// The body.
        body: Vec<u8>,
    },
}

/// A quota store shared by a router's request handlers: cheap to clone (an `Arc` inside),
/// `Send + Sync`.
#[derive(Debug, Clone)]
pub struct QuotaStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    backend: Backend,
    in_flight: AtomicUsize,
    mode: watch::Sender<StoreMode>,
    signals: LocalSignals,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Settlements and cancels made while Redis was unreachable (Redis backend only).
    replay: Mutex<VecDeque<Replay>>,
    replay_dropped: AtomicU64,
    /// Concurrency buckets of this replica's live Redis reservations, by reservation id: the
    /// slots the renewal task keeps leased.
    leases: Mutex<HashMap<String, SmallVec<[Arc<BucketSpec>; 2]>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per store, built once inside an Arc: the size costs nothing
enum Backend {
    InProcess(Mutex<LocalBook>),
    Redis(RedisBackend),
}

#[derive(Debug)]
struct RedisBackend {
    remote: Remote,
    fallback: Mutex<LocalBook>,
    share: u32,
    probe_interval: Duration,
    probing: AtomicBool,
    slot_lease: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the book leaves it consistent (core never half-applies).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A live reservation. Settle it with [`QuotaStore::reconcile`], [`QuotaStore::release`] or
/// [`QuotaStore::cancel`]; dropping it unsettled releases it with the estimate kept and its
/// concurrency freed (in process at once, with Redis in a spawned task), so no exit path
/// leaks a slot (field case 13).
#[derive(Debug)]
pub struct Ticket {
    live: Option<Live>,
    tightest: Tightest,
}

#[derive(Debug)]
struct Live {
    shared: Arc<Shared>,
    issued: Issued,
    /// Redis tickets: buckets debited (deduplicated by key) and the units debited on each,
    /// needed to settle; empty for local tickets.
    charges: SmallVec<[(Arc<BucketSpec>, u64); 6]>,
    demand: Demand,
}

#[derive(Debug, Clone)]
enum Issued {
    Local(ReservationId),
    Fallback(ReservationId),
    Redis(String),
}

impl Ticket {
    /// The caller's tightest bucket right after this reservation (its debit included), for the
    /// `x-ratelimit-*` headers of a successful response without another store call: its
    /// position in the `buckets` passed to [`QuotaStore::reserve`] and its figures. As core's
    /// [`Ledger::tightest`](switchyard_core::quota::Ledger::tightest): the smallest
    /// `remaining / limit`, provider-side and concurrency buckets skipped; `None` if none is left.
    pub fn tightest(&self) -> Option<(usize, RateFigures)> {
        self.tightest
    }

    /// The estimate reserved.
    pub fn demand(&self) -> Demand {
        self.live.as_ref().map(|l| l.demand).unwrap_or_default()
    }

    /// Which backend issued it ([`StoreMode::InProcess`], [`StoreMode::Redis`] or
    /// [`StoreMode::LocalFallback`]).
    pub fn issued_by(&self) -> Option<StoreMode> {
        self.live.as_ref().map(|l| match l.issued {
            Issued::Local(_) => StoreMode::InProcess,
            Issued::Fallback(_) => StoreMode::LocalFallback,
            Issued::Redis(_) => StoreMode::Redis,
        })
    }

    /// A stable id for logs: the ledger's 64-bit id, or the Redis reservation id.
    pub fn id(&self) -> String {
        match self.live.as_ref().map(|l| &l.issued) {
            Some(Issued::Local(id) | Issued::Fallback(id)) => format!("{:x}", id.as_u64()),
            Some(Issued::Redis(id)) => id.clone(),
            None => String::new(),
        }
    }

    /// Units debited in Redis per bucket key, in reservation order (a key listed twice appears
    /// once); empty for tickets of a local ledger, which keeps its own record.
    pub fn charges(&self) -> impl Iterator<Item = (&str, u64)> {
        self.live
            .iter()
            .flat_map(|l| l.charges.iter().map(|(s, a)| (s.key.as_str(), *a)))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(live) = self.live.take() else { return };
        match &live.issued {
            Issued::Local(_) | Issued::Fallback(_) => settle_local(live, Settle::KeepEstimate),
            Issued::Redis(_) => match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(settle_live(live, Settle::KeepEstimate));
                }
                Err(_) => {
                    // No runtime to talk to Redis: the record expires by TTL, its slots with
                    // their lease.
                    if let Issued::Redis(id) = &live.issued {
                        lock(&live.shared.leases).remove(id);
                    }
                    live.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            },
        }
    }
}

fn settle_local(live: Live, how: Settle) {
    match (&live.shared.backend, &live.issued) {
        (Backend::InProcess(book), Issued::Local(id)) => {
            lock(book).settle(*id, how);
        }
        (Backend::Redis(r), Issued::Fallback(id)) => {
            lock(&r.fallback).settle(*id, how);
        }
        _ => {}
    }
    live.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
}

async fn settle_live(live: Live, how: Settle) {
    let Issued::Redis(id) = &live.issued else {
        settle_local(live, how);
        return;
    };
    lock(&live.shared.leases).remove(id);
    if let Backend::Redis(r) = &live.shared.backend {
        let replay = Replay {
            id: id.clone(),
            charges: live
                .charges
                .iter()
                .map(|(spec, _)| {
                    let amount = match how {
                        Settle::Actual(u) => Some(spec.usage_amount(&u, &live.demand)),
                        Settle::KeepEstimate => None,
                        Settle::Nothing => Some(0),
                    };
                    (Arc::clone(spec), amount)
                })
                .collect(),
            tombstone: Duration::ZERO,
        };
        send_or_queue(&live.shared, r, replay, "settle").await;
    }
    live.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
}

/// Sends a settlement or cancel to Redis; while Redis is unreachable (or when this call
/// fails) it is queued and replayed when Redis answers again, so a short outage neither keeps
/// slots taken nor estimates charged.
async fn send_or_queue(shared: &Arc<Shared>, r: &RedisBackend, replay: Replay, op: &str) {
    if *shared.mode.borrow() == StoreMode::Redis {
        match send_replay(r, &replay).await {
            Ok(()) => return,
            Err(e) => enter_fallback(shared, r, op, &e),
        }
    }
    queue_replay(shared, replay);
}

async fn send_replay(r: &RedisBackend, replay: &Replay) -> Result<(), StoreError> {
    let asks: SmallVec<[Ask<'_>; 6]> = replay
        .charges
        .iter()
        .map(|(spec, amount)| Ask {
            spec,
            amount: *amount,
        })
        .collect();
    r.remote
        .settle(&replay.id, &asks, replay.tombstone, wall_now())
        .await
        .map(|_| ())
}

fn queue_replay(shared: &Shared, replay: Replay) {
    let mut q = lock(&shared.replay);
    if q.len() >= REPLAY_CAP {
        q.pop_front();
        shared.replay_dropped.fetch_add(1, Ordering::Relaxed);
    }
    q.push_back(replay);
}

/// A reservation sent to Redis whose answer has not been read. Dropped armed (the caller's
/// future was dropped mid-call, or the call failed), it cancels the id: at once on a task
/// when Redis is reachable, else queued for replay. The cancel leaves a tombstone, so it wins
/// even if Redis runs the reservation script after it.
struct Pending {
    shared: Arc<Shared>,
    replay: Option<Replay>,
}

impl Pending {
    fn disarm(mut self) {
        self.replay = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(replay) = self.replay.take() else {
            return;
        };
        if *self.shared.mode.borrow() != StoreMode::Redis {
            // Redis is away: queued at once, replayed when it answers.
            queue_replay(&self.shared, replay);
            return;
        }
        let shared = Arc::clone(&self.shared);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Backend::Redis(r) = &shared.backend {
                        send_or_queue(&shared, r, replay, "cancel").await;
                    }
                });
            }
            Err(_) => queue_replay(&shared, replay),
        }
    }
}

/// Switches to the local fallback (once per outage) and starts the probe that switches back.
fn enter_fallback(shared: &Arc<Shared>, r: &RedisBackend, op: &str, err: &StoreError) {
    let changed = shared.mode.send_if_modified(|m| {
        if *m == StoreMode::Redis {
            *m = StoreMode::LocalFallback;
            true
        } else {
            false
        }
    });
    if changed {
        tracing::warn!(op, error = %err, share = r.share, "quota store: redis unreachable, serving from local buckets with 1/share of each limit");
    }
    if !r.probing.swap(true, Ordering::AcqRel)
        && let Ok(handle) = tokio::runtime::Handle::try_current()
    {
        let weak = Arc::downgrade(shared);
        let task = handle.spawn(probe(weak, r.probe_interval));
        lock(&shared.tasks).push(task.abort_handle());
    }
}

async fn probe(weak: Weak<Shared>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = weak.upgrade() else { return };
        let Backend::Redis(r) = &shared.backend else {
            return;
        };
        if r.remote.ping().await.is_ok() && drain_replays(&shared, r).await {
            r.probing.store(false, Ordering::Release);
            shared.mode.send_replace(StoreMode::Redis);
            tracing::info!("quota store: redis answers again, back to shared buckets");
            return;
        }
    }
}

/// Replays queued settlements and cancels in order; `false` (the rest kept) at the first that
/// fails.
async fn drain_replays(shared: &Shared, r: &RedisBackend) -> bool {
    let mut sent = 0usize;
    loop {
        let Some(next) = lock(&shared.replay).pop_front() else {
            if sent > 0 {
                tracing::info!(
                    sent,
                    "quota store: settlements made during the outage replayed"
                );
            }
            return true;
        };
        if let Err(e) = send_replay(r, &next).await {
            lock(&shared.replay).push_front(next);
            tracing::debug!(error = %e, sent, "quota store: replay interrupted; retrying at the next probe");
            return false;
        }
        sent += 1;
    }
}

/// Keeps this replica's live concurrency slots leased: every quarter lease, one script call
/// per [`RENEW_BATCH`] slots. Failures are ignored (the next round retries; a slot pruned
/// meanwhile is added back while its reservation lives).
async fn renew_leases(weak: Weak<Shared>, lease: Duration) {
    let every = (lease / 4).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = weak.upgrade() else { return };
        let Backend::Redis(r) = &shared.backend else {
            return;
        };
        let slots: Vec<(String, Arc<BucketSpec>)> = lock(&shared.leases)
            .iter()
            .flat_map(|(id, specs)| specs.iter().map(|s| (id.clone(), Arc::clone(s))))
            .collect();
        for chunk in slots.chunks(RENEW_BATCH) {
            let pairs: Vec<(&str, &BucketSpec)> =
                chunk.iter().map(|(id, s)| (id.as_str(), &**s)).collect();
            if let Err(e) = r.remote.renew(&pairs, lease).await {
                tracing::debug!(error = %e, "quota store: slot lease renewal failed; retrying");
                break;
            }
        }
    }
}

/// Deduplicates by key, keeping the first of each.
fn unique(buckets: &[Arc<BucketSpec>]) -> SmallVec<[Arc<BucketSpec>; 6]> {
    let mut out: SmallVec<[Arc<BucketSpec>; 6]> = SmallVec::new();
    for b in buckets {
        if !out.iter().any(|o| o.key == b.key) {
            out.push(Arc::clone(b));
        }
    }
    out
}

/// Core's `Ledger::tightest` rule over figures the Redis script returned: the smallest
/// `remaining / limit` among the caller's own buckets (not provider-side, not concurrency);
/// the first wins ties.
fn tightest_of(specs: &[Arc<BucketSpec>], figures: &[RateFigures]) -> Option<(usize, RateFigures)> {
    let mut best: Option<(usize, RateFigures)> = None;
    for (i, (s, f)) in specs.iter().zip(figures).enumerate() {
        if s.scope.is_provider_side()
            || s.dimension == switchyard_core::quota::Dimension::Concurrency
        {
            continue;
        }
        let tighter = best.is_none_or(|(_, g)| {
            u128::from(f.remaining) * u128::from(g.limit.max(1))
                < u128::from(g.remaining) * u128::from(f.limit.max(1))
        });
        if tighter {
            best = Some((i, *f));
        }
    }
    best
}

/// A refusal that names no bucket (the store could not say which).
fn store_refusal(wait: Wait) -> Refusal {
    Refusal {
        bucket: BucketId::from_index(0),
        key: String::new(),
        scope: switchyard_core::quota::Scope::Tenant(String::new()),
        dimension: switchyard_core::quota::Dimension::Requests,
        reason: "quota_store_error".into(),
        wait,
        demanded: 0,
        figures: RateFigures {
            limit: 0,
            remaining: 0,
            reset_after: Duration::ZERO,
        },
    }
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl QuotaStore {
    /// A store for one router: a core ledger behind a mutex.
    pub fn in_process() -> QuotaStore {
        QuotaStore::from_backend(
            Backend::InProcess(Mutex::new(LocalBook::new(1))),
            StoreMode::InProcess,
        )
    }

    fn from_backend(backend: Backend, mode: StoreMode) -> QuotaStore {
        QuotaStore {
            shared: Arc::new(Shared {
                backend,
                in_flight: AtomicUsize::new(0),
                mode: watch::Sender::new(mode),
                signals: LocalSignals::new(),
                tasks: Mutex::new(Vec::new()),
                replay: Mutex::new(VecDeque::new()),
                replay_dropped: AtomicU64::new(0),
                leases: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A store shared through Redis by several replicas. Connects, subscribes to the signal
    /// channel (so [`QuotaStore::subscribe`] sees signals published after this returns) and
    /// loads the current signals.
    ///
    /// Errors: [`StoreError::Url`] for a bad URL, [`StoreError::Connect`] or
    /// [`StoreError::Timeout`] when Redis cannot be reached within `connect_timeout`.
    pub async fn redis(opts: RedisOptions) -> Result<QuotaStore, StoreError> {
        let client = redis::Client::open(opts.url.as_str()).map_err(StoreError::Url)?;
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            // The op timeout governs each call (ours fires first when it is shorter).
            .set_response_timeout(Some(opts.connect_timeout.max(opts.op_timeout)))
            .set_number_of_retries(1);
        let conn = match tokio::time::timeout(
            opts.connect_timeout,
            client.get_connection_manager_with_config(cfg),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(StoreError::Connect(e)),
            Err(_) => return Err(StoreError::Timeout(opts.connect_timeout)),
        };
        let remote = Remote::new(conn, &opts.key_prefix, opts.op_timeout);
        let share = opts.local_share.max(1);
        let store = QuotaStore::from_backend(
            Backend::Redis(RedisBackend {
                remote,
                fallback: Mutex::new(LocalBook::new(u64::from(share))),
                share,
                probe_interval: opts.probe_interval,
                probing: AtomicBool::new(false),
                slot_lease: opts.slot_lease.max(Duration::from_millis(40)),
            }),
            StoreMode::Redis,
        );
        let renew = tokio::spawn(renew_leases(
            Arc::downgrade(&store.shared),
            opts.slot_lease.max(Duration::from_millis(40)),
        ));
        lock(&store.shared.tasks).push(renew.abort_handle());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(signals::listen(
            Arc::downgrade(&store.shared),
            client,
            opts.probe_interval,
            ready_tx,
        ));
        lock(&store.shared.tasks).push(task.abort_handle());
        match tokio::time::timeout(opts.connect_timeout, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(store),
            Ok(Ok(Err(e))) => Err(StoreError::Connect(e)),
            Ok(Err(_)) | Err(_) => Err(StoreError::Timeout(opts.connect_timeout)),
        }
    }

    /// Reserves `demand` on every bucket in `buckets` or on none (all-or-nothing). A bucket
    /// seen for the first time, or with a changed spec, is registered (a same-kind change
    /// keeps what was consumed); a key listed twice is charged once; an invalid spec is
    /// logged and left out. `ttl` is the reservation's expiry: past it an unsettled
    /// reservation keeps its estimate and frees its concurrency slots by itself.
    ///
    /// Errors: the [`Refusal`] of the binding bucket, with nothing debited. Its `bucket` is the
    /// binding bucket's position in `buckets` ([`BucketId::index`]). With Redis failing, the
    /// local fallback answers instead (see the module docs for the bound).
    pub async fn reserve(
        &self,
        buckets: &[Arc<BucketSpec>],
        demand: Demand,
        ttl: Duration,
    ) -> Result<Ticket, Box<Refusal>> {
        // The ledger deduplicates by itself, and a local ticket needs only its id: the
        // in-process path clones no spec.
        let (issued, charges, tightest) = match &self.shared.backend {
            Backend::InProcess(book) => {
                let (id, tightest) = lock(book).reserve(buckets, demand, ttl)?;
                (Issued::Local(id), SmallVec::new(), tightest)
            }
            Backend::Redis(r) => {
                let specs = unique(buckets);
                match self.reserve_redis(r, &specs, demand, ttl).await? {
                    (Issued::Redis(id), tightest) => {
                        let slots: SmallVec<[Arc<BucketSpec>; 2]> = specs
                            .iter()
                            .filter(|s| {
                                matches!(s.rule, switchyard_core::quota::Rule::Concurrency { .. })
                            })
                            .cloned()
                            .collect();
                        if !slots.is_empty() {
                            lock(&self.shared.leases).insert(id.clone(), slots);
                        }
                        let charges = specs
                            .into_iter()
                            .map(|s| {
                                let a = s.demand_amount(&demand);
                                (s, a)
                            })
                            .collect();
                        (Issued::Redis(id), charges, tightest)
                    }
                    (other, tightest) => (other, SmallVec::new(), tightest),
                }
            }
        };
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        Ok(Ticket {
            live: Some(Live {
                shared: Arc::clone(&self.shared),
                issued,
                charges,
                demand,
            }),
            tightest,
        })
    }

    async fn reserve_redis(
        &self,
        r: &RedisBackend,
        specs: &[Arc<BucketSpec>],
        demand: Demand,
        ttl: Duration,
    ) -> Result<(Issued, Tightest), Box<Refusal>> {
        if *self.shared.mode.borrow() == StoreMode::Redis {
            let valid: SmallVec<[Arc<BucketSpec>; 6]> = specs
                .iter()
                .filter(|s| match s.validate() {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(bucket = %s.key, error = %e, "invalid quota bucket left out of reservations");
                        false
                    }
                })
                .cloned()
                .collect();
            let asks: SmallVec<[Ask<'_>; 6]> = valid
                .iter()
                .map(|s| Ask {
                    spec: s,
                    amount: Some(s.demand_amount(&demand)),
                })
                .collect();
            // The id is chosen before the script is sent: whatever happens to this call (its
            // future dropped, a timeout, a lost answer), the reservation can be cancelled by id.
            let id = r.remote.next_id();
            let pending = Pending {
                shared: Arc::clone(&self.shared),
                replay: Some(Replay {
                    id: id.clone(),
                    charges: valid.iter().map(|s| (Arc::clone(s), Some(0))).collect(),
                    tombstone: ttl.max(Duration::from_secs(1)),
                }),
            };
            let reply = r
                .remote
                .reserve(&id, &asks, ttl, r.slot_lease, wall_now())
                .await;
            match reply {
                Ok(Reply::Cancelled) => {
                    // Only a cancel of this very id leaves its tombstone: never while this call
                    // is alive. Nothing was debited.
                    pending.disarm();
                    return Err(Box::new(store_refusal(Wait::OnRelease)));
                }
                Ok(Reply::Admitted(figures)) => {
                    pending.disarm();
                    let tightest = tightest_of(&valid, &figures).and_then(|(i, f)| {
                        let key = &valid.get(i)?.key;
                        Some((specs.iter().position(|o| o.key == *key)?, f))
                    });
                    return Ok((Issued::Redis(id), tightest));
                }
                Ok(Reply::Refused(refused)) => {
                    pending.disarm();
                    let spec = valid.get(refused.index).or(valid.first());
                    let pos = spec
                        .and_then(|s| specs.iter().position(|o| o.key == s.key))
                        .unwrap_or(0);
                    let wait = match refused.wait_kind {
                        2 => Wait::Never,
                        1 => Wait::After(micros(refused.wait_us)),
                        _ => Wait::OnRelease,
                    };
                    return Err(Box::new(match spec {
                        Some(s) => Refusal {
                            bucket: BucketId::from_index(u32::try_from(pos).unwrap_or(u32::MAX)),
                            key: s.key.clone(),
                            scope: s.scope.clone(),
                            dimension: s.dimension,
                            reason: s.reason_code(),
                            wait,
                            demanded: s.demand_amount(&demand),
                            figures: RateFigures {
                                limit: u64::try_from(refused.limit).unwrap_or(0),
                                remaining: u64::try_from(refused.remaining).unwrap_or(0),
                                reset_after: micros(refused.reset_us),
                            },
                        },
                        None => return Err(Box::new(store_refusal(wait))),
                    }));
                }
                Err(e) => {
                    // The script may still run (a slow or frozen Redis): the armed guard
                    // queues a cancel of this id, replayed when Redis answers again.
                    enter_fallback(&self.shared, r, "reserve", &e);
                    drop(pending);
                }
            }
        }
        let (id, tightest) = lock(&r.fallback).reserve(specs, demand, ttl)?;
        Ok((Issued::Fallback(id), tightest))
    }

    /// Settles with the provider's reported usage: each bucket is credited the unused estimate
    /// or charged the overrun (requests stay charged), concurrency is freed.
    pub async fn reconcile(&self, ticket: Ticket, usage: Usage) {
        settle_ticket(ticket, Settle::Actual(usage)).await;
    }

    /// Settles an aborted request (client disconnect, upstream error, deadline): `Some(usage)`
    /// charges what was really used (field case 17); `None` keeps the estimate (never a zero
    /// record, field case 15). Concurrency is freed either way.
    pub async fn release(&self, ticket: Ticket, usage: Option<Usage>) {
        let how = usage.map_or(Settle::KeepEstimate, Settle::Actual);
        settle_ticket(ticket, how).await;
    }

    /// Settles a request that never left the router: everything is credited back, requests
    /// included, and concurrency is freed.
    pub async fn cancel(&self, ticket: Ticket) {
        settle_ticket(ticket, Settle::Nothing).await;
    }

    /// Header figures of a bucket now (`x-ratelimit-limit/remaining/reset`); `None` for an
    /// invalid spec. With Redis failing, the local share's figures.
    pub async fn figures(&self, bucket: &BucketSpec) -> Option<RateFigures> {
        let spec = bucket;
        match &self.shared.backend {
            Backend::InProcess(book) => lock(book).figures(spec),
            Backend::Redis(r) => {
                if spec.validate().is_err() {
                    return None;
                }
                if *self.shared.mode.borrow() == StoreMode::Redis {
                    match r.remote.figures(spec, None, wall_now()).await {
                        Ok((limit, remaining, reset, _)) => {
                            return Some(RateFigures {
                                limit: u64::try_from(limit).unwrap_or(0),
                                remaining: u64::try_from(remaining).unwrap_or(0),
                                reset_after: micros(reset),
                            });
                        }
                        Err(e) => enter_fallback(&self.shared, r, "figures", &e),
                    }
                }
                lock(&r.fallback).figures(spec)
            }
        }
    }

    /// Lowers a provider bucket to what the provider's rate-limit headers report (`remaining`
    /// units, full again or window reset after `reset_after`); never raises it (core
    /// [`Ledger::correct_from_headers`](switchyard_core::quota::Ledger::correct_from_headers)).
    /// Returns whether anything changed. In fallback the local share is corrected with
    /// `⌈remaining / share⌉`.
    pub async fn correct_from_headers(
        &self,
        bucket: &BucketSpec,
        remaining: u64,
        reset_after: Duration,
    ) -> bool {
        let spec = bucket;
        match &self.shared.backend {
            Backend::InProcess(book) => lock(book).correct(spec, remaining, reset_after),
            Backend::Redis(r) => {
                if spec.validate().is_err() {
                    return false;
                }
                if *self.shared.mode.borrow() == StoreMode::Redis {
                    match r
                        .remote
                        .figures(spec, Some((remaining, reset_after)), wall_now())
                        .await
                    {
                        Ok((_, _, _, changed)) => return changed,
                        Err(e) => enter_fallback(&self.shared, r, "correct", &e),
                    }
                }
                lock(&r.fallback).correct(spec, remaining, reset_after)
            }
        }
    }

    /// Where reservations are served from now.
    pub fn mode(&self) -> StoreMode {
        *self.shared.mode.borrow()
    }

    /// A receiver that sees every mode change (for a gauge and for tests).
    pub fn watch_mode(&self) -> watch::Receiver<StoreMode> {
        self.shared.mode.subscribe()
    }

    /// Reservations issued by this instance and not yet settled or dropped (a dropped Redis
    /// ticket counts until its spawned release has finished).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Batching on Redis: `(script calls, items)` sent so far for reservations, then for
    /// settlements (their ratio is the mean batch size); `None` for the in-process store.
    pub fn redis_batches(&self) -> Option<[(u64, u64); 2]> {
        match &self.shared.backend {
            Backend::Redis(r) => Some(r.remote.batch_stats()),
            Backend::InProcess(_) => None,
        }
    }

    /// Reservations not sent to Redis because their caller stopped waiting while they were
    /// queued (its cancel went out instead); 0 for the in-process store.
    pub fn redis_reservations_skipped(&self) -> u64 {
        match &self.shared.backend {
            Backend::Redis(r) => r.remote.reservations_skipped(),
            Backend::InProcess(_) => 0,
        }
    }

    /// Claims an `Idempotency-Key` (already scoped by the caller, e.g. tenant and key) in the
    /// shared store for `owner` (a replica-unique id), so a retry that lands on another replica
    /// finds it. An in-flight marker lives at most `in_flight`, so a replica that died while
    /// running the request does not hold the key longer.
    ///
    /// `None` for the in-process store, in fallback, or when Redis fails (the caller keeps to
    /// its own replica's table: Redis trouble never blocks a request).
    pub async fn idempotency_claim(
        &self,
        key: &str,
        fingerprint: u64,
        owner: &str,
        in_flight: Duration,
    ) -> Option<SharedClaim> {
        let fp = format!("{fingerprint:x}");
        let ttl = in_flight.as_millis().max(1).to_string();
        let reply = self
            .idempotency(
                key,
                &[b"claim", fp.as_bytes(), owner.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        let mut it = reply.into_iter();
        let tag = it.next()?;
        Some(match tag.as_slice() {
            b"run" => SharedClaim::Run,
            b"reused" => SharedClaim::Reused,
            b"F" => SharedClaim::InFlight,
            b"S" => SharedClaim::Streamed,
            b"done" => {
                let status = std::str::from_utf8(&it.next()?).ok()?.parse().ok()?;
                SharedClaim::Done {
                    status,
                    headers: it.next()?,
                    body: it.next()?,
                }
            }
            _ => return None,
        })
    }

    /// Stores the answer of a claimed key for `ttl` (only the owner's write is kept).
    /// Returns whether it was stored.
    pub async fn idempotency_done(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        status: u16,
        headers: &[u8],
        body: &[u8],
    ) -> bool {
        let ttl = ttl.as_millis().max(1).to_string();
        let status = status.to_string();
        let args: [&[u8]; 6] = [
            b"done",
            owner.as_bytes(),
            ttl.as_bytes(),
            status.as_bytes(),
            headers,
            body,
        ];
        self.idempotency(key, &args)
            .await
            .is_some_and(|r| r.first().is_some_and(|t| t == b"ok"))
    }

    /// Marks a claimed key as a stream for `ttl`: later claims answer [`SharedClaim::Streamed`].
    pub async fn idempotency_streamed(&self, key: &str, owner: &str, ttl: Duration) {
        let ttl = ttl.as_millis().max(1).to_string();
        let _ = self
            .idempotency(key, &[b"streamed", owner.as_bytes(), ttl.as_bytes()])
            .await;
    }

    /// Frees a claimed key whose request failed or was abandoned (only its owner may).
    pub async fn idempotency_forget(&self, key: &str, owner: &str) {
        let _ = self.idempotency(key, &[b"forget", owner.as_bytes()]).await;
    }

    async fn idempotency(&self, key: &str, args: &[&[u8]]) -> Option<Vec<Vec<u8>>> {
        let Backend::Redis(r) = &self.shared.backend else {
            return None;
        };
        if *self.shared.mode.borrow() != StoreMode::Redis {
            return None;
        }
        match r.remote.idempotency(key, args).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::debug!(error = %e, "idempotency: shared store unavailable, this replica's table only");
                None
            }
        }
    }

    /// Settlements and cancels waiting for Redis to answer again (0 for the in-process store).
    pub fn replay_pending(&self) -> usize {
        lock(&self.shared.replay).len()
    }

    /// Queued settlements dropped because the queue was full ([`REPLAY_CAP`]); their
    /// reservations expire by TTL with their estimates kept.
    pub fn replay_dropped(&self) -> u64 {
        self.shared.replay_dropped.load(Ordering::Relaxed)
    }

    /// Concurrency slots this replica keeps leased in Redis (live Redis reservations).
    pub fn leased(&self) -> usize {
        lock(&self.shared.leases).values().map(SmallVec::len).sum()
    }

    /// What the configured Redis persists; `None` for the in-process store or when Redis does
    /// not say (`CONFIG` renamed or forbidden, as on some managed services, or unreachable).
    /// A Redis that persists nothing loses every bucket on restart: the docs list which limit
    /// kinds that matters for (docs/broker.md, "Redis persistence").
    pub async fn persistence(&self) -> Option<Persistence> {
        let Backend::Redis(r) = &self.shared.backend else {
            return None;
        };
        match r.remote.persistence().await {
            Ok((snapshots, append_only)) => Some(Persistence {
                snapshots,
                append_only,
            }),
            Err(e) => {
                tracing::debug!(error = %e, "quota store: redis persistence settings unreadable");
                None
            }
        }
    }

    /// Live reservations in the local ledger (in process, or the fallback ledger), after
    /// expiring the due ones. For tests and a gauge.
    pub fn local_live(&self) -> usize {
        match &self.shared.backend {
            Backend::InProcess(book) => lock(book).live(),
            Backend::Redis(r) => lock(&r.fallback).live(),
        }
    }
}

async fn settle_ticket(mut ticket: Ticket, how: Settle) {
    if let Some(live) = ticket.live.take() {
        settle_live(live, how).await;
    }
}
