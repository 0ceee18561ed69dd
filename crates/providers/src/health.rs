//! The health board: per provider × modality, the probe state machine of
//! [`switchyard_core::health`] and when it was last probed, shared by the probe loop
//! ([`crate::probe::run`]), the candidate filter and `/status`.
//!
//! Keyed by the provider's `namespace/name` (like the rest of the state that outlives
//! configuration reloads, the router's `state` module), not by its index in the routing table: indices
//! move on every reload, and a probe result that lands just after a reload must not be
//! credited to another provider. Reads take a shared lock held for one hash lookup; writes
//! happen once per probe.
//!
//! Fail-open throughout (DESIGN §4.8, seed 003): a provider or modality without an entry
//! admits, a stale entry admits, and a poisoned lock is recovered rather than propagated.

use std::collections::{BTreeMap, HashMap};
use std::sync::{PoisonError, RwLock};

use chrono::{DateTime, Utc};
use switchyard_api::provider::{
    HealthState as ApiHealthState, Modality, ModalityHealth, health_reason,
};
use switchyard_core::health::{HealthConfig, HealthState, HealthTracker, ProbeOutcome};
use switchyard_core::time::Instant;

/// A Kubernetes `Time` from a UTC timestamp (millisecond precision).
fn time(at: DateTime<Utc>) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_millisecond(at.timestamp_millis())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// One (provider, modality) entry.
#[derive(Debug, Clone)]
struct Slot {
    tracker: HealthTracker,
    cfg: HealthConfig,
    last_probe_wall: Option<DateTime<Utc>>,
}

/// Per provider × modality health, fed by probes, read by the request path and status.
#[derive(Debug, Default)]
pub struct HealthBoard {
    slots: RwLock<HashMap<String, BTreeMap<Modality, Slot>>>,
}

/// The API's spelling of a core verdict.
pub fn api_state(s: HealthState) -> ApiHealthState {
    match s {
        HealthState::Healthy => ApiHealthState::Healthy,
        HealthState::Degraded => ApiHealthState::Degraded,
        HealthState::Unhealthy => ApiHealthState::Unhealthy,
        HealthState::Unknown => ApiHealthState::Unknown,
    }
}

impl HealthBoard {
    /// An empty board (admits everything).
    pub fn new() -> Self {
        HealthBoard::default()
    }

    /// Records a probe of `modality` on `provider` that finished at `now` (`wall` for status),
    /// under thresholds `cfg`. Returns the state right after.
    pub fn record(
        &self,
        provider: &str,
        modality: Modality,
        cfg: &HealthConfig,
        outcome: &ProbeOutcome,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> HealthState {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let slot = slots
            .entry(provider.to_owned())
            .or_default()
            .entry(modality)
            .or_insert_with(|| Slot {
                tracker: HealthTracker::new(),
                cfg: cfg.clone(),
                last_probe_wall: None,
            });
        let before = slot.tracker.state(now, &slot.cfg);
        slot.cfg = cfg.clone();
        slot.last_probe_wall = Some(wall);
        let after = slot.tracker.record(outcome, now, cfg);
        if before != after {
            tracing::info!(provider, ?modality, from = ?before, to = ?after, detail = slot.tracker.message().unwrap_or(""), "provider health changed");
        }
        if let ProbeOutcome::ProbeRejected { status, detail } = outcome {
            tracing::warn!(provider, ?modality, ?status, detail = %detail, "health probe refused for its shape; fix the probe settings (not counted as unavailability)");
        }
        after
    }

    /// Whether requests needing `modality` may go to `provider` at `now`: false only for a
    /// fresh `Unhealthy` verdict; a missing or stale entry admits (fail-open).
    pub fn admits(&self, provider: &str, modality: Modality, now: Instant) -> bool {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots
            .get(provider)
            .and_then(|m| m.get(&modality))
            .is_none_or(|s| s.tracker.admits(now, &s.cfg))
    }

    /// [`Self::admits`] for every modality a request needs (one lock, one provider lookup).
    pub fn admits_all(&self, provider: &str, modalities: &[Modality], now: Instant) -> bool {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let Some(entries) = slots.get(provider) else {
            return true;
        };
        modalities
            .iter()
            .all(|m| entries.get(m).is_none_or(|s| s.tracker.admits(now, &s.cfg)))
    }

    /// The candidate filter of DESIGN §4.8 with fail-open at the set level: the candidates
    /// whose provider admits every modality in `modalities`, or all of `candidates` unchanged
    /// when that would leave none (probes that call every provider unhealthy are more likely
    /// wrong than every provider being down, and trying costs one failed attempt). `key` maps
    /// a candidate to its provider key.
    pub fn prefer_admitted<'k, T>(
        &self,
        candidates: Vec<T>,
        key: impl Fn(&T) -> &'k str,
        modalities: &[Modality],
        now: Instant,
    ) -> Vec<T> {
        if self.is_empty() {
            return candidates;
        }
        let admitted = |c: &T| self.admits_all(key(c), modalities, now);
        if candidates.iter().any(admitted) {
            candidates.into_iter().filter(|c| admitted(c)).collect()
        } else {
            candidates
        }
    }

    /// The state of `modality` on `provider` at `now` (`Unknown` without an entry).
    pub fn state(&self, provider: &str, modality: Modality, now: Instant) -> HealthState {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots
            .get(provider)
            .and_then(|m| m.get(&modality))
            .map_or(HealthState::Unknown, |s| s.tracker.state(now, &s.cfg))
    }

    /// The probe configuration problem of each modality of `provider` that has one
    /// (`"HTTP 400: Unknown voice 'v9'"`), in modality order.
    pub fn probe_problems(&self, provider: &str) -> Vec<(Modality, String)> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots
            .get(provider)
            .map(|m| {
                m.iter()
                    .filter_map(|(modality, s)| {
                        s.tracker.probe_problem().map(|p| (*modality, p.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `status.health[]` of `provider` at `now`, one entry per probed modality, in modality
    /// order. `reason` is one of [`health_reason`]; a probe configuration problem shows as
    /// `ProbeRejected` with the provider's message, whatever the state.
    pub fn status(&self, provider: &str, now: Instant) -> Vec<ModalityHealth> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let Some(entries) = slots.get(provider) else {
            return Vec::new();
        };
        entries
            .iter()
            .map(|(modality, s)| {
                let state = s.tracker.state(now, &s.cfg);
                let (reason, message) = if let Some(problem) = s.tracker.probe_problem() {
                    (
                        health_reason::PROBE_REJECTED,
                        Some(format!(
                            "probe configuration problem, not unavailability: {problem}"
                        )),
                    )
                } else {
                    let reason = match state {
                        HealthState::Healthy => health_reason::PROBE_SUCCEEDED,
                        HealthState::Degraded if s.tracker.consecutive_failures() == 0 => {
                            health_reason::PROBE_SLOW
                        }
                        HealthState::Degraded | HealthState::Unhealthy => {
                            health_reason::PROBE_FAILED
                        }
                        HealthState::Unknown if s.tracker.verdict_at().is_some() => {
                            health_reason::STALE
                        }
                        HealthState::Unknown => health_reason::NOT_PROBED,
                    };
                    (reason, s.tracker.message().map(str::to_owned))
                };
                ModalityHealth {
                    modality: *modality,
                    state: api_state(state),
                    last_probe_time: s.last_probe_wall.map(time),
                    message,
                    reason: Some(reason.to_owned()),
                }
            })
            .collect()
    }

    /// Keeps only the entries for which `keep(provider, modality)` holds (providers removed
    /// from the configuration, modalities no longer probed).
    pub fn retain(&self, mut keep: impl FnMut(&str, Modality) -> bool) {
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        slots.retain(|provider, entries| {
            entries.retain(|m, _| keep(provider, *m));
            !entries.is_empty()
        });
    }

    /// Whether no entry exists.
    pub fn is_empty(&self) -> bool {
        self.slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cfg() -> HealthConfig {
        HealthConfig::for_interval(Duration::from_secs(1), 2, Duration::from_millis(500))
    }

    fn fail() -> ProbeOutcome {
        ProbeOutcome::Failure {
            detail: "HTTP 500".into(),
        }
    }

    fn ok() -> ProbeOutcome {
        ProbeOutcome::Success {
            latency: Duration::from_millis(5),
        }
    }

    fn wall() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    #[test]
    fn board_empty_admits_everything() {
        let b = HealthBoard::new();
        assert!(b.admits("ns/p", Modality::Text, Instant::ZERO));
        assert!(b.admits_all("ns/p", &[Modality::Text, Modality::Image], Instant::ZERO));
        assert_eq!(
            b.state("ns/p", Modality::Text, Instant::ZERO),
            HealthState::Unknown
        );
        assert!(b.status("ns/p", Instant::ZERO).is_empty());
    }

    #[test]
    fn board_unhealthy_modality_blocks_only_itself() {
        let b = HealthBoard::new();
        let t = Instant::from_millis(100);
        b.record("ns/p", Modality::Text, &cfg(), &ok(), t, wall());
        b.record("ns/p", Modality::Transcription, &cfg(), &fail(), t, wall());
        b.record("ns/p", Modality::Transcription, &cfg(), &fail(), t, wall());
        assert!(b.admits("ns/p", Modality::Text, t));
        assert!(!b.admits("ns/p", Modality::Transcription, t));
        assert!(b.admits_all("ns/p", &[Modality::Text], t));
        assert!(!b.admits_all("ns/p", &[Modality::Text, Modality::Transcription], t));
        // Another provider is unaffected.
        assert!(b.admits("ns/q", Modality::Transcription, t));
        let s = b.status("ns/p", t);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].modality, Modality::Text);
        assert_eq!(s[0].state, ApiHealthState::Healthy);
        assert_eq!(s[1].state, ApiHealthState::Unhealthy);
        assert_eq!(s[1].reason.as_deref(), Some(health_reason::PROBE_FAILED));
        assert!(s[1].last_probe_time.is_some());
    }

    #[test]
    fn board_stale_unhealthy_admits() {
        let b = HealthBoard::new();
        let t = Instant::from_millis(0);
        b.record("ns/p", Modality::Text, &cfg(), &fail(), t, wall());
        b.record("ns/p", Modality::Text, &cfg(), &fail(), t, wall());
        assert!(!b.admits("ns/p", Modality::Text, t + Duration::from_secs(3)));
        let later = t + Duration::from_millis(3_001);
        assert!(b.admits("ns/p", Modality::Text, later));
        assert_eq!(
            b.status("ns/p", later)[0].reason.as_deref(),
            Some(health_reason::STALE)
        );
    }

    #[test]
    fn board_probe_rejected_reported_and_admits() {
        let b = HealthBoard::new();
        let t = Instant::from_millis(0);
        let rejected = ProbeOutcome::ProbeRejected {
            status: Some(400),
            detail: "Unknown voice 'v9'".into(),
        };
        for _ in 0..5 {
            b.record("ns/p", Modality::Speech, &cfg(), &rejected, t, wall());
        }
        assert!(b.admits("ns/p", Modality::Speech, t));
        let s = b.status("ns/p", t);
        assert_eq!(s[0].state, ApiHealthState::Unknown);
        assert_eq!(s[0].reason.as_deref(), Some(health_reason::PROBE_REJECTED));
        assert!(
            s[0].message
                .as_deref()
                .unwrap()
                .contains("Unknown voice 'v9'")
        );
        assert_eq!(
            b.probe_problems("ns/p"),
            vec![(Modality::Speech, "HTTP 400: Unknown voice 'v9'".to_owned())]
        );
    }

    #[test]
    fn board_prefer_admitted_filters_unhealthy_but_never_empties() {
        let b = HealthBoard::new();
        let t = Instant::ZERO;
        let keys = ["ns/a", "ns/b", "ns/c"];
        assert_eq!(
            b.prefer_admitted(keys.to_vec(), |k| k, &[Modality::Transcription], t),
            keys
        );
        for k in ["ns/a", "ns/c"] {
            b.record(k, Modality::Transcription, &cfg(), &fail(), t, wall());
            b.record(k, Modality::Transcription, &cfg(), &fail(), t, wall());
        }
        assert_eq!(
            b.prefer_admitted(keys.to_vec(), |k| k, &[Modality::Transcription], t),
            ["ns/b"]
        );
        // Text is not affected by broken transcription.
        assert_eq!(
            b.prefer_admitted(keys.to_vec(), |k| k, &[Modality::Text], t),
            keys
        );
        // Every candidate unhealthy: keep them all (fail-open at the set level).
        assert_eq!(
            b.prefer_admitted(vec!["ns/a", "ns/c"], |k| k, &[Modality::Transcription], t),
            ["ns/a", "ns/c"]
        );
    }

    #[test]
    fn board_prefer_admitted_positions_keyed_through_a_table() {
        // The shape of the dispatcher's call: candidates are positions, keys live in a table.
        let table: Vec<String> = vec!["ns/a".into(), "ns/b".into()];
        let b = HealthBoard::new();
        let t = Instant::ZERO;
        b.record("ns/a", Modality::Text, &cfg(), &fail(), t, wall());
        b.record("ns/a", Modality::Text, &cfg(), &fail(), t, wall());
        let candidates: Vec<usize> = vec![0, 1];
        let candidates =
            b.prefer_admitted(candidates, |&pos| table[pos].as_str(), &[Modality::Text], t);
        assert_eq!(candidates, [1]);
    }

    #[test]
    fn board_retain_drops_removed_providers() {
        let b = HealthBoard::new();
        let t = Instant::ZERO;
        b.record("ns/p", Modality::Text, &cfg(), &fail(), t, wall());
        b.record("ns/p", Modality::Text, &cfg(), &fail(), t, wall());
        b.retain(|p, _| p != "ns/p");
        assert!(b.is_empty());
        assert!(b.admits("ns/p", Modality::Text, t));
    }
}
