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
            weight: Family::default(),
            paused_seconds: Family::default(),
            circuit_open: Family::default(),
            in_flight: Family::default(),
            reloads: Family::default(),
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
