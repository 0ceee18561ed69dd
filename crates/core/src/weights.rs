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
//!
//! ## Tiers with static weights (issue 18 item 4)
//!
//! A RoutingPolicy may group providers into priority tiers (`providers[].priority`, lower is
//! filled first) with a static weight each (`providers[].weight`, default 1), for instance two
//! equal providers on a 70/30 contract split with a third as the fallback tier.
//! [`tiered_cascade_weights`] runs the same cascade over tiers instead of single providers:
//!
//! ```text
//! tier t (ascending priority) with members i, static weights vi, availabilities ai:
//!   Wt  = min(Σ ai over members with vi > 0,  1 − (W1 + … + W(t−1)))
//!   wi  = Wt · vi·ai / Σ vj·aj          (the tier's share split by weight × availability)
//! if Σw < 1:  wi ← wi / Σw             (scale up, as above)
//! if Σa = 0:  wi = vi / Σv              (keep traffic flowing, by static weight)
//! ```
//!
//! Each availability counts, as in the list cascade, for the share of the route's traffic a
//! provider can take, so a tier can take the sum of its members' availabilities; a tier of one
//! provider gives exactly the list cascade's weight, and a policy without priorities is a list
//! of one-provider tiers. A provider of weight 0 never gets a share (its `vi·ai` is 0 and it
//! adds nothing to its tier's capacity): it is reached only through the tail of a chain
//! ([`crate::chain::tiered_chain`]). Source of the weighted-tier idea: Envoy's priority levels
//! with weighted endpoints inside each level (its "priority load" spills a level's unhealthy
//! share to the next level); the sum-of-availabilities capacity is our own, chosen so that one
//! member's tier reduces to the list cascade.
//!
//! Alternative rejected: the weight-averaged availability `Σ vi·ai / Σ vi` as a tier's
//! capacity. It spills half of a two-provider tier's traffic to the next tier as soon as one
//! member is down, although the other member is healthy and its availability says it copes.

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

/// Highest `priority` a RoutingPolicy provider may set (lower numbers are filled first).
pub const MAX_PRIORITY: u32 = 1000;
/// Highest static `weight` a RoutingPolicy provider may set.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// The static weight of a provider that sets none.
pub const DEFAULT_WEIGHT: u32 = 1;

/// The static tier layout of one route: per member (route position), its priority tier and its
/// static weight. Built by [`Tiers::from_spec`]; a route without priorities or weights has none
/// and keeps the plain list cascade and chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    priority: Vec<u32>,
    weight: Vec<u32>,
}

impl Tiers {
    /// The tiers of a route from its providers' `priority` and `weight` fields (`names`,
    /// `priority` and `weight` by route position, of equal length).
    ///
    /// Returns `Ok(None)` when no provider sets either field (today's list behaviour, bit for
    /// bit). When none sets `priority`, each provider is its own tier in list order. Errors,
    /// as messages naming the providers: `priority` set on some providers but not all; a
    /// priority above [`MAX_PRIORITY`] or a weight above [`MAX_WEIGHT`]; every weight 0; slices
    /// of different lengths.
    pub fn from_spec(
        names: &[&str],
        priority: &[Option<u32>],
        weight: &[Option<u32>],
    ) -> Result<Option<Tiers>, String> {
        if names.len() != priority.len() || names.len() != weight.len() {
            return Err(format!(
                "{} providers but {} priorities and {} weights",
                names.len(),
                priority.len(),
                weight.len()
            ));
        }
        if priority.iter().all(Option::is_none) && weight.iter().all(Option::is_none) {
            return Ok(None);
        }
        let with: Vec<&str> = names
            .iter()
            .zip(priority)
            .filter(|(_, p)| p.is_some())
            .map(|(n, _)| *n)
            .collect();
        if !with.is_empty() && with.len() != names.len() {
            let without: Vec<&str> = names
                .iter()
                .zip(priority)
                .filter(|(_, p)| p.is_none())
                .map(|(n, _)| *n)
                .collect();
            return Err(format!(
                "priority must be set on every provider of the policy or on none: set on {with:?}, missing on {without:?}"
            ));
        }
        if let Some((n, p)) = names
            .iter()
            .zip(priority)
            .find_map(|(n, p)| p.filter(|&p| p > MAX_PRIORITY).map(|p| (n, p)))
        {
            return Err(format!(
                "provider {n:?}: priority {p} is above the maximum {MAX_PRIORITY}"
            ));
        }
        if let Some((n, w)) = names
            .iter()
            .zip(weight)
            .find_map(|(n, w)| w.filter(|&w| w > MAX_WEIGHT).map(|w| (n, w)))
        {
            return Err(format!(
                "provider {n:?}: weight {w} is above the maximum {MAX_WEIGHT}"
            ));
        }
        let weight: Vec<u32> = weight.iter().map(|w| w.unwrap_or(DEFAULT_WEIGHT)).collect();
        if weight.iter().all(|&w| w == 0) {
            return Err(
                "every provider has weight 0: at least one provider must have a weight above 0"
                    .to_owned(),
            );
        }
        let priority = if with.is_empty() {
            (0..names.len() as u32).collect()
        } else {
            priority.iter().map(|p| p.unwrap_or(0)).collect()
        };
        Ok(Some(Tiers { priority, weight }))
    }

    /// Priority tier of each member (lower first; list positions when the policy set none).
    pub fn priority(&self) -> &[u32] {
        &self.priority
    }

    /// Static weight of each member (unset = [`DEFAULT_WEIGHT`]).
    pub fn weight(&self) -> &[u32] {
        &self.weight
    }

    /// Whether member `i` has static weight 0: it serves only while no provider of positive
    /// weight can, so a project that failed over to it must not keep it at the head of its
    /// pinned chain (the machine's move-to-front is skipped for it) — once the others are back
    /// its next turn goes to them.
    pub fn is_standby(&self, i: usize) -> bool {
        self.weight.get(i) == Some(&0)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.priority.len()
    }

    /// Whether the route has no members.
    pub fn is_empty(&self) -> bool {
        self.priority.is_empty()
    }
}

/// Cascade weights over priority tiers with static weights inside each tier (module docs,
/// "Tiers with static weights").
///
/// `availabilities[i]` and the tiers are by route position; availabilities are sanitised as in
/// [`cascade_weights`], and positions beyond either input get weight 0. Returns one weight per
/// availability, each in `[0,1]`, summing to 1 unless every static weight is 0 (which
/// [`Tiers::from_spec`] refuses; then all are 0). Weight-0 providers always get 0.
pub fn tiered_cascade_weights(availabilities: &[f64], tiers: &Tiers) -> Vec<f64> {
    let n = availabilities.len();
    let mut out = vec![0.0; n];
    let member = |i: usize| -> Option<(u32, f64, f64)> {
        let p = *tiers.priority.get(i)?;
        let v = f64::from(*tiers.weight.get(i)?);
        Some((p, v, sanitise(availabilities[i])))
    };
    let mut levels: Vec<u32> = (0..n).filter_map(|i| member(i).map(|m| m.0)).collect();
    levels.sort_unstable();
    levels.dedup();
    let mut assigned = 0.0_f64;
    for level in levels {
        let mut capacity = 0.0;
        let mut mass = 0.0;
        for (_, v, a) in (0..n).filter_map(member).filter(|m| m.0 == level) {
            if v > 0.0 {
                capacity += a;
                mass += v * a;
            }
        }
        let share = capacity.min((1.0 - assigned).max(0.0));
        if share <= 0.0 || mass <= 0.0 {
            continue;
        }
        for (i, w) in out.iter_mut().enumerate() {
            if let Some((p, v, a)) = member(i)
                && p == level
            {
                *w = share * v * a / mass;
            }
        }
        assigned += share;
    }
    if assigned <= 0.0 {
        let total: f64 = (0..n).filter_map(member).map(|m| m.1).sum();
        if total > 0.0 {
            for (i, w) in out.iter_mut().enumerate() {
                *w = member(i).map_or(0.0, |m| m.1 / total);
            }
        }
        return out;
    }
    out.iter_mut().for_each(|w| *w = (*w / assigned).min(1.0));
    out
}

/// The weights of a route: [`tiered_cascade_weights`] when it has [`Tiers`], else the list
/// [`cascade_weights`]. The one entry point the router, the operator and the simulator use.
pub fn route_weights(availabilities: &[f64], tiers: Option<&Tiers>) -> Vec<f64> {
    match tiers {
        Some(t) => tiered_cascade_weights(availabilities, t),
        None => cascade_weights(availabilities),
    }
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

    fn tiers(priority: &[Option<u32>], weight: &[Option<u32>]) -> Tiers {
        let names: Vec<String> = (0..priority.len()).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Tiers::from_spec(&names, priority, weight)
            .expect("valid")
            .expect("tiered")
    }

    #[test]
    fn tiered_one_provider_tiers_equal_list_cascade() {
        let t = tiers(&[None; 4], &[Some(1), None, Some(1), None]);
        for a in [
            [1.0, 1.0, 1.0, 1.0],
            [0.6, 0.7, 1.0, 0.2],
            [0.2, 0.3, 0.0, 0.0],
            [0.0; 4],
        ] {
            assert!(
                close(&tiered_cascade_weights(&a, &t), &cascade_weights(&a)),
                "{a:?}"
            );
        }
    }

    #[test]
    fn tiered_weights_split_tier_by_weight_times_availability() {
        // Tier 0: 70/30 at full availability takes everything.
        let t = tiers(&[Some(0), Some(0), Some(1)], &[Some(70), Some(30), None]);
        assert!(close(
            &tiered_cascade_weights(&[1.0, 1.0, 1.0], &t),
            &[0.7, 0.3, 0.0]
        ));
        // Tier 0 capacity 0.5 + 0.3 = 0.8; split 35 : 9; the fallback tier takes 0.2.
        let w = tiered_cascade_weights(&[0.5, 0.3, 1.0], &t);
        assert!(
            close(&w, &[0.8 * 35.0 / 44.0, 0.8 * 9.0 / 44.0, 0.2]),
            "{w:?}"
        );
        // One member down: the other takes the tier's share (its availability covers it).
        assert!(close(
            &tiered_cascade_weights(&[0.0, 1.0, 1.0], &t),
            &[0.0, 1.0, 0.0]
        ));
    }

    #[test]
    fn tiered_weight_zero_gets_nothing_until_everything_is_zero() {
        let t = tiers(&[Some(5), Some(5), Some(9)], &[Some(0), Some(2), Some(1)]);
        assert!(close(
            &tiered_cascade_weights(&[1.0, 0.4, 1.0], &t),
            &[0.0, 0.4, 0.6]
        ));
        // Every availability 0: by static weight, and still nothing for weight 0.
        assert!(close(
            &tiered_cascade_weights(&[0.0, 0.0, 0.0], &t),
            &[0.0, 2.0 / 3.0, 1.0 / 3.0]
        ));
        // List order does not matter: the same providers reversed give the same weights.
        let r = tiers(&[Some(9), Some(5), Some(5)], &[Some(1), Some(2), Some(0)]);
        assert!(close(
            &tiered_cascade_weights(&[1.0, 0.4, 1.0], &r),
            &[0.6, 0.4, 0.0]
        ));
    }

    #[test]
    fn tiers_from_spec_refuses_with_messages() {
        let names = ["a", "b", "c"];
        assert_eq!(Tiers::from_spec(&names, &[None; 3], &[None; 3]), Ok(None));
        let e = Tiers::from_spec(&names, &[Some(0), None, Some(1)], &[None; 3]).unwrap_err();
        assert!(e.contains("every provider of the policy or on none"), "{e}");
        assert!(e.contains(r#"missing on ["b"]"#), "{e}");
        let e = Tiers::from_spec(&names, &[None; 3], &[Some(0); 3]).unwrap_err();
        assert!(
            e.contains("at least one provider must have a weight above 0"),
            "{e}"
        );
        let e = Tiers::from_spec(&names, &[Some(1001), Some(0), Some(0)], &[None; 3]).unwrap_err();
        assert!(e.contains("priority 1001"), "{e}");
        let e = Tiers::from_spec(&names, &[None; 3], &[Some(1_000_001), None, None]).unwrap_err();
        assert!(e.contains("weight 1000001"), "{e}");
        let t = Tiers::from_spec(&names, &[None; 3], &[Some(3), None, Some(0)])
            .unwrap()
            .unwrap();
        assert_eq!(t.priority(), &[0, 1, 2]);
        assert_eq!(t.weight(), &[3, 1, 0]);
    }
}
