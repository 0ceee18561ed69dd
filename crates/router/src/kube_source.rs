//! Kubernetes mode (`switchyard router`): the routing snapshot from reflectors on the cluster.
//!
//! **Pipeline.** Four reflectors (kube-runtime `watcher` feeding a reflector `Writer`, one per
//! kind: LLMProvider, RoutingPolicy, TenantQuota, Secret; one namespace or all) keep an
//! in-memory copy of the objects. Any change wakes one applier task, which waits for a quiet
//! period ([`Options::debounce`], 200 ms by default, at most ten of them under a steady stream
//! of events) and then:
//!
//! 1. **reads** the four stores, sorted by namespace and name so every replica builds the same
//!    table from the same objects;
//! 2. computes the **revision**: SHA-256 over each object's kind, namespace, name, uid and
//!    `metadata.generation` (which moves on spec changes only, never on status writes) and the
//!    `resourceVersion` of every referenced Secret. Replicas that show the same revision in
//!    `/status` serve the same configuration (field case 30);
//! 3. when the revision moved, **judges** the objects with the verdict the operator writes
//!    into status ([`switchyard_api::verdict`]: the standalone loader's schema, CEL and
//!    reference checks, the adapters' settings, Secrets). An object that fails is replaced by
//!    its last accepted version, or skipped when it never had one, and a message says why;
//!    its dependents (a TenantQuota allowing only a skipped route, a child of a skipped parent)
//!    are judged against what is served, so status and routing agree; other objects are not
//!    held back by it (field case 29). A RoutingPolicy that names a missing LLMProvider is
//!    kept: the table skips that entry, as it does in standalone mode;
//! 4. **builds** the [`RoutingTable`] (Secrets resolved from memory), reusing the provider
//!    adapters (and so their connection pools) of providers whose spec and Secret did not
//!    change, and **swaps** it into the [`Runtime`] like a standalone reload; breakers, pins
//!    and counters survive as they do there;
//! 5. **applies status**: availability from each LLMProvider's status and weights from each
//!    RoutingPolicy's status, as the operator computed them from every replica's outcomes
//!    (this mode runs no availability controller of its own). Without a status, or with one
//!    computed for another generation of the policy (a new priority order not yet seen by the
//!    operator), availability is 1 and the weights are the priority cascade over the
//!    availabilities (DESIGN §4.2), so a new policy serves at once in its declared order.
//!    Status-only changes take this step alone: no rebuild, no lost connection pools.
//!
//! **Fail-static.** Watch errors never touch the table: the last snapshot and weights keep
//! serving. Each kind's watch health is a gauge (`switchyard_kube_watch_healthy`), the time
//! since the first failure is `switchyard_config_stale_seconds`, and `/status` says so. A
//! failed watch is restarted with a fresh list after a capped exponential backoff (0.5 s to
//! 5 s), so recovery is confirmed by a complete list rather than by the next change.
//!
//! **Periodic resync.** Every [`Options::resync`] (60 s by default) each watcher is restarted
//! from a fresh list, and the reflector replaces its store atomically when the list completes.
//! A replica that missed notifications (a dropped watch event, a proxy that silently stalled
//! the stream) converges within one period. Client-go's informers resync from their cache,
//! which would not repair a lost event; a re-list does, at one list per kind per period.
//!
//! **Health (DESIGN §4.8, fail-open).** A provider whose status reports a modality
//! `Unhealthy` with a `lastProbeTime` younger than three probe intervals is not a candidate for
//! requests needing that modality; `Unknown`, `Degraded`, stale or missing health never blocks.
//! The filter is applied through the table: the route's entry for that provider stops listing
//! the blocked modality (the dispatcher already filters requests by modality), or becomes
//! ineligible when every modality it serves is blocked. A verdict that goes stale is
//! noticed by a one-second tick, which rebuilds the table without it.
//!
//! This is separate from [`crate::health::HealthBoard`], which holds this process's own probe
//! results (standalone mode); in this mode the operator probes and the verdicts arrive in
//! status, with their probe times, so freshness is judged against the wall clock here.
//!
//! **Secrets.** The Secret reflector watches every Secret of the namespace (the API offers no
//! selector by a set of names), but only referenced ones are decoded into the
//! [`InMemorySecrets`] the table is built from; values are never logged. RBAC: `list` and
//! `watch` on the three kinds and on Secrets in the watched namespace(s); nothing is written.
//!
//! Alternatives rejected: rebuilding on every event without a debounce (a `kubectl apply` of
//! a folder is dozens of events); refusing the whole configuration when one object is invalid
//! (the standalone rule, where the folder is one unit; in a cluster objects belong to different
//! teams); trusting status weights computed for an older generation (a changed priority order
//! would wait one operator interval).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::store::{Store, Writer};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use switchyard_api::loader::Manifests;
use switchyard_api::provider::{HealthState, Modality};
use switchyard_api::verdict::{Judge, SecretAccess, SecretIndex, World};
use switchyard_api::{LLMProvider, RoutingPolicy, TenantQuota, duration};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::app::{self, App};
use crate::config::{InMemorySecrets, ProviderConfig, RoutingTable, SecretSource};
use crate::metrics::{ResourceLabel, RouteOutcome};
use crate::server;
use crate::state::{Live, Runtime, lock};

/// Settings of `switchyard router`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace to watch; `None` watches all namespaces.
    pub namespace: Option<String>,
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Period of the full re-list of every kind (default 60 s).
    pub resync: Duration,
    /// Quiet period after a change before rebuilding (default 200 ms).
    pub debounce: Duration,
    /// Keep quota buckets, pauses and breaker signals in Redis, shared by the replicas;
    /// `None` keeps them in this process.
    pub redis: Option<switchyard_store::RedisOptions>,
    /// Connection limits, timeouts and the authentication opt-out.
    pub serve: app::ServeOptions,
}

impl Options {
    /// Defaults for `namespace` (or all namespaces) on `listen`.
    pub fn new(namespace: Option<String>, listen: SocketAddr) -> Self {
        Options {
            namespace,
            listen,
            max_body_bytes: app::DEFAULT_MAX_BODY_BYTES,
            resync: DEFAULT_RESYNC,
            debounce: DEFAULT_DEBOUNCE,
            redis: None,
            serve: app::ServeOptions::default(),
        }
    }
}

/// Re-list period: case 30 asks a replica that missed a notification to converge within 60 s.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

/// Quiet period before a rebuild: long enough to fold a `kubectl apply -f folder/` into one
/// rebuild, short against the 10 s case 30 allows for a change to reach every replica.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(200);

/// Probe intervals after which a health verdict no longer counts (fail-open on stale data).
pub const HEALTH_FRESH_INTERVALS: u32 = 3;

/// Probe interval assumed when the provider's `healthCheck.interval` is not set (the CRD's
/// documented default).
const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(60);

/// First and longest wait before a failed watch is restarted.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long a fresh list may take before the watch counts as failing (bounded by the resync
/// period, so a test with a short period notices a silent API server quickly too).
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why Kubernetes mode could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listen address could not be bound.
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("failed to serve: {0}")]
    Serve(#[source] std::io::Error),
    /// The quota store could not be set up (e.g. an invalid Redis URL).
    #[error("quota store: {0}")]
    Store(#[source] switchyard_store::StoreError),
}

/// The watched kinds, for health, metrics and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Provider,
    Policy,
    Tenant,
    Secret,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Provider, Kind::Policy, Kind::Tenant, Kind::Secret];

    fn name(self) -> &'static str {
        match self {
            Kind::Provider => "LLMProvider",
            Kind::Policy => "RoutingPolicy",
            Kind::Tenant => "TenantQuota",
            Kind::Secret => "Secret",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Health of one kind's watch.
#[derive(Debug, Clone, Default)]
struct WatchHealth {
    /// A complete list has arrived at least once (the store is usable).
    listed: bool,
    /// Since when the watch has been failing; `None` while it answers.
    failing_since: Option<Instant>,
    /// The last failure, for `/status`.
    last_error: Option<String>,
}

#[derive(Debug)]
struct Shared {
    app: Arc<App>,
    providers: Store<LLMProvider>,
    policies: Store<RoutingPolicy>,
    tenants: Store<TenantQuota>,
    secrets: Store<Secret>,
    health: Mutex<[WatchHealth; 4]>,
    changed: Notify,
    options: Options,
}

impl Shared {
    fn watch_ok(&self, kind: Kind, listed: bool) {
        let mut health = lock(&self.health);
        let h = &mut health[kind.index()];
        if h.failing_since.take().is_some() {
            tracing::info!(resource = kind.name(), "watch recovered");
        }
        h.listed |= listed;
        h.last_error = None;
    }

    fn watch_failed(&self, kind: Kind, error: String) {
        let mut health = lock(&self.health);
        let h = &mut health[kind.index()];
        if h.failing_since.is_none() {
            tracing::warn!(
                resource = kind.name(),
                %error,
                "watch failed; serving the last configuration until it recovers"
            );
            h.failing_since = Some(Instant::now());
        }
        h.last_error = Some(error);
    }

    fn all_listed(&self) -> bool {
        lock(&self.health).iter().all(|h| h.listed)
    }
}

/// A running Kubernetes-mode router.
#[derive(Debug)]
pub struct KubeRouter {
    /// Address it serves on.
    pub addr: SocketAddr,
    /// The app (runtime, metrics, status).
    pub app: Arc<App>,
    tasks: Vec<JoinHandle<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl KubeRouter {
    /// Starts the reflectors, the applier and the HTTP server. The router answers `/readyz`
    /// with 503 until every kind has been listed once and the first table is installed.
    ///
    /// # Errors
    /// The quota store cannot be set up, or the listen address cannot be bound.
    pub async fn start(client: Client, options: Options) -> Result<KubeRouter, StartError> {
        let store = crate::broker::connect_store(options.redis.as_ref())
            .await
            .map_err(StartError::Store)?;
        if options.serve.allow_anonymous {
            tracing::warn!("--allow-anonymous: requests without an API key are served");
        }
        let app = App::with_options(
            Runtime::new(RoutingTable::default()),
            options.max_body_bytes,
            store,
            options.serve.clone(),
        );
        app.ready.store(false, Ordering::Relaxed);
        let (providers, provider_writer) = writer::<LLMProvider>();
        let (policies, policy_writer) = writer::<RoutingPolicy>();
        let (tenants, tenant_writer) = writer::<TenantQuota>();
        let (secrets, secret_writer) = writer::<Secret>();
        let shared = Arc::new(Shared {
            app: app.clone(),
            providers,
            policies,
            tenants,
            secrets,
            health: Mutex::new(Default::default()),
            changed: Notify::new(),
            options: options.clone(),
        });
        let ns = options.namespace.as_deref();
        let tasks = vec![
            tokio::spawn(reflect(
                api::<LLMProvider>(&client, ns),
                provider_writer,
                Kind::Provider,
                shared.clone(),
            )),
            tokio::spawn(reflect(
                api::<RoutingPolicy>(&client, ns),
                policy_writer,
                Kind::Policy,
                shared.clone(),
            )),
            tokio::spawn(reflect(
                api::<TenantQuota>(&client, ns),
                tenant_writer,
                Kind::Tenant,
                shared.clone(),
            )),
            tokio::spawn(reflect(
                api::<Secret>(&client, ns),
                secret_writer,
                Kind::Secret,
                shared.clone(),
            )),
            tokio::spawn(apply_loop(shared)),
            // The table arrives with the reflectors: look again every 15 s.
            tokio::spawn(crate::control::watch_persistence(
                app.clone(),
                std::time::Duration::from_secs(15),
            )),
        ];
        let bound = match tokio::net::TcpListener::bind(options.listen).await {
            Ok(listener) => listener.local_addr().map(|addr| (listener, addr)),
            Err(e) => Err(e),
        };
        let (listener, addr) = match bound {
            Ok(bound) => bound,
            Err(source) => {
                for t in &tasks {
                    t.abort();
                }
                return Err(StartError::Bind {
                    addr: options.listen,
                    source,
                });
            }
        };
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let shutdown = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        };
        let server = tokio::spawn(server::serve(app.clone(), listener, shutdown));
        tracing::info!(
            %addr,
            namespace = options.namespace.as_deref().unwrap_or("(all)"),
            "router serving in Kubernetes mode"
        );
        Ok(KubeRouter {
            addr,
            app,
            tasks,
            server: Some(server),
            stop,
        })
    }

    /// The revision of the configuration being served (`None` before the first one).
    pub fn revision(&self) -> Option<String> {
        self.app.runtime.live().table.revision.clone()
    }

    /// Stops accepting, drains in-flight requests, then stops the reflectors.
    ///
    /// # Errors
    /// Serving failed.
    pub async fn stop(mut self) -> Result<(), StartError> {
        let _ = self.stop.send(true);
        let served = match self.server.take() {
            Some(server) => match server.await {
                Ok(r) => r.map_err(StartError::Serve),
                Err(e) => Err(StartError::Serve(std::io::Error::other(e))),
            },
            None => Ok(()),
        };
        for t in &self.tasks {
            t.abort();
        }
        served
    }
}

impl Drop for KubeRouter {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(server) = &self.server {
            server.abort();
        }
    }
}

/// Serves until `shutdown` resolves, then drains. Prints `switchyard listening on
/// http://ADDR` to stderr once the socket is bound.
///
/// # Errors
/// The listen address cannot be bound, or serving failed.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let router = KubeRouter::start(client, options).await?;
    eprintln!("switchyard listening on http://{}", router.addr);
    shutdown.await;
    router.stop().await
}

/// A client for the reflectors from `config` (usually `kube::Config::infer()`: in-cluster
/// service account, else `$KUBECONFIG` / `~/.kube/config`), with kube's own retry layer off.
///
/// That layer retries 429/503/504 up to 15 times with a backoff growing to minutes, inside
/// one request: an API server answering 503 would then look like a slow but working watch,
/// and fail-static would never be reported. The reflectors retry on their own (capped
/// backoff, fresh list), and show every failure in the watch-health gauge.
///
/// # Errors
/// The client cannot be built from the configuration (TLS, proxy, auth plugin).
pub fn client(mut config: kube::Config) -> Result<Client, kube::Error> {
    config.default_retry = false;
    Client::try_from(config)
}

/// Why the Kubernetes client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file given could not be read or used.
    #[error("failed to use kubeconfig {}", path.display())]
    Kubeconfig {
        /// File given.
        path: PathBuf,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No configuration was found.
    #[error(
        "failed to find a cluster configuration (in-cluster service account, $KUBECONFIG or \
         ~/.kube/config)"
    )]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("failed to build the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// The client for `switchyard router` and its default namespace: from `kubeconfig` when
/// given, else as `kube::Client::try_default()` finds it (in-cluster service account, then
/// `$KUBECONFIG` or `~/.kube/config`); built by [`client`].
///
/// # Errors
/// No usable configuration, or a client that cannot be built from it.
pub async fn connect(
    kubeconfig: Option<&std::path::Path>,
) -> Result<(Client, String), ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let error = |source| ClientError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(error)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(error)?
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer)?,
    };
    let namespace = config.default_namespace.clone();
    Ok((client(config).map_err(ClientError::Client)?, namespace))
}

fn writer<K>() -> (Store<K>, Writer<K>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let w = Writer::default();
    (w.as_reader(), w)
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One kind's reflector: watch events into the store, restarted from a fresh list every
/// resync period and after a failure (see the module docs).
async fn reflect<K>(api: Api<K>, mut writer: Writer<K>, kind: Kind, shared: Arc<Shared>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let resync = shared.options.resync.max(Duration::from_millis(100));
    let list_timeout = LIST_TIMEOUT.min(resync);
    let mut backoff = BACKOFF_MIN;
    loop {
        let mut stream = std::pin::pin!(watcher(api.clone(), watcher::Config::default()));
        let resync_at = tokio::time::sleep(resync);
        let list_deadline = tokio::time::sleep(list_timeout);
        tokio::pin!(resync_at, list_deadline);
        let mut listed = false;
        let failed = loop {
            tokio::select! {
                () = &mut resync_at => break false,
                () = &mut list_deadline, if !listed => {
                    shared.watch_failed(
                        kind,
                        format!("no complete list within {}s", list_timeout.as_secs_f64()),
                    );
                    break true;
                }
                item = stream.next() => match item {
                    Some(Ok(event)) => {
                        let relevant =
                            matches!(event, Event::Apply(_) | Event::Delete(_) | Event::InitDone);
                        let done = matches!(event, Event::InitDone);
                        listed |= done;
                        writer.apply_watcher_event(&event);
                        if done || !matches!(event, Event::Init | Event::InitApply(_)) {
                            shared.watch_ok(kind, done);
                            backoff = BACKOFF_MIN;
                        }
                        if relevant {
                            shared.changed.notify_one();
                        }
                    }
                    Some(Err(e)) => {
                        shared.watch_failed(kind, e.to_string());
                        break true;
                    }
                    None => break false,
                },
            }
        };
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, config)
}

/// The applier: debounced rebuilds on change, and a one-second tick for gauges, messages,
/// health expiry and housekeeping.
async fn apply_loop(shared: Arc<Shared>) {
    let mut applier = Applier::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut since_housekeeping = Duration::ZERO;
    loop {
        tokio::select! {
            () = shared.changed.notified() => {
                let debounce = shared.options.debounce;
                let give_up = Instant::now() + debounce * 10;
                while Instant::now() < give_up
                    && tokio::time::timeout(debounce, shared.changed.notified()).await.is_ok()
                {}
                applier.sync(&shared);
            }
            _ = tick.tick() => {
                applier.tick(&shared);
                since_housekeeping += Duration::from_secs(1);
                if since_housekeeping >= app::HOUSEKEEPING_INTERVAL {
                    shared.app.runtime.housekeeping(shared.app.clock.now());
                    since_housekeeping = Duration::ZERO;
                }
            }
        }
    }
}

/// The shared verdict ([`switchyard_api::verdict`], the operator's too) with the adapters'
/// settings check, so the router rejects exactly what the operator reports as rejected.
#[derive(Debug)]
struct RouterJudge(Judge);

impl Default for RouterJudge {
    fn default() -> Self {
        RouterJudge(Judge::new(switchyard_providers::adapter::check_spec))
    }
}

/// The key names of the listed Secrets (values stay in the store), for the verdict.
fn secret_index(secrets: &[Arc<Secret>]) -> SecretIndex {
    let mut index = SecretIndex::default();
    index.set_access(SecretAccess::Synced);
    for s in secrets {
        let keys = switchyard_api::verdict::secret_keys(s);
        index.insert(
            &s.namespace().unwrap_or_else(|| "default".to_owned()),
            &s.name_any(),
            keys,
        );
    }
    index
}

/// Which (provider key, modality) pairs fresh `Unhealthy` verdicts block at `now`.
fn blocked_modalities(
    providers: &[Arc<LLMProvider>],
    now: chrono::DateTime<chrono::Utc>,
) -> BTreeSet<(String, Modality)> {
    let mut out = BTreeSet::new();
    for p in providers {
        let Some(status) = &p.status else { continue };
        let interval = p
            .spec
            .health_check
            .as_ref()
            .and_then(|h| h.interval.as_deref())
            .and_then(duration::parse)
            .unwrap_or(DEFAULT_PROBE_INTERVAL);
        let fresh_for = interval * HEALTH_FRESH_INTERVALS;
        for h in &status.health {
            if h.state == HealthState::Unhealthy
                && h.last_probe_time
                    .as_ref()
                    .is_some_and(|t| is_fresh(t, now, fresh_for))
            {
                out.insert((provider_key(p.as_ref()), h.modality));
            }
        }
    }
    out
}

/// A probe time younger than `fresh_for`; a time further in the future than that (a skewed
/// clock) does not count either, so it cannot block forever.
fn is_fresh(
    t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    now: chrono::DateTime<chrono::Utc>,
    fresh_for: Duration,
) -> bool {
    let Some(at) = chrono::DateTime::from_timestamp_millis(t.0.as_millisecond()) else {
        return false;
    };
    let Ok(window) = chrono::Duration::from_std(fresh_for) else {
        return false;
    };
    at > now - window && at < now + window
}

fn provider_key<K: Resource>(o: &K) -> String {
    format!(
        "{}/{}",
        o.meta().namespace.as_deref().unwrap_or("default"),
        o.meta().name.as_deref().unwrap_or_default()
    )
}

fn sorted<K: Resource + Clone + 'static>(store: &Store<K>) -> Vec<Arc<K>>
where
    K::DynamicType: Eq + Hash + Clone,
{
    let mut items = store.state();
    items.sort_by(|a, b| {
        (a.meta().namespace.as_deref(), a.meta().name.as_deref())
            .cmp(&(b.meta().namespace.as_deref(), b.meta().name.as_deref()))
    });
    items
}

/// State of the applier between rebuilds.
#[derive(Debug, Default)]
struct Applier {
    /// Revision of the last validated object set.
    revision: Option<String>,
    /// The validated manifests of that revision.
    manifests: Option<Manifests>,
    /// Secrets referenced by them, resolved.
    secrets: Option<Arc<InMemorySecrets>>,
    /// Per-provider fingerprint of the referenced Secret (its resourceVersion).
    secret_versions: HashMap<String, String>,
    /// Validation messages of that revision.
    messages: Vec<String>,
    /// The verdict, with the last accepted version of every object.
    judge: RouterJudge,
    /// Provider adapters of the installed table, by key, with the fingerprint they were built
    /// from (uid, generation, Secret version).
    adapters: HashMap<String, (String, Arc<ProviderConfig>)>,
    /// Health blocks in the installed table.
    blocked: BTreeSet<(String, Modality)>,
}

impl Applier {
    /// Rebuilds if the configuration or the health blocks changed; applies status in any case.
    fn sync(&mut self, shared: &Shared) {
        if !shared.all_listed() {
            return;
        }
        let providers = sorted(&shared.providers);
        let policies = sorted(&shared.policies);
        let tenants = sorted(&shared.tenants);
        let secrets = sorted(&shared.secrets);
        let revision = revision(&providers, &policies, &tenants, &secrets);
        if self.revision.as_deref() != Some(revision.as_str()) {
            self.validate(&providers, &policies, &tenants, &secrets);
            self.revision = Some(revision);
            self.install(shared, &providers);
        } else {
            let blocked = blocked_modalities(&providers, shared.app.clock.wall());
            if blocked != self.blocked {
                self.install(shared, &providers);
            }
        }
        apply_status(&shared.app.runtime.live(), &providers, &policies);
        self.publish(shared);
    }

    /// Judges the current objects with the shared verdict, which keeps the last accepted
    /// versions of rejected ones and leaves out what cannot be served (dependents included).
    fn validate(
        &mut self,
        providers: &[Arc<LLMProvider>],
        policies: &[Arc<RoutingPolicy>],
        tenants: &[Arc<TenantQuota>],
        secrets: &[Arc<Secret>],
    ) {
        let world = World {
            providers: providers.to_vec(),
            policies: policies.to_vec(),
            tenants: tenants.to_vec(),
            secrets: secret_index(secrets),
        };
        let judgement = self.judge.0.judge(&world);
        let messages = judgement.notes;
        for m in &messages {
            tracing::warn!("{m}");
        }
        let manifests = judgement.served.manifests();
        // Referenced Secrets, resolved into memory; and each provider's Secret version.
        let by_name: HashMap<(String, String), &Arc<Secret>> = secrets
            .iter()
            .map(|s| {
                (
                    (
                        s.namespace().unwrap_or_else(|| "default".to_owned()),
                        s.name_any(),
                    ),
                    s,
                )
            })
            .collect();
        let mut memory = InMemorySecrets::default();
        let mut take = |ns: &str, name: &str| -> String {
            let key = (ns.to_owned(), name.to_owned());
            match by_name.get(&key) {
                Some(s) => {
                    let data: BTreeMap<String, String> = s
                        .data
                        .iter()
                        .flatten()
                        .filter_map(|(k, v)| {
                            String::from_utf8(v.0.clone()).ok().map(|v| (k.clone(), v))
                        })
                        .chain(
                            s.string_data
                                .iter()
                                .flatten()
                                .map(|(k, v)| (k.clone(), v.clone())),
                        )
                        .collect();
                    memory.0.insert(key, data);
                    s.resource_version().unwrap_or_default()
                }
                None => "missing".to_owned(),
            }
        };
        self.secret_versions.clear();
        for p in &manifests.providers {
            let ns = p.namespace().unwrap_or_else(|| "default".to_owned());
            let version = match &p.spec.credentials {
                Some(c) => take(&ns, &c.secret_ref.name),
                None => "-".to_owned(),
            };
            self.secret_versions.insert(provider_key(p), version);
        }
        for t in &manifests.tenants {
            let ns = t.namespace().unwrap_or_else(|| "default".to_owned());
            for k in &t.spec.api_keys {
                take(&ns, &k.secret_ref.name);
            }
        }
        self.secrets = Some(Arc::new(memory));
        self.manifests = Some(manifests);
        self.messages = messages;
    }

    /// Builds the table from the validated manifests and installs it.
    fn install(&mut self, shared: &Shared, providers: &[Arc<LLMProvider>]) {
        let Some(manifests) = &self.manifests else {
            return;
        };
        let secrets = SecretSource {
            dir: None,
            memory: self.secrets.clone(),
        };
        let mut table = RoutingTable::build(manifests, &secrets);
        // Keep the adapters (and connection pools) of providers that did not change.
        let mut adapters = HashMap::new();
        for (slot, p) in table.providers.iter_mut().zip(&manifests.providers) {
            let fingerprint = format!(
                "{}/{}/{}",
                p.metadata.uid.as_deref().unwrap_or_default(),
                p.metadata.generation.unwrap_or_default(),
                self.secret_versions
                    .get(&slot.key)
                    .map(String::as_str)
                    .unwrap_or_default()
            );
            if let Some((f, previous)) = self.adapters.get(&slot.key)
                && *f == fingerprint
            {
                *slot = previous.clone();
            }
            adapters.insert(slot.key.clone(), (fingerprint, slot.clone()));
        }
        self.adapters = adapters;
        // Health from status (fail-open): drop blocked modalities from the route entries.
        let blocked = blocked_modalities(providers, shared.app.clock.wall());
        for route in &mut table.routes {
            let Some(route) = Arc::get_mut(route) else {
                continue;
            };
            for rp in &mut route.providers {
                let Some(key) = table.providers.get(rp.index).map(|p| p.key.clone()) else {
                    continue;
                };
                let blocked_here: Vec<Modality> = blocked
                    .iter()
                    .filter(|(k, _)| *k == key)
                    .map(|(_, m)| *m)
                    .collect();
                if blocked_here.is_empty() || rp.ineligible.is_some() {
                    continue;
                }
                // A model that declares no modalities handles text (the CRD's default).
                let declared: Vec<Modality> = if rp.modalities.is_empty() {
                    vec![Modality::Text]
                } else {
                    rp.modalities.clone()
                };
                let left: Vec<Modality> = declared
                    .into_iter()
                    .filter(|m| !blocked_here.contains(m))
                    .collect();
                if left.is_empty() {
                    rp.ineligible = Some(format!(
                        "unhealthy for every modality it serves ({blocked_here:?}) by recent \
                         health probes"
                    ));
                } else {
                    rp.modalities = left;
                }
            }
        }
        table.warnings.extend(self.messages.iter().cloned());
        table.revision = self.revision.clone();
        for w in &table.warnings {
            tracing::debug!("{w}");
        }
        tracing::info!(
            providers = table.providers.len(),
            routes = table.routes.len(),
            tenants = table.tenants.len(),
            revision = table.revision.as_deref().unwrap_or_default(),
            "configuration installed from the cluster"
        );
        // Providers that stay keep their state across the swap: give them the status
        // availability first, so the cascade weights the swap computes for routes without
        // usable status weights are already the right ones (no window with stale weights).
        set_availabilities(&shared.app.runtime.live(), providers);
        shared.app.runtime.swap(table);
        crate::server::warm_if_needed(&shared.app);
        // Limits may have grown: let waiting requests try again.
        shared.app.broker.capacity_freed();
        self.blocked = blocked;
        let outcome = if self.messages.iter().any(|m| m.contains(" rejected: ")) {
            "invalid"
        } else {
            "ok"
        };
        shared
            .app
            .metrics
            .reloads
            .get_or_create(&RouteOutcome {
                route: String::new(),
                outcome: outcome.to_owned(),
            })
            .inc();
        shared.app.ready.store(true, Ordering::Relaxed);
    }

    /// Gauges, messages, and a rebuild when a health verdict went stale.
    fn tick(&mut self, shared: &Shared) {
        if self.manifests.is_some() {
            let providers = sorted(&shared.providers);
            let blocked = blocked_modalities(&providers, shared.app.clock.wall());
            if blocked != self.blocked {
                self.install(shared, &providers);
                apply_status(
                    &shared.app.runtime.live(),
                    &providers,
                    &sorted(&shared.policies),
                );
            }
        } else {
            self.sync(shared);
        }
        self.publish(shared);
    }

    /// Watch health into the gauges and `/status` messages.
    fn publish(&self, shared: &Shared) {
        let health = lock(&shared.health).clone();
        let now = Instant::now();
        let mut stale = Duration::ZERO;
        let mut messages = Vec::new();
        for kind in Kind::ALL {
            let h = &health[kind.index()];
            shared
                .app
                .metrics
                .kube_watch_healthy
                .get_or_create(&ResourceLabel {
                    resource: kind.name().to_owned(),
                })
                .set(i64::from(h.failing_since.is_none()));
            if let Some(since) = h.failing_since {
                let age = now.saturating_duration_since(since);
                stale = stale.max(age);
                messages.push(format!(
                    "watch of {} failing for {}s ({}); serving the last configuration{}",
                    kind.name(),
                    age.as_secs(),
                    h.last_error.as_deref().unwrap_or("no detail"),
                    self.revision
                        .as_deref()
                        .map(|r| format!(" (revision {r})"))
                        .unwrap_or_default()
                ));
            } else if !h.listed {
                messages.push(format!("waiting for the first list of {}", kind.name()));
            }
        }
        shared
            .app
            .metrics
            .config_stale_seconds
            .set(stale.as_secs_f64());
        *lock(&shared.app.config_messages) = messages;
    }
}

/// The revision of a set of objects: see the module docs.
fn revision(
    providers: &[Arc<LLMProvider>],
    policies: &[Arc<RoutingPolicy>],
    tenants: &[Arc<TenantQuota>],
    secrets: &[Arc<Secret>],
) -> String {
    let mut referenced: BTreeSet<(String, String)> = BTreeSet::new();
    for p in providers {
        if let Some(c) = &p.spec.credentials {
            referenced.insert((p.namespace().unwrap_or_default(), c.secret_ref.name.clone()));
        }
    }
    for t in tenants {
        for k in &t.spec.api_keys {
            referenced.insert((t.namespace().unwrap_or_default(), k.secret_ref.name.clone()));
        }
    }
    let mut hash = Sha256::new();
    let mut line = |kind: &str, meta: &kube::core::ObjectMeta| {
        hash.update(
            format!(
                "{kind} {}/{} {} {}\n",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
                meta.uid.as_deref().unwrap_or_default(),
                meta.generation.unwrap_or_default()
            )
            .as_bytes(),
        );
    };
    for o in providers {
        line("LLMProvider", &o.metadata);
    }
    for o in policies {
        line("RoutingPolicy", &o.metadata);
    }
    for o in tenants {
        line("TenantQuota", &o.metadata);
    }
    for s in secrets {
        let key = (s.namespace().unwrap_or_default(), s.name_any());
        if referenced.remove(&key) {
            hash.update(
                format!(
                    "Secret {}/{} {}\n",
                    key.0,
                    key.1,
                    s.resource_version().unwrap_or_default()
                )
                .as_bytes(),
            );
        }
    }
    for (ns, name) in referenced {
        hash.update(format!("Secret {ns}/{name} missing\n").as_bytes());
    }
    let digest = hash.finalize();
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Availability from LLMProvider status and weights from RoutingPolicy status into `live`
/// (see the module docs for the rules).
fn apply_status(live: &Live, providers: &[Arc<LLMProvider>], policies: &[Arc<RoutingPolicy>]) {
    set_availabilities(live, providers);
    let by_key: HashMap<String, &Arc<RoutingPolicy>> = policies
        .iter()
        .map(|p| (provider_key(p.as_ref()), p))
        .collect();
    for (i, (route, state)) in live.table.routes.iter().zip(&live.routes).enumerate() {
        let policy = by_key.get(&route.key);
        let weights = policy
            .and_then(|p| status_weights(p, route))
            .unwrap_or_else(|| live.compute_weights(i));
        if **state.weights.load() != weights {
            state.weights.store(Arc::new(weights));
        }
        let computed = policy
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.last_update_time.as_ref())
            .and_then(|t| chrono::DateTime::from_timestamp_millis(t.0.as_millisecond()));
        *lock(&state.computed_at) = computed;
    }
}

/// Availability of every provider of `live` from its LLMProvider status; 1 without one.
fn set_availabilities(live: &Live, providers: &[Arc<LLMProvider>]) {
    let availability: HashMap<String, f64> = providers
        .iter()
        .filter_map(|p| {
            let a = p.status.as_ref()?.availability?;
            Some((provider_key(p.as_ref()), a))
        })
        .collect();
    for (p, s) in live.table.providers.iter().zip(&live.providers) {
        s.set_availability(availability.get(&p.key).copied().unwrap_or(1.0));
    }
}

/// The weights of a policy's status, by the route's provider order, when they were computed
/// for the policy's current generation and cover every provider; ineligible providers on this
/// router get 0. `None` when the status cannot be used.
fn status_weights(policy: &RoutingPolicy, route: &crate::config::Route) -> Option<Vec<f64>> {
    let status = policy.status.as_ref()?;
    if status.observed_generation.is_some()
        && status.observed_generation != policy.metadata.generation
    {
        return None;
    }
    let weights: Vec<f64> = route
        .provider_names
        .iter()
        .zip(&route.providers)
        .map(|(name, rp)| {
            let w = status.providers.iter().find(|p| &p.name == name)?.weight;
            let w = if w.is_finite() { w.max(0.0) } else { 0.0 };
            Some(if rp.ineligible.is_some() { 0.0 } else { w })
        })
        .collect::<Option<_>>()?;
    (weights.iter().sum::<f64>() > 0.0).then_some(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_fresh_window_bounds_both_sides() {
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let at = |secs: i64| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap(),
            )
        };
        let window = Duration::from_secs(180);
        assert!(is_fresh(&at(-179), now, window));
        assert!(!is_fresh(&at(-181), now, window));
        assert!(is_fresh(&at(10), now, window));
        assert!(!is_fresh(&at(3600), now, window));
    }
}
