//! Prometheus metrics of the operator (DESIGN §5), served on `GET /metrics`.
//!
//! Labels are bounded: kinds and results are fixed words, providers and replicas come from
//! configuration and the router Service.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels `kind`, `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindResult {
    /// `LLMProvider`, `RoutingPolicy` or `TenantQuota`.
    pub kind: String,
    /// `ok`, `written`, `unchanged`, `skipped_not_leader` or an error label.
    pub result: String,
}

/// Labels `kind`, `reason` (of a watch failure).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindReason {
    /// `LLMProvider`, `RoutingPolicy`, `TenantQuota` or `Secret`.
    pub kind: String,
    /// `list_failed`, `watch_start_failed`, `gone` (410: the watcher relists), `watch_error`,
    /// `watch_failed` or `no_resource_version`.
    pub reason: String,
}

/// Label `replica` (a router address).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// Base URL of the replica.
    pub replica: String,
}

/// Label `provider`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// `namespace/name`.
    pub provider: String,
}

/// Label `state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `reachable` or `unreachable`.
    pub state: String,
}

/// Every metric of the operator.
#[derive(Debug)]
pub struct Metrics {
    /// The registry `/metrics` encodes.
    pub registry: Registry,
    /// 1 while this replica holds the Lease.
    pub leader: Gauge,
    /// Status syncs by kind and result.
    pub syncs: Family<KindResult, Counter>,
    /// Control ticks run.
    pub ticks: Counter,
    /// Failed scrapes by replica.
    pub scrape_failures: Family<ReplicaLabel, Counter>,
    /// Router replicas at the last tick, by state.
    pub replicas: Family<StateLabel, Gauge>,
    /// Availability per provider as last computed.
    pub availability: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
    /// Watch failures by kind and reason (`gone` = 410, the watcher relists).
    pub watch_errors: Family<KindReason, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `switchyard_operator` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("switchyard_operator");
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let syncs = Family::<KindResult, Counter>::default();
        registry.register(
            "status_syncs",
            "Status syncs by kind and result",
            syncs.clone(),
        );
        let ticks = Counter::default();
        registry.register(
            "control_ticks",
            "Control loop ticks run as leader",
            ticks.clone(),
        );
        let scrape_failures = Family::<ReplicaLabel, Counter>::default();
        registry.register(
            "scrape_failures",
            "Outcome scrapes that failed, by router replica",
            scrape_failures.clone(),
        );
        let replicas = Family::<StateLabel, Gauge>::default();
        registry.register(
            "router_replicas",
            "Router replicas at the last tick by state (reachable, unreachable)",
            replicas.clone(),
        );
        let availability = Family::<ProviderLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "provider_availability",
            "Availability per LLMProvider as last computed",
            availability.clone(),
        );
        let watch_errors = Family::<KindReason, Counter>::default();
        registry.register(
            "watch_errors",
            "Watch failures by kind and reason (gone: 410 after compaction, the cache relists)",
            watch_errors.clone(),
        );
        Metrics {
            watch_errors,
            registry,
            leader,
            syncs,
            ticks,
            scrape_failures,
            replicas,
            availability,
        }
    }

    /// Counts one status sync.
    pub fn sync(&self, kind: &str, result: &str) {
        self.syncs
            .get_or_create(&KindResult {
                kind: kind.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// Counts one watch failure of `kind`.
    pub fn watch_error(&self, kind: &str, reason: &str) {
        self.watch_errors
            .get_or_create(&KindReason {
                kind: kind.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
