//! Active health of one provider for one modality (DESIGN §4.8), from tiny real probe requests.
//!
//! ```text
//!                 success, latency ≤ L                      failures in a row ≥ N
//!   Unknown ─────────────────────────────► Healthy ─────────────────────────────► Unhealthy
//!      │  success, latency > L                ▲ │ failure (< N in a row)               │
//!      └───────────────► Degraded ◄───────────┘ └──────────► Degraded                  │
//!                            ▲                                                          │
//!                            └─────────────── any success (resets the run) ◄────────────┘
//!   any state ── no verdict for longer than `stale_after` ──► Unknown (read-side, not stored)
//! ```
//!
//! A probe ends in one of four [`ProbeOutcome`]s:
//! - **success** — the verdict is `Healthy`, or `Degraded` when slower than the latency
//!   threshold; the run of failures restarts at zero;
//! - **failure** — a transport failure, a timeout, a 5xx, or a 401/403/408: real traffic would
//!   meet it too. `failure_threshold` failures in a row make the modality `Unhealthy`; fewer
//!   make it `Degraded` ("fails intermittently");
//! - **probe rejected** — any other 4xx: the provider refused the *probe's shape* (a parameter
//!   it does not take, a model or voice it does not know, a path it does not serve). That says
//!   the probe is misconfigured, not that the provider is down, so it leaves the verdict and
//!   the failure run untouched and is reported separately ([`HealthTracker::probe_problem`]);
//! - **throttled** — a 429: the provider is up and at its limit. A 429 is a load signal for the
//!   rate-limit machinery, not an eviction (STYLE pattern 8), so it is inconclusive here too.
//!
//! Only a success or a failure refreshes the verdict's age. A verdict older than `stale_after`
//! (three probe intervals by default) reads as `Unknown`. [`HealthTracker::admits`] is
//! fail-open: only a *fresh* `Unhealthy` verdict keeps traffic of that modality away; unknown,
//! stale, degraded or never-probed admit (seed 003: a health source that fails must never stop
//! the service).
//!
//! Source: seed 003 (per-region, per-modality checks judged by response time and consecutive
//! failures, a text-only check that hid a broken audio path, fail-open client). Rejected
//! alternatives: a success *ratio* over a window (needs many probes per interval to mean
//! anything at one probe a minute; consecutive failures react in `N` intervals and are what the
//! CRD's `failureThreshold` promises); counting probe 4xx as failures (case 26: a provider that
//! rejects `max_tokens` on embeddings would be evicted while serving its real traffic fine);
//! requiring several successes to recover (a real request succeeding is better evidence than a
//! probe, and the availability controller already damps flapping providers).

use std::time::Duration;

use crate::time::Instant;

/// Verdict for one (provider, modality).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthState {
    /// The last probe succeeded within the latency threshold.
    Healthy,
    /// The last probe succeeded slowly, or failed fewer than `failure_threshold` times in a row.
    Degraded,
    /// At least `failure_threshold` probes in a row failed.
    Unhealthy,
    /// No verdict yet, or the last one is older than `stale_after`.
    Unknown,
}

/// What one probe showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The provider answered the probe successfully after `latency`.
    Success {
        /// Time from sending the probe to the complete answer.
        latency: Duration,
    },
    /// The provider could not serve the probe (transport error, timeout, 5xx, auth, 408).
    Failure {
        /// Short description for status (`"HTTP 500"`, `"timed out after 10s"`).
        detail: String,
    },
    /// The provider refused the probe's own shape (4xx other than 401/403/408/429), or the
    /// probe could not be built from its configuration (no model serves the modality, a speech
    /// probe without a voice): a probe configuration problem, never a sign of unavailability.
    ProbeRejected {
        /// HTTP status returned; `None` when the probe was not sent.
        status: Option<u16>,
        /// The provider's error message, shortened, for status.
        detail: String,
    },
    /// 429: the provider is rate-limiting; says nothing about health.
    Throttled,
}

impl ProbeOutcome {
    /// Classifies a complete HTTP answer to a probe: 2xx → success, 429 → throttled,
    /// 401/403/408 and 5xx (and anything outside 200..=599) → failure, other 4xx → probe
    /// rejected. `detail` is the provider's error message (ignored for a success).
    pub fn from_status(status: u16, latency: Duration, detail: &str) -> ProbeOutcome {
        match status {
            200..=299 => ProbeOutcome::Success { latency },
            429 => ProbeOutcome::Throttled,
            // Credentials or permissions fail real traffic as much as the probe; 408 is the
            // provider timing out.
            401 | 403 | 408 => ProbeOutcome::Failure {
                detail: with_detail(status, detail),
            },
            400..=499 => ProbeOutcome::ProbeRejected {
                status: Some(status),
                detail: detail.to_owned(),
            },
            _ => ProbeOutcome::Failure {
                detail: with_detail(status, detail),
            },
        }
    }
}

fn with_detail(status: u16, detail: &str) -> String {
    if detail.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {detail}")
    }
}

/// Thresholds of one (provider, modality).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// Failed probes in a row that make the modality `Unhealthy` (0 is treated as 1).
    pub failure_threshold: u32,
    /// Successes slower than this are `Degraded`.
    pub latency_threshold: Duration,
    /// A verdict older than this reads as `Unknown` (and admits).
    pub stale_after: Duration,
}

/// Verdicts older than this many probe intervals are stale: one lost probe is normal (a
/// timeout longer than the interval, a restart), three in a row mean the prober is gone.
pub const STALE_INTERVALS: u32 = 3;

impl HealthConfig {
    /// Thresholds for probes every `interval`: stale after [`STALE_INTERVALS`] intervals.
    pub fn for_interval(
        interval: Duration,
        failure_threshold: u32,
        latency_threshold: Duration,
    ) -> HealthConfig {
        HealthConfig {
            failure_threshold,
            latency_threshold,
            stale_after: interval.saturating_mul(STALE_INTERVALS),
        }
    }
}

impl Default for HealthConfig {
    /// The CRD defaults: 3 failures, 5 s latency threshold, 60 s interval (stale after 180 s).
    fn default() -> Self {
        HealthConfig::for_interval(Duration::from_secs(60), 3, Duration::from_secs(5))
    }
}

/// Health of one (provider, modality): the state machine of the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthTracker {
    verdict: Option<HealthState>,
    consecutive_failures: u32,
    verdict_at: Option<Instant>,
    last_probe_at: Option<Instant>,
    message: Option<String>,
    probe_problem: Option<String>,
}

impl HealthTracker {
    /// A tracker with no probe yet (reads `Unknown`, admits).
    pub fn new() -> Self {
        HealthTracker::default()
    }

    /// Records the outcome of a probe that finished at `now`. Returns the state as read right
    /// after it.
    pub fn record(
        &mut self,
        outcome: &ProbeOutcome,
        now: Instant,
        cfg: &HealthConfig,
    ) -> HealthState {
        self.last_probe_at = Some(now);
        match outcome {
            ProbeOutcome::Success { latency } => {
                self.consecutive_failures = 0;
                self.probe_problem = None;
                if *latency > cfg.latency_threshold {
                    self.verdict = Some(HealthState::Degraded);
                    self.message = Some(format!(
                        "probe took {} ms, above the {} ms latency threshold",
                        latency.as_millis(),
                        cfg.latency_threshold.as_millis()
                    ));
                } else {
                    self.verdict = Some(HealthState::Healthy);
                    self.message = None;
                }
                self.verdict_at = Some(now);
            }
            ProbeOutcome::Failure { detail } => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.probe_problem = None;
                let unhealthy = self.consecutive_failures >= cfg.failure_threshold.max(1);
                self.verdict = Some(if unhealthy {
                    HealthState::Unhealthy
                } else {
                    HealthState::Degraded
                });
                self.message = Some(format!(
                    "{} probe(s) in a row failed; last: {detail}",
                    self.consecutive_failures
                ));
                self.verdict_at = Some(now);
            }
            ProbeOutcome::ProbeRejected { status, detail } => {
                self.probe_problem = Some(match status {
                    Some(status) => with_detail(*status, detail),
                    None => format!("probe not sent: {detail}"),
                });
            }
            ProbeOutcome::Throttled => {}
        }
        self.state(now, cfg)
    }

    /// The state at `now`: the last verdict, or `Unknown` when there is none or it is older
    /// than `cfg.stale_after`.
    pub fn state(&self, now: Instant, cfg: &HealthConfig) -> HealthState {
        match (self.verdict, self.verdict_at) {
            (Some(v), Some(at)) if now.saturating_since(at) <= cfg.stale_after => v,
            _ => HealthState::Unknown,
        }
    }

    /// Whether traffic of this modality may go to the provider at `now`: false only for a
    /// fresh `Unhealthy` verdict (fail-open).
    pub fn admits(&self, now: Instant, cfg: &HealthConfig) -> bool {
        self.state(now, cfg) != HealthState::Unhealthy
    }

    /// Failed probes in a row so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// When the last probe of any outcome finished.
    pub fn last_probe_at(&self) -> Option<Instant> {
        self.last_probe_at
    }

    /// When the last success or failure finished (the verdict's age).
    pub fn verdict_at(&self) -> Option<Instant> {
        self.verdict_at
    }

    /// Detail of the current verdict (why Degraded or Unhealthy), if any.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// Set while the most recent conclusive-or-rejected probe was refused for its shape
    /// (`"HTTP 400: ..."`); cleared by the next success or failure.
    pub fn probe_problem(&self) -> Option<&str> {
        self.probe_problem.as_deref()
    }
}

/// Fail-open admission over an optional tracker: a missing one admits.
pub fn admits(tracker: Option<&HealthTracker>, now: Instant, cfg: &HealthConfig) -> bool {
    tracker.is_none_or(|t| t.admits(now, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HealthConfig {
        HealthConfig::for_interval(Duration::from_secs(10), 3, Duration::from_millis(500))
    }

    fn ok(ms: u64) -> ProbeOutcome {
        ProbeOutcome::Success {
            latency: Duration::from_millis(ms),
        }
    }

    fn fail() -> ProbeOutcome {
        ProbeOutcome::Failure {
            detail: "HTTP 500".into(),
        }
    }

    fn at(s: u64) -> Instant {
        Instant::from_millis(s * 1000)
    }

    #[test]
    fn tracker_new_is_unknown_and_admits() {
        let t = HealthTracker::new();
        assert_eq!(t.state(at(0), &cfg()), HealthState::Unknown);
        assert!(t.admits(at(0), &cfg()));
        assert!(admits(None, at(0), &cfg()));
    }

    #[test]
    fn tracker_fast_success_is_healthy() {
        let mut t = HealthTracker::new();
        assert_eq!(t.record(&ok(100), at(1), &cfg()), HealthState::Healthy);
        assert_eq!(t.message(), None);
    }

    #[test]
    fn tracker_slow_success_is_degraded_and_admits() {
        let mut t = HealthTracker::new();
        assert_eq!(t.record(&ok(900), at(1), &cfg()), HealthState::Degraded);
        assert!(t.admits(at(1), &cfg()));
        assert!(t.message().is_some_and(|m| m.contains("900 ms")));
    }

    #[test]
    fn tracker_failures_below_threshold_degraded_then_unhealthy_at_threshold() {
        let c = cfg();
        let mut t = HealthTracker::new();
        t.record(&ok(10), at(0), &c);
        assert_eq!(t.record(&fail(), at(10), &c), HealthState::Degraded);
        assert_eq!(t.record(&fail(), at(20), &c), HealthState::Degraded);
        assert!(t.admits(at(20), &c));
        assert_eq!(t.record(&fail(), at(30), &c), HealthState::Unhealthy);
        assert!(!t.admits(at(30), &c));
        assert_eq!(t.consecutive_failures(), 3);
    }

    #[test]
    fn tracker_success_after_unhealthy_recovers_and_resets_run() {
        let c = cfg();
        let mut t = HealthTracker::new();
        for i in 0..4 {
            t.record(&fail(), at(i * 10), &c);
        }
        assert_eq!(t.record(&ok(10), at(40), &c), HealthState::Healthy);
        assert_eq!(t.consecutive_failures(), 0);
        assert_eq!(t.record(&fail(), at(50), &c), HealthState::Degraded);
    }

    #[test]
    fn tracker_unhealthy_goes_unknown_and_admits_once_stale() {
        let c = cfg();
        let mut t = HealthTracker::new();
        for i in 0..3 {
            t.record(&fail(), at(i), &c);
        }
        // stale_after = 3 × 10 s after the last verdict at 2 s.
        assert!(!t.admits(at(32), &c));
        assert_eq!(t.state(at(33), &c), HealthState::Unknown);
        assert!(t.admits(at(33), &c));
    }

    #[test]
    fn tracker_probe_rejected_keeps_verdict_and_run_and_reports_problem() {
        let c = cfg();
        let mut t = HealthTracker::new();
        t.record(&ok(10), at(0), &c);
        let rejected = ProbeOutcome::ProbeRejected {
            status: Some(400),
            detail: "Unrecognized request argument supplied: max_tokens".into(),
        };
        for i in 1..10 {
            assert_eq!(t.record(&rejected, at(i), &c), HealthState::Healthy);
        }
        assert_eq!(t.consecutive_failures(), 0);
        assert_eq!(
            t.probe_problem(),
            Some("HTTP 400: Unrecognized request argument supplied: max_tokens")
        );
        assert_eq!(t.verdict_at(), Some(at(0)));
        assert_eq!(t.last_probe_at(), Some(at(9)));
        t.record(&ok(10), at(10), &c);
        assert_eq!(t.probe_problem(), None);
    }

    #[test]
    fn tracker_only_rejected_probes_stays_unknown_and_admits() {
        let c = cfg();
        let mut t = HealthTracker::new();
        let rejected = ProbeOutcome::ProbeRejected {
            status: Some(404),
            detail: String::new(),
        };
        for i in 0..20 {
            t.record(&rejected, at(i), &c);
        }
        assert_eq!(t.state(at(20), &c), HealthState::Unknown);
        assert!(t.admits(at(20), &c));
        assert_eq!(t.probe_problem(), Some("HTTP 404"));
    }

    #[test]
    fn tracker_throttled_neither_fails_nor_refreshes() {
        let c = cfg();
        let mut t = HealthTracker::new();
        t.record(&fail(), at(0), &c);
        t.record(&fail(), at(1), &c);
        t.record(&ProbeOutcome::Throttled, at(2), &c);
        assert_eq!(t.consecutive_failures(), 2);
        assert_eq!(t.verdict_at(), Some(at(1)));
        assert_eq!(t.record(&fail(), at(3), &c), HealthState::Unhealthy);
    }

    #[test]
    fn tracker_threshold_zero_is_one() {
        let mut c = cfg();
        c.failure_threshold = 0;
        let mut t = HealthTracker::new();
        assert_eq!(t.record(&fail(), at(0), &c), HealthState::Unhealthy);
    }

    #[test]
    fn outcome_from_status_classes() {
        let l = Duration::from_millis(5);
        assert_eq!(
            ProbeOutcome::from_status(200, l, ""),
            ProbeOutcome::Success { latency: l }
        );
        assert_eq!(
            ProbeOutcome::from_status(429, l, ""),
            ProbeOutcome::Throttled
        );
        for s in [400, 404, 405, 413, 415, 422] {
            assert!(
                matches!(ProbeOutcome::from_status(s, l, "x"), ProbeOutcome::ProbeRejected { status, .. } if status == Some(s)),
                "{s}"
            );
        }
        for s in [401, 403, 408, 500, 502, 503, 504, 529, 302, 600] {
            assert!(
                matches!(
                    ProbeOutcome::from_status(s, l, ""),
                    ProbeOutcome::Failure { .. }
                ),
                "{s}"
            );
        }
        assert_eq!(
            ProbeOutcome::from_status(503, l, "down"),
            ProbeOutcome::Failure {
                detail: "HTTP 503: down".into()
            }
        );
    }

    #[test]
    fn config_default_stale_after_three_intervals() {
        let c = HealthConfig::default();
        assert_eq!(c.stale_after, Duration::from_secs(180));
        assert_eq!(c.failure_threshold, 3);
    }
}
