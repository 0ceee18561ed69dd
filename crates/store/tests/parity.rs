//! Refusals from Redis match the in-process ones on a table of cases: the binding bucket, its
//! reason code, the kind of wait and its `Retry-After` rounding, the demand and the header
//! figures. Each case runs the same steps on a fresh in-process store and a fresh Redis
//! store, then compares the refusal of one last reservation.

// Test helpers outside #[test] functions: a failed setup must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use common::*;
use switchyard_core::quota::{BucketSpec, Demand, Dimension, Refusal, Rule, Scope, Usage, Wait};
use switchyard_store::{QuotaStore, Ticket};
use switchyard_testkit::RedisServer;

/// One step before the final reservation: reserve and hold, or reserve and reconcile.
enum Step {
    Hold(Demand),
    Reconcile(Demand, Usage),
}

struct Case {
    name: &'static str,
    buckets: Vec<Arc<BucketSpec>>,
    steps: Vec<Step>,
    last: Demand,
    /// Expected binding position, reason (a 10-minute period has no period word), and header
    /// seconds (`None`: no time wait).
    expect: (u32, &'static str, Option<u64>),
    /// Whether the wait depends on the wall clock's position in a window (compare ±1 s).
    windowed: bool,
}

/// 1,000 units per 10 minutes: one unit refills every 600 ms, so the few milliseconds
/// between the two stores' steps never change a figure.
fn slow_tokens(key: &str, scope: Scope, dim: Dimension) -> Arc<BucketSpec> {
    spec(
        key,
        scope,
        dim,
        Rule::TokenBucket {
            capacity: 1_000,
            period: Duration::from_secs(600),
        },
    )
}

fn itok(n: u64) -> Demand {
    input(n)
}

fn cases() -> Vec<Case> {
    let t_itok = slow_tokens("t1/itok", tenant("t1"), Dimension::InputTokens);
    let p_itok = slow_tokens(
        "pa/itok",
        Scope::Provider("P-A".into()),
        Dimension::InputTokens,
    );
    let per_minute_reqs = |cap| {
        spec(
            "t1/req/min",
            tenant("t1"),
            Dimension::Requests,
            Rule::FixedWindow {
                capacity: cap,
                period: Duration::from_secs(60),
                reset_at: None,
                tz: Tz::UTC,
            },
        )
    };
    let spend = spec(
        "t1/spend/day",
        tenant("t1"),
        Dimension::SpendMicroUsd,
        daily(100),
    );
    vec![
        Case {
            name: "token bucket waits for refill",
            buckets: vec![t_itok.clone()],
            steps: vec![Step::Hold(itok(700))],
            last: itok(600),
            // (600 − 300) × 600 s / 1,000 = 180 s, a little less by the time it is asked.
            expect: (0, "tenant_input_tokens", Some(180)),
            windowed: false,
        },
        Case {
            name: "demand above capacity never fits",
            buckets: vec![t_itok.clone()],
            steps: vec![],
            last: itok(1_500),
            expect: (0, "tenant_input_tokens", None),
            windowed: false,
        },
        Case {
            name: "overrun leaves debt to wait out",
            buckets: vec![t_itok.clone()],
            steps: vec![Step::Reconcile(itok(500), used_input(1_500))],
            last: itok(1),
            // level −500: (1 + 500) × 0.6 s = 300.6 s → 301.
            expect: (0, "tenant_input_tokens", Some(301)),
            windowed: false,
        },
        Case {
            name: "fixed window waits for its end",
            buckets: vec![per_minute_reqs(2)],
            steps: vec![Step::Hold(itok(1)), Step::Hold(itok(1))],
            last: itok(1),
            expect: (0, "tenant_requests_per_minute", Some(60)),
            windowed: true,
        },
        Case {
            name: "concurrency waits for a release",
            buckets: vec![t_itok.clone(), conc("t1/conc", 1)],
            steps: vec![Step::Hold(itok(1))],
            last: itok(1),
            expect: (1, "tenant_concurrency", None),
            windowed: false,
        },
        Case {
            name: "the longest wait binds: provider over tenant window",
            buckets: vec![per_minute_reqs(1), p_itok.clone()],
            steps: vec![Step::Hold(itok(1_000))],
            last: itok(1_000),
            // Provider: 1,000 × 0.6 s = 600 s; the window waits < 60 s.
            expect: (1, "provider_capacity", Some(600)),
            windowed: false,
        },
        Case {
            name: "never binds over a time wait",
            buckets: vec![p_itok.clone(), spend.clone()],
            steps: vec![Step::Hold(itok(1_000))],
            last: Demand {
                requests: 1,
                input_tokens: 10,
                spend_micro_usd: 200,
                ..Demand::default()
            },
            expect: (1, "tenant_spend", None),
            windowed: false,
        },
        Case {
            name: "a key listed twice is charged once",
            buckets: vec![t_itok.clone(), t_itok],
            steps: vec![Step::Hold(itok(600))],
            last: itok(600),
            // 400 left: (600 − 400) × 0.6 s = 120 s.
            expect: (0, "tenant_input_tokens", Some(120)),
            windowed: false,
        },
    ]
}

async fn run(store: &QuotaStore, case: &Case) -> (Box<Refusal>, Vec<Ticket>) {
    let mut held = Vec::new();
    for step in &case.steps {
        match step {
            Step::Hold(d) => held.push(store.reserve(&case.buckets, *d, TTL).await.unwrap()),
            Step::Reconcile(d, u) => {
                let t = store.reserve(&case.buckets, *d, TTL).await.unwrap();
                store.reconcile(t, *u).await;
            }
        }
    }
    let refusal = store
        .reserve(&case.buckets, case.last, TTL)
        .await
        .unwrap_err();
    (refusal, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refusals_match_in_process_refusals() {
    let server = RedisServer::start().unwrap();
    for case in cases() {
        let local = QuotaStore::in_process();
        let redis = redis_store(&server, &prefix("parity")).await;
        let (l, _held_l) = run(&local, &case).await;
        let (r, _held_r) = run(&redis, &case).await;
        let name = case.name;

        // Both agree with each other...
        assert_eq!(r.bucket, l.bucket, "{name}: binding bucket");
        assert_eq!(r.key, l.key, "{name}");
        assert_eq!(r.reason, l.reason, "{name}: reason code");
        assert_eq!(r.scope, l.scope, "{name}");
        assert_eq!(r.dimension, l.dimension, "{name}");
        assert_eq!(r.demanded, l.demanded, "{name}");
        assert_eq!(r.figures.limit, l.figures.limit, "{name}: limit");
        assert_eq!(
            r.figures.remaining, l.figures.remaining,
            "{name}: remaining"
        );
        match (l.wait, r.wait) {
            (Wait::After(a), Wait::After(b)) => {
                let (ha, hb) = (l.wait.header_secs().unwrap(), r.wait.header_secs().unwrap());
                if case.windowed {
                    assert!(
                        a.abs_diff(b) < Duration::from_secs(1),
                        "{name}: {a:?} vs {b:?}"
                    );
                    assert!(ha.abs_diff(hb) <= 1, "{name}");
                } else {
                    assert_eq!(ha, hb, "{name}: Retry-After rounding ({a:?} vs {b:?})");
                }
            }
            (a, b) => assert_eq!(a, b, "{name}: kind of wait"),
        }

        // ...and with the expected values.
        let (pos, reason, header) = case.expect;
        assert_eq!(r.bucket.index(), pos, "{name}");
        assert_eq!(r.reason, reason, "{name}");
        match header {
            Some(h) if case.windowed => assert!(r.wait.header_secs().unwrap() <= h, "{name}"),
            Some(h) => assert_eq!(r.wait.header_secs(), Some(h), "{name}"),
            None => assert!(r.retry_after().is_none(), "{name}"),
        }
    }
}
