//! The `switchyard` strategy: the router's own dispatch machine
//! ([`switchyard_core::dispatch::Dispatch`]) over a [`LocalFleet`], in virtual time.
//!
//! The engine creates one machine per request and does what it asks: `Send` becomes a
//! simulated attempt whose timeout is the machine's attempt deadline, `Wait` a resume event,
//! `Served` and `Respond` the end of the request. Every attempt's end is [`settle`]d, as the
//! router's attempt guard does. Nothing here decides where a request goes; this module only
//! builds the machine's settings from the scenario and closes the controller windows:
//! every interval `T`, one `AvailabilityController::step` per provider on the window counts
//! ([`window_counts`], the rule the router's controller uses too), then `route_weights` over
//! the availabilities (the list cascade, or the tiered one when the scenario's providers set
//! `priority`/`weight`; chat only; embeddings use latency p2c and have no weights).

use std::time::Duration;

use switchyard_core::availability::{AvailabilityController, ControllerConfig};
use switchyard_core::breaker::{BreakerConfig, CircuitBreaker};
use switchyard_core::budget::{FallbackThrottle, RetryBudget};
use switchyard_core::chain::ChainPins;
use switchyard_core::classify::{Classification, ErrorClass, class_for_status};
use switchyard_core::dispatch::{
    Dispatch, Failure, Fit, LocalFleet, Member, Order, Policy, Request, Reservation, Settled,
    Verdict, window_counts,
};
use switchyard_core::latency::LatencyModel;
use switchyard_core::p2c::{P2c, P2cConfig, ScoringMode};
use switchyard_core::pause::{DEFAULT_PROBE_TIMEOUT, Pauses, RetryPolicy};
use switchyard_core::time::Instant;
use switchyard_core::waitline::{WaitLines, WaiterId};
use switchyard_core::weights::route_weights;

use crate::model::Outcome;
use crate::scenario::{BreakerOverrides, Scenario, ServiceType, SwitchyardSettings};
use crate::strategy::{Ordered, P2cInFlight, RoundRobin, Strategy, StrategyKind};

/// Builds the strategy object of a baseline run; `None` for `switchyard`, which runs the
/// dispatch machine ([`Switchyard`]).
pub(crate) fn build<'a>(sc: &'a Scenario, kind: StrategyKind) -> Option<Box<dyn Strategy + 'a>> {
    let n = sc.providers.len();
    match kind {
        StrategyKind::Switchyard => None,
        StrategyKind::Ordered => Some(Box::new(Ordered { n })),
        StrategyKind::RoundRobin => Some(Box::new(RoundRobin { n, next: 0 })),
        StrategyKind::P2c => Some(Box::new(P2cInFlight {
            in_flight: vec![0; n],
        })),
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

/// The breaker settings of a scenario: core defaults with the scenario's overrides, read as the
/// router reads an LLMProvider's `circuitBreaker`.
pub(crate) fn breaker_config(o: &BreakerOverrides) -> BreakerConfig {
    let mut c = BreakerConfig::default();
    if let Some(v) = o.consecutive_failures {
        c.consecutive_failures = v;
    }
    if let Some(v) = o.cooldown {
        c.cooldown = v;
    }
    if let Some(v) = o.max_cooldown {
        c.max_cooldown = v;
    }
    c
}

/// The dispatch policy a RoutingPolicy with the scenario's settings gets in the router.
pub(crate) fn policy(sc: &Scenario) -> Policy {
    let s = &sc.switchyard;
    Policy {
        order: match sc.service {
            ServiceType::Chat => Order::StickyChain,
            ServiceType::Embedding => Order::PowerOfTwoChoices,
        },
        max_attempts: s.max_attempts.max(1),
        retry: RetryPolicy {
            same_provider_retries: s.same_provider_retries,
            ..RetryPolicy::default()
        },
        deadline: s.deadline,
        cache_hold: s.cache_hold.filter(|d| !d.is_zero()),
        pause_wait: s.pause_wait,
        ..Policy::default()
    }
}

/// The shared state of the simulated router and its control loop.
#[derive(Debug)]
pub(crate) struct Switchyard {
    /// Pauses, breakers, pins, p2c, budget, throttle and window tallies.
    pub(crate) fleet: LocalFleet,
    policy: Policy,
    keys: Vec<String>,
    controllers: Vec<AvailabilityController>,
    avail: Vec<f64>,
    chat: bool,
    skips_are_errors: bool,
    target_error_rate: f64,
}

impl Switchyard {
    /// The router state for a run of `sc`.
    pub(crate) fn new(sc: &Scenario) -> Self {
        let n = sc.providers.len();
        let s = &sc.switchyard;
        let cfg = controller_config(s);
        let projects = match &sc.traffic {
            crate::scenario::Traffic::Sessions(t) => t.projects,
            crate::scenario::Traffic::Poisson(_) => 1024,
            crate::scenario::Traffic::Script(t) => {
                t.requests.iter().map(|r| r.project + 1).max().unwrap_or(1)
            }
        };
        let names: Vec<String> = sc.providers.iter().map(|p| p.name.clone()).collect();
        let mut fleet = LocalFleet::new(names, s.pin, projects as usize * 2);
        fleet.pins =
            ChainPins::new(projects as usize * 2, s.pin).with_refresh_on_hit(s.pin_refresh_on_hit);
        fleet.pauses = Pauses::with_probe(DEFAULT_PROBE_TIMEOUT, s.probe_gate);
        let breaker = breaker_config(&s.circuit_breaker);
        fleet.breakers = (0..n)
            .map(|_| CircuitBreaker::new(breaker.clone()))
            .collect();
        fleet.budget = s
            .retry_budget_ratio
            .map(|r| RetryBudget::new(r, Duration::from_secs(10), s.retry_budget_floor_per_sec));
        fleet.throttle = s
            .fallback_throttle_per_sec
            .map(|r| FallbackThrottle::new(r, (2.0 * r).ceil().max(1.0) as u32));
        if sc.service == ServiceType::Embedding {
            fleet.p2c = P2c::new(
                n,
                P2cConfig {
                    mode: ScoringMode::Latency,
                    ..P2cConfig::default()
                },
            );
        }
        let controllers: Vec<_> = (0..n)
            .map(|_| AvailabilityController::new(cfg.clone()))
            .collect();
        let avail: Vec<f64> = controllers.iter().map(|c| c.availability()).collect();
        // `validate` refused invalid tiers already.
        fleet.tiers = sc.tiers().ok().flatten();
        let chat = sc.service == ServiceType::Chat;
        if chat && s.latency_signal {
            fleet.latency = vec![LatencyModel::new(); n];
        }
        fleet.weights = route_weights(&avail, fleet.tiers.as_ref());
        if s.wait_lines {
            fleet.lines = Some(WaitLines::default());
        }
        Switchyard {
            fleet,
            policy: policy(sc),
            keys: (0..projects).map(|i| format!("project-{i}")).collect(),
            controllers,
            avail,
            chat,
            skips_are_errors: s.skips_count_as_errors,
            target_error_rate: cfg.target_error_rate,
        }
    }

    /// A machine for a request of `project` with `input_tokens` of input arriving at `start`:
    /// every provider serves, none reserves (the simulated providers keep their own limits), no
    /// tenant queue; chat requests are streams (agents stream), so the adaptive first-token
    /// deadline applies to them when the latency signal is on. `waiter` is its id in the wait
    /// lines (when the scenario has them).
    pub(crate) fn request(
        &self,
        project: u32,
        start: Instant,
        input_tokens: u64,
        waiter: WaiterId,
    ) -> Dispatch {
        let members = (0..self.fleet.names.len())
            .map(|provider| Member {
                provider,
                fit: Fit::Serves,
                healthy: true,
                reservation: Reservation::None,
            })
            .collect();
        let key = &self.keys[project as usize % self.keys.len()];
        Dispatch::new(
            self.policy,
            Request {
                project: key.clone(),
                start,
                members,
                queue: None,
                stream_input: self.chat.then_some(input_tokens),
            },
        )
        .with_waiter(waiter)
    }

    /// The waiters the wait lines woke since the last call (empty without lines).
    pub(crate) fn take_woken(&mut self) -> Vec<WaiterId> {
        match self.fleet.lines.as_mut() {
            Some(l) if l.has_woken() => l.take_woken(),
            _ => Vec::new(),
        }
    }

    /// Closes the controller windows (end of interval).
    pub(crate) fn tick(&mut self) {
        let tallies = self.fleet.take_tallies();
        for (i, (c, t)) in self.controllers.iter_mut().zip(&tallies).enumerate() {
            let counts = window_counts(t, self.skips_are_errors, self.target_error_rate);
            self.avail[i] = c.step(counts).availability;
        }
        self.fleet.weights = route_weights(&self.avail, self.fleet.tiers.as_ref());
    }

    /// Per-provider availability after the last tick (chat).
    pub(crate) fn availability(&self) -> Option<&[f64]> {
        self.chat.then_some(&self.avail[..])
    }

    /// Per-provider weight after the last tick (chat).
    pub(crate) fn weights(&self) -> Option<&[f64]> {
        self.chat.then_some(&self.fleet.weights[..])
    }
}

/// A simulated outcome as the router's classifier would see it, for the machine and
/// [`settle`](switchyard_core::dispatch::settle). `at_deadline`: the attempt's timeout was the
/// request deadline, so a timeout is the request's deadline passing (the router's
/// `RequestDeadline`, class `deadline`: not the provider's fault, no breaker failure).
pub(crate) fn outcome_of(o: Outcome, at_deadline: bool) -> (Settled, Result<(), Failure>) {
    let (classification, status) = match o {
        Outcome::Ok => return (Settled::Success, Ok(())),
        Outcome::RateLimited { retry_after } => (
            Classification {
                retry_after: Some(retry_after),
                pause: Some(retry_after),
                ..Classification::new(ErrorClass::Capacity)
            },
            Some(429),
        ),
        Outcome::Server { status } => (Classification::new(class_for_status(status)), Some(status)),
        Outcome::Timeout if at_deadline => (Classification::new(ErrorClass::Deadline), None),
        Outcome::Timeout => (Classification::new(ErrorClass::Timeout), None),
        // The router reads a reset before content as a broken connection and fails over.
        Outcome::StreamCut { content: false } => (Classification::new(ErrorClass::Connect), None),
        // After content the stream is committed: served, and settled as a server failure.
        Outcome::StreamCut { content: true } => {
            return (Settled::Failure(ErrorClass::Server), Ok(()));
        }
    };
    (
        Settled::Failure(classification.class),
        Err(Failure {
            classification,
            status,
        }),
    )
}

/// How a request the machine answered with `verdict` is counted: `true` for a wait that ran
/// out (the request waited for a paused provider or its deadline), `false` for nothing left to
/// try; `None` for an exhausted chain.
pub(crate) fn waited_out(verdict: &Verdict) -> Option<bool> {
    match verdict {
        Verdict::Exhausted { .. } | Verdict::Rejected(_) => None,
        Verdict::Deadline { .. } => Some(true),
        Verdict::Unavailable { retry_after, .. } => Some(retry_after.is_some()),
        _ => Some(false),
    }
}
