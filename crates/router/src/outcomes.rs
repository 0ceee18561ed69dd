//! `GET /outcomes`: this replica's cumulative per-provider outcome counters, in the shape of
//! [`switchyard_api::outcomes::OutcomeReport`] (DESIGN §2, outcome protocol).
//!
//! The operator scrapes every replica and takes deltas between two scrapes; it recognises a
//! restart by a different `startedAt`. So `startedAt` must not move during the life of one
//! router: it is read once per router (from the wall clock minus the router's monotonic age)
//! and remembered, rather than recomputed per scrape, where an NTP step would make it jump and
//! look like a reset. Counters come straight from [`crate::state::OutcomeCounters`], which
//! outlive configuration reloads (a provider that leaves the configuration and comes back
//! starts from zero, which the operator sees as a counter that went down, i.e. a reset).
//!
//! Unauthenticated, like `/metrics`: it carries counts, no keys, prompts or tenants.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use switchyard_api::outcomes::{OutcomeReport, ProviderOutcomes, TenantOutcomes};
use switchyard_core::classify::ErrorClass;
use switchyard_core::time::Instant;

use crate::app::App;
use crate::state::{OutcomeCounters, lock};

/// The replica identity: `POD_NAME` (set from the downward API in the chart), else the host
/// name (`HOSTNAME`, then `/etc/hostname`), else `"unknown"`.
pub fn replica_identity() -> String {
    static IDENTITY: OnceLock<String> = OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            ["POD_NAME", "HOSTNAME"]
                .iter()
                .filter_map(|v| std::env::var(v).ok())
                .chain(std::fs::read_to_string("/etc/hostname").ok())
                .map(|s| s.trim().to_owned())
                .find(|s| !s.is_empty())
                .unwrap_or_else(|| "unknown".to_owned())
        })
        .clone()
}

/// When the router serving `app` started, remembered per router (keyed by its clock's
/// origin, so several routers in one test process each keep their own).
pub fn started_at(app: &App) -> DateTime<Utc> {
    static STARTS: OnceLock<Mutex<HashMap<tokio::time::Instant, DateTime<Utc>>>> = OnceLock::new();
    let origin = app
        .clock
        .to_tokio(Instant::from_origin(std::time::Duration::ZERO));
    let mut starts = lock(STARTS.get_or_init(|| Mutex::new(HashMap::new())));
    *starts.entry(origin).or_insert_with(|| {
        let age = app.clock.now().since_origin();
        let wall = app.clock.wall();
        chrono::Duration::from_std(age).map_or(wall, |age| wall - age)
    })
}

/// One provider's counters in the protocol's shape (error classes by their names, zeros left
/// out).
pub fn provider_outcomes(c: &OutcomeCounters) -> ProviderOutcomes {
    let errors: BTreeMap<String, u64> = ErrorClass::ALL
        .iter()
        .zip(&c.errors)
        .map(|(class, n)| (class.metric_label().to_owned(), n.load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect();
    ProviderOutcomes {
        successes: c.successes.load(Ordering::Relaxed),
        errors,
        cancelled: c.cancelled.load(Ordering::Relaxed),
        in_flight: c.in_flight.load(Ordering::Relaxed),
        slow: c.slow.load(Ordering::Relaxed),
        full_on_spill: c.full_on_spill.load(Ordering::Relaxed),
    }
}

/// The report of this router now: every provider and tenant of the current configuration,
/// keyed `namespace/name`, with the tenants' usage read from the quota store.
pub async fn report(app: &App) -> OutcomeReport {
    let mut usage = crate::status::tenant_usage(app).await;
    let live = app.runtime.live();
    let tenants = live
        .table
        .tenants
        .iter()
        .map(|t| {
            let counts = app.broker.tenant_counts(&t.key);
            let outcomes = TenantOutcomes {
                throttled: counts.throttled,
                rejected: counts.rejected,
                usage: usage.remove(&t.key).unwrap_or_default(),
            };
            (t.key.clone(), outcomes)
        })
        .collect();
    let providers = live
        .table
        .providers
        .iter()
        .zip(&live.providers)
        .map(|(p, s)| (p.key.clone(), provider_outcomes(&s.counters)))
        .collect();
    OutcomeReport {
        replica: replica_identity(),
        started_at: started_at(app),
        providers,
        tenants,
        quota_store: app.broker.store().mode().label().to_owned(),
    }
}

/// `GET /outcomes`.
pub async fn handler(State(app): State<Arc<App>>) -> Response {
    axum::Json(report(&app).await).into_response()
}
