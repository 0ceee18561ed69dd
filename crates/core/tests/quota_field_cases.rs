//! Field cases 10, 11, 13, 15, 16 and 17 (../shared/cases/field-cases.md) against the quota
//! ledger, plus the documented edges of each rule (DST resets, overrun debt, header correction).

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use switchyard_core::quota::{
    BucketId, BucketSpec, Demand, Dimension, Ledger, ReserveError, Rule, Scope, SettleError, Usage,
    Wait,
};
use switchyard_core::time::Instant;

fn wall(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

fn t0() -> DateTime<Utc> {
    wall(2026, 11, 30, 10, 0, 0)
}

fn spec(key: &str, scope: Scope, dimension: Dimension, rule: Rule) -> BucketSpec {
    BucketSpec {
        key: key.to_owned(),
        scope,
        dimension,
        rule,
        count_cached_input: false,
    }
}

fn tenant(name: &str) -> Scope {
    Scope::Tenant(name.to_owned())
}

fn per_minute_window(capacity: u64) -> Rule {
    Rule::FixedWindow {
        capacity,
        period: Duration::from_secs(60),
        reset_at: None,
        tz: Tz::UTC,
    }
}

fn daily(capacity: u64, tz: Tz) -> Rule {
    Rule::FixedWindow {
        capacity,
        period: Duration::from_secs(86_400),
        reset_at: Some((0, 0)),
        tz,
    }
}

fn refusal(err: ReserveError) -> Box<switchyard_core::quota::Refusal> {
    match err {
        ReserveError::Refused(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

const FAR: Instant = Instant::from_millis(86_400_000 * 30);

#[test]
fn case10_tenant_itpm_and_rpm_window_admit_at_most_ten_with_window_retry_after() {
    let mut ledger = Ledger::new();
    let now = Instant::ZERO;
    let itpm = ledger
        .register(
            spec(
                "tenant/t1/itpm",
                tenant("t1"),
                Dimension::InputTokens,
                per_minute_window(10_000),
            ),
            now,
            t0(),
        )
        .unwrap();
    let rpm = ledger
        .register(
            spec(
                "tenant/t1/rpm",
                tenant("t1"),
                Dimension::Requests,
                per_minute_window(12),
            ),
            now,
            t0(),
        )
        .unwrap();
    let demand = Demand {
        requests: 1,
        input_tokens: 1_000,
        output_tokens: 50,
        ..Demand::default()
    };
    let mut admitted = 0;
    let mut reserved_input = 0;
    // 30 requests evenly over 20 s, from the start of a UTC minute.
    for i in 0..30u64 {
        let offset = Duration::from_millis(i * 20_000 / 30);
        let now = Instant::from_origin(offset);
        let wall_now = t0() + chrono::TimeDelta::from_std(offset).unwrap();
        match ledger.reserve(&[itpm, rpm], demand, now, wall_now, FAR) {
            Ok(_) => {
                admitted += 1;
                reserved_input += 1_000;
            }
            Err(e) => {
                let r = refusal(e);
                assert_eq!(r.reason, "tenant_input_tokens_per_minute");
                assert!(!r.scope.is_provider_side());
                let remainder = Duration::from_secs(60) - offset;
                let retry = r.retry_after().unwrap();
                assert!(retry <= remainder, "{retry:?} > {remainder:?}");
                assert_eq!(retry, remainder, "the window resets exactly then");
                assert_eq!(r.figures.limit, 10_000);
                assert_eq!(r.figures.remaining, 0);
            }
        }
    }
    assert_eq!(admitted, 10);
    assert!(reserved_input <= 10_000);
}

#[test]
fn case10_token_bucket_bound_is_burst_plus_refill() {
    // The same limit as a token bucket admits the burst plus the refill of the elapsed time:
    // 10,000 + 10,000 × 20/60 ≈ 13,333 tokens in 20 s, i.e. 13 requests. This is why
    // "per calendar minute" limits map to fixed windows.
    let mut ledger = Ledger::new();
    let itpm = ledger
        .register(
            spec(
                "tenant/t1/itpm",
                tenant("t1"),
                Dimension::InputTokens,
                Rule::TokenBucket {
                    capacity: 10_000,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let demand = Demand {
        requests: 1,
        input_tokens: 1_000,
        ..Demand::default()
    };
    let admitted = (0..30u64)
        .filter(|i| {
            let now = Instant::from_millis(i * 20_000 / 30);
            ledger.reserve(&[itpm], demand, now, t0(), FAR).is_ok()
        })
        .count();
    assert_eq!(admitted, 13);
}

#[test]
fn case11_spend_cap_admits_one_of_ten_then_reconciles_to_098() {
    let mut ledger = Ledger::new();
    let now = Instant::ZERO;
    let spend = ledger
        .register(
            spec(
                "tenant/t1/spend/day",
                tenant("t1"),
                Dimension::SpendMicroUsd,
                daily(1_000_000, Tz::UTC),
            ),
            now,
            t0(),
        )
        .unwrap();
    let cost = |micro: u64| Demand {
        requests: 1,
        spend_micro_usd: micro,
        ..Demand::default()
    };
    // $0.95 already spent today.
    let earlier = ledger
        .reserve(&[spend], cost(950_000), now, t0(), FAR)
        .unwrap();
    ledger
        .reconcile(
            earlier,
            Usage {
                spend_micro_usd: 950_000,
                ..Usage::default()
            },
            now,
            t0(),
        )
        .unwrap();

    let results: Vec<_> = (0..10)
        .map(|_| ledger.reserve(&[spend], cost(40_000), now, t0(), FAR))
        .collect();
    let admitted: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(admitted.len(), 1);
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        let r = r.refusal().unwrap();
        assert_eq!(r.reason, "tenant_spend");
        // Nothing refills a daily cap but midnight: 14 h from 10:00 UTC.
        assert_eq!(r.wait, Wait::After(Duration::from_secs(14 * 3_600)));
    }
    assert_eq!(ledger.level(spend, now, t0()), Some(10_000));

    ledger
        .reconcile(
            *admitted[0],
            Usage {
                spend_micro_usd: 30_000,
                ..Usage::default()
            },
            now,
            t0(),
        )
        .unwrap();
    assert_eq!(ledger.level(spend, now, t0()), Some(20_000), "spent $0.98");
    assert_eq!(ledger.in_flight(), 0);
    let follow_up = ledger.reserve(&[spend], cost(20_000), now, t0(), FAR);
    assert!(follow_up.is_ok());
    assert_eq!(ledger.level(spend, now, t0()), Some(0), "never above $1.00");
}

#[test]
fn case13_disconnected_stream_frees_the_only_slot() {
    let mut ledger = Ledger::new();
    let conc = ledger
        .register(
            spec(
                "tenant/t1/concurrency",
                tenant("t1"),
                Dimension::Concurrency,
                Rule::Concurrency { limit: 1 },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    for cycle in 0..100u64 {
        let base = cycle * 3_000;
        let stream = ledger
            .reserve(&[conc], one, Instant::from_millis(base), t0(), FAR)
            .unwrap();
        let second = ledger.reserve(&[conc], one, Instant::from_millis(base + 1_000), t0(), FAR);
        let r = refusal(second.unwrap_err());
        assert_eq!(r.reason, "tenant_concurrency");
        assert_eq!(r.wait, Wait::OnRelease);
        // Client closes at 2 s: settle what the stream counted so far.
        let used = Usage {
            input_uncached: 100,
            output: 20,
            ..Usage::default()
        };
        ledger
            .release(stream, Some(used), Instant::from_millis(base + 2_000), t0())
            .unwrap();
        assert_eq!(ledger.held(conc), Some(0));
        let next = ledger
            .reserve(&[conc], one, Instant::from_millis(base + 2_500), t0(), FAR)
            .unwrap();
        ledger
            .reconcile(next, used, Instant::from_millis(base + 2_600), t0())
            .unwrap();
    }
    assert_eq!(ledger.held(conc), Some(0));
    assert_eq!(ledger.in_flight(), 0);
}

fn token_dims(ledger: &mut Ledger, count_cached_input: bool) -> (BucketId, BucketId) {
    let bucket = || Rule::TokenBucket {
        capacity: 1_000_000,
        period: Duration::from_secs(60),
    };
    let input = ledger
        .register(
            BucketSpec {
                count_cached_input,
                ..spec(
                    "tenant/t1/itpm",
                    tenant("t1"),
                    Dimension::InputTokens,
                    bucket(),
                )
            },
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let output = ledger
        .register(
            spec(
                "tenant/t1/otpm",
                tenant("t1"),
                Dimension::OutputTokens,
                bucket(),
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    (input, output)
}

#[test]
fn case15_release_without_usage_keeps_the_estimate_never_zero() {
    let mut ledger = Ledger::new();
    let (input, output) = token_dims(&mut ledger, false);
    let now = Instant::ZERO;
    let demand = Demand {
        requests: 1,
        input_tokens: 812,
        output_tokens: 500,
        ..Demand::default()
    };
    let id = ledger
        .reserve(&[input, output], demand, now, t0(), FAR)
        .unwrap();
    let settled = ledger.release(id, None, now, t0()).unwrap();
    assert_eq!(settled.demand, demand);
    assert_eq!(ledger.level(input, now, t0()), Some(1_000_000 - 812));
    assert_eq!(ledger.level(output, now, t0()), Some(1_000_000 - 500));
}

#[test]
fn case16_cache_reads_count_only_where_the_bucket_says_so() {
    let usage = Usage {
        input_uncached: 4,
        cache_read: 2_455,
        cache_write: 0,
        output: 23,
        spend_micro_usd: 0,
    };
    for (count_cached, expected_input) in [(false, 4), (true, 2_459)] {
        let mut ledger = Ledger::new();
        let (input, output) = token_dims(&mut ledger, count_cached);
        let now = Instant::ZERO;
        let demand = Demand {
            requests: 1,
            input_tokens: 10,
            cached_input_tokens: 2_455,
            output_tokens: 100,
            ..Demand::default()
        };
        let id = ledger
            .reserve(&[input, output], demand, now, t0(), FAR)
            .unwrap();
        ledger.reconcile(id, usage, now, t0()).unwrap();
        assert_eq!(
            ledger.level(input, now, t0()),
            Some(1_000_000 - expected_input)
        );
        assert_eq!(ledger.level(output, now, t0()), Some(1_000_000 - 23));
    }
}

#[test]
fn case17_client_disconnect_charges_what_was_consumed() {
    let demand = Demand {
        requests: 1,
        input_tokens: 1_200,
        output_tokens: 4_000,
        ..Demand::default()
    };
    // (a) 420 output tokens counted at disconnect, (b) none before first byte, (c) 0/0 reported.
    for (input_used, output_used) in [(1_200, 420), (1_200, 0), (0, 0)] {
        let mut ledger = Ledger::new();
        let (input, output) = token_dims(&mut ledger, false);
        let now = Instant::ZERO;
        let id = ledger
            .reserve(&[input, output], demand, now, t0(), FAR)
            .unwrap();
        let used = Usage {
            input_uncached: input_used,
            output: output_used,
            ..Usage::default()
        };
        ledger.release(id, Some(used), now, t0()).unwrap();
        assert_eq!(
            ledger.level(input, now, t0()),
            Some(1_000_000 - input_used as i64)
        );
        assert_eq!(
            ledger.level(output, now, t0()),
            Some(1_000_000 - output_used as i64)
        );
        assert_eq!(ledger.in_flight(), 0);
        assert_eq!(
            ledger.release(id, Some(used), now, t0()),
            Err(SettleError::NotLive(id))
        );
    }
}

fn berlin_daily_requests(ledger: &mut Ledger, at: DateTime<Utc>) -> BucketId {
    ledger
        .register(
            spec(
                "tenant/t1/requests/day",
                tenant("t1"),
                Dimension::Requests,
                daily(1, chrono_tz::Europe::Berlin),
            ),
            Instant::ZERO,
            at,
        )
        .unwrap()
}

#[test]
fn daily_window_berlin_spring_forward_resets_at_local_midnight() {
    // 2026-03-29 is 23 h long in Berlin: 00:00 CET = 23:00Z on the 28th, next midnight
    // 00:00 CEST = 22:00Z on the 29th.
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    let mut ledger = Ledger::new();
    let start = wall(2026, 3, 28, 22, 30, 0); // 23:30 CET on the 28th
    let b = berlin_daily_requests(&mut ledger, start);
    assert!(ledger.reserve(&[b], one, Instant::ZERO, start, FAR).is_ok());
    let r = refusal(
        ledger
            .reserve(&[b], one, Instant::ZERO, start, FAR)
            .unwrap_err(),
    );
    assert_eq!(r.reason, "tenant_requests_per_day");
    assert_eq!(r.wait, Wait::After(Duration::from_secs(30 * 60)));
    // Local midnight of the 29th.
    let day = wall(2026, 3, 28, 23, 0, 0);
    assert!(ledger.reserve(&[b], one, Instant::ZERO, day, FAR).is_ok());
    let late = wall(2026, 3, 29, 21, 59, 0); // 23:59 CEST
    let r = refusal(
        ledger
            .reserve(&[b], one, Instant::ZERO, late, FAR)
            .unwrap_err(),
    );
    assert_eq!(r.wait, Wait::After(Duration::from_secs(60)));
    assert_eq!(r.figures.reset_after, Duration::from_secs(60));
    assert!(
        ledger
            .reserve(&[b], one, Instant::ZERO, wall(2026, 3, 29, 22, 0, 0), FAR)
            .is_ok()
    );
}

#[test]
fn daily_window_berlin_fall_back_day_is_25_hours() {
    // 2026-10-25 is 25 h long: 00:00 CEST = 22:00Z on the 24th, next midnight 00:00 CET =
    // 23:00Z on the 25th.
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    let mut ledger = Ledger::new();
    let start = wall(2026, 10, 24, 22, 0, 0);
    let b = berlin_daily_requests(&mut ledger, start);
    assert!(ledger.reserve(&[b], one, Instant::ZERO, start, FAR).is_ok());
    let r = refusal(
        ledger
            .reserve(&[b], one, Instant::ZERO, start, FAR)
            .unwrap_err(),
    );
    assert_eq!(r.wait, Wait::After(Duration::from_secs(25 * 3_600)));
    assert!(
        ledger
            .reserve(
                &[b],
                one,
                Instant::ZERO,
                wall(2026, 10, 25, 22, 59, 59),
                FAR
            )
            .is_err()
    );
    assert!(
        ledger
            .reserve(&[b], one, Instant::ZERO, wall(2026, 10, 25, 23, 0, 0), FAR)
            .is_ok()
    );
}

#[test]
fn daily_window_reset_in_dst_gap_uses_first_valid_minute() {
    // 02:30 does not exist in Berlin on 2026-03-29 (02:00 CET → 03:00 CEST = 01:00Z).
    let mut ledger = Ledger::new();
    let rule = Rule::FixedWindow {
        capacity: 1,
        period: Duration::from_secs(86_400),
        reset_at: Some((2, 30)),
        tz: chrono_tz::Europe::Berlin,
    };
    let start = wall(2026, 3, 29, 0, 0, 0);
    let b = ledger
        .register(
            spec("t1/day", tenant("t1"), Dimension::Requests, rule),
            Instant::ZERO,
            start,
        )
        .unwrap();
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    assert!(ledger.reserve(&[b], one, Instant::ZERO, start, FAR).is_ok());
    let r = refusal(
        ledger
            .reserve(&[b], one, Instant::ZERO, start, FAR)
            .unwrap_err(),
    );
    assert_eq!(r.wait, Wait::After(Duration::from_secs(3_600)));
}

#[test]
fn overrun_goes_negative_and_blocks_until_refilled() {
    let mut ledger = Ledger::new();
    let b = ledger
        .register(
            spec(
                "t1/otpm",
                tenant("t1"),
                Dimension::OutputTokens,
                Rule::TokenBucket {
                    capacity: 600,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let d = Demand {
        output_tokens: 100,
        ..Demand::default()
    };
    let id = ledger.reserve(&[b], d, Instant::ZERO, t0(), FAR).unwrap();
    let used = Usage {
        output: 1_200,
        ..Usage::default()
    };
    ledger.reconcile(id, used, Instant::ZERO, t0()).unwrap();
    assert_eq!(ledger.level(b, Instant::ZERO, t0()), Some(-600));
    let zero = Demand::default();
    let r = refusal(
        ledger
            .reserve(&[b], zero, Instant::ZERO, t0(), FAR)
            .unwrap_err(),
    );
    // 600 tokens of debt at 10 tokens/s.
    assert_eq!(r.wait, Wait::After(Duration::from_secs(60)));
    assert_eq!(r.figures.remaining, 0);
    let later = Instant::from_millis(60_000);
    assert!(ledger.reserve(&[b], zero, later, t0(), FAR).is_ok());
    assert_eq!(ledger.level(b, later, t0()), Some(0));
}

#[test]
fn demand_above_capacity_is_never() {
    let mut ledger = Ledger::new();
    let b = ledger
        .register(
            spec(
                "t1/itpm",
                tenant("t1"),
                Dimension::InputTokens,
                Rule::TokenBucket {
                    capacity: 1_000,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let d = Demand {
        input_tokens: 1_001,
        ..Demand::default()
    };
    let r = refusal(
        ledger
            .reserve(&[b], d, Instant::ZERO, t0(), FAR)
            .unwrap_err(),
    );
    assert!(r.exceeds_capacity());
    assert_eq!(r.retry_after(), None);
    assert_eq!(r.demanded, 1_001);
}

#[test]
fn refusal_binding_bucket_has_the_longest_wait_and_provider_code() {
    let mut ledger = Ledger::new();
    let tenant_b = ledger
        .register(
            spec(
                "t1/itpm",
                tenant("t1"),
                Dimension::InputTokens,
                Rule::TokenBucket {
                    capacity: 600,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let provider_b = ledger
        .register(
            spec(
                "pa/itpm",
                Scope::Provider("P-A".to_owned()),
                Dimension::InputTokens,
                Rule::TokenBucket {
                    capacity: 60,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let d = |n| Demand {
        input_tokens: n,
        ..Demand::default()
    };
    ledger
        .reserve(&[tenant_b, provider_b], d(60), Instant::ZERO, t0(), FAR)
        .unwrap();
    // Tenant has 540 left, provider 0: the provider binds (needs 30 s for 30 tokens).
    let r = refusal(
        ledger
            .reserve(&[tenant_b, provider_b], d(30), Instant::ZERO, t0(), FAR)
            .unwrap_err(),
    );
    assert_eq!(r.bucket, provider_b);
    assert_eq!(r.reason, "provider_capacity");
    assert_eq!(r.wait, Wait::After(Duration::from_secs(30)));
    assert_eq!(r.wait.header_secs(), Some(30));
    // Nothing was debited by the refusal.
    assert_eq!(ledger.level(tenant_b, Instant::ZERO, t0()), Some(540));
}

#[test]
fn bucket_listed_twice_is_charged_once() {
    let mut ledger = Ledger::new();
    let b = ledger
        .register(
            spec(
                "t1/rpm",
                tenant("t1"),
                Dimension::Requests,
                per_minute_window(5),
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    ledger
        .reserve(&[b, b, b], one, Instant::ZERO, t0(), FAR)
        .unwrap();
    assert_eq!(ledger.level(b, Instant::ZERO, t0()), Some(4));
}

#[test]
fn expire_returns_abandoned_reservations_keeps_estimate_frees_slots() {
    let mut ledger = Ledger::new();
    let conc = ledger
        .register(
            spec(
                "t1/conc",
                tenant("t1"),
                Dimension::Concurrency,
                Rule::Concurrency { limit: 4 },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let rpm = ledger
        .register(
            spec(
                "t1/rpm",
                tenant("t1"),
                Dimension::Requests,
                per_minute_window(10),
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    let a = ledger
        .reserve(
            &[conc, rpm],
            one,
            Instant::ZERO,
            t0(),
            Instant::from_millis(1_000),
        )
        .unwrap();
    let b = ledger
        .reserve(
            &[conc, rpm],
            one,
            Instant::ZERO,
            t0(),
            Instant::from_millis(5_000),
        )
        .unwrap();
    assert!(ledger.expire(Instant::from_millis(999)).is_empty());
    let gone = ledger.expire(Instant::from_millis(1_000));
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].id, a);
    assert_eq!(gone[0].buckets, vec![conc, rpm]);
    assert_eq!(ledger.held(conc), Some(1));
    assert_eq!(
        ledger.level(rpm, Instant::ZERO, t0()),
        Some(8),
        "estimate kept"
    );
    assert_eq!(
        ledger.reconcile(a, Usage::default(), Instant::ZERO, t0()),
        Err(SettleError::NotLive(a))
    );
    ledger.cancel(b, Instant::ZERO, t0()).unwrap();
    assert_eq!(ledger.held(conc), Some(0));
    assert_eq!(
        ledger.level(rpm, Instant::ZERO, t0()),
        Some(9),
        "cancel credits"
    );
    assert!(ledger.expire(Instant::from_millis(10_000)).is_empty());
}

#[test]
fn headers_lower_the_level_never_raise_it() {
    let mut ledger = Ledger::new();
    let b = ledger
        .register(
            spec(
                "pa/itpm",
                Scope::Provider("P-A".to_owned()),
                Dimension::InputTokens,
                Rule::TokenBucket {
                    capacity: 60_000,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let now = Instant::ZERO;
    assert_eq!(
        ledger.correct_from_headers(b, 50_000, None, now, t0()),
        Ok(true)
    );
    assert_eq!(ledger.level(b, now, t0()), Some(50_000));
    assert_eq!(
        ledger.correct_from_headers(b, 55_000, None, now, t0()),
        Ok(false)
    );
    // Full again in 20 s at 1,000/s means 40,000 left now.
    assert_eq!(
        ledger.correct_from_headers(b, 59_000, Some(Duration::from_secs(20)), now, t0()),
        Ok(true)
    );
    assert_eq!(ledger.level(b, now, t0()), Some(40_000));
    let figures = ledger.remaining(b, now, t0()).unwrap();
    assert_eq!(figures.remaining, 40_000);
    assert_eq!(figures.reset_after, Duration::from_secs(20));
}

#[test]
fn reload_with_new_capacity_keeps_consumption() {
    let mut ledger = Ledger::new();
    let mk = |capacity| {
        spec(
            "t1/itpm",
            tenant("t1"),
            Dimension::InputTokens,
            Rule::TokenBucket {
                capacity,
                period: Duration::from_secs(60),
            },
        )
    };
    let b = ledger.register(mk(1_000), Instant::ZERO, t0()).unwrap();
    let d = Demand {
        input_tokens: 300,
        ..Demand::default()
    };
    ledger.reserve(&[b], d, Instant::ZERO, t0(), FAR).unwrap();
    let again = ledger.register(mk(2_000), Instant::ZERO, t0()).unwrap();
    assert_eq!(again, b);
    assert_eq!(ledger.level(b, Instant::ZERO, t0()), Some(1_700));
    let bad = BucketSpec {
        dimension: Dimension::OutputTokens,
        ..mk(1)
    };
    assert!(ledger.register(bad, Instant::ZERO, t0()).is_err());
}

#[test]
fn time_going_backwards_credits_nothing() {
    let mut ledger = Ledger::new();
    let b = ledger
        .register(
            spec(
                "t1/rpm",
                tenant("t1"),
                Dimension::Requests,
                Rule::TokenBucket {
                    capacity: 60,
                    period: Duration::from_secs(60),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let d = Demand {
        requests: 60,
        ..Demand::default()
    };
    let late = Instant::from_millis(10_000);
    ledger.reserve(&[b], d, late, t0(), FAR).unwrap();
    assert_eq!(ledger.level(b, Instant::from_millis(5_000), t0()), Some(0));
    assert_eq!(ledger.level(b, Instant::from_millis(11_000), t0()), Some(1));
}

#[test]
fn window_settled_after_reset_drops_the_credit_and_charges_the_overrun_to_the_new_window() {
    let mut ledger = Ledger::new();
    let before_midnight = wall(2026, 11, 30, 23, 59, 0);
    let after_midnight = wall(2026, 12, 1, 0, 1, 0);
    let b = ledger
        .register(
            spec(
                "t1/otpd",
                tenant("t1"),
                Dimension::OutputTokens,
                daily(10_000, Tz::UTC),
            ),
            Instant::ZERO,
            before_midnight,
        )
        .unwrap();
    let d = Demand {
        output_tokens: 4_000,
        ..Demand::default()
    };
    let credit = ledger
        .reserve(&[b], d, Instant::ZERO, before_midnight, FAR)
        .unwrap();
    let overrun = ledger
        .reserve(&[b], d, Instant::ZERO, before_midnight, FAR)
        .unwrap();
    let used = |output| Usage {
        output,
        ..Usage::default()
    };
    ledger
        .reconcile(credit, used(1_000), Instant::ZERO, after_midnight)
        .unwrap();
    assert_eq!(
        ledger.level(b, Instant::ZERO, after_midnight),
        Some(10_000),
        "yesterday's credit is not today's"
    );
    ledger
        .reconcile(overrun, used(5_500), Instant::ZERO, after_midnight)
        .unwrap();
    assert_eq!(ledger.level(b, Instant::ZERO, after_midnight), Some(8_500));
}

#[test]
fn refusal_prefers_a_known_wait_over_a_concurrency_release() {
    let mut ledger = Ledger::new();
    let conc = ledger
        .register(
            spec(
                "t1/conc",
                tenant("t1"),
                Dimension::Concurrency,
                Rule::Concurrency { limit: 1 },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let rpm = ledger
        .register(
            spec(
                "t1/rpm",
                tenant("t1"),
                Dimension::Requests,
                Rule::TokenBucket {
                    capacity: 1,
                    period: Duration::from_secs(5),
                },
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let one = Demand {
        requests: 1,
        ..Demand::default()
    };
    ledger
        .reserve(&[conc, rpm], one, Instant::ZERO, t0(), FAR)
        .unwrap();
    let r = refusal(
        ledger
            .reserve(&[conc, rpm], one, Instant::ZERO, t0(), FAR)
            .unwrap_err(),
    );
    assert_eq!(r.bucket, rpm);
    assert_eq!(r.reason, "tenant_requests");
    assert_eq!(r.wait, Wait::After(Duration::from_secs(5)));
}

#[test]
fn invalid_specs_are_refused_with_a_reason() {
    let mut ledger = Ledger::new();
    let bad = [
        spec(
            "a",
            tenant("t1"),
            Dimension::Requests,
            Rule::Concurrency { limit: 1 },
        ),
        spec(
            "b",
            tenant("t1"),
            Dimension::Requests,
            Rule::TokenBucket {
                capacity: 1,
                period: Duration::ZERO,
            },
        ),
        spec(
            "c",
            tenant("t1"),
            Dimension::Requests,
            Rule::FixedWindow {
                capacity: 1,
                period: Duration::from_secs(3_600),
                reset_at: Some((0, 0)),
                tz: Tz::UTC,
            },
        ),
        spec(
            "d",
            tenant("t1"),
            Dimension::Requests,
            Rule::FixedWindow {
                capacity: 1,
                period: Duration::from_secs(86_400),
                reset_at: Some((24, 0)),
                tz: Tz::UTC,
            },
        ),
    ];
    for s in bad {
        let key = s.key.clone();
        let err = ledger.register(s, Instant::ZERO, t0()).unwrap_err();
        assert!(err.to_string().contains(&format!("bucket {key}")), "{err}");
    }
    assert_eq!(ledger.bucket_id("a"), None);
}

#[test]
fn tightest_names_the_callers_scarcest_bucket_not_the_providers() {
    let mut ledger = Ledger::new();
    let tb = |capacity| Rule::TokenBucket {
        capacity,
        period: Duration::from_secs(60),
    };
    let itpm = ledger
        .register(
            spec("t1/itpm", tenant("t1"), Dimension::InputTokens, tb(10_000)),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let rpm = ledger
        .register(
            spec("t1/rpm", tenant("t1"), Dimension::Requests, tb(10)),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let provider = ledger
        .register(
            spec(
                "pa/itpm",
                Scope::Provider("P-A".to_owned()),
                Dimension::InputTokens,
                tb(2_000),
            ),
            Instant::ZERO,
            t0(),
        )
        .unwrap();
    let d = Demand {
        requests: 1,
        input_tokens: 1_500,
        ..Demand::default()
    };
    ledger
        .reserve(&[itpm, rpm, provider], d, Instant::ZERO, t0(), FAR)
        .unwrap();
    // itpm at 85 %, rpm at 90 %, provider at 25 % (hidden).
    let (id, figures) = ledger
        .tightest(&[itpm, rpm, provider], Instant::ZERO, t0())
        .unwrap();
    assert_eq!(id, itpm);
    assert_eq!(figures.limit, 10_000);
    assert_eq!(figures.remaining, 8_500);
    assert_eq!(figures.reset_after, Duration::from_secs(9));
}
