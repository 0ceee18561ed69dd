//! The wanted status of each object, and whether it differs from the stored one.
//!
//! Read → validate → **compute** → apply: pure functions from an object, its
//! [`crate::validate`] verdict and the control loop's availability figures to the CRD status
//! shapes of `switchyard-api`. The shapes and meanings are those of the standalone router's
//! `GET /status` (`crates/router/src/status.rs`), so `kubectl get` in a cluster and
//! `switchyard status` on a laptop read alike:
//!
//! - **LLMProvider**: `availability` (PID controller, DESIGN §4.1; 1 until the first window),
//!   `lastWindow` (successes, provider-side errors, score), `Ready` (valid, references and
//!   credentials resolve: `Reconciled`; else the first problem's reason), `Degraded`
//!   (availability below [`DEGRADED_BELOW`]: `LowAvailability`, else `Recovered`).
//! - **RoutingPolicy**: `providers[]` in list order with availability, cascade weight
//!   (DESIGN §4.2, tiered by `priority` and `weight` when the policy sets them, the same
//!   [`route_weights`] the router uses; ineligible providers at 0) and eligibility; `Ready` is `False` when a
//!   reference does not resolve or no provider is eligible, and the weights are still computed
//!   over the eligible providers (the router keeps routing to them); `Degraded` when the best
//!   eligible provider is below the threshold.
//! - **TenantQuota**: `Ready` only (usage figures belong to the routers).
//!
//! Every condition and the top level carry `observedGeneration`. `lastTransitionTime` moves
//! only when a condition's status flips; `lastUpdateTime` is the time of the control tick
//! that computed the figures. [`needs_write`] compares with every timestamp removed, so a
//! tick that changes nothing but time writes nothing (STYLE pattern 3).
//!
//! Figures are rounded to 4 decimals ([`round`]): status is for people and for the routers'
//! weights, and a 1e-12 wobble must not cost an API write every interval.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use serde::Serialize;
use switchyard_api::common::condition::{self, DEGRADED_BELOW};
use switchyard_api::common::reason;
use switchyard_api::policy::{ProviderWeight, RoutingPolicyStatus};
use switchyard_api::provider::{LLMProviderStatus, WindowStatus};
use switchyard_api::tenant::TenantQuotaStatus;
use switchyard_api::{LLMProvider, RoutingPolicy, TenantQuota};
use switchyard_core::availability::FlapState;
use switchyard_core::weights::{Tiers, route_weights};

use crate::validate::{Eligibility, Problem};

/// Availability figures of one provider from the control loop.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderFigures {
    /// Availability in [0, 1].
    pub availability: f64,
    /// The last completed window, once one completed.
    pub window: Option<WindowStatus>,
    /// Flap damping: the relapse penalty and whether it holds the recovery ramp.
    pub flap: FlapState,
    /// When the control tick that produced these figures ran.
    pub computed_at: Option<DateTime<Utc>>,
    /// How far every router replica was counted for this window (`status.counted`).
    pub counted: Vec<switchyard_api::provider::ReplicaCounted>,
}

/// A wall-clock time as a Kubernetes `Time` (whole milliseconds, as the router writes it).
pub use switchyard_api::common::k8s_time as time;

/// Rounds a figure to 4 decimals (see the module docs); NaN becomes 0.
pub fn round(x: f64) -> f64 {
    if x.is_finite() {
        (x * 10_000.0).round() / 10_000.0
    } else {
        0.0
    }
}

/// One condition, keeping `lastTransitionTime` from `current` unless the status flips.
pub fn condition(
    current: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let since = current
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| time(now), |c| c.last_transition_time.clone());
    switchyard_api::common::new_condition(
        type_,
        status == "True",
        reason,
        message,
        generation,
        since,
    )
}

fn ready(
    current: &[Condition],
    problems: &[Problem],
    ok_message: String,
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> Condition {
    match problems.first() {
        None => condition(
            current,
            condition::READY,
            true,
            reason::RECONCILED,
            ok_message,
            generation,
            now,
        ),
        Some(first) => condition(
            current,
            condition::READY,
            false,
            first.reason,
            problems
                .iter()
                .map(Problem::describe)
                .collect::<Vec<_>>()
                .join("; "),
            generation,
            now,
        ),
    }
}

fn degraded(
    current: &[Condition],
    availability: f64,
    message: String,
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> Condition {
    let low = availability < DEGRADED_BELOW;
    condition(
        current,
        condition::DEGRADED,
        low,
        if low {
            reason::LOW_AVAILABILITY
        } else {
            reason::RECOVERED
        },
        message,
        generation,
        now,
    )
}

/// The availability a provider is shown with: the control loop's figure, else the one in its
/// stored status (written by the previous leader), else 1 (trusted until it fails).
pub fn availability_of(p: &LLMProvider, figures: Option<&ProviderFigures>) -> f64 {
    figures
        .map(|f| f.availability)
        .or_else(|| p.status.as_ref().and_then(|s| s.availability))
        .unwrap_or(1.0)
}

/// The wanted status of an LLMProvider.
pub fn provider_status(
    p: &LLMProvider,
    problems: &[Problem],
    figures: Option<&ProviderFigures>,
    now: DateTime<Utc>,
) -> LLMProviderStatus {
    let current = p.status.clone().unwrap_or_default();
    let generation = p.metadata.generation;
    let availability = round(availability_of(p, figures));
    let (last_window, last_update_time, counted, flap) = match figures {
        Some(f) if f.window.is_some() => (
            f.window.clone().map(|w| WindowStatus {
                score: round(w.score),
                ..w
            }),
            f.computed_at.map(time),
            f.counted.clone(),
            Some(f.flap),
        ),
        _ => (
            current.last_window.clone(),
            current.last_update_time.clone(),
            current.counted.clone(),
            None,
        ),
    };
    let conditions = vec![
        ready(
            &current.conditions,
            problems,
            "serving".to_owned(),
            generation,
            now,
        ),
        degraded(
            &current.conditions,
            availability,
            format!("availability {availability:.3}"),
            generation,
            now,
        ),
    ];
    let mut status = LLMProviderStatus {
        availability: Some(availability),
        last_window,
        flap_penalty: current.flap_penalty,
        flap_suppressed: current.flap_suppressed,
        health: current.health,
        last_update_time,
        conditions,
        observed_generation: generation,
        counted,
    };
    if let Some(flap) = flap {
        status.set_flap(flap);
    }
    status
}

/// The wanted status of a RoutingPolicy.
///
/// `entries` are the policy's providers with their eligibility ([`crate::validate`]);
/// `availability(key)` gives a provider's availability by `namespace/name`.
pub fn policy_status(
    policy: &RoutingPolicy,
    problems: &[Problem],
    entries: &[Eligibility],
    availability: impl Fn(&str) -> f64,
    computed_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> RoutingPolicyStatus {
    let current = policy.status.clone().unwrap_or_default();
    let generation = policy.metadata.generation;
    let availabilities: Vec<f64> = entries
        .iter()
        .map(|e| {
            if e.eligible {
                round(availability(&e.key))
            } else {
                0.0
            }
        })
        .collect();
    // Tiers over the listed entries, by name (the entries are the policy's providers in list
    // order); invalid tiers are refused by the CRD's CEL rules and then fall back to the list
    // cascade here, with the verdict's problem on `Ready`.
    let tier_field = |name: &str| {
        policy
            .spec
            .providers
            .iter()
            .find(|p| p.name == name)
            .map_or((None, None), |p| (p.priority, p.weight))
    };
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let (priority, weight): (Vec<_>, Vec<_>) = entries.iter().map(|e| tier_field(&e.name)).unzip();
    let tiers = Tiers::from_spec(&names, &priority, &weight).ok().flatten();
    let mut weights = route_weights(&availabilities, tiers.as_ref());
    // Ineligible providers never take traffic, even when every eligible one is at zero and
    // the cascade falls back to equal weights (same rule as the router).
    for (w, e) in weights.iter_mut().zip(entries) {
        if !e.eligible {
            *w = 0.0;
        }
    }
    let providers: Vec<ProviderWeight> = entries
        .iter()
        .zip(&weights)
        .map(|(e, w)| ProviderWeight {
            name: e.name.clone(),
            availability: round(availability(&e.key)),
            weight: round(*w),
            eligible: e.eligible,
            reason: e.reason.clone(),
        })
        .collect();
    let usable = providers.iter().filter(|p| p.eligible).count();
    let no_provider;
    let problems = if problems.is_empty() && usable == 0 {
        no_provider = [Problem {
            reason: reason::INVALID_SPEC,
            field: Some("spec.providers".to_owned()),
            message: "no eligible provider".to_owned(),
        }];
        &no_provider[..]
    } else {
        problems
    };
    let best = providers
        .iter()
        .filter(|p| p.eligible)
        .map(|p| p.availability)
        .fold(0.0, f64::max);
    let conditions = vec![
        ready(
            &current.conditions,
            problems,
            format!("{usable} of {} providers eligible", providers.len()),
            generation,
            now,
        ),
        degraded(
            &current.conditions,
            best,
            format!("best provider availability {best:.3}"),
            generation,
            now,
        ),
    ];
    RoutingPolicyStatus {
        providers,
        last_update_time: computed_at.map(time).or(current.last_update_time),
        conditions,
        observed_generation: generation,
    }
}

/// The wanted status of a TenantQuota: `Ready` and `observedGeneration`; the usage figures
/// of the stored status are kept as they are (the operator does not own them).
pub fn tenant_status(
    t: &TenantQuota,
    problems: &[Problem],
    now: DateTime<Utc>,
) -> TenantQuotaStatus {
    let current = t.status.clone().unwrap_or_default();
    let generation = t.metadata.generation;
    let keys = t.spec.api_keys.len();
    let ready = ready(
        &current.conditions,
        problems,
        format!("{keys} API key(s) resolved"),
        generation,
        now,
    );
    TenantQuotaStatus {
        conditions: vec![ready],
        observed_generation: generation,
        ..current
    }
}

/// Keys whose values are timestamps; [`needs_write`] ignores them.
const TIMESTAMP_KEYS: [&str; 3] = ["lastTransitionTime", "lastUpdateTime", "lastProbeTime"];

/// Removes every timestamp key, recursively (what [`needs_write`] compares without).
pub fn strip_timestamps(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for key in TIMESTAMP_KEYS {
                map.remove(key);
            }
            for child in map.values_mut() {
                strip_timestamps(child);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_timestamps),
        _ => {}
    }
}

/// Whether `wanted` differs from `current` in anything but timestamps (no current status
/// always needs a write).
pub fn needs_write<S: Serialize>(current: Option<&S>, wanted: &S) -> bool {
    let Some(current) = current else { return true };
    let (Ok(mut a), Ok(mut b)) = (serde_json::to_value(current), serde_json::to_value(wanted))
    else {
        return true;
    };
    strip_timestamps(&mut a);
    strip_timestamps(&mut b);
    a != b
}

/// The status of `Degraded` in a condition list, if present.
pub fn degraded_flag(conditions: &[Condition]) -> Option<bool> {
    conditions
        .iter()
        .find(|c| c.type_ == condition::DEGRADED)
        .map(|c| c.status == "True")
}

/// `namespace/name` of an object (namespace `default` when unset).
pub fn key_of<K: kube::Resource>(o: &K) -> String {
    format!(
        "{}/{}",
        o.namespace().unwrap_or_else(|| "default".to_owned()),
        o.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap() + chrono::Duration::seconds(s)
    }

    fn policy(providers: &[&str]) -> RoutingPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "RoutingPolicy",
            "metadata": {"name": "r", "namespace": "ns", "generation": 4},
            "spec": {"model": "m", "providers": providers.iter().map(|p| serde_json::json!({"name": p})).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    fn entry(name: &str, eligible: bool) -> Eligibility {
        Eligibility {
            name: name.into(),
            key: format!("ns/{name}"),
            eligible,
            reason: (!eligible).then(|| "does not serve model \"m\"".to_owned()),
        }
    }

    #[test]
    fn condition_same_status_keeps_transition_time_and_flip_moves_it() {
        let first = condition(
            &[],
            "Ready",
            true,
            "Reconciled",
            "ok".into(),
            Some(1),
            at(0),
        );
        let again = condition(
            std::slice::from_ref(&first),
            "Ready",
            true,
            "Reconciled",
            "still ok".into(),
            Some(2),
            at(60),
        );
        assert_eq!(again.last_transition_time, time(at(0)));
        assert_eq!(again.observed_generation, Some(2));
        let flipped = condition(
            &[again],
            "Ready",
            false,
            "InvalidSpec",
            "x".into(),
            Some(2),
            at(90),
        );
        assert_eq!(flipped.last_transition_time, time(at(90)));
    }

    #[test]
    fn needs_write_ignores_timestamps_but_not_figures() {
        let p = policy(&["a"]);
        let entries = [entry("a", true)];
        let one = policy_status(&p, &[], &entries, |_| 0.8, Some(at(0)), at(0));
        let later = policy_status(&p, &[], &entries, |_| 0.8, Some(at(30)), at(30));
        assert!(!needs_write(Some(&one), &later));
        let moved = policy_status(&p, &[], &entries, |_| 0.7, Some(at(30)), at(30));
        assert!(needs_write(Some(&one), &moved));
        assert!(needs_write(None, &one));
    }

    #[test]
    fn policy_status_ineligible_provider_gets_zero_weight_and_rest_sums_to_one() {
        let p = policy(&["a", "b", "c"]);
        let entries = [entry("a", true), entry("b", false), entry("c", true)];
        let s = policy_status(
            &p,
            &[],
            &entries,
            |k| if k == "ns/a" { 0.6 } else { 1.0 },
            None,
            at(0),
        );
        let weights: Vec<f64> = s.providers.iter().map(|p| p.weight).collect();
        assert_eq!(weights, [0.6, 0.0, 0.4]);
        assert_eq!(s.providers[1].availability, 1.0);
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(s.conditions[0].message, "2 of 3 providers eligible");
    }

    /// The router's route weights for the same figures (`Live::compute_weights`, the same
    /// `route_weights`), so `kubectl get` and the routers agree on a tiered policy.
    #[test]
    fn policy_status_tiered_weights_split_tier_by_weight_times_availability() {
        let p: RoutingPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "RoutingPolicy",
            "metadata": {"name": "r", "namespace": "ns", "generation": 4},
            "spec": {"model": "m", "providers": [
                {"name": "c", "priority": 1},
                {"name": "b", "priority": 0, "weight": 30},
                {"name": "a", "priority": 0, "weight": 70}]},
        }))
        .unwrap();
        let entries = [entry("c", true), entry("b", true), entry("a", true)];
        let avail = |k: &str| match k {
            "ns/a" => 0.5,
            "ns/b" => 0.3,
            _ => 1.0,
        };
        let s = policy_status(&p, &[], &entries, avail, None, at(0));
        let weights: Vec<f64> = s.providers.iter().map(|p| p.weight).collect();
        // Tier 0 takes 0.5 + 0.3 = 0.8 split 70·0.5 : 30·0.3; tier 1 the remaining 0.2.
        assert_eq!(
            weights,
            [0.2, round(0.8 * 9.0 / 44.0), round(0.8 * 35.0 / 44.0)]
        );
        assert_eq!(weights, [0.2, 0.1636, 0.6364]);
    }

    #[test]
    fn policy_status_no_eligible_provider_is_not_ready() {
        let p = policy(&["a"]);
        let s = policy_status(&p, &[], &[entry("a", false)], |_| 1.0, None, at(0));
        assert_eq!(s.conditions[0].status, "False");
        assert_eq!(s.conditions[0].reason, reason::INVALID_SPEC);
        assert!(s.conditions[0].message.contains("no eligible provider"));
        assert_eq!(s.providers[0].weight, 0.0);
        // Its best eligible availability is 0: degraded.
        assert_eq!(s.conditions[1].status, "True");
    }

    #[test]
    fn round_keeps_four_decimals_and_zeroes_nan() {
        assert_eq!(round(0.123_456), 0.1235);
        assert_eq!(round(f64::NAN), 0.0);
    }
}
