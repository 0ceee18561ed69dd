//! Property tests for the balancing half of switchyard-core: weights, chains, the availability
//! controller and p2c (DESIGN §4.1–§4.3, §4.6).

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_core::availability::{AvailabilityController, ControllerConfig, WindowCounts};
use switchyard_core::chain::{ChainPins, sticky_chain};
use switchyard_core::p2c::{P2c, P2cConfig, ScoringMode};
use switchyard_core::time::Instant;
use switchyard_core::weights::cascade_weights;

/// Any f64 a broken status or config could produce, biased toward the interesting range.
fn any_availability() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => 0.0..=1.0f64,
        1 => Just(0.0),
        1 => Just(1.0),
        1 => prop::num::f64::ANY,
    ]
}

fn provider_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("provider-{i}")).collect()
}

/// Fraction of `keys` whose first choice differs between two weight vectors.
fn moved_share(keys: &[String], names: &[&str], before: &[f64], after: &[f64]) -> f64 {
    let moved = keys
        .iter()
        .filter(|k| sticky_chain(k, names, before)[0] != sticky_chain(k, names, after)[0])
        .count();
    moved as f64 / keys.len() as f64
}

proptest! {
    #[test]
    fn cascade_weights_any_input_in_unit_range_summing_to_one(
        a in prop::collection::vec(any_availability(), 1..16)
    ) {
        let w = cascade_weights(&a);
        prop_assert_eq!(w.len(), a.len());
        for &x in &w {
            prop_assert!((0.0..=1.0).contains(&x), "{:?} -> {:?}", a, w);
        }
        let sum: f64 = w.iter().sum();
        prop_assert!((sum - 1.0).abs() <= 1e-9, "sum {} for {:?}", sum, a);
    }

    #[test]
    fn sticky_chain_is_deterministic_permutation(
        key in ".{0,40}",
        weights in prop::collection::vec(prop_oneof![3 => 0.0..1.0f64, 1 => Just(0.0)], 0..12),
    ) {
        let names = provider_names(weights.len());
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let chain = sticky_chain(&key, &names, &weights);
        let mut sorted = chain.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..names.len()).collect::<Vec<_>>());
        prop_assert_eq!(&chain, &sticky_chain(&key, &names, &weights));
        // Zero-weight providers form the tail, in configured order.
        let zeros: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] <= 0.0).collect();
        prop_assert_eq!(&chain[chain.len() - zeros.len()..], &zeros[..]);
    }

    #[test]
    fn controller_any_window_sequence_stays_in_unit_range(
        start in any_availability(),
        windows in prop::collection::vec(
            (prop_oneof![0..1_000u64, any::<u64>()], prop_oneof![0..50u64, any::<u64>()]),
            1..200,
        ),
        kp in 0.0..2.0f64, ki in 0.0..2.0f64, kd in 0.0..2.0f64,
    ) {
        for cfg in [ControllerConfig::default(), ControllerConfig { kp, ki, kd, ..ControllerConfig::default() }] {
            let mut c = AvailabilityController::with_availability(cfg, start);
            prop_assert!((0.0..=1.0).contains(&c.availability()));
            for &(successes, provider_errors) in &windows {
                let r = c.step(WindowCounts { successes, provider_errors });
                prop_assert!((0.0..=1.0).contains(&r.availability), "{:?}", r);
                prop_assert!((-1.0..=1.0).contains(&r.error_signal), "{:?}", r);
            }
        }
    }

    #[test]
    fn p2c_pair_distinct_and_eligible(
        n in 1usize..16,
        mask in any::<u16>(),
        seed in any::<u64>(),
        history in prop::collection::vec((0usize..16, 0u64..5_000, any::<bool>(), any::<bool>()), 0..60),
        reliability in any::<bool>(),
    ) {
        let mode = if reliability { ScoringMode::ReliabilityAndLoad } else { ScoringMode::Latency };
        let mut p = P2c::new(n, P2cConfig { mode, ..P2cConfig::default() });
        for (t, &(i, ms, ok, start)) in history.iter().enumerate() {
            let now = Instant::from_millis(t as u64 * 10);
            if start {
                p.on_start(i, now);
            } else {
                p.on_finish(i, now, std::time::Duration::from_millis(ms), ok);
            }
        }
        let eligible: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let now = Instant::from_millis(1_000);
        for _ in 0..20 {
            match p.pick_pair(&eligible, &mut rng) {
                Some((a, b)) => {
                    prop_assert_ne!(a, b);
                    prop_assert!(eligible.contains(&a) && eligible.contains(&b));
                }
                None => prop_assert!(eligible.len() < 2),
            }
            match p.pick(&eligible, now, &mut rng) {
                Some(i) => prop_assert!(eligible.contains(&i)),
                None => prop_assert!(eligible.is_empty()),
            }
        }
    }

    #[test]
    fn chain_pins_never_exceed_capacity(
        cap in 1usize..8,
        ops in prop::collection::vec((0u8..20, 0u64..1_000), 1..100),
    ) {
        let mut pins = ChainPins::new(cap, std::time::Duration::from_secs(60));
        let names = ["a", "b", "c"];
        for (k, t) in ops {
            let chain = pins.chain(&format!("k{k}"), &names, &[0.5, 0.3, 0.2], Instant::from_millis(t * 100));
            prop_assert_eq!(chain.len(), 3);
            prop_assert!(pins.len() <= cap);
        }
    }
}

proptest! {
    // 20 000 chains per case: fewer cases keep the suite quick.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn weight_change_moves_only_its_share_of_first_choices(
        raw in prop::collection::vec(0.05..1.0f64, 2..6),
        which in any::<prop::sample::Index>(),
        delta in -0.2..0.2f64,
    ) {
        let names = provider_names(raw.len());
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let sum: f64 = raw.iter().sum();
        let before: Vec<f64> = raw.iter().map(|w| w / sum).collect();
        let j = which.index(before.len());
        let mut after = before.clone();
        after[j] = (after[j] + delta).max(0.01);
        // Share of first choices that must change: the total-variation distance between the
        // normalised weight vectors (for one weight moving, exactly |Δ share of j|).
        let total: f64 = after.iter().sum();
        let tv = 0.5 * before.iter().zip(&after).map(|(b, a)| (b - a / total).abs()).sum::<f64>();
        let keys: Vec<String> = (0..10_000).map(|i| format!("project-{i}")).collect();
        let moved = moved_share(&keys, &names, &before, &after);
        // Binomial sampling slack over 10 000 keys (4 sd) plus a small absolute margin.
        let slack = 4.0 * (tv * (1.0 - tv) / 10_000.0).sqrt() + 0.003;
        prop_assert!(moved <= tv + slack, "moved {} vs share {} (+{})", moved, tv, slack);
        // Rendezvous moves exactly that share in expectation, not less.
        prop_assert!(moved >= tv - slack, "moved {} vs share {} (-{})", moved, tv, slack);
    }
}
