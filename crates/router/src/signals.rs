//! Retry-After pauses and open circuit breakers shared by every router replica (field case 8).
//!
//! The decisions stay local and fast: each replica pauses a scope or opens a breaker the
//! moment it sees the reason. It then *publishes* the deadline through the quota store
//! ([`switchyard_store::QuotaStore::publish_pause`], `publish_breaker_open`), which keeps the
//! latest deadline per subject and announces it; every replica *applies* what it hears with
//! the same never-shorten rule it uses for its own pauses, and a replica that starts (or
//! restarts) loads the deadlines still running. With the in-process store the announcements
//! go to this process only, so the code path is the same.
//!
//! Deadlines cross processes as wall-clock times (millisecond resolution); each replica turns
//! them back into its own monotonic clock on arrival. Replicas' clocks must agree to well
//! within a pause (NTP), which Kubernetes nodes do.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use switchyard_core::classify::ErrorClass;
use switchyard_store::{Signal, SignalKind};

use crate::app::App;
use crate::state::lock;

/// Announces that `scope` is paused until the monotonic `until` (non-blocking).
pub fn publish_pause(app: &Arc<App>, scope: &str, until: switchyard_core::time::Instant) {
    let Some(wall) = to_wall(app, until) else {
        return;
    };
    let store = app.broker.store().clone();
    let scope = scope.to_owned();
    tokio::spawn(async move {
        store.publish_pause(&scope, wall).await;
    });
}

/// Announces that the breaker of `provider` (its `namespace/name`) is open until `until`.
pub fn publish_breaker_open(app: &Arc<App>, provider: &str, until: switchyard_core::time::Instant) {
    let Some(wall) = to_wall(app, until) else {
        return;
    };
    let store = app.broker.store().clone();
    let provider = provider.to_owned();
    tokio::spawn(async move {
        store.publish_breaker_open(&provider, wall).await;
    });
}

fn to_wall(app: &App, until: switchyard_core::time::Instant) -> Option<DateTime<Utc>> {
    let left = until.saturating_since(app.clock.now());
    if left.is_zero() {
        return None;
    }
    let left = chrono::Duration::from_std(left).ok()?;
    Some(app.clock.wall() + left)
}

/// Applies one announced deadline to this replica's pauses or breakers.
pub fn apply(app: &App, signal: &Signal) {
    let now = app.clock.now();
    let Ok(left) = (signal.until - app.clock.wall()).to_std() else {
        return; // already over
    };
    if left.is_zero() {
        return;
    }
    match signal.kind {
        SignalKind::Pause => {
            // The class only labels the pause; capacity is what shared pauses are about.
            lock(&app.runtime.pauses).pause(&signal.subject, left, now, ErrorClass::Capacity);
        }
        SignalKind::BreakerOpen => {
            let live = app.runtime.live();
            if let Some(i) = live
                .table
                .providers
                .iter()
                .position(|p| p.key == signal.subject)
            {
                lock(&live.providers[i].breaker).force_open(now + left, now);
            }
        }
    }
}

/// Loads the deadlines still running, then applies every announcement until the process
/// ends.
pub async fn run(app: Arc<App>) {
    let store = app.broker.store().clone();
    let mut announcements = Box::pin(store.subscribe());
    for signal in store.load_signals().await {
        apply(&app, &signal);
    }
    while let Some(signal) = announcements.next().await {
        tracing::debug!(kind = ?signal.kind, subject = %signal.subject, until = %signal.until, "shared signal");
        apply(&app, &signal);
    }
}
