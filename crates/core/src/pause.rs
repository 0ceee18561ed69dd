//! Pauses, backoff and the retry decision.
//!
//! # Pauses (DESIGN §3 step 4, §4.4)
//! A *scope* is a provider name or a quota-group name (several LLMProvider resources sharing
//! one upstream account, field case 2). [`Pauses`] keeps one deadline per scope; a provider is
//! paused while any of its scopes is (the caller asks with `[provider, group]`).
//!
//! Rule (field case 7): **the effective deadline is the maximum of all active deadlines**. A
//! later, longer pause extends the current one; a shorter one never cuts it. So a stray
//! `Retry-After: 1` that lands after a `Retry-After: 120` cannot reopen the provider early, and
//! a header-less 429 (default cooldown 60 s) after a `Retry-After: 1` extends to 60 s.
//!
//! **Single probe after a pause** ([`Pauses::admit`], field case 2). When a pause ends, every
//! request queued behind it would otherwise go out in the same instant and, if the limit is
//! still there, collect a fresh round of 429s. `admit` lets exactly one request through as a
//! probe and keeps the scope closed to others for a probe timeout (10 s) or until the caller
//! reports the outcome: success opens the scope, a failure records a new pause. This is the
//! half-open state of a circuit breaker applied to Retry-After pauses; the breaker itself
//! (`crate::breaker`) handles runs of errors, this handles one advertised cooldown.
//!
//! # How long ([`PausePolicy`])
//! A Retry-After (or vendor reset) is a lower bound (seed 001, DESIGN §4.4): we pause until the
//! hint **plus** a bounded jitter, never less. The jitter is uniform in
//! `[0, min(ratio·hint, max)]` (defaults 5 %, 5 s): replicas and queued requests that all saw
//! the same header wake at slightly different moments instead of in one burst, and a 40 s hint
//! becomes at most 42 s (field case 1 tolerates +10 %). Without a hint: a default cooldown
//! (60 s for capacity, field case 7; 5 s for overload) — the availability controller and circuit
//! breaker handle the rest.
//!
//! # Backoff ([`Backoff`])
//! When a same-provider retry has no hint: capped exponential `min(cap, base·2^(n−1))` with
//! **equal jitter** by default (`jitter = 0.5`: half fixed, half uniform). The `jitter` field
//! generalises the scheme: the delay is `c·(1−j) + U[0, c·j]` for ceiling `c`, so `j = 1` is
//! AWS "full jitter" and `j = 0` none. Equal jitter rather than full: full jitter minimises total
//! work when many clients contend for one server, but it draws waits close to zero, which for us
//! means an immediate re-send to a provider that just refused — the exact hammering a backoff
//! exists to avoid. Equal jitter keeps a floor of half the ceiling while still de-synchronising.
//! Source: Brooker, "Exponential Backoff And Jitter" (AWS Architecture Blog, 2015).
//!
//! # Retry decision ([`next_attempt`])
//! Given a [`Classification`], the remaining deadline and the allowances, decide between waiting
//! and retrying the same provider, moving down the chain, or giving up. Moving on is preferred
//! when possible (field cases 2, 3, 22: a 429 moves the request and its affinity to the next
//! provider); a same-provider retry happens only when nothing else can serve, and only when it
//! would *start* before the deadline (field case 1). Retry budgets and the fallback throttle
//! live elsewhere (`crate::budget`); the caller folds them into
//! [`AttemptContext::next_provider_available`] and [`RetryPolicy::same_provider_retries`].

use std::collections::HashMap;
use std::time::Duration;

use rand::Rng;

use crate::classify::{Classification, ErrorClass};
use crate::time::Instant;

/// A pause scope: a provider name or a quota-group name.
pub type ScopeKey = String;

/// One active pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseEntry {
    /// When traffic may resume.
    pub until: Instant,
    /// When the pause that set `until` was recorded.
    pub since: Instant,
    /// The class of the failure that set `until` (the longest one wins, so this is its class).
    pub reason: ErrorClass,
    /// True while a probe admitted by [`Pauses::admit`] is in flight; `until` is then the end
    /// of the probe window.
    pub probing: bool,
}

/// Pause deadlines per scope. The effective deadline is the max of all recorded ones.
///
/// Memory: one entry per paused scope; an entry outlives its pause by the probe gate (so the
/// first request after the pause can be a single probe, [`Pauses::admit`]) and is then pruned
/// on every [`Pauses::pause`] call and by [`Pauses::prune`]. Scopes are few (providers and
/// quota groups of one router), so pruning is a linear pass.
#[derive(Debug, Clone)]
pub struct Pauses {
    entries: HashMap<ScopeKey, PauseEntry>,
    probe_timeout: Duration,
    probe_gate: Duration,
}

impl Default for Pauses {
    fn default() -> Self {
        Pauses {
            entries: HashMap::new(),
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            probe_gate: DEFAULT_PROBE_GATE,
        }
    }
}

/// How long one probe may take before another is allowed: 10 s. The caller reports success
/// as soon as response headers (or the first stream event) show the provider accepts work, so
/// this bounds time-to-headers, not a whole generation.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long after a pause ends the single-probe gate stays armed: 60 s. Only traffic that
/// arrives soon after the end can stampede; a scope idle for longer simply opens.
pub const DEFAULT_PROBE_GATE: Duration = Duration::from_secs(60);

/// The dispatch-path verdict of [`Pauses::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// No pause: send.
    Open,
    /// A pause just ended and this request is its single probe: send, then report the result
    /// with [`Pauses::probe_succeeded`] or by recording a new pause.
    Probe,
    /// Paused (or a probe is in flight) until this instant: skip the provider.
    Paused {
        /// When the pause or the probe window ends.
        until: Instant,
    },
}

impl Pauses {
    /// No scope paused; probe timeout [`DEFAULT_PROBE_TIMEOUT`], probe gate
    /// [`DEFAULT_PROBE_GATE`].
    pub fn new() -> Self {
        Self::default()
    }

    /// No scope paused, with explicit probe settings (see [`Pauses::admit`]). A zero
    /// `probe_gate` disables the single-probe gate: a scope opens fully when its pause ends.
    pub fn with_probe(probe_timeout: Duration, probe_gate: Duration) -> Self {
        Pauses {
            entries: HashMap::new(),
            probe_timeout,
            probe_gate,
        }
    }

    /// Pauses `scope` for `delay` from `now` and returns the effective deadline: the later of
    /// the existing (still active) deadline and `now + delay`. A shorter pause never cuts a
    /// longer one (field case 7). A zero delay records nothing and returns the existing
    /// deadline or `now`.
    pub fn pause(
        &mut self,
        scope: &str,
        delay: Duration,
        now: Instant,
        reason: ErrorClass,
    ) -> Instant {
        self.prune(now);
        if delay.is_zero() {
            return self.paused_until(&[scope], now).unwrap_or(now);
        }
        let wanted = now + delay;
        match self.entries.get_mut(scope) {
            // A probe window is not a pause the provider asked for: the failed probe's own
            // hint replaces it, even when shorter (field case 1: each retry honours the
            // Retry-After of the response it just got).
            Some(entry) if entry.until >= wanted && !entry.probing => entry.until,
            Some(entry) => {
                *entry = PauseEntry {
                    until: wanted,
                    since: now,
                    reason,
                    probing: false,
                };
                wanted
            }
            None => {
                self.entries.insert(
                    scope.to_owned(),
                    PauseEntry {
                        until: wanted,
                        since: now,
                        reason,
                        probing: false,
                    },
                );
                wanted
            }
        }
    }

    /// The latest active deadline among `scopes` (e.g. `[provider, quota_group]`), or `None`
    /// when none of them is paused at `now`. A deadline equal to `now` is over.
    pub fn paused_until(&self, scopes: &[&str], now: Instant) -> Option<Instant> {
        scopes
            .iter()
            .filter_map(|s| self.entries.get(*s))
            .map(|e| e.until)
            .filter(|until| *until > now)
            .max()
    }

    /// The class of the failure behind the latest active deadline among `scopes` (what
    /// [`Pauses::paused_until`] returns), or `None` when none of them is paused at `now`.
    pub fn reason(&self, scopes: &[&str], now: Instant) -> Option<ErrorClass> {
        scopes
            .iter()
            .filter_map(|s| self.entries.get(*s))
            .filter(|e| e.until > now)
            .max_by_key(|e| e.until)
            .map(|e| e.reason)
    }

    /// Whether any of `scopes` is paused at `now`.
    pub fn is_paused(&self, scopes: &[&str], now: Instant) -> bool {
        self.paused_until(scopes, now).is_some()
    }

    /// The active pause of one scope, if any.
    pub fn entry(&self, scope: &str, now: Instant) -> Option<PauseEntry> {
        self.entries.get(scope).copied().filter(|e| e.until > now)
    }

    /// Removes the pause of `scope` (e.g. the provider was reconfigured with new credentials).
    /// Returns whether one was active or stale.
    pub fn clear(&mut self, scope: &str) -> bool {
        self.entries.remove(scope).is_some()
    }

    /// Dispatch-path check for a provider with `scopes` (e.g. `[provider, quota_group]`), with a
    /// single probe after a pause (field case 2: "the first request to the group after the
    /// pause is a single probe").
    ///
    /// * any scope paused (or probing) at `now` → [`Admission::Paused`] with the latest end;
    /// * else, a scope whose pause ended less than the probe gate ago and has not been probed
    ///   → [`Admission::Probe`]; those scopes stay closed to everyone else for the probe
    ///   timeout. Success → [`Pauses::probe_succeeded`]; failure → record the new pause with
    ///   [`Pauses::pause`] (it replaces the probe window when longer); no report → another
    ///   probe is allowed after the probe timeout;
    /// * else [`Admission::Open`].
    ///
    /// [`Pauses::paused_until`] ignores the gate; use it for read-only views and retry waits.
    pub fn admit(&mut self, scopes: &[&str], now: Instant) -> Admission {
        if let Some(until) = self.paused_until(scopes, now) {
            return Admission::Paused { until };
        }
        let gate = self.probe_gate;
        let window_end = now + self.probe_timeout;
        let mut probe = false;
        for scope in scopes {
            if let Some(e) = self
                .entries
                .get_mut(*scope)
                .filter(|e| e.until + gate > now)
            {
                *e = PauseEntry {
                    until: window_end,
                    since: now,
                    reason: e.reason,
                    probing: true,
                };
                probe = true;
            }
        }
        if probe && !self.probe_timeout.is_zero() {
            Admission::Probe
        } else {
            Admission::Open
        }
    }

    /// Reports that a probe through `scopes` got a healthy answer: their probe windows close
    /// and traffic flows. Scopes paused again meanwhile (`probing == false`) keep their pause.
    pub fn probe_succeeded(&mut self, scopes: &[&str]) {
        for scope in scopes {
            if self.entries.get(*scope).is_some_and(|e| e.probing) {
                self.entries.remove(*scope);
            }
        }
    }

    /// Drops entries that can no longer affect anything: pause (or probe window) over and the
    /// probe gate elapsed too.
    pub fn prune(&mut self, now: Instant) {
        let gate = self.probe_gate;
        self.entries.retain(|_, e| e.until + gate > now);
    }

    /// Active pauses at `now`, in no particular order (for status and metrics).
    pub fn active(&self, now: Instant) -> impl Iterator<Item = (&str, PauseEntry)> + '_ {
        self.entries
            .iter()
            .filter(move |(_, e)| e.until > now)
            .map(|(k, e)| (k.as_str(), *e))
    }

    /// Number of stored entries, including expired ones (kept for the probe gate or not yet
    /// pruned).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Bounded jitter added on top of a provider's hint: uniform in `[0, min(ratio·hint, max)]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HintJitter {
    /// Fraction of the hint (clamped to `[0, 1]`; NaN counts as 0). Default 0.05.
    pub ratio: f64,
    /// Absolute bound on the added time. Default 5 s.
    pub max: Duration,
}

impl Default for HintJitter {
    fn default() -> Self {
        HintJitter {
            ratio: 0.05,
            max: Duration::from_secs(5),
        }
    }
}

impl HintJitter {
    /// `hint` plus a random extra in `[0, min(ratio·hint, max)]`; never below `hint`.
    pub fn apply(&self, hint: Duration, rng: &mut impl Rng) -> Duration {
        let bound = scale(hint, self.ratio).min(self.max);
        hint.saturating_add(uniform_up_to(bound, rng))
    }
}

/// Capped exponential backoff with adjustable jitter (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Ceiling for the first failure. Default 1 s.
    pub base: Duration,
    /// Largest ceiling. Default 60 s.
    pub cap: Duration,
    /// Randomised fraction of the ceiling, in `[0, 1]` (clamped; NaN counts as 0):
    /// 0.5 = equal jitter (default), 1 = full jitter, 0 = none.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The un-jittered ceiling after `consecutive` failures (1-based; 0 is treated as 1):
    /// `min(cap, base·2^(consecutive−1))`.
    pub fn ceiling(&self, consecutive: u32) -> Duration {
        let exponent = consecutive.max(1) - 1;
        1u32.checked_shl(exponent)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The delay before the next try after `consecutive` failures: `c·(1−j) + U[0, c·j]` for
    /// ceiling `c` and jitter `j`; always within `[c·(1−j), c]`.
    pub fn delay(&self, consecutive: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(consecutive);
        let spread = scale(ceiling, self.jitter);
        ceiling
            .saturating_sub(spread)
            .saturating_add(uniform_up_to(spread, rng))
    }
}

/// How long to pause a provider scope after a classified failure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PausePolicy {
    /// Pause after a capacity answer (429) without a hint. Default 60 s (field case 7).
    pub default_cooldown: Duration,
    /// Pause after an overload answer (503/529) without a hint. Default 5 s: overload is often
    /// one busy replica of the provider, and the breaker reacts to a run of them.
    pub overload_cooldown: Duration,
    /// Jitter added on top of every pause.
    pub jitter: HintJitter,
    /// Longest pause ever recorded. Default 24 h (= [`crate::classify::POLICY_MAX_PAUSE`]).
    pub max_pause: Duration,
}

impl Default for PausePolicy {
    fn default() -> Self {
        PausePolicy {
            default_cooldown: Duration::from_secs(60),
            overload_cooldown: Duration::from_secs(5),
            jitter: HintJitter::default(),
            max_pause: crate::classify::POLICY_MAX_PAUSE,
        }
    }
}

impl PausePolicy {
    /// The pause to record for the failure's provider scope, or `None` for classes that do not
    /// pause (timeout, connect, server, auth: breaker and availability controller; request and
    /// deadline: not the provider's fault).
    ///
    /// Capacity and overload use the classification's pause (the provider's hint) or the
    /// default cooldown; policy uses the classification's long pause. Jitter is added on top
    /// and the result is capped at `max_pause`, an operator bound that wins over any hint (with
    /// the default 24 h it only trims jitter off a policy pause that is already 24 h: capacity
    /// hints of an hour or more are classified as policy).
    pub fn scope_pause(&self, c: &Classification, rng: &mut impl Rng) -> Option<Duration> {
        let base = match c.class {
            ErrorClass::Capacity => c.pause.unwrap_or(self.default_cooldown),
            ErrorClass::Overload => c.pause.unwrap_or(self.overload_cooldown),
            ErrorClass::Policy => c.pause.unwrap_or(crate::classify::POLICY_MIN_PAUSE),
            _ => return None,
        };
        Some(self.jitter.apply(base, rng).min(self.max_pause))
    }
}

/// Retry settings for one route.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Same-provider retries allowed per request. Default 1 (field cases' default).
    pub same_provider_retries: u32,
    /// Backoff when the provider gave no hint.
    pub backoff: Backoff,
    /// Jitter on top of a provider's hint.
    pub hint_jitter: HintJitter,
    /// An attempt is only worth starting with at least this much deadline left. Default 0: the
    /// rule is only "never start after the deadline"; routes with slow models may raise it.
    pub min_attempt_time: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            same_provider_retries: 1,
            backoff: Backoff::default(),
            hint_jitter: HintJitter::default(),
            min_attempt_time: Duration::ZERO,
        }
    }
}

/// Where the request stands when an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptContext {
    /// When the failure was observed.
    pub now: Instant,
    /// The request's deadline.
    pub deadline: Instant,
    /// Same-provider retries already made for this request on this provider.
    pub same_provider_retries_used: u32,
    /// Consecutive failures on this provider within this request, including this one (drives
    /// the backoff exponent).
    pub consecutive_failures: u32,
    /// Whether another provider down the chain is eligible now (not paused, circuit closed,
    /// within the retry budget and fallback throttle). The caller decides this.
    pub next_provider_available: bool,
    /// The latest pause deadline of this provider's scopes, if paused (from
    /// [`Pauses::paused_until`]); a same-provider retry never starts before it.
    pub scope_paused_until: Option<Instant>,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Wait this long, then retry the same provider.
    SameProviderAfter(Duration),
    /// Try the next provider in the chain now.
    NextProvider,
    /// Return the failure to the client, with this `Retry-After` (if any): at least the
    /// provider's remaining advertised wait (for policy answers, the bounded scope pause rather
    /// than a multi-week hint). The router may lower it when another provider of the route
    /// will be back sooner.
    GiveUp {
        /// `Retry-After` for the client.
        retry_after: Option<Duration>,
    },
}

/// Whether an attempt that waits `wait` from `now` starts strictly before `deadline`.
pub fn wait_fits_deadline(wait: Duration, now: Instant, deadline: Instant) -> bool {
    now + wait < deadline
}

/// Decides the next step after a failed attempt (module docs; field cases 1, 2, 3, 22).
///
/// Order: request errors and a passed deadline give up; a class that may move on moves to the
/// next provider when one is available; otherwise a class worth retrying on the same provider
/// waits `max(hint + jitter, pause left)` (or the backoff when there is no hint) and retries if
/// that start (plus `min_attempt_time`) is before the deadline; else give up, advertising the
/// wait the provider asked for.
pub fn next_attempt(
    policy: &RetryPolicy,
    c: &Classification,
    ctx: &AttemptContext,
    rng: &mut impl Rng,
) -> RetryDecision {
    let paused_left = ctx.scope_paused_until.map(|u| u.saturating_since(ctx.now));
    // A policy hint can be weeks (case 3d); the client hears the bounded scope pause instead,
    // since the route may serve again through another provider long before that.
    let hint = if c.class == ErrorClass::Policy {
        None
    } else {
        c.retry_after
    };
    let advertised = [hint, c.pause, paused_left].into_iter().flatten().max();
    if c.class == ErrorClass::Request {
        return RetryDecision::GiveUp { retry_after: None };
    }
    if ctx.now >= ctx.deadline {
        return RetryDecision::GiveUp {
            retry_after: advertised,
        };
    }
    if c.class.retry_elsewhere() && ctx.next_provider_available {
        return RetryDecision::NextProvider;
    }
    if c.class.retry_same_provider()
        && ctx.same_provider_retries_used < policy.same_provider_retries
    {
        let wait = match c.retry_after {
            Some(hint) => policy.hint_jitter.apply(hint, rng),
            None => policy.backoff.delay(ctx.consecutive_failures, rng),
        };
        let wait = wait.max(paused_left.unwrap_or(Duration::ZERO));
        if wait_fits_deadline(
            wait.saturating_add(policy.min_attempt_time),
            ctx.now,
            ctx.deadline,
        ) {
            return RetryDecision::SameProviderAfter(wait);
        }
        return RetryDecision::GiveUp {
            retry_after: Some(advertised.map_or(wait, |a| a.max(wait))),
        };
    }
    RetryDecision::GiveUp {
        retry_after: advertised,
    }
}

/// `d · f` for `f` clamped to `[0, 1]` (NaN → 0); never panics.
fn scale(d: Duration, f: f64) -> Duration {
    let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
    Duration::try_from_secs_f64(d.as_secs_f64() * f).map_or(d, |s| s.min(d))
}

/// Uniform in `[0, bound]` at nanosecond resolution.
fn uniform_up_to(bound: Duration, rng: &mut impl Rng) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rng.random_range(0..=nanos))
}
