//! The in-process control loop of the embedded default: every interval, close the window of
//! outcome counters, step each provider's availability controller and recompute each route's
//! cascade weights (DESIGN §4.1–§4.2). In Kubernetes mode the operator runs the same steps on
//! counters scraped from every router replica.

use std::sync::Arc;
use std::time::Duration;

use crate::server::App;

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
        if since_housekeeping >= crate::server::HOUSEKEEPING_INTERVAL {
            app.runtime.housekeeping(app.clock.now());
            since_housekeeping = Duration::ZERO;
        }
        tracing::debug!(interval_ms = period.as_millis() as u64, "control tick");
    }
}
