//! The embedded default: the router and the control loop in one process, configured from a
//! folder of the same manifests a cluster would take.
//!
//! The folder is validated by the API crate's loader (schema, unknown fields, CEL rules,
//! references). A change to the folder is picked up by a file watcher (`notify`); an invalid
//! change is reported — on stderr, in `/status` messages and in the `config_reloads` metric —
//! and the last good configuration keeps serving.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use switchyard_api::loader::{LoadErrors, load_dir};

use crate::app::{self, App};
use crate::config::{RoutingTable, SecretSource};
use crate::server;
use crate::state::{Runtime, lock};

/// Settings of `switchyard standalone`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Folder of manifests.
    pub manifests: PathBuf,
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Where `secretRef`s are resolved, besides environment variables.
    pub secrets: SecretSource,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Whether to watch the folder and reload on change.
    pub watch: bool,
    /// Keep quota buckets, pauses and breaker signals in Redis (several replicas share them);
    /// `None` keeps them in this process.
    pub redis: Option<switchyard_store::RedisOptions>,
    /// How long a completed answer is replayed for a repeated `Idempotency-Key`.
    pub idempotency_ttl: std::time::Duration,
    /// Connection limits, timeouts and the authentication opt-out.
    pub serve: app::ServeOptions,
}

/// Why standalone mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The manifests did not validate.
    #[error("{0}")]
    Invalid(#[from] LoadErrors),
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

fn build(dir: &Path, secrets: &SecretSource) -> Result<RoutingTable, LoadErrors> {
    let manifests = load_dir(dir)?;
    for w in &manifests.warnings {
        tracing::warn!("{w}");
    }
    if manifests.tenants.is_empty() {
        tracing::warn!(
            "no TenantQuota in the manifests: no API key is valid, so every request without \
             --allow-anonymous is refused with 401"
        );
    }
    let table = RoutingTable::build(&manifests, secrets);
    for w in &table.warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(
        providers = table.providers.len(),
        routes = table.routes.len(),
        tenants = table.tenants.len(),
        "configuration loaded"
    );
    Ok(table)
}

/// Loads, serves and watches until `shutdown` resolves. Prints
/// `switchyard listening on http://ADDR` to stderr once the socket is bound.
///
/// # Errors
/// Invalid manifests at start (every problem listed), or a socket that cannot be bound.
pub async fn run(
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let table = build(&options.manifests, &options.secrets)?;
    let runtime = Runtime::new(table);
    let store = crate::broker::connect_store(options.redis.as_ref())
        .await
        .map_err(StartError::Store)?;
    if options.serve.allow_anonymous {
        tracing::warn!("--allow-anonymous: requests without an API key are served");
    }
    let app = App::with_options(
        runtime,
        options.max_body_bytes,
        store,
        options.serve.clone(),
    );
    app.idempotency.set_ttl(options.idempotency_ttl);
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: options.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(StartError::Serve)?;
    let control = tokio::spawn(crate::control::run(app.clone()));
    // Active health probes of providers with `healthCheck.enabled` (idle when none is).
    let probes = tokio::spawn(crate::probe::run_for_app(app.clone()));
    let persistence = tokio::spawn(crate::control::watch_persistence(
        app.clone(),
        Duration::from_secs(60),
    ));
    let watcher = options.watch.then(|| {
        tokio::spawn(watch(
            app.clone(),
            options.manifests.clone(),
            options.secrets.clone(),
        ))
    });
    eprintln!("switchyard listening on http://{addr}");
    tracing::info!(%addr, manifests = %options.manifests.display(), "standalone router serving");
    let served = server::serve(app, listener, shutdown).await;
    control.abort();
    probes.abort();
    persistence.abort();
    if let Some(w) = watcher {
        w.abort();
    }
    served.map_err(StartError::Serve)
}

/// Reloads the configuration from `dir`, keeping the last good one on error.
pub fn reload(app: &App, dir: &Path, secrets: &SecretSource) -> Result<(), LoadErrors> {
    let outcome = |o: &str| crate::metrics::RouteOutcome {
        route: String::new(),
        outcome: o.to_owned(),
    };
    match build(dir, secrets) {
        Ok(table) => {
            app.runtime.swap(table);
            crate::server::warm_if_needed(app);
            // Limits may have grown: let waiting requests try again.
            app.broker.capacity_freed();
            lock(&app.config_messages).clear();
            app.metrics.reloads.get_or_create(&outcome("ok")).inc();
            tracing::info!("configuration reloaded");
            Ok(())
        }
        Err(errors) => {
            app.metrics.reloads.get_or_create(&outcome("invalid")).inc();
            tracing::error!(
                "configuration change rejected; still serving the last good configuration:\n{errors}"
            );
            eprintln!(
                "configuration change rejected; still serving the last good configuration:\n{errors}"
            );
            *lock(&app.config_messages) = std::iter::once(
                "the last configuration change was rejected; serving the previous one".to_owned(),
            )
            .chain(errors.0.iter().map(ToString::to_string))
            .collect();
            Err(errors)
        }
    }
}

/// Quiet period after a file event before reloading, so an editor's burst of writes (or a
/// `kubectl`-style replace of several files) becomes one reload.
const DEBOUNCE: Duration = Duration::from_millis(300);

async fn watch(app: Arc<App>, dir: PathBuf, secrets: SecretSource) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "failed to start the manifest watcher; changes need a restart");
            return;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::error!(error = %e, dir = %dir.display(), "failed to watch the manifest folder; changes need a restart");
        return;
    }
    // Secret files change on key rotation; they live in a folder of their own (often inside
    // the manifest folder, which is watched non-recursively).
    if let Some(secrets_dir) = &secrets.dir
        && let Err(e) = watcher.watch(secrets_dir, RecursiveMode::Recursive)
    {
        tracing::warn!(error = %e, dir = %secrets_dir.display(), "failed to watch the secrets folder; key rotation needs a manifest change or a restart");
    }
    while rx.recv().await.is_some() {
        // Collapse a burst of events into one reload.
        loop {
            match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let _ = reload(&app, &dir, &secrets);
    }
}
