//! The live view (issue 17 item 4): a read-only page at `GET /ui`, the last hour of per-route
//! provider state at `GET /ui/history`, and the chain a project gets at `GET /ui/chain`.
//! Switched by [`crate::app::ServeOptions::ui`] (`--ui=false` turns it off: the three paths
//! answer 404 and no history is kept).
//!
//! History: a sampler task takes one [`Sample`] per period (the control interval, clamped to
//! [`MIN_PERIOD`]..[`MAX_PERIOD`]) into a ring of at most [`HISTORY_CAPACITY`] samples, and
//! drops samples older than [`HISTORY_WINDOW`]. Memory is bounded by
//! `HISTORY_CAPACITY × (route, provider) pairs × ~150 bytes` (10 pairs: about 5 MiB at the
//! 1 s floor, 180 KiB at the default 30 s interval). A sample holds, per route and provider,
//! the availability and weight at sampling time and the outcome counters' deltas since the
//! previous sample (successes, errors by [`ErrorClass`], skips while paused or open), plus
//! whether a pause or an open circuit held at sampling time. Counters are per provider, so a
//! provider listed by two routes shows the same deltas in both; a route's traffic share is
//! its providers' successes over their sum.
//!
//! Chain lookup: keyed on the *project id* requests are pinned on (the route's affinity
//! header, else the TenantQuota's `namespace/name`, else `anonymous`), never on an API key,
//! so typing a key reveals nothing about it: any string gets a chain, computed as the
//! router would ([`switchyard_core::chain::route_chain`]) or read from the project's pin. The
//! lookup never creates a pin and is `O(routes × providers)`; the id is capped at
//! [`crate::request::MAX_PROJECT_KEY_BYTES`]. It does show whether a project id currently has
//! a pin (an operator's view, like `/status`, served on the same port).
//!
//! The page is one HTML file with inline CSS and JS, embedded with `include_str!`; its charts
//! are hand-written SVG (`ui/charts.js`, shared with the simulator's page
//! [`SIMULATOR_PAGE`]). Nothing is fetched from elsewhere at run time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use switchyard_core::breaker::BreakerState;
use switchyard_core::classify::ErrorClass;

use crate::app::App;
use crate::state::lock;

/// The router's page.
pub const ROUTER_PAGE: &str = concat!(
    include_str!("ui/router.html"),
    "<script>\n",
    include_str!("ui/charts.js"),
    "</script>\n<script>\n",
    include_str!("ui/router.js"),
    "</script>\n</body>\n</html>\n"
);

/// The simulator's page (`switchyard simulate --serve`), with the same chart code.
pub const SIMULATOR_PAGE: &str = concat!(
    include_str!("ui/sim.html"),
    "<script>\n",
    include_str!("ui/charts.js"),
    "</script>\n<script>\n",
    include_str!("ui/sim.js"),
    "</script>\n</body>\n</html>\n"
);

/// Shortest sampling period (a route may run its control loop every 100 ms).
pub const MIN_PERIOD: Duration = Duration::from_secs(1);
/// Longest sampling period, so a slow control loop still draws a line.
pub const MAX_PERIOD: Duration = Duration::from_secs(60);

use crate::history::Cumulative;
pub use crate::history::{
    HISTORY_CAPACITY, HISTORY_WINDOW, History, HistoryDocument, ProviderSample, RouteSample, Sample,
};

impl History {
    /// Takes one sample of `app` now and appends it, dropping the oldest past
    /// [`HISTORY_CAPACITY`] or [`HISTORY_WINDOW`].
    pub fn sample(&self, app: &App, period: Duration) {
        let live = app.runtime.live();
        let now = app.clock.now();
        let wall = app.clock.wall();
        let mut inner = lock(&self.inner);
        inner.period = period;
        let mut current: HashMap<String, Cumulative> =
            HashMap::with_capacity(live.table.providers.len());
        let mut deltas: Vec<(Cumulative, bool, bool)> = Vec::with_capacity(live.providers.len());
        {
            let pauses = lock(&app.runtime.pauses);
            for (p, s) in live.table.providers.iter().zip(&live.providers) {
                let c = &s.counters;
                let cum = Cumulative {
                    successes: c.successes.load(Ordering::Relaxed),
                    errors: std::array::from_fn(|i| c.errors[i].load(Ordering::Relaxed)),
                    skipped_paused: c.skipped_paused.load(Ordering::Relaxed),
                    skipped_open: c.skipped_open.load(Ordering::Relaxed),
                };
                let prev = inner.last.get(&p.key).copied().unwrap_or_default();
                let delta = Cumulative {
                    successes: cum.successes.saturating_sub(prev.successes),
                    errors: std::array::from_fn(|i| cum.errors[i].saturating_sub(prev.errors[i])),
                    skipped_paused: cum.skipped_paused.saturating_sub(prev.skipped_paused),
                    skipped_open: cum.skipped_open.saturating_sub(prev.skipped_open),
                };
                let paused = p
                    .pause_scopes
                    .iter()
                    .any(|scope| pauses.entry(scope, now).is_some_and(|e| e.until > now));
                let open = matches!(lock(&s.breaker).state(now), BreakerState::Open { .. });
                deltas.push((delta, paused, open));
                current.insert(p.key.clone(), cum);
            }
        }
        inner.last = current;
        let routes = live
            .table
            .routes
            .iter()
            .zip(&live.routes)
            .map(|(r, state)| {
                let weights = state.weights.load();
                let mut providers: Vec<ProviderSample> = r
                    .providers
                    .iter()
                    .zip(&r.provider_names)
                    .enumerate()
                    .map(|(i, (rp, name))| {
                        let (delta, paused, open) =
                            deltas.get(rp.index).copied().unwrap_or_default();
                        ProviderSample {
                            name: name.clone(),
                            availability: live
                                .providers
                                .get(rp.index)
                                .map_or(0.0, |p| p.availability()),
                            weight: weights.get(i).copied().unwrap_or(0.0),
                            served: delta.successes,
                            share: 0.0,
                            errors: delta.errors,
                            skipped_paused: delta.skipped_paused,
                            skipped_open: delta.skipped_open,
                            paused,
                            open,
                            eligible: rp.ineligible.is_none(),
                        }
                    })
                    .collect();
                let total: u64 = providers.iter().map(|p| p.served).sum();
                if total > 0 {
                    for p in &mut providers {
                        p.share = p.served as f64 / total as f64;
                    }
                }
                RouteSample {
                    route: r.key.clone(),
                    model: r.model.clone(),
                    providers,
                }
            })
            .collect();
        let t = wall.timestamp_millis();
        inner.points.push_back(Sample { t, routes });
        let oldest = t.saturating_sub(i64::try_from(HISTORY_WINDOW.as_millis()).unwrap_or(0));
        while inner.points.len() > HISTORY_CAPACITY
            || inner.points.front().is_some_and(|s| s.t < oldest)
        {
            inner.points.pop_front();
        }
    }

    /// The samples taken after `since` (Unix ms; all when `None`).
    pub fn document(&self, since: Option<i64>) -> HistoryDocument {
        let inner = lock(&self.inner);
        HistoryDocument {
            period_s: inner.period.as_secs_f64(),
            capacity: HISTORY_CAPACITY,
            window_s: HISTORY_WINDOW.as_secs(),
            error_classes: ErrorClass::ALL.iter().map(ToString::to_string).collect(),
            points: inner
                .points
                .iter()
                .filter(|s| since.is_none_or(|t| s.t > t))
                .cloned()
                .collect(),
        }
    }

    /// Samples held now.
    pub fn len(&self) -> usize {
        lock(&self.inner).points.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The sampling period for `app`: its control interval within [`MIN_PERIOD`]..[`MAX_PERIOD`].
pub fn period(app: &App) -> Duration {
    crate::control::interval(app).clamp(MIN_PERIOD, MAX_PERIOD)
}

/// Samples `app` every [`period`] until the task is dropped (a first sample at once, so the
/// page has a starting point).
pub async fn run_sampler(app: Arc<App>) {
    loop {
        let every = period(&app);
        app.history.sample(&app, every);
        tokio::time::sleep(every).await;
    }
}

/// The routes of the live view, for [`crate::server::router`] when the view is on.
pub fn routes() -> axum::Router<Arc<App>> {
    axum::Router::new()
        .route("/ui", axum::routing::get(page))
        .route("/ui/history", axum::routing::get(history))
        .route("/ui/chain", axum::routing::get(chain))
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            // Everything is inline and from this origin; nothing else may load.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
        ],
        ROUTER_PAGE,
    )
        .into_response()
}

/// Query of `GET /ui/history`.
#[derive(Debug, Deserialize)]
struct HistoryQuery {
    /// Only samples after this Unix ms.
    since: Option<i64>,
}

async fn history(State(app): State<Arc<App>>, Query(q): Query<HistoryQuery>) -> Response {
    axum::Json(app.history.document(q.since)).into_response()
}

/// Query of `GET /ui/chain`.
#[derive(Debug, Deserialize)]
struct ChainQuery {
    /// The project id (affinity header value or TenantQuota `namespace/name`).
    project: String,
    /// Only this route (`namespace/name`, name or model); every route when absent.
    route: Option<String>,
}

/// One provider of a looked-up chain.
#[derive(Debug, Clone, Serialize)]
pub struct ChainEntry {
    /// Provider object name.
    pub name: String,
    /// Route weight now.
    pub weight: f64,
    /// Availability now.
    pub availability: f64,
    /// The route may use it.
    pub eligible: bool,
    /// Paused now.
    pub paused: bool,
    /// Circuit open now.
    pub open: bool,
}

/// The chain of one project on one route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteChain {
    /// `namespace/name`.
    pub route: String,
    /// Public model name.
    pub model: String,
    /// Whether the chain is the project's current pin (else computed fresh from the weights;
    /// the lookup creates no pin).
    pub pinned: bool,
    /// Providers in chain order; a request goes to the first one not paused, open or
    /// ineligible.
    pub chain: Vec<ChainEntry>,
    /// The provider a request would try first now, if any.
    pub first: Option<String>,
}

/// What `GET /ui/chain` returns.
#[derive(Debug, Clone, Serialize)]
pub struct ChainDocument {
    /// The project id looked up.
    pub project: String,
    /// One entry per matching route.
    pub routes: Vec<RouteChain>,
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(serde_json::json!({"error": {"message": message}})),
    )
        .into_response()
}

async fn chain(State(app): State<Arc<App>>, Query(q): Query<ChainQuery>) -> Response {
    match lookup_chain(&app, &q.project, q.route.as_deref()) {
        Ok(doc) => axum::Json(doc).into_response(),
        Err(message) => bad_request(message),
    }
}

/// The chain `project` gets on every route (or the one named `route`), without pinning.
///
/// Errors (a message for a 400): an empty id, one longer than
/// [`crate::request::MAX_PROJECT_KEY_BYTES`], or a route that matches nothing.
pub fn lookup_chain(
    app: &App,
    project: &str,
    route: Option<&str>,
) -> Result<ChainDocument, String> {
    let max = crate::request::MAX_PROJECT_KEY_BYTES;
    if project.is_empty() {
        return Err("project is empty: give the project id requests are pinned on".to_owned());
    }
    if project.len() > max {
        return Err(format!("project is longer than {max} bytes"));
    }
    let live = app.runtime.live();
    let now = app.clock.now();
    let pauses = lock(&app.runtime.pauses);
    let mut routes = Vec::new();
    for (r, state) in live.table.routes.iter().zip(&live.routes) {
        if route.is_some_and(|want| want != r.key && want != r.name && want != r.model) {
            continue;
        }
        let weights = state.weights.load();
        let names: Vec<&str> = r.provider_names.iter().map(String::as_str).collect();
        let pinned = lock(&state.pins).peek(project, now);
        let order = match &pinned {
            Some(chain) => chain.clone(),
            None => {
                switchyard_core::chain::route_chain(project, &names, &weights, r.tiers.as_ref())
            }
        };
        let chain: Vec<ChainEntry> = order
            .iter()
            .filter_map(|&i| {
                let rp = r.providers.get(i)?;
                let p = live.table.providers.get(rp.index)?;
                let s = live.providers.get(rp.index)?;
                Some(ChainEntry {
                    name: r.provider_names.get(i)?.clone(),
                    weight: weights.get(i).copied().unwrap_or(0.0),
                    availability: s.availability(),
                    eligible: rp.ineligible.is_none(),
                    paused: p
                        .pause_scopes
                        .iter()
                        .any(|scope| pauses.entry(scope, now).is_some_and(|e| e.until > now)),
                    open: matches!(lock(&s.breaker).state(now), BreakerState::Open { .. }),
                })
            })
            .collect();
        let first = chain
            .iter()
            .find(|e| e.eligible && !e.paused && !e.open)
            .map(|e| e.name.clone());
        routes.push(RouteChain {
            route: r.key.clone(),
            model: r.model.clone(),
            pinned: pinned.is_some(),
            chain,
            first,
        });
    }
    if routes.is_empty()
        && let Some(want) = route
    {
        return Err(format!("no route named {want:?}"));
    }
    Ok(ChainDocument {
        project: project.to_owned(),
        routes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_at_most_capacity_samples() {
        let app = App::new(
            crate::state::Runtime::new(crate::config::RoutingTable::default()),
            1 << 20,
        );
        for _ in 0..HISTORY_CAPACITY + 5 {
            app.history.sample(&app, MIN_PERIOD);
        }
        assert_eq!(app.history.len(), HISTORY_CAPACITY);
        let doc = app.history.document(None);
        assert_eq!(doc.points.len(), HISTORY_CAPACITY);
        assert_eq!(doc.error_classes.len(), 9);
        let newest = doc.points.last().map(|p| p.t).unwrap_or_default();
        assert!(app.history.document(Some(newest)).points.is_empty());
    }

    #[test]
    fn chain_lookup_refuses_empty_and_oversized_ids() {
        let app = App::new(
            crate::state::Runtime::new(crate::config::RoutingTable::default()),
            1 << 20,
        );
        assert!(lookup_chain(&app, "", None).is_err());
        let long = "x".repeat(crate::request::MAX_PROJECT_KEY_BYTES + 1);
        assert!(lookup_chain(&app, &long, None).is_err());
        assert!(lookup_chain(&app, "p", Some("nope")).is_err());
        assert!(lookup_chain(&app, "p", None).unwrap().routes.is_empty());
    }
}
