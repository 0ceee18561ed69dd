//! Priority-cascade weights (DESIGN §4.2).
//!
//! Input: the providers of one RoutingPolicy in priority order with their availabilities
//! `a1..an ∈ [0,1]` (from [`crate::availability`]). Output: one weight per provider, each in
//! `[0,1]`, summing to 1, used as the sampling weights of the sticky chains ([`crate::chain`]).
//!
//! ```text
//! w1 = a1
//! wi = min(ai, 1 − (w1 + … + w(i−1)))
//! if Σw < 1:  wi ← wi / Σw          (scale up proportionally)
//! if Σa = 0:  wi = 1/n              (keep traffic flowing; this creates no capacity)
//! ```
//!
//! Higher-priority providers are filled first; a lower one becomes a first choice only for the
//! share the providers above it cannot take. Source: the sticky-chain article (seed 000).
//!
//! Alternatives rejected: plain normalisation `ai / Σa` ignores priority (a healthy preferred
//! provider would share traffic with every healthy backup); strict ordered fallback (all traffic to
//! the first provider until it fails) spreads a project over two providers as soon as the first one
//! rate-limits part of its traffic, which is the prompt-cache case the cascade exists to avoid.

/// Clamps one availability reading into `[0,1]`; NaN and negatives count as 0 (no capacity is
/// assumed from a broken reading), values above 1 as 1.
fn sanitise(a: f64) -> f64 {
    if a.is_nan() || a <= 0.0 {
        0.0
    } else if a >= 1.0 {
        1.0
    } else {
        a
    }
}

/// Priority-cascade weights for providers given in priority order.
///
/// `availabilities[i]` is provider `i`'s availability; NaN or negative values are treated as 0 and
/// values above 1 as 1. Returns a vector of the same length whose entries are in `[0,1]` and sum
/// to 1 (up to rounding), or an empty vector for empty input. When every availability is 0 the
/// weights are equal. See the module docs for the formula.
pub fn cascade_weights(availabilities: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; availabilities.len()];
    cascade_weights_into(availabilities, &mut out);
    out
}

/// Allocation-free form of [`cascade_weights`]: writes the weights into `out`.
///
/// Only the first `min(availabilities.len(), out.len())` entries are computed and written; callers
/// pass slices of equal length.
pub fn cascade_weights_into(availabilities: &[f64], out: &mut [f64]) {
    let n = availabilities.len().min(out.len());
    let (availabilities, out) = (&availabilities[..n], &mut out[..n]);
    if n == 0 {
        return;
    }
    let mut assigned = 0.0_f64;
    for (w, &a) in out.iter_mut().zip(availabilities) {
        let room = (1.0 - assigned).max(0.0);
        *w = sanitise(a).min(room);
        assigned += *w;
    }
    if assigned <= 0.0 {
        let equal = 1.0 / n as f64;
        out.iter_mut().for_each(|w| *w = equal);
        return;
    }
    // Dividing each weight (rather than multiplying by 1/Σ) cannot overflow even when Σ is tiny;
    // it also cleans up the sum when rounding made it drift slightly above 1.
    out.iter_mut().for_each(|w| *w = (*w / assigned).min(1.0));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    #[test]
    fn cascade_weights_first_provider_full_takes_everything() {
        assert!(close(&cascade_weights(&[1.0, 1.0, 1.0]), &[1.0, 0.0, 0.0]));
    }

    #[test]
    fn cascade_weights_first_saturated_spills_to_second() {
        // w1 = 0.6, w2 = min(0.7, 0.4) = 0.4, w3 = 0.
        assert!(close(&cascade_weights(&[0.6, 0.7, 1.0]), &[0.6, 0.4, 0.0]));
    }

    #[test]
    fn cascade_weights_sum_below_one_scales_up() {
        // w = [0.2, 0.3] sums to 0.5 → scaled by 2.
        assert!(close(&cascade_weights(&[0.2, 0.3]), &[0.4, 0.6]));
    }

    #[test]
    fn cascade_weights_all_zero_equal() {
        assert!(close(&cascade_weights(&[0.0, 0.0, 0.0, 0.0]), &[0.25; 4]));
    }

    #[test]
    fn cascade_weights_invalid_inputs_clamped() {
        // NaN → 0, −1 → 0, 7 → 1: so the third provider takes everything.
        assert!(close(
            &cascade_weights(&[f64::NAN, -1.0, 7.0]),
            &[0.0, 0.0, 1.0]
        ));
        assert!(close(&cascade_weights(&[f64::INFINITY, 0.5]), &[1.0, 0.0]));
        assert!(close(&cascade_weights(&[f64::NEG_INFINITY]), &[1.0]));
    }

    #[test]
    fn cascade_weights_empty_is_empty() {
        assert!(cascade_weights(&[]).is_empty());
    }
}
