//! The live view's history ring ([`crate::ui`]): the sample types and the bounded ring the
//! [`crate::app::App`] holds. Defined below `app` so the application state can own it; the
//! sampling and the HTTP handlers, which read the whole `App`, are in [`crate::ui`].

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// Most samples kept: one hour at the 1 s floor of [`crate::ui::MIN_PERIOD`].
pub const HISTORY_CAPACITY: usize = 3600;
/// Samples older than this are dropped.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(3600);

/// One provider of one route in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderSample {
    /// Provider object name.
    pub name: String,
    /// Availability at sampling time, 0..1.
    pub availability: f64,
    /// Route weight at sampling time, 0..1.
    pub weight: f64,
    /// Successful attempts since the previous sample.
    pub served: u64,
    /// `served` over the route's providers' `served` (0 when the route served nothing).
    pub share: f64,
    /// Failed attempts since the previous sample, by class, in the order of
    /// [`HistoryDocument::error_classes`].
    pub errors: [u64; 9],
    /// Requests that skipped the provider while it was paused, since the previous sample.
    pub skipped_paused: u64,
    /// Requests that skipped the provider while its circuit was open, since the previous sample.
    pub skipped_open: u64,
    /// Whether a pause (Retry-After, exhaustion) held on one of its scopes at sampling time.
    pub paused: bool,
    /// Whether its circuit was open at sampling time.
    pub open: bool,
    /// Whether the route may use it at all.
    pub eligible: bool,
}

/// One route in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct RouteSample {
    /// `namespace/name`.
    pub route: String,
    /// Public model name.
    pub model: String,
    /// Providers in the route's order.
    pub providers: Vec<ProviderSample>,
}

/// One point of history.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Sampling time, Unix milliseconds.
    pub t: i64,
    /// Every route.
    pub routes: Vec<RouteSample>,
}

/// What `GET /ui/history` returns.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryDocument {
    /// Sampling period, seconds.
    pub period_s: f64,
    /// Most samples kept.
    pub capacity: usize,
    /// Oldest sample age kept, seconds.
    pub window_s: u64,
    /// Names of the error classes, in the order of [`ProviderSample::errors`].
    pub error_classes: Vec<String>,
    /// Samples, oldest first (only those after `since` when it was given).
    pub points: Vec<Sample>,
}

/// Cumulative counters of one provider at the previous sample.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cumulative {
    pub(crate) successes: u64,
    pub(crate) errors: [u64; 9],
    pub(crate) skipped_paused: u64,
    pub(crate) skipped_open: u64,
}

/// The ring of samples and the counters of the previous sample.
#[derive(Debug, Default)]
pub struct History {
    pub(crate) inner: Mutex<HistoryInner>,
}

#[derive(Debug, Default)]
pub(crate) struct HistoryInner {
    pub(crate) points: VecDeque<Sample>,
    pub(crate) last: HashMap<String, Cumulative>,
    pub(crate) period: Duration,
}
