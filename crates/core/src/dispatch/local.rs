//! A [`Fleet`] over plain values: one route whose members are the fleet's providers in order
//! (member `i` is provider `i`). The simulator drives its requests through it, and the unit
//! tests of the machine use it.

use std::time::Duration;

use super::{Count, Fleet};
use crate::availability::WindowCounts;
use crate::breaker::{BreakerConfig, CircuitBreaker};
use crate::budget::{FallbackThrottle, RetryBudget};
use crate::chain::{ChainPins, MoveCause};
use crate::latency::{LatencyModel, peer_log_ratio, slow_as_errors};
use crate::p2c::{P2c, P2cConfig};
use crate::pause::Pauses;
use crate::time::Instant;
use crate::waitline::WaitLines;
use crate::weights::Tiers;

/// One provider's outcome counts since the last controller step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Successful attempts.
    pub successes: u64,
    /// Failed attempts of provider-side classes.
    pub provider_errors: u64,
    /// Failed attempts that were not the provider's fault (request, deadline).
    pub other_errors: u64,
    /// Attempts the client abandoned.
    pub cancelled: u64,
    /// Requests that skipped the provider while it was paused.
    pub skipped_paused: u64,
    /// Requests that skipped the provider while its circuit was open.
    pub skipped_open: u64,
    /// Successes judged slow against the provider's latency baseline (also in `successes`).
    pub slow: u64,
    /// Capacity refusals and skips of spill-over traffic ([`Count::FullOnSpill`]); not in
    /// the controller window.
    pub full_on_spill: u64,
}

impl Tally {
    /// Adds one event.
    pub fn add(&mut self, event: Count) {
        match event {
            Count::Success => self.successes += 1,
            Count::Error(c) if c.is_provider_side() => self.provider_errors += 1,
            Count::Error(_) => self.other_errors += 1,
            Count::Cancelled => self.cancelled += 1,
            Count::SkippedPaused => self.skipped_paused += 1,
            Count::SkippedOpen => self.skipped_open += 1,
            Count::Slow => self.slow += 1,
            Count::FullOnSpill => self.full_on_spill += 1,
        }
    }
}

/// The controller window of one provider from its tally (DESIGN §4.1).
///
/// With `skips_as_errors`, a request that skipped the provider because it was paused counts as
/// a provider-side error: without it, pauses hide the overflow from the controller, which keeps
/// availability 1 while every pause sheds the provider's projects down their chains. A skip for
/// an open circuit stands for an attempt predicted to fail; it counts only while the window's
/// real outcomes agree (no success at all, or an error rate above `target_error_rate`), so one
/// stale skip at low volume right after a recovery cannot read as a high error rate.
///
/// Slow successes are soft errors: each counts as `target_error_rate / SLOW_TARGET` of an
/// error ([`crate::latency::slow_as_errors`]).
pub fn window_counts(t: &Tally, skips_as_errors: bool, target_error_rate: f64) -> WindowCounts {
    let mut errors = t.provider_errors + slow_as_errors(t.slow, target_error_rate);
    if skips_as_errors {
        let real = (t.successes + t.provider_errors) as f64;
        if t.successes == 0 || t.provider_errors as f64 > target_error_rate * real {
            errors += t.skipped_open;
        }
        errors += t.skipped_paused;
    }
    WindowCounts {
        successes: t.successes,
        provider_errors: errors,
    }
}

/// Plain shared state for one route (see the module docs).
#[derive(Debug)]
pub struct LocalFleet {
    /// Provider names, the rendezvous keys of the chain.
    pub names: Vec<String>,
    /// Each provider's pause scopes (own name first).
    pub scopes: Vec<Vec<String>>,
    /// The pause table.
    pub pauses: Pauses,
    /// One breaker per provider.
    pub breakers: Vec<CircuitBreaker>,
    /// Pinned chains.
    pub pins: ChainPins,
    /// The route's current cascade weights, per member.
    pub weights: Vec<f64>,
    /// The route's priority tiers and static weights, when it has any: chains are then
    /// [`crate::chain::tiered_chain`]s (set `weights` from
    /// [`crate::weights::tiered_cascade_weights`] too).
    pub tiers: Option<Tiers>,
    /// p2c scores.
    pub p2c: P2c,
    /// The retry budget, if any.
    pub budget: Option<RetryBudget>,
    /// The fallback throttle, if any.
    pub throttle: Option<FallbackThrottle>,
    /// Outcome counts since the last [`LocalFleet::take_tallies`].
    pub tallies: Vec<Tally>,
    /// Latency baselines per provider ([`crate::latency`]); empty = no latency signal.
    pub latency: Vec<LatencyModel>,
    /// FIFO wait lines per full provider ([`crate::waitline`]); `None` = none (requests wait
    /// to their own timers).
    pub lines: Option<WaitLines>,
}

impl LocalFleet {
    /// Providers `names` with default breakers, equal weights, no tiers, default p2c, pins of `pin`
    /// (capacity `pin_capacity`), the router's default retry budget (20 % over 10 s, floor
    /// 5/s), no throttle, the core's default pause table, no latency models and no wait lines.
    pub fn new(names: Vec<String>, pin: Duration, pin_capacity: usize) -> Self {
        let n = names.len();
        LocalFleet {
            scopes: names.iter().map(|s| vec![s.clone()]).collect(),
            names,
            pauses: Pauses::new(),
            breakers: (0..n)
                .map(|_| CircuitBreaker::new(BreakerConfig::default()))
                .collect(),
            pins: ChainPins::new(pin_capacity.max(1), pin),
            weights: vec![1.0; n],
            tiers: None,
            p2c: P2c::new(n, P2cConfig::default()),
            budget: Some(RetryBudget::new(0.2, Duration::from_secs(10), 5)),
            throttle: None,
            tallies: vec![Tally::default(); n],
            latency: Vec::new(),
            lines: None,
        }
    }

    /// The tallies since the last call, resetting them.
    pub fn take_tallies(&mut self) -> Vec<Tally> {
        let n = self.tallies.len();
        std::mem::replace(&mut self.tallies, vec![Tally::default(); n])
    }
}

impl Fleet for LocalFleet {
    fn chain(&mut self, project: &str, now: Instant) -> Vec<usize> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        self.pins
            .route_chain(project, &names, &self.weights, self.tiers.as_ref(), now)
    }

    fn pinned(&mut self, project: &str, now: Instant) -> bool {
        self.pins.is_pinned(project, now)
    }

    fn move_to_front(
        &mut self,
        project: &str,
        member: usize,
        cause: MoveCause,
        now: Instant,
    ) -> bool {
        self.pins
            .route_move_to_front(project, member, self.tiers.as_ref(), cause, now)
    }

    fn pauses<R>(&mut self, provider: usize, f: impl FnOnce(&mut Pauses, &[&str]) -> R) -> R {
        let scopes: Vec<&str> = self
            .scopes
            .get(provider)
            .map(|s| s.iter().map(String::as_str).collect())
            .unwrap_or_default();
        f(&mut self.pauses, &scopes)
    }

    fn breaker<R>(&mut self, provider: usize, f: impl FnOnce(&mut CircuitBreaker) -> R) -> R {
        f(&mut self.breakers[provider])
    }

    fn p2c<R>(&mut self, f: impl FnOnce(&mut P2c) -> R) -> R {
        f(&mut self.p2c)
    }

    fn retry_budget<R>(&mut self, f: impl FnOnce(&mut RetryBudget) -> R) -> Option<R> {
        self.budget.as_mut().map(f)
    }

    fn fallback_throttle<R>(&mut self, f: impl FnOnce(&mut FallbackThrottle) -> R) -> Option<R> {
        self.throttle.as_mut().map(f)
    }

    fn wait_lines<R>(&mut self, f: impl FnOnce(&mut WaitLines) -> R) -> Option<R> {
        self.lines.as_mut().map(f)
    }

    fn count(&mut self, provider: usize, event: Count) {
        if let Some(t) = self.tallies.get_mut(provider) {
            t.add(event);
        }
    }

    fn latency<R>(
        &mut self,
        provider: usize,
        f: impl FnOnce(&mut LatencyModel, f64) -> R,
    ) -> Option<R> {
        let peers = peer_log_ratio(
            self.latency
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != provider)
                .map(|(_, m)| m.recent_log_ratio()),
        );
        self.latency.get_mut(provider).map(|m| f(m, peers))
    }
}
