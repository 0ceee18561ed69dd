//! The in-process control loop of the embedded default: every interval, close the window of
//! outcome counters, step each provider's availability controller and recompute each route's
//! cascade weights (DESIGN §4.1–§4.2). In Kubernetes mode the operator runs the same steps on
//! counters scraped from every router replica.

use std::sync::Arc;
use std::time::Duration;

use crate::app::{App, HOUSEKEEPING_INTERVAL};

/// The controller interval: the shortest interval of any route (default 30 s), so a route
/// that asks for a faster loop gets it.
pub fn interval(app: &App) -> Duration {
    app.runtime
        .live()
        .table
        .routes
        .iter()
        .map(|r| r.interval)
        .min()
        .unwrap_or(Duration::from_secs(30))
        .max(Duration::from_millis(100))
}

/// Runs the control loop until the task is dropped.
pub async fn run(app: Arc<App>) {
    let mut since_housekeeping = Duration::ZERO;
    loop {
        let period = interval(&app);
        tokio::time::sleep(period).await;
        app.runtime.control_tick(app.clock.wall());
        since_housekeeping += period;
        if since_housekeeping >= HOUSEKEEPING_INTERVAL {
            app.runtime.housekeeping(app.clock.now());
            since_housekeeping = Duration::ZERO;
        }
        tracing::debug!(interval_ms = period.as_millis() as u64, "control tick");
    }
}

/// Checks, at start and then every `every`, whether the configured Redis persists
/// (`CONFIG GET save` / `appendonly`) while limits that need it are configured (see
/// [`needs_persistence`]); if not, logs a warning naming them (once per change) and sets
/// `switchyard_quota_unpersisted_limits` to their number. Returns at once for the in-process
/// store. A Redis that does not answer `CONFIG` (managed services often forbid it) is logged
/// once at debug level and counted as 0: unknown is not reported as a risk.
pub async fn watch_persistence(app: Arc<App>, every: Duration) {
    if app.broker.store().mode() == switchyard_store::StoreMode::InProcess {
        return;
    }
    let mut last: Option<usize> = None;
    loop {
        let at_risk = match app.broker.store().persistence().await {
            Some(p) if !p.persists() => {
                let live = app.runtime.live();
                let table = &live.table;
                let mut keys: Vec<&str> = table
                    .tenants
                    .iter()
                    .flat_map(|t| t.buckets.iter())
                    .chain(table.routes.iter().flat_map(|r| r.buckets.iter()))
                    .chain(table.providers.iter().flat_map(|p| p.buckets.iter()))
                    .filter(|b| crate::broker::needs_persistence(b))
                    .map(|b| b.key.as_str())
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                if last != Some(keys.len()) && !keys.is_empty() {
                    tracing::warn!(
                        limits = keys.len(),
                        first = %keys.iter().take(5).copied().collect::<Vec<_>>().join(", "),
                        "quota store: Redis persists nothing (save \"\", appendonly no) while daily or longer or spend limits are configured; a Redis restart resets them (see docs/broker.md, Redis persistence)"
                    );
                }
                keys.len()
            }
            _ => 0,
        };
        last = Some(at_risk);
        app.metrics
            .unpersisted_limits
            .set(i64::try_from(at_risk).unwrap_or(i64::MAX));
        tokio::time::sleep(every).await;
    }
}
