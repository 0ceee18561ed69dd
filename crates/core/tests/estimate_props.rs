//! Properties of the estimation arithmetic: the calibration never leaves its bounds, a stable
//! ratio is converged to, and image formulas are symmetric and bounded by their unknown-size
//! charge.

// Test code unwraps freely.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use switchyard_core::estimate::{
    ANTHROPIC_IMAGE_MAX_TOKENS, Calibration, ImageDetail, OPENAI_IMAGE_MAX_TOKENS, TokenPrices,
    anthropic_image_tokens, openai_image_tokens, worst_case_spend_micro_usd,
};

proptest! {
    #[test]
    fn calibration_any_settles_ratio_stays_within_bounds(
        alpha in 0.001f64..=1.0,
        lo in 0.1f64..1.0,
        hi in 1.0f64..10.0,
        settles in prop::collection::vec((0u64..1_000_000, 0u64..1_000_000, 0u64..10_000_000), 0..200),
    ) {
        let mut c = Calibration::new(alpha, lo, hi);
        for (raw, est, actual) in settles {
            c.settle(raw, est, actual);
            prop_assert!(c.ratio() >= lo && c.ratio() <= hi, "ratio {} outside [{lo}, {hi}]", c.ratio());
            let applied = c.apply(raw);
            prop_assert!(applied as f64 >= raw as f64 * lo - 1.0 && applied as f64 <= raw as f64 * hi + 1.0);
        }
    }

    #[test]
    fn calibration_stable_ratio_converges_to_it(
        ratio in 0.5f64..=2.0,
        raws in prop::collection::vec(1_000u64..100_000, 200),
    ) {
        let mut c = Calibration::default();
        for raw in raws {
            let actual = (raw as f64 * ratio).round() as u64;
            let est = c.apply(raw);
            c.settle(raw, est, actual);
        }
        // 200 settles at α = 0.1 leave 0.9^200 ≈ 7e-10 of the initial gap; rounding of
        // `actual` adds at most 0.5 / 1000.
        prop_assert!((c.ratio() - ratio).abs() < 1e-3, "ratio {} vs {ratio}", c.ratio());
        // The reserved estimate then errs by about the rounding only.
        let err = c.last_relative_error().unwrap_or(f64::MAX).abs();
        prop_assert!(err < 2e-3, "relative error {err}");
    }

    #[test]
    fn calibration_ratio_outside_bounds_converges_to_bound(
        ratio in prop_oneof![0.01f64..0.5, 2.0f64..50.0],
        n in 100usize..300,
    ) {
        let mut c = Calibration::default();
        for _ in 0..n {
            let raw = 10_000u64;
            c.settle(raw, c.apply(raw), (raw as f64 * ratio).round().max(1.0) as u64);
        }
        let bound = if ratio < 1.0 { 0.5 } else { 2.0 };
        prop_assert!((c.ratio() - bound).abs() < 1e-3);
    }

    #[test]
    fn openai_image_tokens_any_size_bounded_and_symmetric(w in 1u32..10_000, h in 1u32..10_000) {
        let t = openai_image_tokens(Some((w, h)), ImageDetail::High);
        prop_assert!((255..=OPENAI_IMAGE_MAX_TOKENS).contains(&t));
        prop_assert_eq!(openai_image_tokens(Some((w, h)), ImageDetail::Low), 85);
        prop_assert_eq!(t, openai_image_tokens(Some((h, w)), ImageDetail::High));
    }

    #[test]
    fn anthropic_image_tokens_any_size_bounded_and_symmetric(w in 1u32..10_000, h in 1u32..10_000) {
        let t = anthropic_image_tokens(Some((w, h)));
        prop_assert!((1..=ANTHROPIC_IMAGE_MAX_TOKENS).contains(&t));
        prop_assert_eq!(t, anthropic_image_tokens(Some((h, w))));
    }

    #[test]
    fn worst_case_spend_matches_exact_rational(
        input in 0u64..10_000_000, output in 0u64..10_000_000,
        pin in 0u64..100_000_000, pout in 0u64..100_000_000,
    ) {
        let spend = worst_case_spend_micro_usd(input, output, TokenPrices { input: pin, output: pout });
        let exact = u128::from(input) * u128::from(pin) + u128::from(output) * u128::from(pout);
        // Never under the exact amount, and less than one micro-USD over it.
        prop_assert!(u128::from(spend) * 1_000_000 >= exact);
        prop_assert!(u128::from(spend) * 1_000_000 < exact + 1_000_000);
    }
}
