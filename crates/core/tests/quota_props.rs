//! Property tests for the quota ledger's invariants (DESIGN §4.7): caps are exact, a refusal
//! changes nothing, reconciliation leaves what actual usage implies, concurrency returns to 0,
//! and `Retry-After` is never shorter than the wait for room.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use proptest::prelude::*;
use switchyard_core::quota::{
    BucketId, BucketSpec, Demand, Dimension, Ledger, ReservationId, ReserveError, Rule, Scope,
    Usage, Wait,
};
use switchyard_core::time::Instant;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 10, 0, 0).unwrap()
}

const FAR: Instant = Instant::from_millis(86_400_000);

/// Rule kinds for a capacity: 0 token bucket, 1 fixed window, 2 concurrency.
fn rule(kind: u8, capacity: u64) -> (Dimension, Rule) {
    match kind {
        0 => (
            Dimension::Requests,
            Rule::TokenBucket {
                capacity,
                period: Duration::from_secs(60),
            },
        ),
        1 => (
            Dimension::Requests,
            Rule::FixedWindow {
                capacity,
                period: Duration::from_secs(60),
                reset_at: None,
                tz: Tz::UTC,
            },
        ),
        _ => (
            Dimension::Concurrency,
            Rule::Concurrency { limit: capacity },
        ),
    }
}

fn register(ledger: &mut Ledger, key: &str, dimension: Dimension, rule: Rule) -> BucketId {
    ledger
        .register(
            BucketSpec {
                key: key.to_owned(),
                scope: Scope::Tenant("t1".to_owned()),
                dimension,
                rule,
                count_cached_input: false,
            },
            Instant::ZERO,
            t0(),
        )
        .unwrap()
}

fn one_request() -> Demand {
    Demand {
        requests: 1,
        ..Demand::default()
    }
}

/// The token dimensions used by the reconcile property, each with its own bucket.
const TOKEN_DIMS: [Dimension; 4] = [
    Dimension::InputTokens,
    Dimension::OutputTokens,
    Dimension::TotalTokens,
    Dimension::SpendMicroUsd,
];

fn demand_of(d: Dimension, demand: &Demand) -> i64 {
    (match d {
        Dimension::InputTokens => demand.input_tokens,
        Dimension::OutputTokens => demand.output_tokens,
        Dimension::TotalTokens => demand.input_tokens + demand.output_tokens,
        Dimension::SpendMicroUsd => demand.spend_micro_usd,
        Dimension::Requests => demand.requests,
        Dimension::Concurrency => 1,
    }) as i64
}

fn usage_of(d: Dimension, u: &Usage) -> i64 {
    let input = u.input_uncached + u.cache_write;
    (match d {
        Dimension::InputTokens => input,
        Dimension::OutputTokens => u.output,
        Dimension::TotalTokens => input + u.output,
        Dimension::SpendMicroUsd => u.spend_micro_usd,
        Dimension::Requests | Dimension::Concurrency => 0,
    }) as i64
}

#[derive(Debug, Clone)]
enum Op {
    Reserve { expires_in_ms: u64 },
    Reconcile(usize),
    Release(usize, bool),
    Cancel(usize),
    Advance(u64),
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..5_000).prop_map(|expires_in_ms| Op::Reserve { expires_in_ms }),
        2 => any::<usize>().prop_map(Op::Reconcile),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, b)| Op::Release(i, b)),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => (0u64..2_000).prop_map(Op::Advance),
        1 => Just(Op::Expire),
    ]
}

proptest! {
    #[test]
    fn reserve_thousand_against_cap_admits_exactly_cap(cap in 0u64..1_500, kind in 0u8..3) {
        let mut ledger = Ledger::new();
        let (dim, r) = rule(kind, cap);
        let capped = register(&mut ledger, "capped", dim, r);
        // A roomy second bucket in every reservation: the cap must still bind exactly.
        let roomy = register(&mut ledger, "roomy", Dimension::Requests, Rule::TokenBucket {
            capacity: 1_000_000,
            period: Duration::from_secs(1),
        });
        let admitted = (0..1_000)
            .filter(|_| {
                ledger
                    .reserve(&[roomy, capped], one_request(), Instant::ZERO, t0(), FAR)
                    .is_ok()
            })
            .count() as u64;
        prop_assert_eq!(admitted, cap.min(1_000));
        prop_assert_eq!(ledger.level(roomy, Instant::ZERO, t0()), Some(1_000_000 - admitted as i64));
    }

    #[test]
    fn reserve_random_amounts_never_exceed_cap_and_refuse_only_without_room(
        cap in 0u64..20_000,
        amounts in prop::collection::vec(1u64..2_000, 1..200),
        window in any::<bool>(),
    ) {
        let mut ledger = Ledger::new();
        let r = if window {
            rule(1, cap).1
        } else {
            rule(0, cap).1
        };
        let b = register(&mut ledger, "itpm", Dimension::InputTokens, r);
        let mut admitted = 0u64;
        for &a in &amounts {
            let d = Demand { input_tokens: a, ..Demand::default() };
            match ledger.reserve(&[b], d, Instant::ZERO, t0(), FAR) {
                Ok(_) => admitted += a,
                Err(e) => {
                    let r = e.refusal().unwrap();
                    prop_assert!(admitted + a > cap);
                    prop_assert_eq!(r.figures.remaining, cap - admitted);
                    prop_assert_eq!(r.exceeds_capacity(), a > cap);
                }
            }
            prop_assert!(admitted <= cap);
        }
    }

    #[test]
    fn refused_reservation_changes_no_bucket(
        caps in prop::collection::vec((0u8..3, 0u64..50), 1..6),
        demands in prop::collection::vec((1u64..10, 0usize..64), 1..100),
        step_ms in 0u64..500,
    ) {
        let mut ledger = Ledger::new();
        let ids: Vec<BucketId> = caps
            .iter()
            .enumerate()
            .map(|(i, &(kind, cap))| {
                let (dim, r) = rule(kind, cap);
                register(&mut ledger, &format!("b{i}"), dim, r)
            })
            .collect();
        for (step, &(requests, mask)) in demands.iter().enumerate() {
            let now = Instant::from_millis(step as u64 * step_ms);
            let chosen: Vec<BucketId> = ids
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, &id)| id)
                .collect();
            let before: Vec<_> = ids.iter().map(|&id| ledger.level(id, now, t0())).collect();
            let held_before: Vec<_> = ids.iter().map(|&id| ledger.held(id)).collect();
            let d = Demand { requests, ..Demand::default() };
            if let Err(e) = ledger.reserve(&chosen, d, now, t0(), FAR) {
                let r = e.refusal().unwrap();
                prop_assert!(chosen.contains(&r.bucket));
                let after: Vec<_> = ids.iter().map(|&id| ledger.level(id, now, t0())).collect();
                let held_after: Vec<_> = ids.iter().map(|&id| ledger.held(id)).collect();
                prop_assert_eq!(before, after);
                prop_assert_eq!(held_before, held_after);
            }
        }
    }

    #[test]
    fn reconcile_leaves_levels_at_cap_minus_actual_usage(
        steps in prop::collection::vec(
            (any::<bool>(), 0u64..3_000, 0u64..3_000, 0u64..3_000, 0u64..3_000, 0u64..500, any::<usize>()),
            1..120,
        ),
        window in any::<bool>(),
    ) {
        const CAP: u64 = 100_000;
        let mut ledger = Ledger::new();
        let ids: Vec<BucketId> = TOKEN_DIMS
            .iter()
            .map(|&dim| {
                let r = if window { rule(1, CAP).1 } else { rule(0, CAP).1 };
                register(&mut ledger, dim.label(), dim, r)
            })
            .collect();
        let mut live: Vec<(ReservationId, Demand)> = Vec::new();
        let mut expected = [CAP as i64; 4];
        for &(reserve, input, output, act_in, act_out, act_write, pick) in &steps {
            if reserve || live.is_empty() {
                let d = Demand {
                    requests: 1,
                    input_tokens: input,
                    output_tokens: output,
                    spend_micro_usd: input + 3 * output,
                    ..Demand::default()
                };
                match ledger.reserve(&ids, d, Instant::ZERO, t0(), FAR) {
                    Ok(id) => {
                        live.push((id, d));
                        for (e, &dim) in expected.iter_mut().zip(&TOKEN_DIMS) {
                            *e -= demand_of(dim, &d);
                        }
                    }
                    Err(ReserveError::Refused(r)) => {
                        let i = ids.iter().position(|&b| b == r.bucket).unwrap();
                        prop_assert!(expected[i] < r.demanded as i64);
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            } else {
                let (id, d) = live.swap_remove(pick % live.len());
                let u = Usage {
                    input_uncached: act_in,
                    cache_write: act_write,
                    output: act_out,
                    spend_micro_usd: act_in + act_write + 3 * act_out,
                    ..Usage::default()
                };
                ledger.reconcile(id, u, Instant::ZERO, t0()).unwrap();
                for (e, &dim) in expected.iter_mut().zip(&TOKEN_DIMS) {
                    *e += demand_of(dim, &d) - usage_of(dim, &u);
                }
            }
            let levels: Vec<i64> = ids.iter().map(|&b| ledger.level(b, Instant::ZERO, t0()).unwrap()).collect();
            prop_assert_eq!(levels, expected.to_vec());
        }
    }

    #[test]
    fn concurrency_returns_to_zero_after_any_interleaving(
        limit in 0u64..8,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mut ledger = Ledger::new();
        let conc = register(&mut ledger, "conc", Dimension::Concurrency, Rule::Concurrency { limit });
        let rpm = register(&mut ledger, "rpm", Dimension::Requests, rule(0, 30).1);
        let mut now = Instant::ZERO;
        let mut live: Vec<(ReservationId, Instant)> = Vec::new();
        let mut settled: Vec<ReservationId> = Vec::new();
        for op in ops {
            match op {
                Op::Reserve { expires_in_ms } => {
                    let exp = now + Duration::from_millis(expires_in_ms);
                    if let Ok(id) = ledger.reserve(&[conc, rpm], one_request(), now, t0(), exp) {
                        live.push((id, exp));
                    }
                }
                Op::Reconcile(i) | Op::Release(i, _) | Op::Cancel(i) if !live.is_empty() => {
                    let (id, _) = live.swap_remove(i % live.len());
                    let used = Usage { output: 7, ..Usage::default() };
                    let result = match op {
                        Op::Reconcile(_) => ledger.reconcile(id, used, now, t0()),
                        Op::Release(_, true) => ledger.release(id, Some(used), now, t0()),
                        Op::Release(_, false) => ledger.release(id, None, now, t0()),
                        _ => ledger.cancel(id, now, t0()),
                    };
                    prop_assert!(result.is_ok());
                    settled.push(id);
                }
                Op::Reconcile(i) | Op::Release(i, _) | Op::Cancel(i) => {
                    // Settling twice is a typed no-op.
                    if let Some(&id) = settled.get(i % settled.len().max(1)) {
                        let held = ledger.held(conc);
                        prop_assert!(ledger.cancel(id, now, t0()).is_err());
                        prop_assert_eq!(ledger.held(conc), held);
                    }
                }
                Op::Advance(ms) => now = now + Duration::from_millis(ms),
                Op::Expire => {
                    let gone = ledger.expire(now);
                    for e in &gone {
                        prop_assert!(e.expires_at <= now);
                        prop_assert!(live.iter().any(|&(id, _)| id == e.id));
                        settled.push(e.id);
                    }
                    live.retain(|&(_, exp)| exp > now);
                }
            }
            let held = ledger.held(conc).unwrap();
            prop_assert!(held <= limit);
            prop_assert_eq!(held, live.len() as u64);
            prop_assert_eq!(ledger.in_flight(), live.len());
        }
        ledger.expire(now + Duration::from_secs(10));
        prop_assert_eq!(ledger.held(conc), Some(0));
        prop_assert_eq!(ledger.in_flight(), 0);
    }

    #[test]
    fn admissions_over_time_stay_within_each_rule(
        capacity in 1u64..5_000,
        period_s in 1u64..120,
        arrivals in prop::collection::vec((0u64..5_000, 1u64..800), 1..300),
    ) {
        // Token bucket: over [0, T] at most C + C·T/P. Fixed window: at most C per window.
        let mut ledger = Ledger::new();
        let period = Duration::from_secs(period_s);
        let tb = register(&mut ledger, "tb", Dimension::InputTokens, Rule::TokenBucket { capacity, period });
        let fw = register(&mut ledger, "fw", Dimension::OutputTokens, Rule::FixedWindow {
            capacity, period, reset_at: None, tz: Tz::UTC,
        });
        let mut now_ms = 0u64;
        let mut tb_total = 0u64;
        let mut fw_per_window: std::collections::HashMap<i64, u64> = Default::default();
        for &(gap_ms, amount) in &arrivals {
            now_ms += gap_ms;
            let now = Instant::from_millis(now_ms);
            let wall = t0() + chrono::TimeDelta::milliseconds(now_ms as i64);
            let d = Demand { input_tokens: amount, ..Demand::default() };
            if ledger.reserve(&[tb], d, now, wall, FAR).is_ok() {
                tb_total += amount;
            }
            let d = Demand { output_tokens: amount, ..Demand::default() };
            if ledger.reserve(&[fw], d, now, wall, FAR).is_ok() {
                let window = wall.timestamp_millis().div_euclid(period_s as i64 * 1_000);
                *fw_per_window.entry(window).or_default() += amount;
            }
        }
        let bound = capacity as u128 + capacity as u128 * now_ms as u128 / (period_s as u128 * 1_000);
        prop_assert!(tb_total as u128 <= bound, "{} > {}", tb_total, bound);
        for (w, used) in fw_per_window {
            prop_assert!(used <= capacity, "window {} used {}", w, used);
        }
    }

    #[test]
    fn retry_after_is_the_exact_wait_for_room(
        capacity in 1u64..100_000,
        period_ms in 1u64..120_000,
        used_share in 0.0f64..1.0,
        demand_share in 0.0f64..1.0,
        elapsed_ms in 0u64..10_000,
    ) {
        let mut ledger = Ledger::new();
        let b = register(&mut ledger, "b", Dimension::OutputTokens, Rule::TokenBucket {
            capacity,
            period: Duration::from_millis(period_ms),
        });
        let used = ((capacity as f64) * used_share) as u64;
        let want = (((capacity as f64) * demand_share) as u64).max(1);
        let take = |n| Demand { output_tokens: n, ..Demand::default() };
        ledger.reserve(&[b], take(used), Instant::ZERO, t0(), FAR).unwrap();
        let now = Instant::from_millis(elapsed_ms);
        let snapshot = ledger.clone();
        match ledger.reserve(&[b], take(want), now, t0(), FAR) {
            Ok(_) => {}
            Err(e) => {
                let r = e.refusal().unwrap().clone();
                let Wait::After(wait) = r.wait else {
                    return Err(TestCaseError::fail(format!("unexpected {:?}", r.wait)));
                };
                prop_assert!(wait > Duration::ZERO);
                let mut early = snapshot.clone();
                prop_assert!(early
                    .reserve(&[b], take(want), now + wait - Duration::from_nanos(1), t0(), FAR)
                    .is_err());
                let mut on_time = snapshot;
                prop_assert!(on_time.reserve(&[b], take(want), now + wait, t0(), FAR).is_ok());
            }
        }
    }
}
