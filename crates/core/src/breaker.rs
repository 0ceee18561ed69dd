//! Per-provider circuit breaker (DESIGN §4.5).
//!
//! ```text
//!            N consecutive failures, or failure ratio ≥ r over ≥ m requests in the window
//!   Closed ───────────────────────────────────────────────────────────────────────► Open{until}
//!     ▲                                                                              │ now ≥ until
//!     │ all trial permits succeeded                                                  ▼
//!     └──────────────────────────────────── HalfOpen (≤ half_open_trials permits) ◄──┘
//!                                              │ any trial fails
//!                                              └──► Open{until = now + 2 × last cooldown, capped}
//! ```
//!
//! Only provider-side failures (capacity, overload, timeout/connect, server, auth) should be
//! reported through [`CircuitBreaker::on_failure`]; client request errors say nothing about the
//! provider. The breaker reacts within seconds on one router replica; the availability controller
//! ([`crate::availability`]) reacts over intervals across all replicas. Source: Nygard, *Release
//! It!* (closed/open/half-open), with the consecutive-or-ratio trip of Envoy/resilience4j and the
//! exponential re-open backoff of seed 004.
//!
//! Lost trials: a half-open trial whose outcome is never reported (the request was dropped)
//! would hold its permit forever. [`CircuitBreaker::on_cancel`] returns a permit explicitly.
//! A trial that is merely slow (it outlives the cooldown) still holds its permit: no new round
//! of permits is issued while earlier trials are in flight, so half-open never sends more than
//! `half_open_trials` at once (issue 14). Only a trial unreported for [`LOST_TRIAL_AFTER`]
//! (longer than any request may run) is taken as lost and its permit re-issued.

use std::time::Duration;

use crate::budget::SlidingCounts;
use crate::time::Instant;

/// Circuit-breaker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive provider-side failures that open a closed circuit (0 disables this trigger).
    pub consecutive_failures: u32,
    /// Failure fraction in `ratio_window` that opens the circuit (`> 1` or NaN disables it).
    pub failure_ratio: f64,
    /// Sliding window over which `failure_ratio` is measured.
    pub ratio_window: Duration,
    /// Minimum outcomes in `ratio_window` before `failure_ratio` may trip the circuit.
    pub min_requests: u32,
    /// Open time after the first trip.
    pub cooldown: Duration,
    /// Cap on the open time, which doubles on every failed half-open trial.
    pub max_cooldown: Duration,
    /// Trial requests admitted in half-open; all must succeed to close (0 is treated as 1).
    pub half_open_trials: u32,
}

impl Default for BreakerConfig {
    /// 5 consecutive failures or ≥ 50 % of ≥ 20 requests in 10 s; 5 s cooldown doubling up to
    /// 60 s; one trial. The ratio trigger catches a provider failing every other request, which
    /// never produces 5 failures in a row.
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_ratio: 0.5,
            ratio_window: Duration::from_secs(10),
            min_requests: 20,
            cooldown: Duration::from_secs(5),
            max_cooldown: Duration::from_secs(60),
            half_open_trials: 1,
        }
    }
}

/// Observable breaker state at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows.
    Closed,
    /// No traffic until `until`.
    Open {
        /// End of the cooldown.
        until: Instant,
    },
    /// A bounded number of trial requests may pass.
    HalfOpen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inner {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        since: Instant,
        issued: u32,
        succeeded: u32,
    },
}

/// After this long in half-open without every trial's outcome, the missing ones are taken as
/// lost (their requests ended without reporting) and a new round of permits is issued.
pub const LOST_TRIAL_AFTER: Duration = Duration::from_secs(15 * 60);

const OK: usize = 0;
const FAILED: usize = 1;

/// Circuit breaker for one provider on one router replica. See the module docs.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    cfg: BreakerConfig,
    inner: Inner,
    consecutive: u32,
    window: SlidingCounts,
    /// Cooldown used by the most recent opening.
    last_cooldown: Duration,
    trips: u64,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        CircuitBreaker {
            window: SlidingCounts::new(cfg.ratio_window),
            last_cooldown: cfg.cooldown,
            cfg,
            inner: Inner::Closed,
            consecutive: 0,
            trips: 0,
        }
    }

    /// The settings.
    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// How many times the circuit has opened (for metrics).
    pub fn trips(&self) -> u64 {
        self.trips
    }

    fn trials(&self) -> u32 {
        self.cfg.half_open_trials.max(1)
    }

    /// Asks to send one request at `now`. Closed: `true`. Open: `false` until the cooldown has
    /// elapsed, then the circuit turns half-open and this call takes the first trial permit.
    /// Half-open: `true` while trial permits remain. A `true` must be followed by exactly one of
    /// [`on_success`](Self::on_success), [`on_failure`](Self::on_failure) or
    /// [`on_cancel`](Self::on_cancel).
    pub fn try_acquire(&mut self, now: Instant) -> bool {
        match self.inner {
            Inner::Closed => true,
            Inner::Open { until } => {
                if now >= until {
                    self.inner = Inner::HalfOpen {
                        since: now,
                        issued: 1,
                        succeeded: 0,
                    };
                    true
                } else {
                    false
                }
            }
            Inner::HalfOpen {
                since,
                issued,
                succeeded,
            } => {
                if issued < self.trials() {
                    self.inner = Inner::HalfOpen {
                        since,
                        issued: issued + 1,
                        succeeded,
                    };
                    true
                } else if now.saturating_since(since) >= LOST_TRIAL_AFTER.max(self.last_cooldown) {
                    // Outcomes of the outstanding trials never came back: start a new round.
                    self.inner = Inner::HalfOpen {
                        since: now,
                        issued: 1,
                        succeeded: 0,
                    };
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Reports a success at `now`. Closes a half-open circuit once every trial has succeeded.
    /// A late success while open (a request admitted before the trip) changes nothing.
    pub fn on_success(&mut self, now: Instant) {
        match self.inner {
            Inner::Closed => {
                self.consecutive = 0;
                self.window.add(now, OK);
            }
            Inner::HalfOpen {
                since,
                issued,
                succeeded,
            } => {
                let succeeded = succeeded + 1;
                if succeeded >= self.trials() {
                    self.close();
                } else {
                    self.inner = Inner::HalfOpen {
                        since,
                        issued,
                        succeeded,
                    };
                }
            }
            Inner::Open { .. } => {}
        }
    }

    /// Reports a provider-side failure at `now`. Opens a closed circuit when a trigger fires;
    /// re-opens a half-open one with twice the previous cooldown (capped at `max_cooldown`).
    pub fn on_failure(&mut self, now: Instant) {
        match self.inner {
            Inner::Closed => {
                self.consecutive = self.consecutive.saturating_add(1);
                self.window.add(now, FAILED);
                if self.should_trip(now) {
                    self.open(now, self.cfg.cooldown);
                }
            }
            Inner::HalfOpen { .. } => {
                let longer = self
                    .last_cooldown
                    .saturating_mul(2)
                    .min(self.cfg.max_cooldown)
                    .max(self.cfg.cooldown);
                self.open(now, longer);
            }
            Inner::Open { .. } => {}
        }
    }

    /// Returns a permit whose request ended without an outcome about the provider (client
    /// cancelled, request rejected locally). Only matters in half-open.
    pub fn on_cancel(&mut self, _now: Instant) {
        if let Inner::HalfOpen {
            since,
            issued,
            succeeded,
        } = self.inner
        {
            self.inner = Inner::HalfOpen {
                since,
                issued: issued.saturating_sub(1),
                succeeded,
            };
        }
    }

    /// Opens the circuit until `until` because another replica's breaker opened (state shared
    /// through the quota store, field case 8). Never shortens an open circuit, and a moment
    /// already past changes nothing. After `until` the circuit turns half-open as usual, so
    /// this replica sends its own trial before trusting the provider again. Not counted in
    /// [`trips`](Self::trips) (the trip was the other replica's).
    pub fn force_open(&mut self, until: Instant, now: Instant) {
        if until <= now {
            return;
        }
        match self.inner {
            Inner::Open { until: current } if current >= until => {}
            _ => {
                self.last_cooldown = until.saturating_since(now).max(self.cfg.cooldown);
                self.inner = Inner::Open { until };
            }
        }
    }

    /// The state at `now`. An open circuit whose cooldown has elapsed reports `HalfOpen` (the
    /// transition itself happens on the next [`try_acquire`](Self::try_acquire)).
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.inner {
            Inner::Closed => BreakerState::Closed,
            Inner::Open { until } if now < until => BreakerState::Open { until },
            Inner::Open { .. } | Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    fn should_trip(&mut self, now: Instant) -> bool {
        let n = self.cfg.consecutive_failures;
        if n > 0 && self.consecutive >= n {
            return true;
        }
        let [ok, failed] = self.window.totals(now);
        let total = ok.saturating_add(failed);
        total > 0
            && total >= u64::from(self.cfg.min_requests)
            && failed as f64 / total as f64 >= self.cfg.failure_ratio
    }

    fn open(&mut self, now: Instant, cooldown: Duration) {
        self.last_cooldown = cooldown;
        self.inner = Inner::Open {
            until: now + cooldown,
        };
        self.trips = self.trips.saturating_add(1);
    }

    fn close(&mut self) {
        self.inner = Inner::Closed;
        self.consecutive = 0;
        self.window.clear();
        self.last_cooldown = self.cfg.cooldown;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    /// One scripted step and the expected result.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Acquire(u64, bool),
        Ok(u64),
        Fail(u64),
        State(u64, BreakerState),
    }

    fn run(cfg: BreakerConfig, steps: &[Step]) {
        let mut b = CircuitBreaker::new(cfg);
        for (n, step) in steps.iter().enumerate() {
            match *step {
                Step::Acquire(t, want) => {
                    assert_eq!(b.try_acquire(at(t)), want, "step {n}: {step:?}")
                }
                Step::Ok(t) => b.on_success(at(t)),
                Step::Fail(t) => b.on_failure(at(t)),
                Step::State(t, want) => assert_eq!(b.state(at(t)), want, "step {n}: {step:?}"),
            }
        }
    }

    fn open_until(ms: u64) -> BreakerState {
        BreakerState::Open { until: at(ms) }
    }

    #[test]
    fn breaker_consecutive_failures_open_then_half_open_then_close() {
        use Step::*;
        run(
            BreakerConfig::default(),
            &[
                State(0, BreakerState::Closed),
                Fail(0),
                Fail(1),
                Fail(2),
                Fail(3),
                State(3, BreakerState::Closed),
                Fail(4),
                State(4, open_until(5_004)),
                Acquire(5_003, false),
                State(5_004, BreakerState::HalfOpen),
                Acquire(5_004, true),
                // One trial only.
                Acquire(5_005, false),
                Ok(5_100),
                State(5_100, BreakerState::Closed),
                Acquire(5_100, true),
            ],
        );
    }

    #[test]
    fn breaker_success_resets_consecutive_count() {
        use Step::*;
        run(
            BreakerConfig::default(),
            &[
                Fail(0),
                Fail(1),
                Fail(2),
                Fail(3),
                Ok(4),
                Fail(5),
                Fail(6),
                Fail(7),
                Fail(8),
                State(8, BreakerState::Closed),
                Fail(9),
                State(9, open_until(5_009)),
            ],
        );
    }

    #[test]
    fn breaker_half_open_failure_doubles_cooldown_capped() {
        use Step::*;
        let cfg = BreakerConfig {
            consecutive_failures: 1,
            cooldown: Duration::from_secs(5),
            max_cooldown: Duration::from_secs(12),
            ..BreakerConfig::default()
        };
        run(
            cfg,
            &[
                Fail(0),
                State(0, open_until(5_000)),
                Acquire(5_000, true),
                Fail(5_010),
                State(5_010, open_until(15_010)),
                Acquire(15_010, true),
                Fail(15_020),
                // 20 s capped at 12 s.
                State(15_020, open_until(27_020)),
                Acquire(27_020, true),
                Ok(27_030),
                State(27_030, BreakerState::Closed),
                // Closing resets the cooldown to the base.
                Fail(27_040),
                State(27_040, open_until(32_040)),
            ],
        );
    }

    #[test]
    fn breaker_failure_ratio_trips_without_consecutive_run() {
        use Step::*;
        let cfg = BreakerConfig {
            min_requests: 10,
            ..BreakerConfig::default()
        };
        // Alternating ok/fail: never 5 in a row, 50 % failures; trips at the 10th outcome.
        let mut steps = Vec::new();
        for i in 0..9u64 {
            steps.push(if i % 2 == 0 {
                Fail(i * 100)
            } else {
                Ok(i * 100)
            });
        }
        steps.push(State(800, BreakerState::Closed));
        steps.push(Ok(900));
        steps.push(State(900, BreakerState::Closed));
        steps.push(Fail(1_000));
        steps.push(State(1_000, open_until(6_000)));
        run(cfg, &steps);
    }

    #[test]
    fn breaker_ratio_window_forgets_old_failures() {
        use Step::*;
        let cfg = BreakerConfig {
            consecutive_failures: 0,
            min_requests: 4,
            failure_ratio: 0.5,
            ..BreakerConfig::default()
        };
        run(
            cfg,
            &[
                Fail(0),
                Fail(100),
                Fail(200),
                // 20 s later the old failures are gone: 1 failure + 3 successes = 25 %.
                Ok(20_000),
                Ok(20_100),
                Ok(20_200),
                Fail(20_300),
                State(20_300, BreakerState::Closed),
            ],
        );
    }

    #[test]
    fn breaker_slow_trial_outliving_cooldown_gets_no_second_permit() {
        use Step::*;
        // Opens at 0 until 5 s; the trial taken at 5 s is still in flight 10 s later (twice the
        // cooldown): no new permit until it reports, or until it counts as lost.
        let mut steps = vec![Fail(0), Fail(1), Fail(2), Fail(3), Fail(4)];
        steps.push(State(4, open_until(5_004)));
        steps.push(Acquire(5_004, true));
        steps.push(Acquire(10_010, false));
        steps.push(Acquire(15_010, false));
        steps.push(Ok(16_000));
        steps.push(State(16_000, BreakerState::Closed));
        run(BreakerConfig::default(), &steps);
        let lost = 5_004 + u64::try_from(LOST_TRIAL_AFTER.as_millis()).unwrap();
        let mut steps = vec![Fail(0), Fail(1), Fail(2), Fail(3), Fail(4)];
        steps.push(Acquire(5_004, true));
        steps.push(Acquire(lost - 1, false));
        steps.push(Acquire(lost, true));
        run(BreakerConfig::default(), &steps);
    }

    #[test]
    fn breaker_multiple_trials_all_must_succeed() {
        use Step::*;
        let cfg = BreakerConfig {
            consecutive_failures: 1,
            half_open_trials: 2,
            ..BreakerConfig::default()
        };
        run(
            cfg,
            &[
                Fail(0),
                Acquire(5_000, true),
                Acquire(5_001, true),
                Acquire(5_002, false),
                Ok(5_100),
                State(5_100, BreakerState::HalfOpen),
                Fail(5_200),
                State(5_200, open_until(15_200)),
            ],
        );
    }

    #[test]
    fn breaker_lost_trial_reissued_after_lost_trial_timeout() {
        let cfg = BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        };
        let lost = 5_000 + u64::try_from(LOST_TRIAL_AFTER.as_millis()).unwrap();
        let mut b = CircuitBreaker::new(cfg);
        b.on_failure(at(0));
        assert!(b.try_acquire(at(5_000)));
        // The trial's outcome never arrives: a cooldown later it may still be running.
        assert!(!b.try_acquire(at(10_000)));
        assert!(!b.try_acquire(at(lost - 1)));
        assert!(b.try_acquire(at(lost)));
        // A cancelled trial returns its permit at once.
        b.on_cancel(at(lost + 1));
        assert!(b.try_acquire(at(lost + 2)));
        assert_eq!(b.trips(), 1);
    }

    #[test]
    fn breaker_late_success_while_open_stays_open() {
        use Step::*;
        let cfg = BreakerConfig {
            consecutive_failures: 1,
            ..BreakerConfig::default()
        };
        run(
            cfg,
            &[Fail(0), Ok(10), Fail(20), State(20, open_until(5_000))],
        );
    }

    #[test]
    fn force_open_extends_never_shortens_then_half_opens() {
        let cfg = BreakerConfig::default();
        let mut b = CircuitBreaker::new(cfg);
        let t0 = Instant::from_millis(1_000);
        b.force_open(t0 + Duration::from_secs(10), t0);
        assert_eq!(
            b.state(t0),
            BreakerState::Open {
                until: t0 + Duration::from_secs(10)
            }
        );
        b.force_open(t0 + Duration::from_secs(5), t0);
        assert!(!b.try_acquire(t0 + Duration::from_secs(6)));
        b.force_open(t0, t0);
        assert_eq!(b.trips(), 0);
        assert!(b.try_acquire(t0 + Duration::from_secs(10)));
        assert_eq!(
            b.state(t0 + Duration::from_secs(10)),
            BreakerState::HalfOpen
        );
    }
}
