//! Prometheus metrics (DESIGN §5), exposed on `GET /metrics`.
//!
//! Label values are bounded: route and provider names come from configuration, outcome labels
//! from [`ErrorClass::metric_label`] and a few fixed words. Never a tenant key, prompt or
//! response.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels `route`, `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcome {
    /// Route (`namespace/name`).
    pub route: String,
    /// `success`, an error class label, or a rejection reason code.
    pub outcome: String,
}

/// Labels `provider`, `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderOutcome {
    /// Provider (`namespace/name`).
    pub provider: String,
    /// `success`, `cancelled` or an error class label.
    pub outcome: String,
}

/// Label `provider`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// Provider (`namespace/name`).
    pub provider: String,
}

/// Labels `route`, `provider`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteProvider {
    /// Route (`namespace/name`).
    pub route: String,
    /// Provider (`namespace/name`).
    pub provider: String,
}

/// Labels `provider`, `kind` (token kind).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// Provider (`namespace/name`).
    pub provider: String,
    /// `input_uncached`, `cache_read`, `cache_write`, `output`.
    pub kind: String,
}

/// Label `route`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// Route (`namespace/name`).
    pub route: String,
}

/// Label `resource` (a watched kind: `LLMProvider`, `RoutingPolicy`, `TenantQuota`, `Secret`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// Kind name.
    pub resource: String,
}

/// Labels `tenant`, `kind` (what was charged).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantCharge {
    /// Tenant (`namespace/name` of the TenantQuota).
    pub tenant: String,
    /// `input_uncached`, `cache_read`, `cache_write`, `output` (tokens) or `spend_micro_usd`.
    pub kind: String,
    /// `reported` (the provider's usage) or `estimated` (the tokenizer's count or the
    /// router's estimate: the provider reported nothing for this attempt).
    pub source: String,
}

/// Label `tenant`: the `namespace/name` of a configured TenantQuota (bounded by the
/// configuration; never a key or a client-chosen value).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// Tenant (`namespace/name` of the TenantQuota).
    pub tenant: String,
}

/// Labels `outcome` (`admitted`, `queued`, or a rejection reason code).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaOutcome {
    /// What the broker decided.
    pub outcome: String,
}

/// Label `mode` of the quota store.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreModeLabel {
    /// `in_process`, `redis` or `local_fallback`.
    pub mode: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 5 ms .. ~82 s in doublings: embeddings at the low end, long generations at the top.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// Every metric of the router.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Client requests by route and final outcome.
    pub requests: Family<RouteOutcome, Counter>,
    /// Upstream attempts by provider and outcome.
    pub attempts: Family<ProviderOutcome, Counter>,
    /// Attempts after the first, by route.
    pub retries: Family<RouteLabel, Counter>,
    /// Requests served by a provider other than the first of their chain.
    pub fallbacks: Family<RouteLabel, Counter>,
    /// Projects whose pinned first choice changed (affinity moved with a failover).
    pub affinity_breaks: Family<RouteLabel, Counter>,
    /// Full upstream latency, seconds.
    pub latency: HistogramFamily<ProviderLabel>,
    /// Time to first content, seconds (streaming).
    pub ttft: HistogramFamily<ProviderLabel>,
    /// Tokens by provider and kind, as reported by the provider (or estimated).
    pub tokens: Family<TokenLabels, Counter>,
    /// Availability from the controller.
    pub availability: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
    /// Flap-damping relapse penalty of the in-process controller, by provider.
    pub flap_penalty: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
    /// Cascade weight per route and provider.
    pub weight: Family<RouteProvider, Gauge<f64, AtomicU64>>,
    /// Seconds left of a Retry-After or exhaustion pause on the provider (or its quota group).
    pub paused_seconds: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
    /// 1 when the provider's circuit is open on this replica.
    pub circuit_open: Family<ProviderLabel, Gauge>,
    /// Attempts in flight.
    pub in_flight: Family<ProviderLabel, Gauge>,
    /// Configuration reloads by result (`ok`, `invalid`).
    pub reloads: Family<RouteOutcome, Counter>,
    /// What tenants were charged after reconciliation (tokens by kind, and micro-USD).
    pub tenant_charged: Family<TenantCharge, Counter>,
    /// Broker decisions on requests: admitted, queued, or the rejection's reason code.
    pub quota_decisions: Family<QuotaOutcome, Counter>,
    /// Reservations issued by this router and not yet settled.
    pub reservations_in_flight: Gauge,
    /// 1 for the quota store's current mode (a Redis outage shows as `local_fallback`).
    pub store_mode: Family<StoreModeLabel, Gauge>,
    /// Settlements and cancels waiting for Redis to answer again.
    pub replay_pending: Gauge,
    /// Configured limits whose state a Redis restart would lose: windows or refill periods
    /// of an hour or more and spend limits, counted when the configured Redis persists
    /// nothing (0 when it persists, or when there is no Redis).
    pub unpersisted_limits: Gauge,
    /// Requests waiting in the broker's queues, per tenant.
    pub queue_depth: Family<TenantLabel, Gauge>,
    /// Time spent waiting in a queue before admission or refusal, seconds, per tenant.
    pub queue_wait: HistogramFamily<TenantLabel>,
    /// Relative error of the input-token estimate, |actual − estimate| / actual, per settle.
    pub estimation_error: Histogram,
    /// Kubernetes mode: 1 while the watch of a kind is answering, 0 while it fails.
    pub kube_watch_healthy: Family<ResourceLabel, Gauge>,
    /// Kubernetes mode: seconds the configuration has been served without a working watch
    /// (0 while every watch answers); fail-static shows here.
    pub config_stale_seconds: Gauge<f64, AtomicU64>,
    /// 1 when the process serves requests without an API key (`--allow-anonymous`), else 0.
    pub anonymous_access: Gauge,
    /// 1 once the `o200k_base` vocabulary is in memory (~70 MB), else 0; stays 0 while
    /// nothing configured counts tokens (issue 16 item 1).
    pub tokenizer_loaded: Gauge,
}

impl Metrics {
    /// Registers every metric under the `switchyard_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard");
        let m = Metrics {
            requests: Family::default(),
            attempts: Family::default(),
            retries: Family::default(),
            fallbacks: Family::default(),
            affinity_breaks: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            ttft: Family::new_with_constructor(latency_histogram),
            tokens: Family::default(),
            availability: Family::default(),
            flap_penalty: Family::default(),
            weight: Family::default(),
            paused_seconds: Family::default(),
            circuit_open: Family::default(),
            in_flight: Family::default(),
            reloads: Family::default(),
            kube_watch_healthy: Family::default(),
            config_stale_seconds: Gauge::default(),
            anonymous_access: Gauge::default(),
            tokenizer_loaded: Gauge::default(),
            tenant_charged: Family::default(),
            quota_decisions: Family::default(),
            reservations_in_flight: Gauge::default(),
            store_mode: Family::default(),
            replay_pending: Gauge::default(),
            unpersisted_limits: Gauge::default(),
            queue_depth: Family::default(),
            queue_wait: Family::new_with_constructor(latency_histogram),
            estimation_error: Histogram::new([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Client requests by route and outcome",
            m.requests.clone(),
        );
        registry.register(
            "attempts",
            "Upstream attempts by provider and outcome",
            m.attempts.clone(),
        );
        registry.register("retries", "Attempts after the first", m.retries.clone());
        registry.register(
            "fallbacks",
            "Requests served below the first provider of their chain",
            m.fallbacks.clone(),
        );
        registry.register(
            "affinity_breaks",
            "Pinned chains whose first provider changed",
            m.affinity_breaks.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Upstream call latency",
            m.latency.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time to first content of streamed responses",
            m.ttft.clone(),
        );
        registry.register("tokens", "Tokens by provider and kind", m.tokens.clone());
        registry.register(
            "provider_availability",
            "Availability computed by the PID controller",
            m.availability.clone(),
        );
        registry.register(
            "provider_flap_penalty",
            "Flap-damping relapse penalty of the in-process availability controller",
            m.flap_penalty.clone(),
        );
        registry.register("route_weight", "Priority-cascade weight", m.weight.clone());
        registry.register(
            "provider_paused_seconds",
            "Seconds left of a Retry-After or exhaustion pause",
            m.paused_seconds.clone(),
        );
        registry.register(
            "circuit_open",
            "1 when the circuit breaker is open",
            m.circuit_open.clone(),
        );
        registry.register(
            "in_flight",
            "Upstream attempts in flight",
            m.in_flight.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration reloads by result",
            m.reloads.clone(),
        );
        registry.register(
            "kube_watch_healthy",
            "1 while the watch of a resource kind answers (Kubernetes mode)",
            m.kube_watch_healthy.clone(),
        );
        registry.register(
            "config_stale_seconds",
            "Seconds the configuration has been served without a working watch (Kubernetes mode)",
            m.config_stale_seconds.clone(),
        );
        registry.register(
            "tenant_charged",
            "What tenants were charged after reconciliation: tokens by kind and micro-USD",
            m.tenant_charged.clone(),
        );
        registry.register(
            "quota_decisions",
            "Broker decisions: admitted, queued, or the rejection reason code",
            m.quota_decisions.clone(),
        );
        registry.register(
            "quota_reservations_in_flight",
            "Reservations issued by this router and not yet settled",
            m.reservations_in_flight.clone(),
        );
        registry.register(
            "quota_store_mode",
            "1 for the quota store's current mode",
            m.store_mode.clone(),
        );
        registry.register(
            "quota_replay_pending",
            "Settlements and cancels made while Redis was unreachable, not yet replayed",
            m.replay_pending.clone(),
        );
        registry.register(
            "quota_unpersisted_limits",
            "Daily or longer limits and spend limits kept in a Redis that persists nothing (a restart resets them)",
            m.unpersisted_limits.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for quota in the broker's queues",
            m.queue_depth.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time spent in a queue before admission or refusal",
            m.queue_wait.clone(),
        );
        registry.register(
            "estimation_error_ratio",
            "Relative error of the input-token estimate per settled request",
            m.estimation_error.clone(),
        );
        registry.register(
            "anonymous_access_allowed",
            "1 when requests without an API key are served (--allow-anonymous), else 0",
            m.anonymous_access.clone(),
        );
        registry.register(
            "tokenizer_loaded",
            "1 once the tokenizer's vocabulary is in memory (only needed when a limit counts tokens), else 0",
            m.tokenizer_loaded.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
