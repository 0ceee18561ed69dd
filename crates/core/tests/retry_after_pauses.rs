//! Pauses, backoff, hint jitter and the retry decision.

// Test helpers fail loudly on bad fixtures; clippy exempts only `#[test]` fns themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use switchyard_core::classify::{Classification, ErrorClass};
use switchyard_core::pause::{
    Admission, AttemptContext, Backoff, HintJitter, PausePolicy, Pauses, RetryDecision,
    RetryPolicy, next_attempt, wait_fits_deadline,
};
use switchyard_core::time::Instant;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn at(s: f64) -> Instant {
    Instant::from_origin(Duration::from_secs_f64(s))
}

fn rng() -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(7)
}

#[test]
fn pauses_pause_returns_deadline_and_reports_it() {
    let mut p = Pauses::new();
    let until = p.pause("P-A", secs(20), at(1.0), ErrorClass::Capacity);
    assert_eq!(until, at(21.0));
    assert_eq!(p.paused_until(&["P-A"], at(1.0)), Some(at(21.0)));
    assert_eq!(p.paused_until(&["P-A"], at(20.999)), Some(at(21.0)));
    assert_eq!(
        p.paused_until(&["P-A"], at(21.0)),
        None,
        "a deadline equal to now is over"
    );
    assert_eq!(p.paused_until(&["P-B"], at(1.0)), None);
}

#[test]
fn pauses_longer_pause_extends_and_takes_its_reason() {
    let mut p = Pauses::new();
    p.pause("P-A", secs(10), at(0.0), ErrorClass::Overload);
    let until = p.pause("P-A", secs(60), at(5.0), ErrorClass::Capacity);
    assert_eq!(until, at(65.0));
    let e = p.entry("P-A", at(6.0)).unwrap();
    assert_eq!(
        (e.until, e.since, e.reason),
        (at(65.0), at(5.0), ErrorClass::Capacity)
    );
}

#[test]
fn pauses_zero_delay_records_nothing() {
    let mut p = Pauses::new();
    assert_eq!(
        p.pause("P-A", Duration::ZERO, at(3.0), ErrorClass::Capacity),
        at(3.0)
    );
    assert!(p.is_empty());
    p.pause("P-A", secs(5), at(3.0), ErrorClass::Capacity);
    assert_eq!(
        p.pause("P-A", Duration::ZERO, at(4.0), ErrorClass::Capacity),
        at(8.0)
    );
}

#[test]
fn pauses_scopes_effective_deadline_is_max_over_provider_and_group() {
    let mut p = Pauses::new();
    p.pause("P-A1", secs(5), at(0.0), ErrorClass::Capacity);
    p.pause("group-a", secs(20), at(0.0), ErrorClass::Capacity);
    assert_eq!(
        p.paused_until(&["P-A1", "group-a"], at(1.0)),
        Some(at(20.0))
    );
    assert_eq!(
        p.paused_until(&["P-A2", "group-a"], at(1.0)),
        Some(at(20.0))
    );
    assert_eq!(p.paused_until(&["P-A1"], at(6.0)), None);
    assert!(p.is_paused(&["P-A1", "group-a"], at(6.0)));
}

#[test]
fn pauses_expired_entries_pruned_on_pause_and_prune() {
    let mut p = Pauses::new();
    p.pause("P-A", secs(1), at(0.0), ErrorClass::Capacity);
    p.pause("P-B", secs(100), at(0.0), ErrorClass::Policy);
    assert_eq!(p.len(), 2);
    p.pause("P-C", secs(1), at(50.0), ErrorClass::Capacity);
    assert_eq!(p.len(), 3, "P-A's probe gate (60 s) keeps it");
    p.pause("P-C", secs(1), at(61.0), ErrorClass::Capacity);
    assert_eq!(p.len(), 2, "P-A expired, its gate too, and was pruned");
    p.prune(at(200.0));
    assert!(p.is_empty());
}

#[test]
fn pauses_clear_and_active_listing() {
    let mut p = Pauses::new();
    p.pause("P-A", secs(10), at(0.0), ErrorClass::Capacity);
    p.pause("P-B", secs(1), at(0.0), ErrorClass::Capacity);
    let mut active: Vec<&str> = p.active(at(5.0)).map(|(k, _)| k).collect();
    active.sort_unstable();
    assert_eq!(active, ["P-A"]);
    assert!(p.clear("P-A"));
    assert!(!p.is_paused(&["P-A"], at(5.0)));
    assert!(!p.clear("P-Z"));
}

#[test]
fn backoff_ceiling_doubles_then_caps() {
    let b = Backoff::default();
    let got: Vec<u64> = (0..=9).map(|n| b.ceiling(n).as_secs()).collect();
    assert_eq!(got, [1, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(b.ceiling(u32::MAX), secs(60));
    assert_eq!(b.ceiling(40), secs(60));
}

#[test]
fn backoff_equal_jitter_within_half_to_full_ceiling_mean_three_quarters() {
    let b = Backoff::default();
    let mut r = rng();
    let n = 4000;
    let mut sum = 0.0;
    for _ in 0..n {
        let d = b.delay(4, &mut r);
        assert!(d >= secs(4) && d <= secs(8), "{d:?}");
        sum += d.as_secs_f64();
    }
    let mean = sum / f64::from(n);
    assert!((mean - 6.0).abs() < 0.1, "mean {mean}");
}

#[test]
fn backoff_full_and_no_jitter_bounds() {
    let mut r = rng();
    let full = Backoff {
        jitter: 1.0,
        ..Backoff::default()
    };
    let none = Backoff {
        jitter: 0.0,
        ..Backoff::default()
    };
    let mut min_seen = secs(100);
    for _ in 0..1000 {
        let d = full.delay(3, &mut r);
        assert!(d <= secs(4));
        min_seen = min_seen.min(d);
        assert_eq!(none.delay(3, &mut r), secs(4));
    }
    assert!(
        min_seen < Duration::from_millis(100),
        "full jitter reaches near zero"
    );
}

#[test]
fn backoff_odd_settings_do_not_panic() {
    let mut r = rng();
    let odd = [
        Backoff {
            base: Duration::MAX,
            cap: Duration::MAX,
            jitter: 1.0,
        },
        Backoff {
            base: Duration::ZERO,
            cap: secs(1),
            jitter: f64::NAN,
        },
        Backoff {
            base: secs(1),
            cap: secs(1),
            jitter: -3.0,
        },
        Backoff {
            base: secs(1),
            cap: secs(10),
            jitter: f64::INFINITY,
        },
    ];
    for b in odd {
        for n in [0, 1, 63, 64, u32::MAX] {
            let d = b.delay(n, &mut r);
            assert!(d <= b.cap, "{b:?} {n} {d:?}");
        }
    }
    let nan = Backoff {
        base: secs(2),
        cap: secs(2),
        jitter: f64::NAN,
    };
    assert_eq!(nan.delay(1, &mut r), secs(2), "NaN jitter counts as none");
}

#[test]
fn hint_jitter_never_below_hint_and_bounded() {
    let j = HintJitter::default();
    let mut r = rng();
    for hint in [secs(0), secs(1), secs(40), secs(120), secs(3600)] {
        let bound = (hint.mul_f64(0.05)).min(secs(5));
        let mut max_seen = Duration::ZERO;
        for _ in 0..500 {
            let d = j.apply(hint, &mut r);
            assert!(d >= hint && d <= hint + bound, "{hint:?} {d:?}");
            max_seen = max_seen.max(d - hint);
        }
        if !hint.is_zero() {
            assert!(
                max_seen > bound.mul_f64(0.8),
                "jitter spreads: {hint:?} {max_seen:?}"
            );
        }
    }
}

#[test]
fn pause_policy_defaults_by_class() {
    let p = PausePolicy::default();
    let mut r = rng();
    let with = |class, pause| Classification {
        pause,
        ..Classification::new(class)
    };
    let cap = p
        .scope_pause(&with(ErrorClass::Capacity, None), &mut r)
        .unwrap();
    assert!(cap >= secs(60) && cap <= secs(63), "{cap:?}");
    let hinted = p
        .scope_pause(&with(ErrorClass::Capacity, Some(secs(20))), &mut r)
        .unwrap();
    assert!(hinted >= secs(20) && hinted <= secs(21), "{hinted:?}");
    let over = p
        .scope_pause(&with(ErrorClass::Overload, None), &mut r)
        .unwrap();
    assert!(
        over >= secs(5) && over <= Duration::from_millis(5250),
        "{over:?}"
    );
    let policy = p
        .scope_pause(&with(ErrorClass::Policy, Some(secs(86_400))), &mut r)
        .unwrap();
    assert_eq!(policy, secs(86_400), "capped at max_pause");
    for class in [
        ErrorClass::Timeout,
        ErrorClass::Connect,
        ErrorClass::Server,
        ErrorClass::Auth,
        ErrorClass::Request,
        ErrorClass::Deadline,
    ] {
        assert_eq!(
            p.scope_pause(&with(class, Some(secs(9))), &mut r),
            None,
            "{class:?}"
        );
    }
}

#[test]
fn wait_fits_deadline_is_strict() {
    assert!(wait_fits_deadline(secs(5), at(20.0), at(30.0)));
    assert!(!wait_fits_deadline(secs(10), at(20.0), at(30.0)));
    assert!(!wait_fits_deadline(secs(11), at(20.0), at(30.0)));
    assert!(!wait_fits_deadline(Duration::MAX, at(20.0), at(30.0)));
}

fn ctx(now: f64, deadline: f64) -> AttemptContext {
    AttemptContext {
        now: at(now),
        deadline: at(deadline),
        same_provider_retries_used: 0,
        consecutive_failures: 1,
        next_provider_available: false,
        scope_paused_until: None,
    }
}

fn hinted(class: ErrorClass, hint: Option<Duration>) -> Classification {
    Classification {
        retry_after: hint,
        pause: hint,
        ..Classification::new(class)
    }
}

#[test]
fn next_attempt_request_error_gives_up_without_hint() {
    let c = hinted(ErrorClass::Request, None);
    let ctx = AttemptContext {
        next_provider_available: true,
        ..ctx(0.0, 60.0)
    };
    let d = next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng());
    assert_eq!(d, RetryDecision::GiveUp { retry_after: None });
}

#[test]
fn next_attempt_prefers_next_provider_for_capacity() {
    let c = hinted(ErrorClass::Capacity, Some(secs(2)));
    let ctx = AttemptContext {
        next_provider_available: true,
        ..ctx(0.0, 60.0)
    };
    assert_eq!(
        next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng()),
        RetryDecision::NextProvider
    );
}

#[test]
fn next_attempt_deadline_passed_gives_up_with_advertised_wait() {
    let c = hinted(ErrorClass::Capacity, Some(secs(7)));
    let ctx = AttemptContext {
        next_provider_available: true,
        ..ctx(60.0, 60.0)
    };
    let d = next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng());
    assert_eq!(
        d,
        RetryDecision::GiveUp {
            retry_after: Some(secs(7))
        }
    );
}

#[test]
fn next_attempt_no_hint_uses_backoff_for_same_provider() {
    let c = hinted(ErrorClass::Server, None);
    let ctx = AttemptContext {
        consecutive_failures: 3,
        ..ctx(0.0, 60.0)
    };
    match next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng()) {
        RetryDecision::SameProviderAfter(w) => assert!(w >= secs(2) && w <= secs(4), "{w:?}"),
        other => panic!("expected a same-provider retry, got {other:?}"),
    }
}

#[test]
fn next_attempt_waits_out_scope_pause() {
    let c = hinted(ErrorClass::Overload, None);
    let ctx = AttemptContext {
        scope_paused_until: Some(at(30.0)),
        ..ctx(10.0, 60.0)
    };
    let d = next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng());
    assert_eq!(d, RetryDecision::SameProviderAfter(secs(20)));
}

#[test]
fn next_attempt_allowance_spent_gives_up() {
    let c = hinted(ErrorClass::Capacity, Some(secs(3)));
    let ctx = AttemptContext {
        same_provider_retries_used: 1,
        ..ctx(0.0, 60.0)
    };
    let d = next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng());
    assert_eq!(
        d,
        RetryDecision::GiveUp {
            retry_after: Some(secs(3))
        }
    );
}

#[test]
fn next_attempt_timeout_auth_policy_never_retry_same_provider() {
    for class in [
        ErrorClass::Timeout,
        ErrorClass::Auth,
        ErrorClass::Policy,
        ErrorClass::Deadline,
    ] {
        let c = hinted(class, None);
        let policy = RetryPolicy {
            same_provider_retries: 5,
            ..RetryPolicy::default()
        };
        let d = next_attempt(&policy, &c, &ctx(0.0, 60.0), &mut rng());
        assert!(
            matches!(d, RetryDecision::GiveUp { .. }),
            "{class:?}: {d:?}"
        );
    }
}

#[test]
fn next_attempt_deadline_class_does_not_move_on() {
    let c = hinted(ErrorClass::Deadline, None);
    let ctx = AttemptContext {
        next_provider_available: true,
        ..ctx(0.0, 60.0)
    };
    let d = next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng());
    assert_eq!(d, RetryDecision::GiveUp { retry_after: None });
}

#[test]
fn next_attempt_min_attempt_time_shrinks_usable_deadline() {
    let c = hinted(ErrorClass::Capacity, Some(secs(5)));
    let policy = RetryPolicy {
        min_attempt_time: secs(10),
        hint_jitter: HintJitter {
            ratio: 0.0,
            max: Duration::ZERO,
        },
        ..RetryPolicy::default()
    };
    let d = next_attempt(&policy, &c, &ctx(0.0, 14.0), &mut rng());
    assert_eq!(
        d,
        RetryDecision::GiveUp {
            retry_after: Some(secs(5))
        }
    );
    let d = next_attempt(&policy, &c, &ctx(0.0, 16.0), &mut rng());
    assert_eq!(d, RetryDecision::SameProviderAfter(secs(5)));
}

#[test]
fn admit_single_probe_after_pause_then_open_on_success() {
    let mut p = Pauses::new();
    p.pause("P-A", secs(20), at(0.0), ErrorClass::Capacity);
    assert_eq!(
        p.admit(&["P-A"], at(19.0)),
        Admission::Paused { until: at(20.0) }
    );
    assert_eq!(p.admit(&["P-A"], at(20.5)), Admission::Probe);
    // Everyone else waits for the probe (up to the 10 s probe timeout).
    assert_eq!(
        p.admit(&["P-A"], at(20.6)),
        Admission::Paused { until: at(30.5) }
    );
    assert!(p.is_paused(&["P-A"], at(21.0)));
    p.probe_succeeded(&["P-A"]);
    assert_eq!(p.admit(&["P-A"], at(21.0)), Admission::Open);
    assert!(p.is_empty());
}

#[test]
fn admit_failed_probe_repauses_and_lost_probe_is_replaced() {
    let mut p = Pauses::new();
    p.pause("P-A", secs(20), at(0.0), ErrorClass::Capacity);
    assert_eq!(p.admit(&["P-A"], at(20.0)), Admission::Probe);
    // The probe got another 429 with Retry-After 30: the new pause replaces the window.
    assert_eq!(
        p.pause("P-A", secs(30), at(21.0), ErrorClass::Capacity),
        at(51.0)
    );
    p.probe_succeeded(&["P-A"]);
    assert!(
        p.is_paused(&["P-A"], at(40.0)),
        "a success report does not lift a fresh pause"
    );
    assert_eq!(p.admit(&["P-A"], at(51.0)), Admission::Probe);
    // That probe never reports back: after the probe timeout another one is allowed.
    assert_eq!(
        p.admit(&["P-A"], at(60.0)),
        Admission::Paused { until: at(61.0) }
    );
    assert_eq!(p.admit(&["P-A"], at(61.0)), Admission::Probe);
}

#[test]
fn admit_gate_expires_and_can_be_disabled() {
    let mut p = Pauses::new();
    p.pause("P-A", secs(5), at(0.0), ErrorClass::Capacity);
    assert_eq!(
        p.admit(&["P-A"], at(65.0)),
        Admission::Open,
        "idle past the 60 s gate"
    );
    let mut q = Pauses::with_probe(secs(10), Duration::ZERO);
    q.pause("P-A", secs(5), at(0.0), ErrorClass::Capacity);
    assert_eq!(q.admit(&["P-A"], at(5.0)), Admission::Open);
    assert_eq!(q.admit(&["P-A"], at(5.0)), Admission::Open);
}

#[test]
fn admit_group_probe_closes_siblings() {
    let mut p = Pauses::new();
    p.pause("group-a", secs(20), at(0.0), ErrorClass::Capacity);
    assert_eq!(p.admit(&["P-A1", "group-a"], at(20.0)), Admission::Probe);
    assert_eq!(
        p.admit(&["P-A2", "group-a"], at(20.1)),
        Admission::Paused { until: at(30.0) }
    );
    p.probe_succeeded(&["P-A1", "group-a"]);
    assert_eq!(p.admit(&["P-A2", "group-a"], at(20.2)), Admission::Open);
}

#[test]
fn next_attempt_policy_give_up_advertises_bounded_pause_not_weeks() {
    let c = Classification {
        retry_after: Some(secs(1_209_600)),
        pause: Some(secs(86_400)),
        ..Classification::new(ErrorClass::Policy)
    };
    let d = next_attempt(&RetryPolicy::default(), &c, &ctx(0.0, 60.0), &mut rng());
    assert_eq!(
        d,
        RetryDecision::GiveUp {
            retry_after: Some(secs(86_400))
        }
    );
}

#[test]
fn pause_failed_probe_shorter_hint_replaces_probe_window() {
    use switchyard_core::classify::ErrorClass;
    use switchyard_core::pause::{Admission, Pauses};
    use switchyard_core::time::Instant;
    let mut pauses = Pauses::new();
    let t0 = Instant::from_millis(0);
    pauses.pause("p-a", Duration::from_secs(5), t0, ErrorClass::Capacity);
    // The pause ends; the next request is the single probe and opens a probe window.
    let t1 = Instant::from_millis(5_000);
    assert_eq!(pauses.admit(&["p-a"], t1), Admission::Probe);
    // The probe gets a 429 with Retry-After: 2; the provider's own hint wins over the window.
    let until = pauses.pause("p-a", Duration::from_secs(2), t1, ErrorClass::Capacity);
    assert_eq!(until, Instant::from_millis(7_000));
    assert_eq!(
        pauses.paused_until(&["p-a"], t1),
        Some(Instant::from_millis(7_000))
    );
}
