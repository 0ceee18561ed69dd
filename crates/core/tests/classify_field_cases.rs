//! Field cases 1, 2 (pause part), 3, 7 and 18 (classification part), replayed against the pure
//! classifier, pause table and retry decision in virtual time.

// Test helpers fail loudly on bad fixtures; clippy exempts only `#[test]` fns themselves.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use switchyard_core::classify::{
    Classification, ErrorClass, POLICY_MIN_PAUSE, classify_response, classify_stream_error,
};
use switchyard_core::pause::{
    Admission, AttemptContext, PausePolicy, Pauses, RetryDecision, RetryPolicy, next_attempt,
};
use switchyard_core::time::Instant;

/// Wall clock at virtual time zero.
fn wall0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap()
}

fn wall(at: Instant) -> DateTime<Utc> {
    wall0() + chrono::Duration::from_std(at.since_origin()).unwrap()
}

fn headers(pairs: &[(&str, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn at(s: f64) -> Instant {
    Instant::from_origin(Duration::from_secs_f64(s))
}

const RATE_LIMIT_BODY: &str =
    r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;

/// Outcome of replaying one client request against a single provider (case 1).
#[derive(Debug)]
struct Replay {
    /// Start time of every upstream call.
    calls: Vec<Instant>,
    /// Hint the classifier read from each refused response.
    hints: Vec<Option<Duration>>,
    /// `Ok(t)`: success at t. `Err((t, retry_after))`: gave up at t.
    end: Result<Instant, (Instant, Option<Duration>)>,
}

/// Replays case 1: one provider, no fallback, `retries` same-provider retries, `deadline`;
/// `responses[n]` are the headers of the n-th refusal (given the wall clock of that moment);
/// the call after the last refusal succeeds.
fn replay_case_1(
    deadline: Duration,
    responses: &[&dyn Fn(DateTime<Utc>) -> HeaderMap],
    seed: u64,
) -> Replay {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let policy = RetryPolicy {
        same_provider_retries: 3,
        ..RetryPolicy::default()
    };
    let pause_policy = PausePolicy::default();
    let mut pauses = Pauses::new();
    let deadline = Instant::ZERO + deadline;
    let mut now = Instant::ZERO;
    let mut calls = Vec::new();
    let mut hints = Vec::new();
    for (n, respond) in responses.iter().enumerate() {
        assert!(
            pauses.paused_until(&["P-A"], now).is_none(),
            "call while paused"
        );
        calls.push(now);
        let c = classify_response(
            StatusCode::TOO_MANY_REQUESTS,
            &respond(wall(now)),
            RATE_LIMIT_BODY.as_bytes(),
            wall(now),
        );
        assert_eq!(c.class, ErrorClass::Capacity);
        hints.push(c.retry_after);
        if let Some(p) = pause_policy.scope_pause(&c, &mut rng) {
            pauses.pause("P-A", p, now, c.class);
        }
        let ctx = AttemptContext {
            now,
            deadline,
            same_provider_retries_used: u32::try_from(n).unwrap(),
            consecutive_failures: u32::try_from(n + 1).unwrap(),
            next_provider_available: false,
            scope_paused_until: pauses.paused_until(&["P-A"], now),
        };
        match next_attempt(&policy, &c, &ctx, &mut rng) {
            RetryDecision::SameProviderAfter(wait) => now = now + wait,
            RetryDecision::GiveUp { retry_after } => {
                return Replay {
                    calls,
                    hints,
                    end: Err((now, retry_after)),
                };
            }
            RetryDecision::NextProvider => panic!("no other provider exists"),
        }
    }
    assert!(now < deadline, "an attempt started after the deadline");
    calls.push(now);
    Replay {
        calls,
        hints,
        end: Ok(now),
    }
}

fn retry_after_secs(s: u64) -> impl Fn(DateTime<Utc>) -> HeaderMap {
    move |_| headers(&[("retry-after", s.to_string())])
}

/// Gap n must be ≥ the n-th advertised delay and ≤ +10 % of it.
fn assert_gaps(replay: &Replay, advertised: &[Duration]) {
    for (n, want) in advertised.iter().enumerate() {
        let gap = replay.calls[n + 1].saturating_since(replay.calls[n]);
        assert!(
            gap >= *want,
            "gap {n} {gap:?} shorter than advertised {want:?}"
        );
        assert!(
            gap <= want.mul_f64(1.1),
            "gap {n} {gap:?} beyond +10 % of {want:?}"
        );
    }
}

#[test]
fn case_01_each_retry_honours_its_own_retry_after() {
    for seed in 0..50 {
        let r = replay_case_1(
            secs(300),
            &[
                &retry_after_secs(5),
                &retry_after_secs(15),
                &retry_after_secs(40),
            ],
            seed,
        );
        assert_eq!(r.calls.len(), 4, "4 upstream calls");
        assert_eq!(r.hints, [Some(secs(5)), Some(secs(15)), Some(secs(40))]);
        assert_gaps(&r, &[secs(5), secs(15), secs(40)]);
        let done = r.end.unwrap();
        assert!(done >= at(60.0), "success at {done:?}");
    }
}

#[test]
fn case_01_explicit_retry_after_wins_over_window_reset_headers() {
    // Real providers (and the mock) also send the bucket's full-window reset on every 429.
    let with_window = |s: u64| {
        move |_: DateTime<Utc>| {
            headers(&[
                ("retry-after", s.to_string()),
                ("x-ratelimit-remaining-requests", "0".to_owned()),
                ("x-ratelimit-reset-requests", "59.75s".to_owned()),
            ])
        }
    };
    let r = replay_case_1(
        secs(300),
        &[&with_window(5), &with_window(15), &with_window(40)],
        1,
    );
    assert_eq!(r.hints, [Some(secs(5)), Some(secs(15)), Some(secs(40))]);
    assert_gaps(&r, &[secs(5), secs(15), secs(40)]);
}

#[test]
fn case_01h_http_date_and_reset_headers_are_read() {
    let http_date_15s = |now: DateTime<Utc>| {
        // HTTP-dates have whole seconds; the provider rounds its own clock.
        let target = now + chrono::Duration::seconds(15);
        let text = httpdate::fmt_http_date(std::time::SystemTime::from(target));
        headers(&[("retry-after", text)])
    };
    for (reset, want) in [("40s", secs(40)), ("1m30s", secs(90))] {
        let third =
            move |_: DateTime<Utc>| headers(&[("x-ratelimit-reset-requests", reset.to_owned())]);
        for seed in 0..20 {
            let r = replay_case_1(
                secs(300),
                &[&retry_after_secs(5), &http_date_15s, &third],
                seed,
            );
            assert_eq!(r.calls.len(), 4);
            let date_hint = r.hints[1].unwrap();
            assert!(
                date_hint >= secs(14) && date_hint <= secs(16),
                "HTTP-date parsed to {date_hint:?}"
            );
            assert_eq!(r.hints[2], Some(want), "{reset}");
            assert_gaps(&r, &[secs(5), date_hint, want]);
        }
    }
}

#[test]
fn case_01_deadline_30s_gives_up_before_deadline_with_remaining_wait() {
    for seed in 0..50 {
        let r = replay_case_1(
            secs(30),
            &[
                &retry_after_secs(5),
                &retry_after_secs(15),
                &retry_after_secs(40),
            ],
            seed,
        );
        assert_eq!(r.calls.len(), 3, "the 4th attempt would start after 30 s");
        assert!(r.calls.iter().all(|c| *c < at(30.0)));
        let (gave_up_at, retry_after) = r.end.unwrap_err();
        assert!(gave_up_at < at(30.0), "client answered within 30 s");
        let retry_after = retry_after.unwrap();
        assert!(
            retry_after >= secs(40),
            "Retry-After {retry_after:?} < remaining advertised 40 s"
        );
    }
}

#[test]
fn case_02_quota_group_pause_covers_sibling_providers() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut pauses = Pauses::new();
    let c = classify_response(
        StatusCode::TOO_MANY_REQUESTS,
        &headers(&[("retry-after", "20".to_owned())]),
        RATE_LIMIT_BODY.as_bytes(),
        wall0(),
    );
    let p = PausePolicy::default().scope_pause(&c, &mut rng).unwrap();
    // P-A1 discovered the 429; the pause goes on the shared quota group.
    pauses.pause("group-a", p, at(0.0), c.class);
    for t in [0.0, 5.0, 19.99] {
        assert!(pauses.is_paused(&["P-A1", "group-a"], at(t)));
        assert!(
            pauses.is_paused(&["P-A2", "group-a"], at(t)),
            "sibling paused at {t}"
        );
    }
    assert!(!pauses.is_paused(&["P-A2", "group-a"], at(21.01)));
    // The request that found the 429 moves on to P-B instead of trying the sibling.
    let ctx = AttemptContext {
        now: at(0.0),
        deadline: at(60.0),
        same_provider_retries_used: 0,
        consecutive_failures: 1,
        next_provider_available: true,
        scope_paused_until: pauses.paused_until(&["P-A1", "group-a"], at(0.0)),
    };
    assert_eq!(
        next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng),
        RetryDecision::NextProvider
    );
}

/// Classifies one case-3 response, then checks the request moves on at once, is never held on
/// P-A, and P-A stays paused for the whole 10-minute follow-up.
fn case_03_exhausted(status: u16, hdrs: HeaderMap, body: &str) -> Classification {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let c = classify_response(
        StatusCode::from_u16(status).unwrap(),
        &hdrs,
        body.as_bytes(),
        wall0(),
    );
    assert_eq!(c.class, ErrorClass::Policy, "{c:?}");
    assert!(c.pause.unwrap() >= POLICY_MIN_PAUSE, "{c:?}");
    assert!(!c.class.retry_same_provider());

    let base = AttemptContext {
        now: at(0.3),
        deadline: at(60.3),
        same_provider_retries_used: 0,
        consecutive_failures: 1,
        next_provider_available: true,
        scope_paused_until: None,
    };
    // Even with generous same-provider retries, P-A gets exactly one call.
    let policy = RetryPolicy {
        same_provider_retries: 3,
        ..RetryPolicy::default()
    };
    assert_eq!(
        next_attempt(&policy, &c, &base, &mut rng),
        RetryDecision::NextProvider
    );
    let alone = AttemptContext {
        next_provider_available: false,
        ..base
    };
    assert!(
        matches!(
            next_attempt(&policy, &c, &alone, &mut rng),
            RetryDecision::GiveUp { .. }
        ),
        "never held open waiting on the provider"
    );

    let mut pauses = Pauses::new();
    let p = PausePolicy::default().scope_pause(&c, &mut rng).unwrap();
    pauses.pause("P-A", p, at(0.3), c.class);
    // 100 follow-up requests over the next 10 minutes: none may reach P-A.
    let reached = (0..100)
        .filter(|k| !pauses.is_paused(&["P-A"], at(0.3 + f64::from(*k) * 6.0)))
        .count();
    assert_eq!(reached, 0);
    c
}

#[test]
fn case_03a_insufficient_quota_429_is_exhaustion() {
    let body = json!({"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota", "param": null, "code": "insufficient_quota"}});
    let c = case_03_exhausted(429, HeaderMap::new(), &body.to_string());
    assert_eq!(c.code.as_deref(), Some("insufficient_quota"));
}

#[test]
fn case_03b_usage_limit_until_date_400_is_exhaustion() {
    let two_weeks = wall0() + chrono::Duration::days(14);
    let message = format!(
        "You have reached your specified API usage limits. You will regain access on {} at 00:00 UTC.",
        two_weeks.format("%Y-%m-%d")
    );
    let body =
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    let c = case_03_exhausted(400, HeaderMap::new(), &body.to_string());
    // The date is two weeks away: the hint says so, the pause is bounded to a day.
    assert!(c.retry_after.unwrap() > secs(13 * 86_400));
    assert_eq!(c.pause, Some(secs(86_400)));
    assert_eq!(c.message.as_deref(), Some(message.as_str()));
}

#[test]
fn case_03c_insufficient_credits_402_is_exhaustion() {
    let body = json!({"error": {"message": "insufficient credits", "code": 402}});
    let c = case_03_exhausted(402, HeaderMap::new(), &body.to_string());
    assert_eq!(c.pause, Some(POLICY_MIN_PAUSE));
}

#[test]
fn case_03d_two_week_retry_after_is_exhaustion_not_a_wait() {
    let c = case_03_exhausted(
        429,
        headers(&[("retry-after", "1209600".to_owned())]),
        RATE_LIMIT_BODY,
    );
    assert_eq!(c.retry_after, Some(secs(1_209_600)));
    assert_eq!(c.pause, Some(secs(86_400)));
}

#[test]
fn case_03e_invalid_parameter_is_request_error_no_pause_no_fallback() {
    let body = json!({"error": {"message": "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 7 instead.",
        "type": "invalid_request_error", "param": "temperature", "code": "decimal_above_max_value"}});
    let c = classify_response(
        StatusCode::BAD_REQUEST,
        &HeaderMap::new(),
        body.to_string().as_bytes(),
        wall0(),
    );
    assert_eq!(c.class, ErrorClass::Request);
    assert_eq!(c.pause, None);
    assert_eq!(c.retry_after, None);
    assert!(!c.class.is_provider_side(), "availability unchanged");
    assert!(
        c.message.as_deref().unwrap().contains("got 7"),
        "client gets the provider's message"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    assert_eq!(PausePolicy::default().scope_pause(&c, &mut rng), None);
    let ctx = AttemptContext {
        now: at(0.3),
        deadline: at(60.0),
        same_provider_retries_used: 0,
        consecutive_failures: 1,
        next_provider_available: true,
        scope_paused_until: None,
    };
    assert_eq!(
        next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng),
        RetryDecision::GiveUp { retry_after: None },
        "no fallback to P-B"
    );
}

/// Records the pause for a 429 with or without a `Retry-After`, as the router does.
fn record_429(
    pauses: &mut Pauses,
    now: Instant,
    retry_after: Option<u64>,
    rng: &mut ChaCha8Rng,
) -> Instant {
    let hdrs = match retry_after {
        Some(s) => headers(&[("retry-after", s.to_string())]),
        None => HeaderMap::new(),
    };
    let c = classify_response(
        StatusCode::TOO_MANY_REQUESTS,
        &hdrs,
        RATE_LIMIT_BODY.as_bytes(),
        wall(now),
    );
    let p = PausePolicy::default().scope_pause(&c, rng).unwrap();
    pauses.pause("P-A", p, now, c.class)
}

#[test]
fn case_07_shorter_pause_never_cuts_longer() {
    let mut pauses = Pauses::new();
    assert_eq!(
        pauses.pause("P-A", secs(120), at(0.0), ErrorClass::Capacity),
        at(120.0)
    );
    assert_eq!(
        pauses.pause("P-A", secs(60), at(5.0), ErrorClass::Capacity),
        at(120.0)
    );
    assert_eq!(
        pauses.pause("P-A", secs(1), at(6.0), ErrorClass::Capacity),
        at(120.0)
    );
    assert_eq!(pauses.paused_until(&["P-A"], at(119.0)), Some(at(120.0)));
}

#[test]
fn case_07_variant_1_default_cooldown_extends_short_retry_after() {
    for seed in 0..20 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut pauses = Pauses::new();
        let first = record_429(&mut pauses, at(0.0), Some(1), &mut rng);
        assert!(first >= at(1.0) && first <= at(1.05));
        let second = record_429(&mut pauses, at(0.25), None, &mut rng);
        // Default cooldown 60 s from the second 429, plus at most 5 % jitter (3 s).
        assert!(second >= at(60.25) && second <= at(63.25), "{second:?}");
        for t in [1.25, 2.0, 30.0, 60.24] {
            assert!(
                pauses.is_paused(&["P-A"], at(t)),
                "P-A must stay paused at {t}"
            );
        }
        assert!(!pauses.is_paused(&["P-A"], at(63.26)));
    }
}

#[test]
fn case_07_variant_2_headerless_429_does_not_shorten_retry_after_120() {
    for seed in 0..20 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut pauses = Pauses::new();
        let first = record_429(&mut pauses, at(0.0), Some(120), &mut rng);
        let second = record_429(&mut pauses, at(5.0), None, &mut rng);
        assert_eq!(second, first, "the effective deadline is the max");
        assert!(first >= at(120.0) && first <= at(125.0));
        for t in [65.0, 66.0, 100.0, 119.99] {
            assert!(
                pauses.is_paused(&["P-A"], at(t)),
                "P-A reopened early at {t}"
            );
        }
        assert!(!pauses.is_paused(&["P-A"], at(125.01)));
    }
}

#[test]
fn case_18_anthropic_overload_in_200_stream_fails_over() {
    // `message_start`, `ping`, then this `event: error` payload.
    let payload =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let c = classify_stream_error(&payload);
    assert_eq!(c.class, ErrorClass::Overload);
    assert_eq!(c.code.as_deref(), Some("overloaded_error"));
    assert!(
        c.class.is_provider_side(),
        "recorded as a failure, not a success"
    );
    let ctx = AttemptContext {
        now: at(0.5),
        deadline: at(60.0),
        same_provider_retries_used: 0,
        consecutive_failures: 1,
        next_provider_available: true,
        scope_paused_until: None,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    assert_eq!(
        next_attempt(&RetryPolicy::default(), &c, &ctx, &mut rng),
        RetryDecision::NextProvider
    );
}

#[test]
fn case_18_responses_failed_overloaded_and_quota_variants() {
    let failed = |code: &str| {
        json!({"type": "response.failed", "sequence_number": 3, "response": {"id": "resp_1", "object": "response",
            "status": "failed", "error": {"code": code, "message": "failed"}}})
    };
    let overloaded = classify_stream_error(&failed("server_is_overloaded"));
    assert_eq!(overloaded.class, ErrorClass::Overload);
    assert!(overloaded.class.retry_elsewhere());

    let quota = classify_stream_error(&failed("insufficient_quota"));
    assert_eq!(quota.class, ErrorClass::Policy, "quota failure per case 3");
    assert!(quota.pause.unwrap() >= POLICY_MIN_PAUSE);

    let error_event = json!({"type": "error", "code": "server_is_overloaded", "message": "overloaded", "param": null});
    assert_eq!(
        classify_stream_error(&error_event).class,
        ErrorClass::Overload
    );
}

#[test]
fn case_02_group_siblings_get_one_call_then_a_single_probe() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut pauses = Pauses::new();
    let policy = PausePolicy::default();
    let mut group_calls: Vec<(f64, &str)> = Vec::new();
    let mut served_by_b = 0;
    // 50 requests over 5 s; chains alternate between the two siblings, then P-B.
    for k in 0..50 {
        let t = f64::from(k) * 0.1;
        let chain: [&str; 2] = if k % 2 == 0 {
            ["P-A1", "P-A2"]
        } else {
            ["P-A2", "P-A1"]
        };
        let mut tried = Vec::new();
        for provider in chain {
            match pauses.admit(&[provider, "group-a"], at(t)) {
                Admission::Paused { .. } => continue,
                Admission::Open | Admission::Probe => {}
            }
            tried.push(provider);
            group_calls.push((t, provider));
            // The shared upstream account refuses everything before t = 20 s.
            let c = classify_response(
                StatusCode::TOO_MANY_REQUESTS,
                &headers(&[("retry-after", "20".to_owned())]),
                RATE_LIMIT_BODY.as_bytes(),
                wall(at(t)),
            );
            let p = policy.scope_pause(&c, &mut rng).unwrap();
            pauses.pause("group-a", p, at(t), c.class);
        }
        assert!(tried.len() <= 1, "request {k} hit both siblings: {tried:?}");
        // P-B is healthy and serves whatever the group did not.
        served_by_b += 1;
    }
    assert!(
        group_calls.len() <= 2,
        "group calls in [0, 20 s): {group_calls:?}"
    );
    assert_eq!(served_by_b, 50);

    // After the pause (20 s + at most 1 s jitter): ten requests arrive together; one probes.
    let after = pauses.paused_until(&["group-a"], at(5.0)).unwrap();
    assert!(after >= at(20.0) && after <= at(21.0));
    let t = after.since_origin().as_secs_f64();
    let verdicts: Vec<Admission> = (0..10)
        .map(|i| pauses.admit(&["P-A1", "group-a"], at(t + f64::from(i) * 0.01)))
        .collect();
    assert_eq!(
        verdicts.iter().filter(|v| **v == Admission::Probe).count(),
        1,
        "{verdicts:?}"
    );
    assert_eq!(verdicts[0], Admission::Probe);
    // The probe succeeds: both siblings open.
    pauses.probe_succeeded(&["P-A1", "group-a"]);
    assert_eq!(
        pauses.admit(&["P-A2", "group-a"], at(t + 0.5)),
        Admission::Open
    );
}
