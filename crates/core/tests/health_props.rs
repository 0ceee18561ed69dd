//! Per-modality health (DESIGN §4.8, field case 26): properties of the probe state machine
//! over arbitrary outcome sequences — fail-open, probe-config rejections never evict, and the
//! verdict depends only on the conclusive outcomes.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use proptest::prelude::*;
use switchyard_core::health::{HealthConfig, HealthState, HealthTracker, ProbeOutcome, admits};
use switchyard_core::time::Instant;

fn outcome() -> impl Strategy<Value = ProbeOutcome> {
    prop_oneof![
        (0u64..2_000).prop_map(|ms| ProbeOutcome::Success {
            latency: Duration::from_millis(ms)
        }),
        Just(ProbeOutcome::Failure {
            detail: "HTTP 503".into()
        }),
        prop::option::of(400u16..429).prop_map(|status| ProbeOutcome::ProbeRejected {
            status,
            detail: "bad probe".into()
        }),
        Just(ProbeOutcome::Throttled),
    ]
}

fn conclusive(o: &ProbeOutcome) -> bool {
    matches!(
        o,
        ProbeOutcome::Success { .. } | ProbeOutcome::Failure { .. }
    )
}

fn cfg(threshold: u32) -> HealthConfig {
    HealthConfig::for_interval(
        Duration::from_secs(10),
        threshold,
        Duration::from_millis(500),
    )
}

/// Feeds `outcomes` one second apart from t = 0; returns the tracker and the last time.
fn run(outcomes: &[ProbeOutcome], c: &HealthConfig) -> (HealthTracker, Instant) {
    let mut t = HealthTracker::new();
    let mut now = Instant::ZERO;
    for (i, o) in outcomes.iter().enumerate() {
        now = Instant::from_millis(i as u64 * 1000);
        t.record(o, now, c);
    }
    (t, now)
}

proptest! {
    /// A fresh tracker blocks exactly when its last `threshold` conclusive outcomes were all
    /// failures (and there were at least `threshold` of them).
    #[test]
    fn tracker_any_sequence_blocks_iff_last_n_conclusive_failed(
        outcomes in prop::collection::vec(outcome(), 0..40),
        threshold in 1u32..5,
    ) {
        let c = cfg(threshold);
        let (t, now) = run(&outcomes, &c);
        let tail: Vec<&ProbeOutcome> = outcomes.iter().filter(|o| conclusive(o)).collect();
        let n = threshold as usize;
        let expect_block = tail.len() >= n
            && tail[tail.len() - n..].iter().all(|o| matches!(o, ProbeOutcome::Failure { .. }))
            // The verdict is at most 40 s old here; stale_after is 30 s.
            && {
                let last = outcomes.iter().rposition(conclusive).unwrap();
                now.saturating_since(Instant::from_millis(last as u64 * 1000)) <= c.stale_after
            };
        prop_assert_eq!(!t.admits(now, &c), expect_block);
    }

    /// Probe-config rejections and 429s change nothing about the verdict: removing them from
    /// any sequence gives the same state at the same reading time.
    #[test]
    fn tracker_rejected_and_throttled_probes_never_change_the_verdict(
        outcomes in prop::collection::vec(outcome(), 1..40),
        threshold in 1u32..5,
    ) {
        let c = cfg(threshold);
        let mut with = HealthTracker::new();
        let mut without = HealthTracker::new();
        for (i, o) in outcomes.iter().enumerate() {
            let now = Instant::from_millis(i as u64 * 1000);
            with.record(o, now, &c);
            if conclusive(o) {
                without.record(o, now, &c);
            }
            prop_assert_eq!(with.state(now, &c), without.state(now, &c));
            prop_assert_eq!(with.consecutive_failures(), without.consecutive_failures());
        }
    }

    /// A sequence without a conclusive probe reads Unknown and admits, however long.
    #[test]
    fn tracker_only_inconclusive_probes_unknown_and_admits(
        outcomes in prop::collection::vec(outcome().prop_filter("inconclusive", |o| !conclusive(o)), 0..40),
    ) {
        let c = cfg(1);
        let (t, now) = run(&outcomes, &c);
        prop_assert_eq!(t.state(now, &c), HealthState::Unknown);
        prop_assert!(t.admits(now, &c));
    }

    /// Fail-open on staleness: whatever happened, once `stale_after` has passed since the last
    /// probe the tracker reads Unknown and admits.
    #[test]
    fn tracker_any_sequence_admits_once_stale(
        outcomes in prop::collection::vec(outcome(), 0..40),
        threshold in 1u32..5,
        extra_ms in 1u64..1_000_000,
    ) {
        let c = cfg(threshold);
        let (t, now) = run(&outcomes, &c);
        let later = now + c.stale_after + Duration::from_millis(extra_ms);
        prop_assert_eq!(t.state(later, &c), HealthState::Unknown);
        prop_assert!(t.admits(later, &c));
        prop_assert!(admits(Some(&t), later, &c));
    }

    /// Degraded never blocks; only Unhealthy does.
    #[test]
    fn tracker_admits_iff_not_unhealthy(
        outcomes in prop::collection::vec(outcome(), 0..40),
        threshold in 1u32..5,
    ) {
        let c = cfg(threshold);
        let (t, now) = run(&outcomes, &c);
        prop_assert_eq!(t.admits(now, &c), t.state(now, &c) != HealthState::Unhealthy);
    }

    /// Status classes: 2xx success, 429 throttled, other 4xx except 401/403/408 rejected,
    /// everything else a failure.
    #[test]
    fn outcome_from_status_partitions_codes(status in 100u16..700) {
        let o = ProbeOutcome::from_status(status, Duration::from_millis(1), "m");
        let expected = match status {
            200..=299 => "success",
            429 => "throttled",
            401 | 403 | 408 => "failure",
            400..=499 => "rejected",
            _ => "failure",
        };
        let got = match o {
            ProbeOutcome::Success { .. } => "success",
            ProbeOutcome::Throttled => "throttled",
            ProbeOutcome::Failure { .. } => "failure",
            ProbeOutcome::ProbeRejected { .. } => "rejected",
        };
        prop_assert_eq!(got, expected);
    }
}
