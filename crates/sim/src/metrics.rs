//! What a run measures: one row per interval `T` and a summary over the run.
//!
//! Definitions (used in every table and test):
//! - *client-visible error*: a request that failed after every attempt the strategy allowed (or
//!   whose queue wait ran out); errors absorbed by a fallback do not count.
//! - *affinity retention*: among served turns of a session that have a previous served turn,
//!   the share served by the same provider as that previous turn.
//! - *uncached input tokens*: input tokens of served attempts that missed the provider's prompt
//!   cache, i.e. the context the provider had to process again.
//! - *traffic share*: a provider's share of the requests served in the interval.
//! - *latency*: client-visible, from the request's arrival to its answer, across attempts and
//!   queue waits; percentiles are over served requests.

use std::time::Duration;

use crate::strategy::StrategyKind;

/// Counters of one provider in one interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderInterval {
    /// Availability computed at the end of the interval (switchyard chat only).
    pub availability: Option<f64>,
    /// Weight computed at the end of the interval (switchyard chat only).
    pub weight: Option<f64>,
    /// Attempts sent.
    pub attempts: u64,
    /// Requests served.
    pub served: u64,
    /// Share of the interval's served requests (0..1).
    pub share: f64,
    /// Provider-side errors other than 429 (5xx, timeouts).
    pub errors: u64,
    /// 429 answers.
    pub rate_limited: u64,
}

/// One interval of one run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IntervalRow {
    /// Interval start since the scenario start.
    pub start: Duration,
    /// Per provider, in scenario order.
    pub providers: Vec<ProviderInterval>,
    /// Requests finished (served or failed) in the interval.
    pub requests: u64,
    /// Client-visible errors.
    pub client_errors: u64,
    /// `client_errors / requests` (0 when idle).
    pub client_error_rate: f64,
    /// Affinity retention of the interval, `None` without a counted turn.
    pub affinity: Option<f64>,
    /// Uncached input tokens processed.
    pub uncached_tokens: u64,
    /// All input tokens of served requests.
    pub input_tokens: u64,
    /// Median latency of served requests, ms.
    pub p50_ms: Option<f64>,
    /// 95th percentile latency of served requests, ms.
    pub p95_ms: Option<f64>,
}

/// Totals of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Scenario name.
    pub scenario: String,
    /// Strategy.
    pub strategy: StrategyKind,
    /// Requests finished.
    pub requests: u64,
    /// Client-visible errors.
    pub client_errors: u64,
    /// `client_errors / requests`.
    pub client_error_rate: f64,
    /// Turns with a previous served turn.
    pub affinity_turns: u64,
    /// Of those, turns on the same provider.
    pub affinity_same: u64,
    /// `affinity_same / affinity_turns` (1 when there are none).
    pub affinity_retention: f64,
    /// Uncached input tokens processed.
    pub uncached_tokens: u64,
    /// All input tokens of served requests.
    pub input_tokens: u64,
    /// Attempts sent.
    pub attempts: u64,
    /// 429 answers.
    pub rate_limited: u64,
    /// Other provider-side errors.
    pub provider_errors: u64,
    /// Latency percentiles of served requests, ms.
    pub p50_ms: f64,
    /// 95th percentile, ms.
    pub p95_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Client-visible errors by cause.
    pub failures: FailureCounts,
}

/// Client-visible errors by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// Every allowed attempt failed.
    pub attempts_exhausted: u64,
    /// Every candidate stayed paused or open longer than the queue wait.
    pub queue_timeout: u64,
    /// No candidate left to try, or the retry budget / fallback throttle refused a retry.
    pub no_candidate: u64,
}

/// Everything one run produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Provider names in scenario order.
    pub providers: Vec<String>,
    /// Interval rows.
    pub intervals: Vec<IntervalRow>,
    /// Totals.
    pub summary: RunSummary,
    /// Every attempt and every request's end, for scripted traffic only (empty otherwise).
    pub replay: Replay,
}

/// What a replay did, request by request: the record the router-equivalence test compares with
/// the attempts a real router sent to the mock providers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replay {
    /// Attempts in the order they were sent.
    pub attempts: Vec<ReplayAttempt>,
    /// Per scripted request (in script order), the provider that served it, `None` for a
    /// client error.
    pub served_by: Vec<Option<usize>>,
}

/// One attempt of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayAttempt {
    /// Index of the scripted request.
    pub request: u64,
    /// Provider index (scenario order).
    pub provider: usize,
    /// Virtual send time.
    pub at: Duration,
}

impl RunResult {
    /// Index of a provider by name.
    pub fn provider(&self, name: &str) -> Option<usize> {
        self.providers.iter().position(|p| p == name)
    }
}

/// Nearest-rank percentile of an unsorted sample (sorts in place); `None` when empty.
pub(crate) fn percentile(xs: &mut [f32], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_unstable_by(f32::total_cmp);
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    Some(f64::from(xs[rank - 1]))
}

/// Accumulates one interval.
#[derive(Debug, Default)]
pub(crate) struct Acc {
    pub(crate) prov: Vec<ProviderInterval>,
    pub(crate) requests: u64,
    pub(crate) client_errors: u64,
    pub(crate) aff_turns: u64,
    pub(crate) aff_same: u64,
    pub(crate) uncached: u64,
    pub(crate) input: u64,
    pub(crate) lat_ms: Vec<f32>,
}

impl Acc {
    pub(crate) fn new(n: usize) -> Self {
        Self {
            prov: vec![ProviderInterval::default(); n],
            ..Self::default()
        }
    }

    /// Closes the interval into a row and resets.
    pub(crate) fn take_row(
        &mut self,
        start: Duration,
        avail: Option<&[f64]>,
        weights: Option<&[f64]>,
    ) -> IntervalRow {
        let n = self.prov.len();
        let served: u64 = self.prov.iter().map(|p| p.served).sum();
        let mut providers = std::mem::replace(&mut self.prov, vec![ProviderInterval::default(); n]);
        for (i, p) in providers.iter_mut().enumerate() {
            p.share = if served > 0 {
                p.served as f64 / served as f64
            } else {
                0.0
            };
            p.availability = avail.and_then(|a| a.get(i).copied());
            p.weight = weights.and_then(|w| w.get(i).copied());
        }
        let row = IntervalRow {
            start,
            providers,
            requests: self.requests,
            client_errors: self.client_errors,
            client_error_rate: ratio(self.client_errors, self.requests).unwrap_or(0.0),
            affinity: ratio(self.aff_same, self.aff_turns),
            uncached_tokens: self.uncached,
            input_tokens: self.input,
            p50_ms: percentile(&mut self.lat_ms, 0.50),
            p95_ms: percentile(&mut self.lat_ms, 0.95),
        };
        self.requests = 0;
        self.client_errors = 0;
        self.aff_turns = 0;
        self.aff_same = 0;
        self.uncached = 0;
        self.input = 0;
        self.lat_ms.clear();
        row
    }
}

pub(crate) fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_nearest_rank_matches_definition() {
        let mut xs: Vec<f32> = (1..=100).rev().map(|x| x as f32).collect();
        assert_eq!(percentile(&mut xs, 0.95), Some(95.0));
        assert_eq!(percentile(&mut xs, 0.5), Some(50.0));
        assert_eq!(percentile(&mut [], 0.5), None);
    }
}
