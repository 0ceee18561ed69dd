//! The availability controllers of the control loop (DESIGN §4.1), one per LLMProvider.
//!
//! Each tick the leader feeds every provider's window counts ([`crate::outcomes`]) to its
//! [`AvailabilityController`]; weights are not stored here but derived from these figures
//! whenever a policy's status is computed ([`crate::status::policy_status`]), so a policy edit
//! gets correct weights at once instead of at the next tick.
//!
//! Settings per provider come from the first RoutingPolicy (by `namespace/name`) that lists it,
//! as in the standalone router; the interval is the shortest `spec.availability.interval` of any
//! policy (default 30 s, at least 1 s). A provider first seen by this leader resumes from the
//! availability in its stored status, so a leader change or restart does not reset every
//! provider to 1.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use switchyard_api::provider::{LLMProviderStatus, ReplicaCounted, WindowStatus};
use switchyard_api::{LLMProvider, RoutingPolicy};
use switchyard_core::availability::{AvailabilityController, ControllerConfig};

use crate::outcomes::ProviderWindow;
use crate::status::{ProviderFigures, key_of};

/// Default control interval (DESIGN §4.1).
pub const DEFAULT_INTERVAL: Duration = switchyard_api::policy::DEFAULT_AVAILABILITY_INTERVAL;
/// Shortest interval honoured, whatever a policy asks for: the tick lists EndpointSlices and
/// scrapes every replica, which should not run in a tight loop.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Controller settings of one policy (defaults for what it leaves out), as
/// [`switchyard_api::policy::AvailabilitySpec::controller_config`] builds them.
pub fn controller_config(policy: &RoutingPolicy) -> ControllerConfig {
    policy
        .spec
        .availability
        .clone()
        .unwrap_or_default()
        .controller_config()
}

/// The control interval for a set of policies (see the module docs).
pub fn interval<'a>(policies: impl IntoIterator<Item = &'a RoutingPolicy>) -> Duration {
    policies
        .into_iter()
        .map(|p| {
            p.spec
                .availability
                .as_ref()
                .map_or(DEFAULT_INTERVAL, |a| a.interval())
        })
        .min()
        .unwrap_or(DEFAULT_INTERVAL)
        .max(MIN_INTERVAL)
}

#[derive(Debug)]
struct ProviderControl {
    controller: AvailabilityController,
    figures: ProviderFigures,
}

/// Every provider's controller and last figures.
#[derive(Debug, Default)]
pub struct ControlState {
    providers: BTreeMap<String, ProviderControl>,
    last_tick: Option<DateTime<Utc>>,
}

impl ControlState {
    /// An empty state (nothing computed yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything (on losing leadership; the next term resumes from status).
    pub fn clear(&mut self) {
        self.providers.clear();
        self.last_tick = None;
    }

    /// The figures of provider `key` (`namespace/name`), once this leader computed them.
    pub fn figures(&self, key: &str) -> Option<&ProviderFigures> {
        self.providers.get(key).map(|p| &p.figures)
    }

    /// When the last tick ran.
    pub fn last_tick(&self) -> Option<DateTime<Utc>> {
        self.last_tick
    }

    /// One tick: steps the controller of every provider in `providers` with its window from
    /// `windows` (no entry = an idle window), records `counted(key)` as how far that window
    /// counted the replicas, and drops the state of providers that are gone.
    pub fn step(
        &mut self,
        providers: &[std::sync::Arc<LLMProvider>],
        policies: &[std::sync::Arc<RoutingPolicy>],
        windows: &BTreeMap<String, ProviderWindow>,
        counted: impl Fn(&str) -> Vec<ReplicaCounted>,
        now: DateTime<Utc>,
    ) {
        let mut sorted: Vec<&RoutingPolicy> = policies.iter().map(|p| &**p).collect();
        sorted.sort_by_key(|p| key_of(*p));
        let mut configs: BTreeMap<String, ControllerConfig> = BTreeMap::new();
        for policy in &sorted {
            let ns = key_of(*policy);
            let ns = ns.split_once('/').map_or("default", |(ns, _)| ns);
            for entry in &policy.spec.providers {
                configs
                    .entry(format!("{ns}/{}", entry.name))
                    .or_insert_with(|| controller_config(policy));
            }
        }
        let mut seen = Vec::with_capacity(providers.len());
        for p in providers {
            let key = key_of(&**p);
            let cfg = configs.get(&key).cloned().unwrap_or_default();
            let status = p.status.as_ref();
            let resume = status.and_then(|s| s.availability);
            let flap = status.map(LLMProviderStatus::flap).unwrap_or_default();
            let control = self.providers.entry(key.clone()).or_insert_with(|| {
                let controller = match resume {
                    Some(a) => AvailabilityController::with_availability(cfg.clone(), a),
                    None => AvailabilityController::new(cfg.clone()),
                }
                .with_flap_state(flap);
                ProviderControl {
                    figures: ProviderFigures {
                        availability: controller.availability(),
                        window: None,
                        flap,
                        computed_at: None,
                        counted: Vec::new(),
                    },
                    controller,
                }
            });
            if control.controller.config() != &cfg {
                control.controller.reconfigure(cfg);
            }
            let window = windows.get(&key).cloned().unwrap_or_default();
            let report = control
                .controller
                .step(window.counts(control.controller.config().target_error_rate));
            control.figures = ProviderFigures {
                availability: report.availability,
                window: Some(WindowStatus {
                    successes: window.successes,
                    errors: window.provider_errors,
                    score: report.score,
                }),
                flap: control.controller.flap_state(),
                computed_at: Some(now),
                counted: counted(&key),
            };
            seen.push(key);
        }
        self.providers.retain(|k, _| seen.contains(k));
        self.last_tick = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn policy(
        name: &str,
        interval: Option<&str>,
        providers: &[&str],
        target: Option<&str>,
    ) -> Arc<RoutingPolicy> {
        let mut availability = serde_json::Map::new();
        if let Some(i) = interval {
            availability.insert("interval".into(), i.into());
        }
        if let Some(t) = target {
            availability.insert("targetErrorRate".into(), t.into());
        }
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "switchyard.dev/v1alpha1", "kind": "RoutingPolicy",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"model": name, "availability": availability,
                    "providers": providers.iter().map(|p| serde_json::json!({"name": p})).collect::<Vec<_>>()},
            }))
            .unwrap(),
        )
    }

    fn provider(name: &str, availability: Option<f64>) -> Arc<LLMProvider> {
        let mut v = serde_json::json!({
            "apiVersion": "switchyard.dev/v1alpha1", "kind": "LLMProvider",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"api": "openai", "endpoint": "https://x.example.com", "models": [{"name": "m"}]},
        });
        if let Some(a) = availability {
            v["status"] = serde_json::json!({"availability": a});
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn interval_is_shortest_policy_interval_with_default_and_floor() {
        assert_eq!(interval([]), DEFAULT_INTERVAL);
        let a = policy("a", Some("45s"), &[], None);
        let b = policy("b", Some("10s"), &[], None);
        let c = policy("c", None, &[], None);
        assert_eq!(interval([&*a, &*b, &*c]), Duration::from_secs(10));
        let fast = policy("d", Some("100ms"), &[], None);
        assert_eq!(interval([&*fast]), MIN_INTERVAL);
    }

    #[test]
    fn step_resumes_from_stored_availability_and_uses_first_policy_settings() {
        let mut state = ControlState::new();
        let providers = [provider("p", Some(0.25))];
        // "a" sorts first, so its target (10 %) applies to p.
        let policies = [
            policy("b", None, &["p"], Some("0.5")),
            policy("a", None, &["p"], Some("0.1")),
        ];
        let now = chrono::DateTime::<Utc>::UNIX_EPOCH;
        state.step(&providers, &policies, &BTreeMap::new(), |_| Vec::new(), now);
        let cfg = ControllerConfig {
            target_error_rate: 0.1,
            ..ControllerConfig::default()
        };
        let mut expected = AvailabilityController::with_availability(cfg, 0.25);
        let report = expected.step(Default::default());
        let figures = state.figures("ns/p").unwrap();
        assert_eq!(figures.availability, report.availability);
        assert_eq!(figures.window.as_ref().unwrap().score, 1.0);
        assert_eq!(figures.computed_at, Some(now));
        // A provider that is gone is forgotten.
        state.step(&[], &policies, &BTreeMap::new(), |_| Vec::new(), now);
        assert!(state.figures("ns/p").is_none());
    }

    #[test]
    fn step_resumes_flap_damping_from_status_and_reports_it() {
        let mut v = serde_json::to_value(&*provider("p", Some(0.3))).unwrap();
        v["status"]["flapPenalty"] = 2.0.into();
        v["status"]["flapSuppressed"] = true.into();
        let providers = [Arc::new(serde_json::from_value::<LLMProvider>(v).unwrap())];
        let policies = [policy("a", None, &["p"], None)];
        let now = chrono::DateTime::<Utc>::UNIX_EPOCH;
        let mut state = ControlState::new();
        state.step(&providers, &policies, &BTreeMap::new(), |_| Vec::new(), now);
        let flap = state.figures("ns/p").unwrap().flap;
        let penalty = flap.penalty;
        // One idle interval at the default half-life (10 intervals) decays 2 by 2^-0.1.
        assert!((penalty - 2.0 * 0.5f64.powf(0.1)).abs() < 1e-9, "{penalty}");
        assert!(flap.suppressed);
        let status = crate::status::provider_status(&providers[0], &[], state.figures("ns/p"), now);
        assert_eq!(status.flap_penalty, Some(crate::status::round(penalty)));
        assert_eq!(status.flap_suppressed, Some(true));
    }
}
