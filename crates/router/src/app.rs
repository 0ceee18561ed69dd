//! The process's shared state as every handler and background task sees it ([`App`]): the
//! configuration snapshot and live state, the quota broker, metrics, the clock, the
//! idempotency table and the process settings ([`ServeOptions`]). It sits between the
//! configuration layer below and the executor, status and server above; nothing here serves
//! a request.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::state::Runtime;

/// Everything a handler needs.
#[derive(Debug)]
pub struct App {
    /// Configuration snapshot and live state.
    pub runtime: Arc<Runtime>,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Process clock.
    pub clock: Clock,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// Connection limits, timeouts and the authentication opt-out.
    pub serve: ServeOptions,
    /// Whether the configuration has loaded (for `/readyz`).
    pub ready: std::sync::atomic::AtomicBool,
    /// Last known status of every condition, to keep `lastTransitionTime` until a flip.
    pub transitions: crate::conditions::Transitions,
    /// Problems of the last configuration load that did not stop serving.
    pub config_messages: std::sync::Mutex<Vec<String>>,
    /// The rate-limit broker (quota store and waiting room).
    pub broker: Arc<crate::broker::Broker>,
    /// Per-route correction of input-token estimates from reported usage.
    pub calibrations: crate::estimate::RouteCalibrations,
    /// `Idempotency-Key` table (in-flight markers and answers kept for replay).
    pub idempotency: Arc<crate::idempotency::Idempotency>,
    /// Permits for estimates on the blocking pool (one per core), so a burst of huge
    /// requests queues instead of occupying hundreds of blocking threads.
    pub estimators: tokio::sync::Semaphore,
    /// The live view's last hour of samples (empty while [`ServeOptions::ui`] is off).
    pub history: crate::history::History,
}

impl App {
    /// An app serving `runtime` with the in-process quota store.
    pub fn new(runtime: Arc<Runtime>, max_body_bytes: usize) -> Arc<App> {
        Self::with_store(
            runtime,
            max_body_bytes,
            switchyard_store::QuotaStore::in_process(),
        )
    }

    /// An app serving `runtime` whose quotas live in `store` (in-process or Redis), with the
    /// default [`ServeOptions`] (API keys required).
    pub fn with_store(
        runtime: Arc<Runtime>,
        max_body_bytes: usize,
        store: switchyard_store::QuotaStore,
    ) -> Arc<App> {
        Self::with_options(runtime, max_body_bytes, store, ServeOptions::default())
    }

    /// An app with explicit [`ServeOptions`].
    pub fn with_options(
        runtime: Arc<Runtime>,
        max_body_bytes: usize,
        store: switchyard_store::QuotaStore,
        serve: ServeOptions,
    ) -> Arc<App> {
        *crate::state::lock(&runtime.pauses) = switchyard_core::pause::Pauses::with_probe(
            switchyard_core::pause::DEFAULT_PROBE_TIMEOUT,
            serve.probe_gate,
        );
        let metrics = Metrics::new();
        metrics
            .anonymous_access
            .set(i64::from(serve.allow_anonymous));
        let idempotency = Arc::new(crate::idempotency::Idempotency::new(
            DEFAULT_IDEMPOTENCY_TTL,
        ));
        if store.mode() != switchyard_store::StoreMode::InProcess {
            // Keys, in-flight markers and answers shared by every replica (issue 14).
            idempotency.share_through(store.clone());
        }
        Arc::new(App {
            serve,
            broker: crate::broker::Broker::new(store),
            calibrations: crate::estimate::RouteCalibrations::new(),
            estimators: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            ),
            idempotency,
            runtime,
            metrics,
            clock: Clock::new(),
            max_body_bytes,
            ready: std::sync::atomic::AtomicBool::new(true),
            transitions: crate::conditions::Transitions::default(),
            config_messages: std::sync::Mutex::new(Vec::new()),
            history: crate::history::History::default(),
        })
    }
}

/// Settings of the client-facing server that are not configuration objects: they belong to
/// the process (flags), so no change to the manifests or the cluster can alter them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Serve requests that carry no API key, as the tenant-less `anonymous` project
    /// (`--allow-anonymous`; off by default). Off, every client request needs the key of a
    /// TenantQuota — with no TenantQuota at all, every request is refused with 401. Whether a
    /// TenantQuota exists never turns authentication on or off (issue 12 item 5). Shown in
    /// `/status` (`authentication`) and as the `switchyard_anonymous_access_allowed` gauge.
    pub allow_anonymous: bool,
    /// Longest time a client may take to send a request's head (request line and headers),
    /// and to start the next request on a keep-alive connection; past it the connection is
    /// closed (slowloris). Default [`DEFAULT_HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// Longest time reading a request body may take once the head is in; past it the client
    /// gets 408 in its API's error shape. Default [`DEFAULT_BODY_READ_TIMEOUT`].
    pub body_read_timeout: Duration,
    /// Client connections served at once; more wait in the kernel's listen backlog.
    /// Default [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// How long after a pause ends the single-probe gate stays armed (`--probe-gate`): the
    /// first request to a scope whose pause ended less than this ago is its only probe until
    /// it answers (field case 2). Zero disables the gate. Default
    /// [`switchyard_core::pause::DEFAULT_PROBE_GATE`] (60 s).
    pub probe_gate: Duration,
    /// Serve the read-only live view at `/ui`, `/ui/history` and `/ui/chain` and keep its
    /// last hour of samples (`--ui`, default on; `--ui=false` answers 404 there and keeps no
    /// history). It shows what `/status` shows, over time; see [`crate::ui`].
    pub ui: bool,
    /// Client connections are served on this many single-threaded runtimes ("shards", one OS
    /// thread each, see [`crate::shards`]), each connection on one shard with every task its
    /// requests spawn; 0 serves them on the calling (shared) runtime. The binary's
    /// `--io-threads` defaults to one per core; the default here is 0.
    pub io_threads: usize,
}

/// Default [`ServeOptions::header_read_timeout`]: 10 s, ample for any client on a working
/// network (a request head is one or two packets), short enough that a slowloris client
/// holds a connection for seconds, not forever.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ServeOptions::body_read_timeout`]: 60 s, a 32 MiB body at ~4 Mbit/s.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`ServeOptions::max_connections`]: 4096, below the usual 65 536 descriptors
/// limit with room for upstream connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            allow_anonymous: false,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            probe_gate: switchyard_core::pause::DEFAULT_PROBE_GATE,
            io_threads: 0,
            ui: true,
        }
    }
}

/// How long a completed answer is replayed for a repeated `Idempotency-Key`.
pub const DEFAULT_IDEMPOTENCY_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// Default largest request body: 32 MiB, room for long contexts with images.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// How often the control loop housekeeping runs.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(60);
