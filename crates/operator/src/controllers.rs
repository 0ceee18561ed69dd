//! The running operator: one kube-runtime `Controller` per kind, a Secret index, the control
//! loop, leader election and the health/metrics listener.
//!
//! Triggers (what re-runs a sync):
//! - an object's own change (each controller's watch), and a periodic resync every
//!   [`RESYNC`];
//! - a RoutingPolicy when an LLMProvider it lists changes; a TenantQuota when its parent or a
//!   route it allows changes (mapped through the caches, so only the dependants run);
//! - every object of every kind when the Secret index changes or this replica becomes the
//!   leader (coarse, but Secrets change rarely and a new leader must write everything once).
//!
//! A failed sync requeues that object alone with doubling backoff ([`Operator::backoff`]);
//! nothing fails the process, and one broken object never delays the others (field case 29).
//! Every replica runs the controllers and keeps its caches warm; only the leader writes.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use switchyard_api::{LLMProvider, RoutingPolicy, TenantQuota};
use tokio::sync::watch;

use crate::control;
use crate::error::Error;
use crate::leader::Leadership;
use crate::operator::{Operator, Settings, Stores, Synced, system_clock};
use crate::outcomes::Targets;
use crate::status::key_of;
use crate::validate::SecretAccess;

/// Periodic resync of every object, so anything a trigger missed converges.
pub const RESYNC: Duration = Duration::from_secs(300);

/// Leader election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
}

/// Everything `switchyard operator` is configured with.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace to watch; every namespace when `None`.
    pub namespace: Option<String>,
    /// Where the routers are.
    pub targets: Targets,
    /// Leader election; `None` runs as the only replica (always the leader).
    pub lease: Option<LeaseOptions>,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// Address of `/healthz`, `/readyz` and `/metrics`.
    pub listen: SocketAddr,
    /// Fixed control interval instead of the policies' shortest `availability.interval`.
    pub interval: Option<Duration>,
    /// Whether the leader runs active health probes and writes `status.health`
    /// (`--no-probes` turns this off).
    pub probes: bool,
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A stream that yields once per change seen on `rx`.
fn changes<T: Send + Sync + 'static>(rx: watch::Receiver<T>) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

async fn reconcile_provider(obj: Arc<LLMProvider>, op: Arc<Operator>) -> Result<Action, Error> {
    let synced = op.sync_provider(&obj).await?;
    finish(&op, &key_of(&*obj), synced)
}

async fn reconcile_policy(obj: Arc<RoutingPolicy>, op: Arc<Operator>) -> Result<Action, Error> {
    let synced = op.sync_policy(&obj).await?;
    finish(&op, &key_of(&*obj), synced)
}

async fn reconcile_tenant(obj: Arc<TenantQuota>, op: Arc<Operator>) -> Result<Action, Error> {
    let synced = op.sync_tenant(&obj).await?;
    finish(&op, &key_of(&*obj), synced)
}

#[allow(clippy::unnecessary_wraps)] // the reconciler signature wants a Result
fn finish(op: &Operator, key: &str, _synced: Synced) -> Result<Action, Error> {
    op.succeeded(key);
    Ok(Action::requeue(RESYNC))
}

fn error_policy<K: kube::Resource>(obj: Arc<K>, error: &Error, op: Arc<Operator>) -> Action {
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let wait = op.backoff(&key);
    tracing::warn!(object = %key, error = %error, retry_in_ms = wait.as_millis() as u64, "sync failed; retrying");
    Action::requeue(wait)
}

/// Reports one controller stream error: watch failures (the list or watch behind the cache;
/// `410 Gone` means the watcher relists from scratch) at warn level and in
/// `switchyard_operator_watch_errors_total{kind,reason}`; a reconcile for an object already
/// gone at debug (expected); reconcile failures are reported by [`error_policy`].
fn log_result<T>(
    op: &Operator,
    kind: &'static str,
    result: Result<T, kube::runtime::controller::Error<Error, watcher::Error>>,
) {
    use kube::runtime::controller::Error as C;
    match result {
        Ok(_) => {}
        Err(C::QueueError(e)) => watch_failed(op, kind, &e),
        Err(C::ReconcilerFailed(..)) => {}
        Err(e @ C::ObjectNotFound(_)) => tracing::debug!(kind, error = %e, "controller event"),
        Err(e) => tracing::warn!(kind, error = %e, "controller runner error"),
    }
}

/// The `reason` label of a watch error (`gone`: the watcher relists).
pub fn watch_error_reason(e: &watcher::Error) -> &'static str {
    match e {
        watcher::Error::InitialListFailed(_) => "list_failed",
        watcher::Error::WatchStartFailed(_) => "watch_start_failed",
        watcher::Error::WatchError(status) if status.code == 410 => "gone",
        watcher::Error::WatchError(_) => "watch_error",
        watcher::Error::WatchFailed(_) => "watch_failed",
        watcher::Error::NoResourceVersion => "no_resource_version",
    }
}

fn watch_failed(op: &Operator, kind: &'static str, e: &watcher::Error) {
    let reason = watch_error_reason(e);
    op.metrics.watch_error(kind, reason);
    if reason == "gone" {
        tracing::warn!(kind, error = %e, "watch expired (410 Gone); relisting");
    } else {
        tracing::warn!(kind, reason, error = %e, "watch failed; retrying with backoff, serving from the cache meanwhile");
    }
}

/// Keeps the Secret index current from a watch on Secrets (values are dropped at once, unless
/// probes run: they need credentials, [`crate::probes`]) and
/// bumps `changed` whenever a key set appears, changes or goes.
///
/// Until the first list completes the index says `Syncing` and no status is written. When the
/// list is refused (403 from RBAC, or 404) the index says `Unreadable` with the permission
/// needed, so objects that reference Secrets report `SecretsForbidden` rather than a Secret
/// "not found"; readiness is reported then too (the operator is up, it reports the fault).
async fn index_secrets(
    api: Api<Secret>,
    namespace: Option<String>,
    op: Arc<Operator>,
    changed: watch::Sender<u64>,
    ready: Arc<AtomicBool>,
) {
    let mut buffer: Vec<SecretEntry> = Vec::new();
    // Values, kept only when probes run (they need the credentials); dropped otherwise.
    let mut value_buffer: BTreeMap<(String, String), BTreeMap<String, String>> = BTreeMap::new();
    let keep_values = op.probes_enabled();
    let mut events = watcher(api).boxed();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                watch_failed(&op, "Secret", &e);
                if let Some(message) = refusal(&e, namespace.as_deref())
                    && op.update_secrets(|index| {
                        !matches!(index.access(), SecretAccess::Synced)
                            && index.set_access(SecretAccess::Unreadable(message))
                    })
                {
                    ready.store(true, Ordering::Relaxed);
                    changed.send_modify(|n| *n = n.wrapping_add(1));
                }
                continue;
            }
        };
        let entry = |s: &Secret| {
            (
                s.namespace().unwrap_or_default(),
                s.name_any(),
                switchyard_api::verdict::secret_keys(s),
            )
        };
        let did_change = match event {
            WatchEvent::Init => {
                buffer.clear();
                value_buffer.clear();
                false
            }
            WatchEvent::InitApply(s) => {
                buffer.push(entry(&s));
                if keep_values {
                    value_buffer.insert(
                        (s.namespace().unwrap_or_default(), s.name_any()),
                        values_of(&s),
                    );
                }
                false
            }
            WatchEvent::InitDone => {
                op.reset_secret_values(std::mem::take(&mut value_buffer));
                let fresh = std::mem::take(&mut buffer);
                ready.store(true, Ordering::Relaxed);
                op.update_secrets(|index| {
                    let mut next = crate::validate::SecretIndex::default();
                    next.set_access(SecretAccess::Synced);
                    for (ns, name, keys) in fresh {
                        next.insert(&ns, &name, keys);
                    }
                    let differs = *index != next;
                    *index = next;
                    differs
                })
            }
            WatchEvent::Apply(s) => {
                let (ns, name, keys) = entry(&s);
                op.set_secret_values(&ns, &name, keep_values.then(|| values_of(&s)));
                op.update_secrets(|index| index.insert(&ns, &name, keys))
            }
            WatchEvent::Delete(s) => op.update_secrets(|index| {
                op.set_secret_values(&s.namespace().unwrap_or_default(), &s.name_any(), None);
                index.remove(&s.namespace().unwrap_or_default(), &s.name_any())
            }),
        };
        if did_change {
            changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// A Secret as the index keeps it: namespace, name, and each key with whether its value is
/// non-empty.
type SecretEntry = (String, String, Vec<(String, bool)>);

/// The message for a Secret list or watch the API server refused (403 or 404), naming the
/// permission; `None` for other errors (network, timeouts), which are retried silently.
fn refusal(e: &watcher::Error, namespace: Option<&str>) -> Option<String> {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.as_ref(),
        watcher::Error::WatchError(s) => s.as_ref(),
        _ => return None,
    };
    (status.is_forbidden() || status.is_not_found()).then(|| {
        switchyard_api::verdict::secrets_unreadable(namespace, status.code, &status.message)
    })
}

/// The UTF-8 values of a Secret's `data` and `stringData` (non-UTF-8 values are skipped:
/// they cannot be an API key).
fn values_of(s: &Secret) -> BTreeMap<String, String> {
    s.data
        .iter()
        .flatten()
        .filter_map(|(k, v)| String::from_utf8(v.0.clone()).ok().map(|v| (k.clone(), v)))
        .chain(
            s.string_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone())),
        )
        .collect()
}

/// Syncs probed providers' status between control ticks: every half of the shortest probe
/// interval, at most [`crate::probes::MAX_STATUS_PERIOD`] apart, so a verdict flip is written
/// promptly and `lastProbeTime` never lags more than about one interval.
async fn health_status_loop(op: Arc<Operator>) {
    loop {
        let (_, shortest) = op.sync_probed().await;
        let period = shortest.map_or(crate::probes::MAX_STATUS_PERIOD, |i| {
            (i / 2).clamp(Duration::from_millis(50), crate::probes::MAX_STATUS_PERIOD)
        });
        tokio::time::sleep(period).await;
    }
}

fn watcher(api: Api<Secret>) -> impl Stream<Item = Result<WatchEvent<Secret>, watcher::Error>> {
    watcher::watcher(api, watcher::Config::default()).default_backoff()
}

/// Whether `store` has seen its first complete list (without waiting for it).
async fn poll_ready<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    tokio::time::timeout(Duration::from_millis(10), store.wait_until_ready())
        .await
        .is_ok_and(|r| r.is_ok())
}

/// The control loop: a first tick as soon as the caches are synced (so the first window is taken
/// from the start, resuming from the checkpoints in status rather than from empty caches), then
/// every interval, and at once whenever this replica becomes the leader.
async fn control_loop(op: Arc<Operator>, fixed: Option<Duration>, ready: Arc<AtomicBool>) {
    while !ready.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut leader = op.leadership().subscribe();
    loop {
        let report = op.tick().await;
        if report.ran && !report.collected.unreachable.is_empty() {
            tracing::warn!(
                unreachable = report.collected.unreachable.len(),
                reachable = report.collected.scraped.len(),
                "some router replicas were not scraped this interval"
            );
        }
        let period = fixed.unwrap_or_else(|| {
            let policies = op.stores().policies.state();
            control::interval(policies.iter().map(|p| &**p))
        });
        let was = *leader.borrow_and_update();
        let sleep = tokio::time::sleep(period);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => break,
                changed = leader.changed() => {
                    if changed.is_err() {
                        (&mut sleep).await;
                        break;
                    }
                    if *leader.borrow_and_update() && !was {
                        break;
                    }
                }
            }
        }
    }
}

/// Serves `/healthz` (the process runs), `/readyz` (caches synced) and `/metrics`.
async fn serve(
    listener: tokio::net::TcpListener,
    op: Arc<Operator>,
    ready: Arc<AtomicBool>,
) -> std::io::Result<()> {
    #[derive(Clone)]
    struct Health {
        op: Arc<Operator>,
        ready: Arc<AtomicBool>,
    }
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move {
                if h.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(h): State<Health>| async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    h.op.metrics.encode(),
                )
            }),
        )
        .with_state(Health { op, ready });
    axum::serve(listener, app).await
}

/// Builds the controllers over `client`, runs everything until `shutdown` resolves.
///
/// # Errors
/// Only a failure to start: the listener cannot bind.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| Error::Serve {
            addr: options.listen,
            source,
        })?;
    let leadership = match &options.lease {
        Some(lease) => Leadership::elect(
            client.clone(),
            &lease.namespace,
            &lease.name,
            &options.identity,
        ),
        None => Leadership::fixed(true),
    };
    let settings = Settings {
        targets: options.targets.clone(),
        leadership,
        identity: options.identity.clone(),
        clock: system_clock(),
    };
    run_with(client, options, settings, listener, shutdown).await
}

/// [`run`] with the settings and listener given (tests: a fixed leadership flag and clock).
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    client: Client,
    options: Options,
    settings: Settings,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let ns = options.namespace.as_deref();
    let wc = watcher::Config::default();
    let providers_api: Api<LLMProvider> = scoped(&client, ns);
    let policies_api: Api<RoutingPolicy> = scoped(&client, ns);
    let tenants_api: Api<TenantQuota> = scoped(&client, ns);
    let secrets_api: Api<Secret> = scoped(&client, ns);

    let providers_c = Controller::new(providers_api.clone(), wc.clone());
    let policies_c = Controller::new(policies_api.clone(), wc.clone());
    let tenants_c = Controller::new(tenants_api.clone(), wc.clone());
    let stores = Stores {
        providers: providers_c.store(),
        policies: policies_c.store(),
        tenants: tenants_c.store(),
    };
    let leader_rx = settings.leadership.subscribe();
    let leadership = settings.leadership.clone();
    let op = Arc::new(
        Operator::new(client.clone(), stores.clone(), settings).with_probes(options.probes),
    );

    // Bumped on every Secret index change and on gaining leadership: re-sync everything.
    let (world_tx, world_rx) = watch::channel(0u64);
    let secrets_ready = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));

    let policy_store = stores.policies.clone();
    let policies_c = policies_c
        .watches(providers_api, wc.clone(), move |provider: LLMProvider| {
            let ns = provider.namespace();
            let name = provider.name_any();
            policy_store
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && p.spec.providers.iter().any(|e| e.name == name))
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .reconcile_all_on(changes(world_rx.clone()));
    let tenant_store = stores.tenants.clone();
    let tenant_store2 = stores.tenants.clone();
    let tenants_c = tenants_c
        .watches(policies_api, wc.clone(), move |policy: RoutingPolicy| {
            let ns = policy.namespace();
            let name = policy.name_any();
            tenant_store
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns && t.spec.allowed_routes.contains(&name))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .watches(tenants_api, wc.clone(), move |parent: TenantQuota| {
            let ns = parent.namespace();
            let name = parent.name_any();
            tenant_store2
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns && t.spec.parent.as_deref() == Some(&name))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .reconcile_all_on(changes(world_rx.clone()));
    let providers_c = providers_c.reconcile_all_on(changes(world_rx));

    let shutdown = shutdown.shared();
    let providers_run = providers_c
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_provider, error_policy, op.clone())
        .for_each({
            let op = op.clone();
            move |r| {
                log_result(&op, "LLMProvider", r);
                futures::future::ready(())
            }
        });
    let policies_run = policies_c
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_policy, error_policy, op.clone())
        .for_each({
            let op = op.clone();
            move |r| {
                log_result(&op, "RoutingPolicy", r);
                futures::future::ready(())
            }
        });
    let tenants_run = tenants_c
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile_tenant, error_policy, op.clone())
        .for_each({
            let op = op.clone();
            move |r| {
                log_result(&op, "TenantQuota", r);
                futures::future::ready(())
            }
        });

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(index_secrets(
        secrets_api,
        options.namespace.clone(),
        op.clone(),
        world_tx.clone(),
        secrets_ready.clone(),
    ));
    {
        let op = op.clone();
        let mut rx = leader_rx;
        tasks.spawn(async move {
            let mut was = *rx.borrow();
            op.metrics.leader.set(i64::from(was));
            if was {
                world_tx.send_modify(|n| *n = n.wrapping_add(1));
            }
            while rx.changed().await.is_ok() {
                let now = *rx.borrow();
                op.metrics.leader.set(i64::from(now));
                if now && !was {
                    tracing::info!("became the leader; writing every status");
                    world_tx.send_modify(|n| *n = n.wrapping_add(1));
                } else if !now && was {
                    tracing::info!("lost the leadership; no more writes");
                    op.step_down().await;
                }
                was = now;
            }
        });
    }
    tasks.spawn(control_loop(op.clone(), options.interval, ready.clone()));
    if options.probes {
        let probing = op.clone();
        tasks.spawn(async move { probing.run_probes().await });
        tasks.spawn(health_status_loop(op.clone()));
    }
    {
        let (stores, ready) = (stores.clone(), ready.clone());
        tasks.spawn(async move {
            // Polled on a timer rather than awaited once: a store's readiness signal wakes only
            // its most recent waiter, and the controllers wait on the same stores.
            loop {
                let synced = poll_ready(&stores.providers).await
                    && poll_ready(&stores.policies).await
                    && poll_ready(&stores.tenants).await
                    && secrets_ready.load(Ordering::Relaxed);
                if synced {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ready.store(true, Ordering::Relaxed);
        });
    }
    {
        let op = op.clone();
        tasks.spawn(async move {
            if let Err(e) = serve(listener, op, ready).await {
                tracing::error!(error = %e, "health and metrics listener stopped");
            }
        });
    }
    tracing::info!(namespace = ns.unwrap_or("<all>"), "operator running");
    futures::join!(providers_run, policies_run, tenants_run);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    // With every other holder of the flag gone, resigning releases the Lease at once.
    drop(op);
    leadership.resign().await;
    Ok(())
}
