//! Runtime state that outlives configuration reloads: outcome counters, circuit breakers,
//! availability controllers, pinned chains, pauses and the retry budget.
//!
//! The routing table is replaced on every reload; this state is keyed by `namespace/name` in a
//! registry so a reload that keeps a provider keeps its breaker, counters and availability.
//! A [`Live`] pairs one table with the state objects of its providers and routes, by index, so
//! the request path never looks anything up by name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use switchyard_core::availability::{AvailabilityController, ControllerConfig, StepReport};
use switchyard_core::breaker::CircuitBreaker;
use switchyard_core::budget::{FallbackThrottle, RetryBudget};
use switchyard_core::chain::ChainPins;
use switchyard_core::classify::ErrorClass;
use switchyard_core::dispatch::{Count, Tally, window_counts};
use switchyard_core::latency::LatencyModel;
use switchyard_core::p2c::{P2c, P2cConfig};
use switchyard_core::pause::Pauses;
use switchyard_core::time::Instant;
use switchyard_core::waitline::{WaitLines, WaiterId};
use switchyard_core::weights::route_weights;
use tokio::sync::Notify;

use crate::config::RoutingTable;

/// Locks a mutex, recovering the data if a panicking holder poisoned it: every critical
/// section here leaves the state consistent between statements, so the data stays usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Monotonic per-provider outcome counters (the outcome protocol of DESIGN §2).
#[derive(Debug, Default)]
pub struct OutcomeCounters {
    /// Successful attempts.
    pub successes: AtomicU64,
    /// Failed attempts by [`ErrorClass`] (index = position in [`ErrorClass::ALL`]).
    pub errors: [AtomicU64; 9],
    /// Attempts ended because the client went away (not the provider's fault).
    pub cancelled: AtomicU64,
    /// Requests that skipped the provider while it was paused (Retry-After, cooldown, a probe
    /// in flight).
    pub skipped_paused: AtomicU64,
    /// Requests that skipped the provider while its circuit was open.
    pub skipped_open: AtomicU64,
    /// Successes judged slow against the provider's latency baseline (also in `successes`).
    pub slow: AtomicU64,
    /// Capacity refusals and paused skips of spill-over traffic (`Count::FullOnSpill`): the
    /// provider was full of what failures elsewhere moved onto it; not errors.
    pub full_on_spill: AtomicU64,
    /// Attempts in flight.
    pub in_flight: AtomicI64,
}

impl OutcomeCounters {
    /// Records a failed attempt of `class`.
    pub fn error(&self, class: ErrorClass) {
        let i = ErrorClass::ALL
            .iter()
            .position(|c| *c == class)
            .unwrap_or(0);
        self.errors[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Errors of provider-side classes.
    pub fn provider_errors(&self) -> u64 {
        ErrorClass::ALL
            .iter()
            .zip(&self.errors)
            .filter(|(c, _)| c.is_provider_side())
            .map(|(_, n)| n.load(Ordering::Relaxed))
            .sum()
    }

    /// The cumulative counts as the dispatch machine's [`Tally`].
    pub fn tally(&self) -> Tally {
        let all: u64 = self.errors.iter().map(|n| n.load(Ordering::Relaxed)).sum();
        let provider_errors = self.provider_errors();
        Tally {
            successes: self.successes.load(Ordering::Relaxed),
            provider_errors,
            other_errors: all.saturating_sub(provider_errors),
            cancelled: self.cancelled.load(Ordering::Relaxed),
            skipped_paused: self.skipped_paused.load(Ordering::Relaxed),
            skipped_open: self.skipped_open.load(Ordering::Relaxed),
            slow: self.slow.load(Ordering::Relaxed),
            full_on_spill: self.full_on_spill.load(Ordering::Relaxed),
        }
    }

    /// Counts one outcome event of the dispatch machine.
    pub fn count(&self, event: Count) {
        let counter = match event {
            Count::Success => &self.successes,
            Count::Error(class) => return self.error(class),
            Count::Cancelled => &self.cancelled,
            Count::SkippedPaused => &self.skipped_paused,
            Count::SkippedOpen => &self.skipped_open,
            Count::Slow => &self.slow,
            Count::FullOnSpill => &self.full_on_spill,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `b - a` per field (cumulative counters; a counter that went down counts from zero).
fn tally_since(b: Tally, a: Tally) -> Tally {
    Tally {
        successes: b.successes.saturating_sub(a.successes),
        provider_errors: b.provider_errors.saturating_sub(a.provider_errors),
        other_errors: b.other_errors.saturating_sub(a.other_errors),
        cancelled: b.cancelled.saturating_sub(a.cancelled),
        skipped_paused: b.skipped_paused.saturating_sub(a.skipped_paused),
        skipped_open: b.skipped_open.saturating_sub(a.skipped_open),
        slow: b.slow.saturating_sub(a.slow),
        full_on_spill: b.full_on_spill.saturating_sub(a.full_on_spill),
    }
}

/// The last controller window of a provider, for status.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    /// Successes in the window.
    pub successes: u64,
    /// Provider-side errors in the window.
    pub errors: u64,
    /// The controller's report, once a window completed.
    pub report: Option<StepReport>,
}

/// Live state of one provider.
#[derive(Debug)]
pub struct ProviderState {
    /// Outcome counters.
    pub counters: OutcomeCounters,
    /// Circuit breaker (per router replica).
    pub breaker: Mutex<CircuitBreaker>,
    controller: Mutex<(AvailabilityController, Tally, Window)>,
    availability_bits: AtomicU64,
    /// Latency baseline (`switchyard_core::latency`), kept across reloads like the counters.
    latency: Mutex<LatencyModel>,
    /// The model's recent log-ratio for its peers (f64 bits; NaN = none yet).
    recent_bits: AtomicU64,
}

impl ProviderState {
    fn new(breaker: CircuitBreaker, controller: ControllerConfig) -> Self {
        ProviderState {
            counters: OutcomeCounters::default(),
            breaker: Mutex::new(breaker),
            controller: Mutex::new((
                AvailabilityController::new(controller),
                Tally::default(),
                Window::default(),
            )),
            availability_bits: AtomicU64::new(1.0f64.to_bits()),
            latency: Mutex::new(LatencyModel::new()),
            recent_bits: AtomicU64::new(f64::NAN.to_bits()),
        }
    }

    /// Runs `f` on the provider's latency model, then publishes its recent log-ratio.
    pub fn with_latency<R>(&self, f: impl FnOnce(&mut LatencyModel) -> R) -> R {
        let mut m = lock(&self.latency);
        let r = f(&mut m);
        let recent = m.recent_log_ratio().unwrap_or(f64::NAN);
        self.recent_bits.store(recent.to_bits(), Ordering::Relaxed);
        r
    }

    /// The latency model's recent log-ratio (what peers compare with); `None` while cold.
    pub fn recent_log_ratio(&self) -> Option<f64> {
        let v = f64::from_bits(self.recent_bits.load(Ordering::Relaxed));
        (!v.is_nan()).then_some(v)
    }

    /// Current availability in [0, 1].
    pub fn availability(&self) -> f64 {
        f64::from_bits(self.availability_bits.load(Ordering::Relaxed))
    }

    /// Sets the availability from outside (Kubernetes mode: the operator's value from the
    /// LLMProvider status), clamped to [0, 1]; a non-finite value counts as 1 (fail-open).
    /// The in-process controller is not stepped in that mode, so nothing overwrites it.
    pub fn set_availability(&self, availability: f64) {
        let a = if availability.is_finite() {
            availability.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.availability_bits.store(a.to_bits(), Ordering::Relaxed);
    }

    /// Flap damping: the relapse penalty and whether it holds the recovery ramp
    /// (`switchyard_core::availability`, "Flap damping").
    pub fn flap(&self) -> switchyard_core::availability::FlapState {
        lock(&self.controller).0.flap_state()
    }

    /// The last completed window.
    pub fn last_window(&self) -> Window {
        lock(&self.controller).2
    }

    /// Closes a controller window: takes the counter deltas since the last call and steps the
    /// controller (DESIGN §4.1). Returns the new availability.
    pub fn step(&self, cfg: &ControllerConfig) -> f64 {
        let now = self.counters.tally();
        let mut guard = lock(&self.controller);
        let (controller, last, window) = &mut *guard;
        if controller.config() != cfg {
            controller.reconfigure(cfg.clone());
        }
        // Skips of a paused or open provider count as the simulator measured them
        // (`window_counts`): the same rule on both sides of the equivalence.
        let counts = window_counts(&tally_since(now, *last), true, cfg.target_error_rate);
        *last = now;
        let report = controller.step(counts);
        *window = Window {
            successes: counts.successes,
            errors: counts.provider_errors,
            report: Some(report),
        };
        self.availability_bits
            .store(report.availability.to_bits(), Ordering::Relaxed);
        report.availability
    }
}

/// Live state of one route.
#[derive(Debug)]
pub struct RouteState {
    /// Pinned chains by project key.
    pub pins: Mutex<ChainPins>,
    /// Priority-cascade weights, by position in the route's provider list.
    pub weights: ArcSwap<Vec<f64>>,
    /// Spill-over throttle, when configured.
    pub throttle: Option<Mutex<FallbackThrottle>>,
    /// When the weights were last computed.
    pub computed_at: Mutex<Option<chrono::DateTime<chrono::Utc>>>,
}

/// Pinned chains kept per route. A pin measured about 175 bytes resident (docs/benchmarks.md),
/// so 100,000 pins hold about 17 MiB. Past the cap the least recently used pin goes; its project
/// then gets the chain rendezvous hashing computes from the current weights, which is the same
/// chain unless the weights moved or a failover had moved its affinity.
const PIN_CAPACITY: usize = 100_000;

/// One routing table together with the state of its providers and routes, by index.
#[derive(Debug)]
pub struct Live {
    /// The configuration.
    pub table: RoutingTable,
    /// State of `table.providers[i]`.
    pub providers: Vec<Arc<ProviderState>>,
    /// State of `table.routes[i]`.
    pub routes: Vec<Arc<RouteState>>,
    /// Load statistics for power-of-two-choices, by provider index (rebuilt on reload).
    pub p2c: Mutex<P2c>,
    /// Controller settings per provider: those of the first route that lists it.
    pub controller_cfg: Vec<ControllerConfig>,
}

impl Live {
    /// Current cascade weights of `route` (tiered when it has tiers), recomputed from the
    /// providers' availabilities.
    pub fn compute_weights(&self, route: usize) -> Vec<f64> {
        let Some(r) = self.table.routes.get(route) else {
            return Vec::new();
        };
        let availabilities: Vec<f64> = r
            .providers
            .iter()
            .map(|p| {
                if p.ineligible.is_some() {
                    0.0
                } else {
                    self.providers
                        .get(p.index)
                        .map_or(0.0, |s| s.availability())
                }
            })
            .collect();
        let mut weights = route_weights(&availabilities, r.tiers.as_ref());
        // Ineligible providers never take traffic, even when every eligible one is at zero
        // and the cascade falls back to equal weights.
        for (w, p) in weights.iter_mut().zip(&r.providers) {
            if p.ineligible.is_some() {
                *w = 0.0;
            }
        }
        weights
    }
}

/// The router's FIFO wait lines per full provider ([`switchyard_core::waitline`]) with one
/// [`Notify`] per registered waiter, woken when it becomes a line's head. A request registers
/// only when its dispatch first touches the lines (it met a provider paused by a 429): requests
/// that never wait never take this lock.
#[derive(Debug, Default)]
pub struct RouterLines {
    /// The lines.
    pub lines: WaitLines,
    notify: HashMap<WaiterId, Arc<Notify>>,
}

impl RouterLines {
    /// Registers `id`'s wake-up.
    pub fn register(&mut self, id: WaiterId, notify: Arc<Notify>) {
        self.notify.insert(id, notify);
    }

    /// Delivers the lines' pending wake-ups (a permit is stored when the waiter is not
    /// sleeping yet, so none is lost).
    pub fn wake(&mut self) {
        if !self.lines.has_woken() {
            return;
        }
        for id in self.lines.take_woken() {
            if let Some(n) = self.notify.get(&id) {
                n.notify_one();
            }
        }
    }

    /// `id` is gone (done, or its client disconnected): out of every line, wake-up forgotten,
    /// the next heads woken.
    pub fn forget(&mut self, id: WaiterId) {
        self.lines.leave(id);
        self.notify.remove(&id);
        self.wake();
    }

    /// Registered waiters (tests, metrics).
    pub fn registered(&self) -> usize {
        self.notify.len()
    }
}

/// State shared by every snapshot of one process.
#[derive(Debug)]
pub struct Runtime {
    providers: Mutex<HashMap<String, Arc<ProviderState>>>,
    routes: Mutex<HashMap<String, Arc<RouteState>>>,
    /// Retry-After pauses by scope (provider key or `group:` quota group).
    pub pauses: Mutex<Pauses>,
    /// Router-wide retry budget.
    pub budget: Mutex<RetryBudget>,
    /// Active-probe health per provider × modality (DESIGN §4.8), keyed by provider key so
    /// it outlives reloads like the rest of this state; fail-open when empty.
    pub health: crate::health::HealthBoard,
    /// FIFO wait lines per full provider, shared by every route (keyed by pause scope).
    pub lines: Mutex<RouterLines>,
    /// The next waiter id of the lines.
    pub next_waiter: AtomicU64,
    live: ArcSwap<Live>,
}

impl Runtime {
    /// A runtime serving `table`.
    pub fn new(table: RoutingTable) -> Arc<Runtime> {
        let runtime = Runtime {
            providers: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            pauses: Mutex::new(Pauses::new()),
            budget: Mutex::new(RetryBudget::new(0.2, Duration::from_secs(10), 5)),
            health: crate::health::HealthBoard::new(),
            lines: Mutex::new(RouterLines::default()),
            next_waiter: AtomicU64::new(0),
            live: ArcSwap::from_pointee(Live {
                table: RoutingTable::default(),
                providers: Vec::new(),
                routes: Vec::new(),
                p2c: Mutex::new(P2c::new(0, P2cConfig::default())),
                controller_cfg: Vec::new(),
            }),
        };
        let runtime = Arc::new(runtime);
        runtime.swap(table);
        runtime
    }

    /// The snapshot requests use now.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Installs a new table, keeping the state of providers and routes that remain, and
    /// (inside a tokio runtime) checks every provider's credentials in the background so a
    /// refused key shows in status before traffic arrives.
    pub fn swap(&self, table: RoutingTable) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let clients: Vec<_> = table
                .providers
                .iter()
                .filter_map(|p| p.client.as_ref().ok().cloned())
                .collect();
            rt.spawn(async move {
                futures::future::join_all(clients.iter().map(|c| c.check_credentials())).await;
            });
        }
        let mut controller_cfg: Vec<Option<ControllerConfig>> = vec![None; table.providers.len()];
        for route in &table.routes {
            for p in &route.providers {
                if let Some(slot) = controller_cfg.get_mut(p.index) {
                    slot.get_or_insert_with(|| route.controller.clone());
                }
            }
        }
        let controller_cfg: Vec<ControllerConfig> = controller_cfg
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        let providers = {
            let mut registry = lock(&self.providers);
            let states: Vec<Arc<ProviderState>> = table
                .providers
                .iter()
                .zip(&controller_cfg)
                .map(|(p, cfg)| {
                    registry
                        .entry(p.key.clone())
                        .or_insert_with(|| {
                            Arc::new(ProviderState::new(
                                CircuitBreaker::new(p.breaker.clone()),
                                cfg.clone(),
                            ))
                        })
                        .clone()
                })
                .collect();
            registry.retain(|k, _| table.providers.iter().any(|p| &p.key == k));
            states
        };
        let routes = {
            let mut registry = lock(&self.routes);
            let states: Vec<Arc<RouteState>> = table
                .routes
                .iter()
                .map(|r| {
                    let fresh = || {
                        Arc::new(RouteState {
                            pins: Mutex::new(ChainPins::new(PIN_CAPACITY, r.pin)),
                            weights: ArcSwap::from_pointee(Vec::new()),
                            throttle: r.throttle.map(|(rate, burst)| {
                                Mutex::new(FallbackThrottle::new(rate, burst))
                            }),
                            computed_at: Mutex::new(None),
                        })
                    };
                    let state = registry.entry(r.key.clone()).or_insert_with(fresh);
                    // Pins over another provider list or pin length would be stale: start over.
                    let stale = lock(&state.pins).pin_duration() != r.pin
                        || state.throttle.is_some() != r.throttle.is_some();
                    if stale {
                        *state = fresh();
                    }
                    state.clone()
                })
                .collect();
            registry.retain(|k, _| table.routes.iter().any(|r| &r.key == k));
            states
        };
        let p2c = P2c::new(table.providers.len(), P2cConfig::default());
        let live = Live {
            table,
            providers,
            routes,
            p2c: Mutex::new(p2c),
            controller_cfg,
        };
        for i in 0..live.routes.len() {
            let weights = live.compute_weights(i);
            live.routes[i].weights.store(Arc::new(weights));
        }
        self.live.store(Arc::new(live));
    }

    /// One control-loop tick: steps every provider's controller over the window since the
    /// previous tick and recomputes every route's weights.
    pub fn control_tick(&self, now_wall: chrono::DateTime<chrono::Utc>) {
        let live = self.live();
        for (state, cfg) in live.providers.iter().zip(&live.controller_cfg) {
            state.step(cfg);
        }
        for (i, route) in live.routes.iter().enumerate() {
            route.weights.store(Arc::new(live.compute_weights(i)));
            *lock(&route.computed_at) = Some(now_wall);
        }
    }

    /// Drops expired pauses and pins (bounded memory over long runs).
    pub fn housekeeping(&self, now: Instant) {
        lock(&self.pauses).prune(now);
        for route in &self.live().routes {
            lock(&route.pins).purge_expired(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(s: u64) -> Instant {
        Instant::from_origin(Duration::from_secs(s))
    }

    /// Two requests waiting on one paused provider are woken in the order they first waited,
    /// and a waiter whose client went away (its guard dropped: `forget`) hands the turn on.
    #[tokio::test]
    async fn waiters_are_notified_in_arrival_order_and_a_departure_hands_the_turn_on() {
        let mut l = RouterLines::default();
        let notify: Vec<Arc<Notify>> = (0..3).map(|_| Arc::new(Notify::new())).collect();
        for (id, n) in notify.iter().enumerate() {
            l.register(id as WaiterId, n.clone());
            l.lines.join("provider-a", id as WaiterId, at(id as u64));
        }
        assert!(l.lines.may_try("provider-a", 0));
        assert!(!l.lines.may_try("provider-a", 1));
        // The head is sent: the second (not the third) is woken.
        l.lines.sent(0, "provider-a", at(5));
        l.wake();
        tokio::time::timeout(Duration::from_secs(1), notify[1].notified())
            .await
            .expect("the second waiter is woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), notify[2].notified())
                .await
                .is_err(),
            "the third waiter must not be woken yet"
        );
        // The second's client goes away: the third is the head and is woken.
        l.forget(1);
        tokio::time::timeout(Duration::from_secs(1), notify[2].notified())
            .await
            .expect("the third waiter is woken");
        assert!(l.lines.may_try("provider-a", 2));
        l.forget(0);
        l.forget(2);
        assert!(l.lines.is_empty());
        assert_eq!(l.registered(), 0);
    }
}
