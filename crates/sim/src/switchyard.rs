//! The `switchyard` strategy: the router's dispatch loop rebuilt on `switchyard-core`.
//!
//! Chat (DESIGN §3 steps 4–5 and 9, §4.1–4.5), per request:
//! 1. chain = `ChainPins::chain(project, providers, weights, now)` (sticky weighted rendezvous,
//!    sliding pins of `pin`);
//! 2. walk the chain, skipping providers already tried by this request, paused by a
//!    `Retry-After` or overload cooldown (`Pauses::paused_until`), whose circuit is open
//!    (`CircuitBreaker::state`), that are waiting for the single probe after a pause
//!    (`Pauses::admit`, field case 2), or whose half-open breaker has no permit left
//!    (`CircuitBreaker::try_acquire`); retries (not first attempts) also need the router's
//!    `RetryBudget` and, if configured, the `FallbackThrottle`;
//! 3. with `cache_hold` (simulator proposal), a first attempt of a project with a live pin
//!    waits up to `cache_hold` for a paused head of its chain instead of spilling;
//! 4. if nothing is eligible but something is paused or open, the request waits for the
//!    earliest end (bounded by `max_queue_wait`);
//! 5. outcomes feed the breaker, the pause table (429 → pause for `Retry-After` plus jitter via
//!    `PausePolicy`; 503 → overload cooldown), the probe (first byte → `probe_succeeded`) and
//!    the per-interval `WindowCounts`; skips of paused providers are counted as provider
//!    errors of that window, skips of open circuits only while the window agrees (see `tick`);
//! 6. a request served by another provider than its chain's head moves that provider to the
//!    front (`ChainPins::move_to_front`), so the project follows its prompt cache;
//! 7. every interval `T`: one `AvailabilityController::step` per provider, then
//!    `cascade_weights` over the availabilities.
//!
//! Embedding (DESIGN §4.6): `P2c` in latency mode over the untried, unpaused providers, then
//! the same pause/breaker walk starting with the p2c choice; no chains (no cache to keep).

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_core::availability::{AvailabilityController, ControllerConfig, WindowCounts};
use switchyard_core::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
use switchyard_core::budget::{FallbackThrottle, RetryBudget};
use switchyard_core::chain::ChainPins;
use switchyard_core::classify::{Classification, ErrorClass, class_for_status};
use switchyard_core::p2c::{P2c, P2cConfig, ScoringMode};
use switchyard_core::pause::{Admission, DEFAULT_PROBE_TIMEOUT, PausePolicy, Pauses};
use switchyard_core::time::Instant;
use switchyard_core::weights::cascade_weights;

use crate::model::{Outcome, hash};
use crate::scenario::{Scenario, ServiceType, SwitchyardSettings};
use crate::strategy::{Ordered, P2cInFlight, Pick, RoundRobin, Strategy, StrategyKind};

/// Builds the strategy object for a run.
pub(crate) fn build<'a>(sc: &'a Scenario, kind: StrategyKind) -> Box<dyn Strategy + 'a> {
    let n = sc.providers.len();
    match (kind, sc.service) {
        (StrategyKind::Switchyard, ServiceType::Chat) => Box::new(Chat::new(sc)),
        (StrategyKind::Switchyard, ServiceType::Embedding) => Box::new(Embedding::new(sc)),
        (StrategyKind::Ordered, _) => Box::new(Ordered { n }),
        (StrategyKind::RoundRobin, _) => Box::new(RoundRobin { n, next: 0 }),
        (StrategyKind::P2c, _) => Box::new(P2cInFlight {
            in_flight: vec![0; n],
        }),
    }
}

/// The controller settings of a scenario: core defaults with the scenario's overrides.
pub(crate) fn controller_config(s: &SwitchyardSettings) -> ControllerConfig {
    let mut c = ControllerConfig::default();
    let o = &s.controller;
    if let Some(v) = o.target_error_rate {
        c.target_error_rate = v;
    }
    if let Some(v) = o.kp {
        c.kp = v;
    }
    if let Some(v) = o.ki {
        c.ki = v;
    }
    if let Some(v) = o.kd {
        c.kd = v;
    }
    if let Some(v) = o.integral_limit {
        c.integral_limit = v;
    }
    c
}

/// Pause, breaker and budget bookkeeping shared by both service types.
#[derive(Debug)]
struct Guards {
    names: Vec<String>,
    pauses: Pauses,
    policy: PausePolicy,
    breakers: Vec<CircuitBreaker>,
    budget: Option<RetryBudget>,
    throttle: Option<FallbackThrottle>,
    rng: ChaCha8Rng,
    /// Requests that skipped each provider because it was paused, since the last tick.
    skipped: Vec<u64>,
    /// Requests that skipped each provider because its circuit was open, since the last tick.
    skipped_open: Vec<u64>,
}

impl Guards {
    fn new(sc: &Scenario) -> Self {
        let s = &sc.switchyard;
        Self {
            names: sc.providers.iter().map(|p| p.name.clone()).collect(),
            pauses: s.probe_gate.map_or_else(Pauses::new, |gate| {
                Pauses::with_probe(DEFAULT_PROBE_TIMEOUT, gate)
            }),
            policy: PausePolicy::default(),
            breakers: sc
                .providers
                .iter()
                .map(|_| CircuitBreaker::new(BreakerConfig::default()))
                .collect(),
            budget: s.retry_budget_ratio.map(|r| {
                RetryBudget::new(r, Duration::from_secs(10), s.retry_budget_floor_per_sec)
            }),
            throttle: s
                .fallback_throttle_per_sec
                .map(|r| FallbackThrottle::new(r, (2.0 * r).ceil().max(1.0) as u32)),
            rng: ChaCha8Rng::seed_from_u64(hash(sc.seed, &[3])),
            skipped: vec![0; sc.providers.len()],
            skipped_open: vec![0; sc.providers.len()],
        }
    }

    fn paused_until(&self, i: usize, now: Instant) -> Option<Instant> {
        self.pauses.paused_until(&[self.names[i].as_str()], now)
    }

    /// Charges a retry to the budget and throttle; `false` means the request may not retry.
    fn allow_retry(&mut self, now: Instant) -> bool {
        if let Some(b) = &mut self.budget
            && !b.try_withdraw(now)
        {
            return false;
        }
        if let Some(t) = &mut self.throttle
            && !t.try_acquire(now)
        {
            return false;
        }
        true
    }

    /// First eligible provider of `order` for a request that tried `tried`; records the first
    /// attempt in the budget or charges a retry.
    ///
    /// `hold` (simulator proposal, chat only, set for a first attempt of a project with a live
    /// pin): the head of the order is where the project was last served and holds its prompt
    /// cache; when it is paused (or gated behind a post-pause probe) for at most `hold`, the
    /// request waits for it instead of spilling the whole context to a cold provider.
    fn choose(
        &mut self,
        order: impl Iterator<Item = usize>,
        tried: u64,
        now: Instant,
        hold: Option<Duration>,
    ) -> Pick {
        let mut wake: Option<Instant> = None;
        let mut chosen = None;
        for (pos, i) in order.enumerate() {
            if tried & (1u64 << i) != 0 {
                continue;
            }
            // Pause first (a Retry-After or overload cooldown is the provider's own word), then
            // the circuit, then the single-probe gate after a pause (`Pauses::admit`, field
            // case 2), so that a provider whose circuit is open does not use up its probe.
            let name = self.names[i].as_str();
            let paused = self.pauses.paused_until(&[name], now);
            let gated = match paused {
                Some(until) => Some(until),
                None if matches!(self.breakers[i].state(now), BreakerState::Open { .. }) => None,
                None => match self.pauses.admit(&[name], now) {
                    Admission::Paused { until } => Some(until),
                    Admission::Open | Admission::Probe => None,
                },
            };
            if let Some(until) = gated {
                if pos == 0
                    && let Some(h) = hold
                    && until.saturating_since(now) <= h
                {
                    return Pick::WaitUntil(until);
                }
                wake = Some(wake.map_or(until, |w| w.min(until)));
                self.skipped[i] += 1;
                continue;
            }
            if let BreakerState::Open { until } = self.breakers[i].state(now) {
                self.skipped_open[i] += 1;
                wake = Some(wake.map_or(until, |w| w.min(until)));
                continue;
            }
            if !self.breakers[i].try_acquire(now) {
                // Half-open with every trial permit out.
                self.skipped_open[i] += 1;
                let t = now + Duration::from_secs(1);
                wake = Some(wake.map_or(t, |w| w.min(t)));
                continue;
            }
            chosen = Some(i);
            break;
        }
        match chosen {
            Some(i) => {
                if tried == 0 {
                    if let Some(b) = &mut self.budget {
                        b.record_attempt(now);
                    }
                } else if !self.allow_retry(now) {
                    self.breakers[i].on_cancel(now);
                    return Pick::GiveUp;
                }
                Pick::Send(i)
            }
            None => wake.map_or(Pick::GiveUp, Pick::WaitUntil),
        }
    }

    /// A provider accepted work: a pending probe after a pause succeeded.
    fn first_byte(&mut self, i: usize) {
        self.pauses.probe_succeeded(&[self.names[i].as_str()]);
    }

    /// Feeds an outcome to breaker and pauses.
    fn record(&mut self, i: usize, now: Instant, o: Outcome) {
        let (class, hint) = match o {
            Outcome::Ok => {
                self.breakers[i].on_success(now);
                return;
            }
            Outcome::RateLimited { retry_after } => (ErrorClass::Capacity, Some(retry_after)),
            Outcome::Server { status } => (class_for_status(status), None),
            Outcome::Timeout => (ErrorClass::Timeout, None),
        };
        if class == ErrorClass::Capacity {
            // A 429 is a penalty, not an eviction (STYLE pattern 8): the pause steers traffic
            // away; the breaker is for failures and only gets its permit back.
            self.breakers[i].on_cancel(now);
        } else {
            self.breakers[i].on_failure(now);
        }
        let c = Classification {
            retry_after: hint,
            pause: hint,
            ..Classification::new(class)
        };
        if let Some(d) = self.policy.scope_pause(&c, &mut self.rng) {
            self.pauses.pause(&self.names[i], d, now, class);
        }
    }
}

/// Sticky chains over controller weights (chat).
#[derive(Debug)]
pub(crate) struct Chat {
    guards: Guards,
    keys: Vec<String>,
    controllers: Vec<AvailabilityController>,
    window: Vec<WindowCounts>,
    avail: Vec<f64>,
    weights: Vec<f64>,
    pins: ChainPins,
    max_attempts: u32,
    skips_are_errors: bool,
    target_error_rate: f64,
    hold: Option<Duration>,
}

impl Chat {
    fn new(sc: &Scenario) -> Self {
        let n = sc.providers.len();
        let s = &sc.switchyard;
        let cfg = controller_config(s);
        let projects = match &sc.traffic {
            crate::scenario::Traffic::Sessions(t) => t.projects,
            crate::scenario::Traffic::Poisson(_) => 1024,
        };
        let controllers: Vec<_> = (0..n)
            .map(|_| AvailabilityController::new(cfg.clone()))
            .collect();
        let avail: Vec<f64> = controllers.iter().map(|c| c.availability()).collect();
        Self {
            guards: Guards::new(sc),
            keys: (0..projects).map(|i| format!("project-{i}")).collect(),
            weights: cascade_weights(&avail),
            avail,
            controllers,
            window: vec![WindowCounts::default(); n],
            pins: ChainPins::new(projects as usize * 2, s.pin)
                .with_refresh_on_hit(s.pin_refresh_on_hit),
            max_attempts: s.max_attempts,
            skips_are_errors: s.skips_count_as_errors,
            target_error_rate: cfg.target_error_rate,
            hold: s.cache_hold,
        }
    }

    fn chain(&mut self, project: u32, now: Instant) -> Vec<usize> {
        let names: Vec<&str> = self.guards.names.iter().map(String::as_str).collect();
        self.pins
            .chain(&self.keys[project as usize], &names, &self.weights, now)
    }
}

impl Strategy for Chat {
    fn tick(&mut self, _now: Instant) {
        let n = self.avail.len();
        let paused = std::mem::replace(&mut self.guards.skipped, vec![0; n]);
        let open = std::mem::replace(&mut self.guards.skipped_open, vec![0; n]);
        if self.skips_are_errors {
            let target = self.target_error_rate;
            for ((w, p), o) in self.window.iter_mut().zip(paused).zip(open) {
                // An open-circuit skip stands for an attempt predicted to fail. The prediction
                // is trusted only while the window's real outcomes agree (error rate above
                // target, or no success at all): at an outage's onset that turns the skipped
                // traffic into the failures it would have been, while right after a recovery
                // one stale skip at low volume cannot read as a high error rate.
                let real = (w.successes + w.provider_errors) as f64;
                if w.successes == 0 || w.provider_errors as f64 > target * real {
                    w.provider_errors += o;
                }
                w.provider_errors += p;
            }
        }
        for (i, c) in self.controllers.iter_mut().enumerate() {
            self.avail[i] = c.step(std::mem::take(&mut self.window[i])).availability;
        }
        self.weights = cascade_weights(&self.avail);
    }
    fn availability(&self) -> Option<&[f64]> {
        Some(&self.avail)
    }
    fn weights(&self) -> Option<&[f64]> {
        Some(&self.weights)
    }
    fn pick(&mut self, project: u32, tried: u64, now: Instant, _: &mut ChaCha8Rng) -> Pick {
        let pinned = self.pins.peek(&self.keys[project as usize], now).is_some();
        let chain = self.chain(project, now);
        let hold = if tried == 0 && pinned {
            self.hold
        } else {
            None
        };
        self.guards.choose(chain.into_iter(), tried, now, hold)
    }
    fn on_finish(&mut self, p: usize, now: Instant, _: Duration, o: Outcome) {
        match o {
            Outcome::Ok => self.window[p].successes += 1,
            _ => self.window[p].provider_errors += 1,
        }
        self.guards.record(p, now, o);
    }
    fn on_first_byte(&mut self, p: usize, _: Instant) {
        self.guards.first_byte(p);
    }
    fn on_served(&mut self, project: u32, p: usize, now: Instant) {
        let key = &self.keys[project as usize];
        if self.pins.peek(key, now).and_then(|c| c.first()) != Some(&p) {
            self.pins.move_to_front(key, p, now);
        }
    }
    fn max_attempts(&self) -> u32 {
        self.max_attempts
    }
}

/// Latency-scored p2c (embedding).
#[derive(Debug)]
pub(crate) struct Embedding {
    guards: Guards,
    p2c: P2c,
    max_attempts: u32,
}

impl Embedding {
    fn new(sc: &Scenario) -> Self {
        Self {
            guards: Guards::new(sc),
            p2c: P2c::new(
                sc.providers.len(),
                P2cConfig {
                    mode: ScoringMode::Latency,
                    ..P2cConfig::default()
                },
            ),
            max_attempts: sc.switchyard.max_attempts,
        }
    }
}

impl Strategy for Embedding {
    fn pick(&mut self, _: u32, tried: u64, now: Instant, rng: &mut ChaCha8Rng) -> Pick {
        let n = self.guards.names.len();
        let mut wake: Option<Instant> = None;
        let eligible: Vec<usize> = (0..n)
            .filter(|&i| tried & (1u64 << i) == 0)
            .filter(|&i| match self.guards.paused_until(i, now) {
                Some(t) => {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                    false
                }
                None => true,
            })
            .collect();
        let Some(first) = self.p2c.pick(&eligible, now, rng) else {
            return wake.map_or(Pick::GiveUp, Pick::WaitUntil);
        };
        // The breaker gets the p2c choice first, then the rest in index order.
        let order = std::iter::once(first).chain(eligible.into_iter().filter(move |&i| i != first));
        self.guards.choose(order, tried, now, None)
    }
    fn on_start(&mut self, p: usize, now: Instant) {
        self.p2c.on_start(p, now);
    }
    fn on_first_byte(&mut self, p: usize, _: Instant) {
        self.guards.first_byte(p);
    }
    fn on_finish(&mut self, p: usize, now: Instant, latency: Duration, o: Outcome) {
        self.p2c.on_finish(p, now, latency, o == Outcome::Ok);
        self.guards.record(p, now, o);
    }
    fn max_attempts(&self) -> u32 {
        self.max_attempts
    }
}
