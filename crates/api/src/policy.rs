//! `RoutingPolicy`: one public model name (plus aliases) and how its traffic is spread.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{DECIMAL_PATTERN, DURATION_PATTERN, Limit, NAME_PATTERN};
use switchyard_core::availability::ControllerConfig;

/// Desired state of a RoutingPolicy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "RoutingPolicy",
    doc = "A public model name and how its traffic is spread over providers: priority order, strategy, affinity, fallback.",
    plural = "routingpolicies",
    singular = "routingpolicy",
    namespaced,
    status = "RoutingPolicyStatus",
    shortname = "rp",
    shortname = "route",
    category = "switchyard",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.model"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.serviceType"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("self.providers.all(p, self.providers.exists_one(q, q.name == p.name))").message("provider names in a policy must be unique"),
    validation = kube::core::Rule::new("!has(self.aliases) || !(self.model in self.aliases)").message("an alias must differ from the model name"),
    validation = kube::core::Rule::new("!has(self.strategy) || self.strategy != 'stickyChain' || self.serviceType == 'chat' || self.serviceType == 'transcription'").message("the stickyChain strategy is only for chat and transcription policies"),
    validation = kube::core::Rule::new("self.providers.all(p, has(p.priority)) || self.providers.all(p, !has(p.priority))").message("priority must be set on every provider of the policy or on none"),
    validation = kube::core::Rule::new("self.providers.exists(p, !has(p.weight) || p.weight > 0)").message("at least one provider must have a weight above 0"),
    validation = kube::core::Rule::new("self.providers.all(p, !has(p.priority) && !has(p.weight)) || (has(self.strategy) ? self.strategy == 'stickyChain' : (self.serviceType == 'chat' || self.serviceType == 'transcription'))").message("priority and weight apply only to the stickyChain strategy"),
)]
pub struct RoutingPolicySpec {
    /// Public model name clients ask for, such as `claude-sonnet`.
    #[schemars(length(min = 1, max = 256))]
    pub model: String,
    /// Other names that resolve to this policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub aliases: Vec<String>,
    /// Kind of traffic; decides the default strategy and the p2c scoring.
    #[serde(default)]
    pub service_type: ServiceType,
    /// Providers in priority order (first = most preferred), or grouped into tiers by their
    /// `priority` and split by `weight` when those are set. Each must be an LLMProvider in the
    /// same namespace serving `model` (or `upstreamModel`).
    #[schemars(length(min = 1, max = 16))]
    pub providers: Vec<PolicyProvider>,
    /// Balancing strategy; `stickyChain` for chat and transcription and `powerOfTwoChoices`
    /// otherwise when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// Where the project key for cache affinity comes from, and how long a chain is pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<AffinitySpec>,
    /// Availability controller settings (DESIGN §4.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability: Option<AvailabilitySpec>,
    /// When and how far a request moves down its chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSpec>,
    /// Regions requests may execute in; any region when empty. Providers outside are never used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub allowed_regions: Vec<String>,
    /// Overall deadline of one client request across all attempts (default `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub deadline: Option<String>,
    /// Output tokens reserved when a request sets no `max_tokens` (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000_000))]
    pub default_max_tokens: Option<u32>,
    /// Route-wide buckets shared by every tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub limits: Vec<Limit>,
    /// When a request is translated between the OpenAI and Anthropic dialects, drop the
    /// parameters the target API has no equivalent for (e.g. `seed`, `logit_bias`) and list
    /// them in the `x-switchyard-dropped-parameters` response header. Off by default: such a
    /// request is refused with 400 naming the parameters, never served with them ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lossy_translation: Option<bool>,
}

/// Kind of traffic a policy serves.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum ServiceType {
    /// Chat and messages APIs; prompt caches make affinity valuable.
    #[default]
    Chat,
    /// Embedding vectors; stateless, latency-sensitive.
    Embedding,
    /// Document reranking; stateless, latency-sensitive.
    Rerank,
    /// Speech to text (`/v1/audio/transcriptions`) on providers whose model lists the
    /// `transcription` modality; candidates follow that modality's probed health per provider
    /// and region (seed 003). Default strategy `stickyChain`: the providers' order is the
    /// preferred region first (latency, data residency), failing over down the list.
    Transcription,
}

/// Balancing strategy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Strategy {
    /// Per-project chain by weighted rendezvous hashing over the cascade weights (DESIGN §4.3).
    StickyChain,
    /// Two random distinct candidates, the better by recent score (DESIGN §4.6).
    PowerOfTwoChoices,
}

/// One provider of a policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyProvider {
    /// Name of an LLMProvider in the same namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = NAME_PATTERN))]
    pub name: String,
    /// Model name on that provider when it differs from the policy's `model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub model: Option<String>,
    /// Priority tier, 0–1000; lower tiers are filled first and a tier gets the share of
    /// traffic that the tiers above it cannot take (priority cascade, DESIGN §4.2). Providers
    /// with the same priority share their tier by `weight` × availability, whatever their
    /// order in the list, and a project's fallback goes to its tier's other members before
    /// the next tier. Set it on every provider of the policy or on none (refused otherwise:
    /// "priority must be set on every provider of the policy or on none"); when none sets it,
    /// each provider is its own tier in list order. Only for the `stickyChain` strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub priority: Option<u32>,
    /// Static weight within the provider's priority tier, 0–1,000,000 (default 1): a tier's
    /// share is split in proportion to weight × availability, so `70` and `30` on two healthy
    /// providers give a 70/30 split. `0`: no traffic while any other provider of the policy
    /// can serve (the provider is tried only after every provider of positive weight). At
    /// least one provider must have a weight above 0. Only for the `stickyChain` strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub weight: Option<u32>,
}

/// Cache-affinity settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct AffinitySpec {
    /// Request header holding the project key (default `x-project-id`); the tenant is the key
    /// when the header is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9-]+$"))]
    pub header: Option<String>,
    /// How long a project's chain stays pinned so weight jitter does not reshuffle it
    /// (default `5m`; match it to the providers' prompt-cache TTL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub pin_duration: Option<String>,
    /// How long the first attempt of a project with a live pin waits for the head of its
    /// chain, the provider holding its prompt cache, while that provider is paused after a
    /// rate limit, instead of spilling the whole context to a provider without the cache
    /// (default `5s`, chosen by the simulator's sweep in docs/simulation.md; `0s` spills at
    /// once). Only pauses no longer than this are waited out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub cache_hold: Option<String>,
}

/// Availability-controller settings; decimal values are strings so the spec has no floats.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("(has(self.flapReuse) ? double(self.flapReuse) : 0.5) < (has(self.flapSuppress) ? double(self.flapSuppress) : 1.5)").message("flapReuse must be below flapSuppress (defaults 0.5 and 1.5)"),
)]
pub struct AvailabilitySpec {
    /// Controller interval (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub interval: Option<String>,
    /// Error rate the controller steers towards, as a fraction (default `"0.005"`, i.e. 0.5 %).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub target_error_rate: Option<String>,
    /// Proportional gain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub kp: Option<String>,
    /// Integral gain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub ki: Option<String>,
    /// Derivative gain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub kd: Option<String>,
    /// Flap damping (after BGP route flap damping, RFC 2439): half-life of the relapse penalty
    /// (default 10 intervals, `5m` at the default interval; `0s` turns flap damping off). A relapse is a window that fails outright
    /// after the provider had served again since its previous failure; each adds 1 to the
    /// penalty, which halves every half-life. The provider's `status.flapPenalty` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub flap_half_life: Option<String>,
    /// Flap damping: penalty from which the clean-window recovery ramp is held at its first step
    /// (default `"1.5"`: a second relapse within one half-life).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub flap_suppress: Option<String>,
    /// Flap damping: penalty below which a held ramp is released (default `"0.5"`); must be
    /// below `flapSuppress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DECIMAL_PATTERN))]
    pub flap_reuse: Option<String>,
}

/// The default availability-controller interval (DESIGN §4.1).
pub const DEFAULT_AVAILABILITY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

impl AvailabilitySpec {
    /// The controller interval: `interval`, or [`DEFAULT_AVAILABILITY_INTERVAL`].
    pub fn interval(&self) -> std::time::Duration {
        crate::duration::or(self.interval.as_deref(), DEFAULT_AVAILABILITY_INTERVAL)
    }

    /// The controller settings this spec asks for, [`ControllerConfig::default`] for what it
    /// leaves out (the operator and the standalone router both build their controllers from
    /// this). The target error rate is clamped into `[1e-6, 1]`; `flapHalfLife` is converted
    /// into intervals of [`Self::interval`]. Values that do not parse (the schema's patterns
    /// refuse them before they get here) fall back to the defaults.
    pub fn controller_config(&self) -> ControllerConfig {
        fn decimal(text: Option<&str>, default: f64) -> f64 {
            text.and_then(|t| t.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .unwrap_or(default)
        }
        let mut cfg = ControllerConfig::default();
        cfg.target_error_rate =
            decimal(self.target_error_rate.as_deref(), cfg.target_error_rate).clamp(1e-6, 1.0);
        cfg.kp = decimal(self.kp.as_deref(), cfg.kp);
        cfg.ki = decimal(self.ki.as_deref(), cfg.ki);
        cfg.kd = decimal(self.kd.as_deref(), cfg.kd);
        if let Some(half_life) = self
            .flap_half_life
            .as_deref()
            .and_then(crate::duration::parse)
        {
            let interval = self.interval().as_secs_f64();
            cfg.flap_half_life = if interval > 0.0 {
                half_life.as_secs_f64() / interval
            } else {
                0.0
            };
        }
        cfg.flap_suppress = decimal(self.flap_suppress.as_deref(), cfg.flap_suppress);
        cfg.flap_reuse = decimal(self.flap_reuse.as_deref(), cfg.flap_reuse);
        cfg
    }
}

/// Error classes a request may fail over on (DESIGN §4.4).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FallbackErrorClass {
    /// 429 rate limit.
    Capacity,
    /// 503, 529.
    Overload,
    /// Connection failures and timeouts.
    Timeout,
    /// 500, 502, 504.
    Server,
    /// 401/403 on our credentials.
    Auth,
    /// Long-term exhaustion on that provider (quota, billing, daily cap).
    Policy,
}

/// Fallback rules.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct FallbackSpec {
    /// Error classes that move a request down its chain (default: all provider-side classes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on: Vec<FallbackErrorClass>,
    /// Attempts per client request across providers, the first included (default 3). A
    /// provider's rate-limit answer (429) does not use one up (at most 4 such per request): the
    /// provider is full for now, and the request may wait for room (at most 16 such per
    /// request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub max_attempts: Option<u32>,
    /// Retries on the same provider after its Retry-After, before moving on (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub same_provider_retries: Option<u32>,
    /// Spill-over to lower-priority providers per second, per router (token bucket rate);
    /// unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub throttle_per_second: Option<u32>,
    /// Burst of the fallback throttle (default: one second's worth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub throttle_burst: Option<u32>,
    /// Time allowed from sending to the first real content before failing over (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub first_token_timeout: Option<String>,
    /// When every provider of the policy is paused (Retry-After, overload cooldown) or has its
    /// circuit open, how long after arrival a request may wait for the earliest to come back
    /// (default `30s`, chosen by the simulator's sweep in docs/simulation.md; `0s` answers 429
    /// at once with that provider's Retry-After). Bounded by the request deadline. A request
    /// that met a full provider (a 429, or a skip of a provider paused by one) waits for room
    /// until its deadline instead, since room comes back with time; `0s` turns that off too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub pause_wait: Option<String>,
}

/// Observed state of a RoutingPolicy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoutingPolicyStatus {
    /// Per provider, in priority order: availability and priority-cascade weight.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["name".into()]))]
    pub providers: Vec<ProviderWeight>,
    /// When the weights were computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Standard conditions (`Ready`, `Degraded`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Availability and weight of one provider under a policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderWeight {
    /// LLMProvider name.
    pub name: String,
    /// The provider's availability in [0, 1].
    pub availability: f64,
    /// Share of new projects whose chain starts at this provider, in [0, 1]; weights sum to 1.
    pub weight: f64,
    /// Whether the provider may serve this policy at all (region allow-list, model served).
    pub eligible: bool,
    /// Why it is ineligible, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> AvailabilitySpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn controller_config_takes_the_spec_and_defaults_the_rest() {
        let d = ControllerConfig::default();
        assert_eq!(AvailabilitySpec::default().controller_config(), d);
        let c = spec(serde_json::json!({
            "interval": "10s", "targetErrorRate": "0.02", "kp": "0.1",
            "flapHalfLife": "1m", "flapSuppress": "3", "flapReuse": "1",
        }))
        .controller_config();
        // The half-life is counted in the policy's intervals: 60 s / 10 s.
        assert_eq!(c.flap_half_life, 6.0);
        assert_eq!((c.flap_suppress, c.flap_reuse), (3.0, 1.0));
        assert_eq!((c.target_error_rate, c.kp, c.ki), (0.02, 0.1, d.ki));
        // 5m at the default 30 s interval is the default of 10 intervals; 0s turns damping off.
        let at_default = spec(serde_json::json!({"flapHalfLife": "5m"})).controller_config();
        assert_eq!(at_default.flap_half_life, d.flap_half_life);
        let off = spec(serde_json::json!({"flapHalfLife": "0s"})).controller_config();
        assert_eq!(off.flap_half_life, 0.0);
        let clamped = spec(serde_json::json!({"targetErrorRate": "7"})).controller_config();
        assert_eq!(clamped.target_error_rate, 1.0);
    }
}
