//! Scenario files: scripted providers and traffic, read from YAML.
//!
//! A scenario names a service type (`chat` or `embedding`), a duration, the controller interval
//! `T`, a seed, the providers in priority order and the traffic. Everything that changes over time
//! (capacity, latency factor, background error rate, arrival rate) is a [`Schedule`]: a constant,
//! a list of `{at, value}` steps (piecewise constant), or `{linear: true, points: [...]}` for a
//! slow ramp. Durations are human strings (`30s`, `10m`, `1h 30m`).
//!
//! The provider model follows what the seed articles describe of real LLM APIs: RPM and ITPM
//! limits enforced as continuously refilled token buckets where only uncached input tokens count
//! (seed 000: "rate limits are defined mainly by the number of uncached tokens we send"), `429`
//! with a `Retry-After` when a bucket is empty, a prompt cache that only helps when the next turn
//! of a session lands on the same provider within its TTL, and outage windows.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::SimError;

/// A value that changes over virtual time.
///
/// YAML shapes: `5` (constant), `[{at: 0s, value: 5}, {at: 10m, value: 3}]` (steps, each value
/// holding from its `at` until the next), or `{linear: true, points: [...]}` (linear
/// interpolation between points, constant before the first and after the last).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    points: Vec<(Duration, f64)>,
    linear: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ScheduleRepr {
    Constant(f64),
    Steps(Vec<PointRepr>),
    Ramp {
        #[serde(default)]
        linear: bool,
        points: Vec<PointRepr>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PointRepr {
    #[serde(deserialize_with = "de_duration")]
    at: Duration,
    value: f64,
}

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let repr = ScheduleRepr::deserialize(d)?;
        let (points, linear) = match repr {
            ScheduleRepr::Constant(v) => (vec![(Duration::ZERO, v)], false),
            ScheduleRepr::Steps(p) => (p.into_iter().map(|p| (p.at, p.value)).collect(), false),
            ScheduleRepr::Ramp { linear, points } => (
                points.into_iter().map(|p| (p.at, p.value)).collect(),
                linear,
            ),
        };
        Schedule::new(points, linear).map_err(serde::de::Error::custom)
    }
}

impl Schedule {
    /// A schedule from `(at, value)` points sorted by `at`; `linear` interpolates between them.
    ///
    /// Errors when there are no points, when they are not sorted, or when a value is not finite.
    pub fn new(points: Vec<(Duration, f64)>, linear: bool) -> Result<Self, String> {
        if points.is_empty() {
            return Err("a schedule needs at least one point".into());
        }
        if points.windows(2).any(|w| w[0].0 > w[1].0) {
            return Err("schedule points must be sorted by `at`".into());
        }
        if points.iter().any(|p| !p.1.is_finite()) {
            return Err("schedule values must be finite".into());
        }
        Ok(Self { points, linear })
    }

    /// A schedule that is `v` at every time.
    pub fn constant(v: f64) -> Self {
        Self {
            points: vec![(Duration::ZERO, v)],
            linear: false,
        }
    }

    /// The value at virtual time `t`.
    pub fn at(&self, t: Duration) -> f64 {
        // Index of the last point with `at <= t` (points are few; a linear scan is cheapest).
        let idx = self.points.iter().rposition(|p| p.0 <= t);
        match idx {
            None => self.points[0].1,
            Some(i) => {
                let (t0, v0) = self.points[i];
                match self.points.get(i + 1) {
                    Some(&(t1, v1)) if self.linear && t1 > t0 => {
                        let f = (t - t0).as_secs_f64() / (t1 - t0).as_secs_f64();
                        v0 + (v1 - v0) * f
                    }
                    _ => v0,
                }
            }
        }
    }

    /// The smallest value the schedule takes (used for validation).
    pub fn min(&self) -> f64 {
        self.points
            .iter()
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min)
    }
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(serde::de::Error::custom)
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
        .transpose()
}

fn default_interval() -> Duration {
    Duration::from_secs(30)
}
fn default_timeout() -> Duration {
    Duration::from_secs(120)
}
fn default_cache_ttl() -> Duration {
    Duration::from_secs(300)
}
fn default_burst() -> Duration {
    Duration::from_secs(60)
}
fn default_error_latency() -> Duration {
    Duration::from_millis(250)
}
fn default_one() -> f64 {
    1.0
}
fn default_zero_schedule() -> Schedule {
    Schedule::constant(0.0)
}
fn default_one_schedule() -> Schedule {
    Schedule::constant(1.0)
}

/// What the routed service is; decides which algorithm the `switchyard` strategy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceType {
    /// LLM chat: sticky chains over cascade weights from the availability controller.
    Chat,
    /// Embeddings: power of two choices with latency scoring.
    Embedding,
}

/// A whole scenario, as read from one YAML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name; used as the output folder name.
    pub name: String,
    /// One line shown in reports.
    #[serde(default)]
    pub description: String,
    /// Service type of the route.
    pub service: ServiceType,
    /// Virtual time simulated.
    #[serde(deserialize_with = "de_duration")]
    pub duration: Duration,
    /// Availability-controller interval `T` and the metrics bucket width (default 30 s).
    #[serde(default = "default_interval", deserialize_with = "de_duration")]
    pub interval: Duration,
    /// Seed for every random draw; the same seed gives the same traffic to every strategy.
    pub seed: u64,
    /// Client/router timeout per attempt: a slower answer counts as a provider-side timeout.
    #[serde(default = "default_timeout", deserialize_with = "de_duration")]
    pub request_timeout: Duration,
    /// Settings of the `switchyard` strategy.
    #[serde(default)]
    pub switchyard: SwitchyardSettings,
    /// Strategies to run (default: all four).
    #[serde(default)]
    pub strategies: Option<Vec<crate::StrategyKind>>,
    /// Providers, in priority order (first = preferred).
    pub providers: Vec<ProviderSpec>,
    /// The traffic offered.
    pub traffic: Traffic,
}

/// Settings of the `switchyard` strategy that a scenario may override.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwitchyardSettings {
    /// Attempts per request including the first (DESIGN §4.4; default 3).
    pub max_attempts: u32,
    /// How long a project's chain is pinned (DESIGN §4.3; default 5 min).
    #[serde(deserialize_with = "de_duration")]
    pub pin: Duration,
    /// Sliding pins (every turn extends the pin; core's default) or fixed pins (re-sampled
    /// `pin` after they were set, the sticky-chain article's behaviour).
    pub pin_refresh_on_hit: bool,
    /// Whether a request that skips a provider because it is paused (Retry-After, overload
    /// cooldown) counts as a provider-side error in that provider's controller window (default
    /// true). Without it, pauses hide the overflow from the controller: the provider keeps
    /// availability 1 while every pause sheds its projects to the next provider. Skips for an
    /// open circuit count only when the window's real outcomes at that provider had no success
    /// or an error rate above target (an outage); right after a recovery one stale skip at low
    /// volume would otherwise read as a 50 % error rate.
    pub skips_count_as_errors: bool,
    /// RoutingPolicy `affinity.cacheHold`: when the head of a project's chain (the provider
    /// holding its prompt cache) is paused for at most this long, the first attempt waits for
    /// it instead of spilling down the chain. Default 5 s, the router's (`DEFAULT_CACHE_HOLD`);
    /// `0s` = spill at once, as DESIGN §3.
    #[serde(deserialize_with = "de_opt_duration")]
    pub cache_hold: Option<Duration>,
    /// The router's `--probe-gate`: how long after a pause ends the single-probe gate stays
    /// armed (`Pauses::admit`, field case 2); default 60 s, `0s` disables the gate.
    #[serde(deserialize_with = "de_duration")]
    pub probe_gate: Duration,
    /// Availability-controller overrides; unset fields keep `ControllerConfig::default()`.
    pub controller: ControllerOverrides,
    /// Router-wide retry budget: retries ≤ ratio × first attempts over 10 s, plus
    /// `retry_budget_floor_per_sec` (default 0.2 and 5/s, the router's; `None` disables the budget).
    pub retry_budget_ratio: Option<f64>,
    /// See `retry_budget_ratio`.
    pub retry_budget_floor_per_sec: u32,
    /// Fallback throttle on retries that spill to another provider, per second (burst 2 s
    /// worth); `None` (default) disables it.
    pub fallback_throttle_per_sec: Option<f64>,
    /// RoutingPolicy `fallback.pauseWait`: how long after arrival a request whose every
    /// candidate is paused or open may wait for the earliest to come back (default 30 s, the
    /// router's `DEFAULT_PAUSE_WAIT`; `0s` answers at once).
    #[serde(deserialize_with = "de_duration")]
    pub pause_wait: Duration,
    /// RoutingPolicy `deadline` (default 60 s): the request deadline, of which one attempt
    /// gets half of what is left while a fallback is possible.
    #[serde(deserialize_with = "de_duration")]
    pub deadline: Duration,
    /// RoutingPolicy `fallback.sameProviderRetries` (default 0).
    pub same_provider_retries: u32,
    /// LLMProvider `circuitBreaker` overrides, the same for every provider.
    pub circuit_breaker: BreakerOverrides,
    /// The latency signal (`switchyard_core::latency`, default on as in the router): slow
    /// answers are soft errors in the controller window, and chat requests (streams) get the
    /// adaptive first-token deadline. `false` = the controller sees errors only.
    pub latency_signal: bool,
    /// FIFO wait lines per full provider (`switchyard_core::waitline`, default on as in the
    /// router): a request waiting for a provider that a capacity refusal paused takes a place in
    /// that provider's line, ordered by the time of its first wait, and only the line's head
    /// tries it. `false` = every waiter sleeps to its own timer and re-contends.
    pub wait_lines: bool,
}

/// Optional overrides of the core's circuit-breaker settings (LLMProvider `circuitBreaker`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerOverrides {
    /// `consecutiveFailures` (default 5).
    pub consecutive_failures: Option<u32>,
    /// `cooldown` (default 5 s).
    #[serde(deserialize_with = "de_opt_duration")]
    pub cooldown: Option<Duration>,
    /// `maxCooldown` (default 60 s).
    #[serde(deserialize_with = "de_opt_duration")]
    pub max_cooldown: Option<Duration>,
}

impl Default for SwitchyardSettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            pin: Duration::from_secs(300),
            pin_refresh_on_hit: true,
            skips_count_as_errors: true,
            cache_hold: Some(switchyard_core::dispatch::DEFAULT_CACHE_HOLD),
            probe_gate: switchyard_core::pause::DEFAULT_PROBE_GATE,
            controller: ControllerOverrides::default(),
            retry_budget_ratio: Some(0.2),
            retry_budget_floor_per_sec: 5,
            fallback_throttle_per_sec: None,
            pause_wait: switchyard_core::dispatch::DEFAULT_PAUSE_WAIT,
            deadline: Duration::from_secs(60),
            same_provider_retries: 0,
            circuit_breaker: BreakerOverrides::default(),
            latency_signal: true,
            wait_lines: true,
        }
    }
}

/// Optional overrides of the core's availability-controller settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerOverrides {
    /// Target provider-side error rate (`K = 1/target`).
    pub target_error_rate: Option<f64>,
    /// Proportional gain.
    pub kp: Option<f64>,
    /// Integral gain.
    pub ki: Option<f64>,
    /// Derivative gain.
    pub kd: Option<f64>,
    /// Integral clamp.
    pub integral_limit: Option<f64>,
}

/// One scripted provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    /// Name shown in outputs.
    pub name: String,
    /// Requests per minute; omitted = unlimited.
    #[serde(default)]
    pub rpm: Option<Schedule>,
    /// Uncached input tokens per minute; omitted = unlimited.
    #[serde(default)]
    pub itpm: Option<Schedule>,
    /// Bucket depth expressed as time of refill (default 60 s: a per-minute limit allows a
    /// minute's worth of burst, like a continuously refilled token bucket).
    #[serde(default = "default_burst", deserialize_with = "de_duration")]
    pub burst: Duration,
    /// How a bucket admits an attempt (default `overdraft`).
    #[serde(default)]
    pub admission: Admission,
    /// Fixed `Retry-After` on a 429; omitted = the time until the bucket has room (rounded up
    /// to whole seconds, at least 1 s), as vendors compute it.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub retry_after: Option<Duration>,
    /// Prompt-cache TTL; a hit refreshes it (default 5 min).
    #[serde(default = "default_cache_ttl", deserialize_with = "de_duration")]
    pub cache_ttl: Duration,
    /// Latency model.
    pub latency: LatencySpec,
    /// Background probability that an attempt fails with a 500 (default 0).
    #[serde(default = "default_zero_schedule")]
    pub error_rate: Schedule,
    /// Outage windows.
    #[serde(default)]
    pub outages: Vec<Outage>,
    /// Concurrent requests served at full speed; above it latency stretches by
    /// `in_flight / concurrency` (processor sharing). Omitted = no queueing.
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Time to answer with an error (429, 5xx).
    #[serde(default = "default_error_latency", deserialize_with = "de_duration")]
    pub error_latency: Duration,
    /// Fixed fates of the first attempts this provider receives, in order of arrival; once the
    /// script is used up the model above decides again. Scripts are how a replay pins every
    /// attempt's outcome (the router-equivalence test feeds the same script to the mock
    /// providers in front of a real router).
    #[serde(default)]
    pub script: Vec<ScriptStep>,
    /// RoutingPolicy `providers[].priority` of this provider (0–1000, lower filled first): set
    /// on every provider or on none, as in the CRD. Only the `switchyard` strategy reads it
    /// (the baselines keep list order).
    #[serde(default)]
    pub priority: Option<u32>,
    /// RoutingPolicy `providers[].weight` within its tier (0–1,000,000, default 1; 0 = no
    /// traffic while another provider can serve). Only the `switchyard` strategy reads it.
    #[serde(default)]
    pub weight: Option<u32>,
}

/// One scripted attempt outcome (see [`ProviderSpec::script`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScriptStep {
    /// A full answer after the provider's base latency.
    Ok,
    /// 429 with this `Retry-After`.
    RateLimited {
        /// The hint.
        #[serde(deserialize_with = "de_duration")]
        retry_after: Duration,
    },
    /// An HTTP error with this status (500, 502, 503 …) and no hint.
    Server {
        /// The status.
        status: u16,
    },
    /// No response headers until the attempt's deadline.
    Timeout,
    /// A 200 stream whose connection breaks before the first content: the router fails over.
    CutBeforeContent,
    /// A 200 stream whose connection breaks after content reached the client: the request is
    /// served (it cannot move) and the attempt still counts as a provider failure.
    CutAfterContent,
}

/// How a rate-limit bucket decides whether an attempt fits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Admission {
    /// Admit while the bucket is above zero and debit the full cost (it may go negative): the
    /// answer does not depend on the request's size, so under pressure a random share of
    /// requests is refused. This is what seed 000 describes ("some requests go through while
    /// others fall back") and how limiters that check before counting tokens behave.
    #[default]
    Overdraft,
    /// Admit only when the whole cost fits. Small (cache-hit) requests then slip through while
    /// large (cache-miss) ones are refused, which sorts sessions between providers by itself.
    Fit,
}

/// Latency of a successful attempt:
/// `factor(t) · (base + uncached/1000 · per_1k_uncached + cached/1000 · per_1k_cached
/// + output · per_output_token) · exp(jitter · z)` with `z` standard normal.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    /// Fixed part.
    #[serde(deserialize_with = "de_duration")]
    pub base: Duration,
    /// Prefill time per 1000 uncached input tokens.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_1k_uncached: Option<Duration>,
    /// Time per 1000 cached input tokens.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_1k_cached: Option<Duration>,
    /// Decode time per output token.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_output_token: Option<Duration>,
    /// Sigma of the log-normal jitter (0 = none).
    #[serde(default)]
    pub jitter: f64,
    /// Multiplier over time (latency shifts); default 1.
    #[serde(default = "default_one_schedule")]
    pub factor: Schedule,
}

/// A window in which a share of attempts fail with `status`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    /// Start, from the scenario start.
    #[serde(deserialize_with = "de_duration")]
    pub start: Duration,
    /// End (exclusive).
    #[serde(deserialize_with = "de_duration")]
    pub end: Duration,
    /// HTTP status returned (500 or 503).
    pub status: u16,
    /// Share of attempts that fail (default 1).
    #[serde(default = "default_one")]
    pub fraction: f64,
}

/// Offered traffic.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Traffic {
    /// Multi-turn agent sessions of projects (chat).
    Sessions(SessionTraffic),
    /// Independent requests arriving as a Poisson stream (embeddings).
    Poisson(PoissonTraffic),
    /// A fixed list of requests (replays); each is its own one-turn session-less request.
    Script(ScriptTraffic),
}

/// Requests at fixed times, for replays against scripted providers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTraffic {
    /// The requests, in arrival order.
    pub requests: Vec<ScriptedRequest>,
    /// Input tokens per request (default 0).
    #[serde(default)]
    pub input_tokens: u64,
}

/// One request of a [`ScriptTraffic`].
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedRequest {
    /// Arrival, from the scenario start.
    #[serde(deserialize_with = "de_duration")]
    pub at: Duration,
    /// Project number; its affinity key is `project-<n>`, as for session traffic.
    pub project: u32,
}

/// Agent sessions: sessions start as a Poisson stream; each belongs to one of `projects`
/// (the affinity key), runs `turns` turns separated by exponential gaps, and its context grows
/// by `tokens_per_turn` plus the previous answer each turn.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionTraffic {
    /// Number of distinct project keys.
    pub projects: u32,
    /// Session starts per minute.
    pub sessions_per_minute: Schedule,
    /// Inclusive range of turns per session.
    pub turns: [u32; 2],
    /// Mean gap between the end of a turn and the start of the next (exponential).
    #[serde(deserialize_with = "de_duration")]
    pub turn_gap: Duration,
    /// Shortest gap (tool execution never takes zero time).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub min_gap: Option<Duration>,
    /// Input tokens of the first turn (system prompt, tools, repository context).
    pub initial_context: u64,
    /// Input tokens each turn adds (tool results, user message).
    pub tokens_per_turn: u64,
    /// Output tokens per turn.
    pub output_tokens: u64,
}

/// Independent requests (embeddings): Poisson arrivals, fixed small inputs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoissonTraffic {
    /// Requests per second.
    pub requests_per_second: Schedule,
    /// Input tokens per request.
    pub input_tokens: u64,
}

impl Scenario {
    /// Parses and validates a scenario from YAML text.
    pub fn from_yaml(text: &str) -> Result<Self, SimError> {
        let s: Scenario = serde_yaml::from_str(text).map_err(|e| SimError::Parse(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Reads, parses and validates a scenario file.
    pub fn from_file(path: &Path) -> Result<Self, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::from_yaml(&text)
    }

    /// A copy with another seed, named `<name>-seed<seed>` (for robustness sweeps).
    pub fn with_seed(&self, seed: u64) -> Scenario {
        Scenario {
            name: format!("{}-seed{seed}", self.name),
            seed,
            ..self.clone()
        }
    }

    /// The providers' priority tiers and static weights, as the router builds them from a
    /// RoutingPolicy (`None` when no provider sets `priority` or `weight`); the error names
    /// what is wrong (priority on some providers only, every weight 0, out of range).
    pub fn tiers(&self) -> Result<Option<switchyard_core::weights::Tiers>, String> {
        let names: Vec<&str> = self.providers.iter().map(|p| p.name.as_str()).collect();
        let priority: Vec<Option<u32>> = self.providers.iter().map(|p| p.priority).collect();
        let weight: Vec<Option<u32>> = self.providers.iter().map(|p| p.weight).collect();
        switchyard_core::weights::Tiers::from_spec(&names, &priority, &weight)
    }

    /// Checks the cross-field rules serde cannot express.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Invalid(m));
        if self.providers.is_empty() {
            return bad("at least one provider is required".into());
        }
        if self.interval.is_zero() || self.duration < self.interval {
            return bad("interval must be > 0 and <= duration".into());
        }
        if self.switchyard.max_attempts == 0 {
            return bad("switchyard.max_attempts must be >= 1".into());
        }
        let mut names = std::collections::HashSet::new();
        for p in &self.providers {
            if !names.insert(p.name.as_str()) {
                return bad(format!("duplicate provider name {}", p.name));
            }
            for (what, s) in [("rpm", &p.rpm), ("itpm", &p.itpm)] {
                if let Some(s) = s
                    && s.min() < 0.0
                {
                    return bad(format!("provider {}: {what} must be >= 0", p.name));
                }
            }
            if p.burst.is_zero() {
                return bad(format!("provider {}: burst must be > 0", p.name));
            }
            if p.latency.factor.min() <= 0.0 || p.latency.jitter < 0.0 {
                return bad(format!(
                    "provider {}: latency factor > 0, jitter >= 0",
                    p.name
                ));
            }
            for o in &p.outages {
                if o.end <= o.start || !(0.0..=1.0).contains(&o.fraction) {
                    return bad(format!(
                        "provider {}: outage needs start < end, fraction in [0,1]",
                        p.name
                    ));
                }
            }
            if p.concurrency == Some(0) {
                return bad(format!("provider {}: concurrency must be >= 1", p.name));
            }
        }
        let tiers = self
            .tiers()
            .map_err(|e| SimError::Invalid(format!("providers: {e}")))?;
        if tiers.is_some() && self.service != ServiceType::Chat {
            return bad(
                "providers: priority and weight apply only to chat (the stickyChain strategy)"
                    .into(),
            );
        }
        match &self.traffic {
            Traffic::Sessions(t) => {
                if t.projects == 0 || t.turns[0] == 0 || t.turns[0] > t.turns[1] {
                    return bad("traffic: projects >= 1 and 1 <= turns[0] <= turns[1]".into());
                }
                if t.sessions_per_minute.min() < 0.0 {
                    return bad("traffic: sessions_per_minute must be >= 0".into());
                }
            }
            Traffic::Poisson(t) => {
                if t.requests_per_second.min() < 0.0 {
                    return bad("traffic: requests_per_second must be >= 0".into());
                }
            }
            Traffic::Script(t) => {
                if t.requests.windows(2).any(|w| w[0].at > w[1].at) {
                    return bad("traffic: scripted requests must be sorted by `at`".into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_steps_hold_until_next_point() {
        let s = Schedule::new(
            vec![(Duration::ZERO, 10.0), (Duration::from_secs(60), 4.0)],
            false,
        )
        .unwrap();
        assert_eq!(s.at(Duration::from_secs(59)), 10.0);
        assert_eq!(s.at(Duration::from_secs(60)), 4.0);
        assert_eq!(s.at(Duration::from_secs(600)), 4.0);
    }

    #[test]
    fn schedule_linear_interpolates_between_points() {
        let s = Schedule::new(
            vec![
                (Duration::from_secs(10), 0.0),
                (Duration::from_secs(20), 1.0),
            ],
            true,
        )
        .unwrap();
        assert_eq!(s.at(Duration::ZERO), 0.0);
        assert!((s.at(Duration::from_secs(15)) - 0.5).abs() < 1e-12);
        assert_eq!(s.at(Duration::from_secs(30)), 1.0);
    }

    #[test]
    fn scenario_yaml_all_shapes_parse() {
        let y = r#"
name: t
service: chat
duration: 10m
seed: 1
providers:
  - name: a
    rpm: 100
    itpm: [{at: 0s, value: 1000}, {at: 5m, value: 10}]
    latency: {base: 1s, factor: {linear: true, points: [{at: 0s, value: 1}, {at: 10m, value: 2}]}}
    outages: [{start: 1m, end: 2m, status: 503}]
traffic:
  kind: sessions
  projects: 3
  sessions_per_minute: 2
  turns: [1, 3]
  turn_gap: 10s
  initial_context: 1000
  tokens_per_turn: 100
  output_tokens: 50
"#;
        let s = Scenario::from_yaml(y).unwrap();
        assert_eq!(s.interval, Duration::from_secs(30));
        assert_eq!(
            s.providers[0]
                .itpm
                .as_ref()
                .unwrap()
                .at(Duration::from_secs(400)),
            10.0
        );
        assert!((s.providers[0].latency.factor.at(Duration::from_secs(300)) - 1.5).abs() < 1e-9);
    }

    #[test]
    fn scenario_unsorted_schedule_is_rejected() {
        let y = "name: t\nservice: embedding\nduration: 1m\nseed: 1\nproviders: [{name: a, latency: {base: 1s}}]\ntraffic: {kind: poisson, requests_per_second: [{at: 1m, value: 1}, {at: 0s, value: 2}], input_tokens: 5}\n";
        assert!(matches!(Scenario::from_yaml(y), Err(SimError::Parse(_))));
    }
}
