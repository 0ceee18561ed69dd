//! One test per decision of the machine, driven over a [`LocalFleet`] with scripted facts.

use std::collections::VecDeque;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::quota::{BucketId, Dimension, RateFigures, Scope};

const T0: Instant = Instant::from_millis(1_000_000);

fn fleet(n: usize) -> LocalFleet {
    LocalFleet::new(
        (0..n).map(|i| format!("p{i}")).collect(),
        Duration::from_secs(600),
        1024,
    )
}

fn member(provider: usize) -> Member {
    Member {
        provider,
        fit: Fit::Serves,
        healthy: true,
        reservation: Reservation::None,
    }
}

fn request(project: &str, start: Instant, members: Vec<Member>) -> Request {
    Request {
        project: project.into(),
        start,
        members,
        queue: None,
        stream_input: None,
    }
}

fn fail(class: ErrorClass) -> Failure {
    Failure {
        classification: Classification::new(class),
        status: None,
    }
}

fn rate_limited(retry_after: Duration) -> Failure {
    let mut c = Classification::new(ErrorClass::Capacity);
    c.retry_after = Some(retry_after);
    c.pause = Some(retry_after);
    Failure {
        classification: c,
        status: Some(429),
    }
}

fn refusal(scope: Scope, wait: Wait) -> Box<Refusal> {
    Box::new(Refusal {
        bucket: BucketId::from_index(0),
        key: "k".into(),
        scope,
        dimension: Dimension::Requests,
        reason: "test_requests_per_minute".into(),
        wait,
        demanded: 1,
        figures: RateFigures {
            limit: 1,
            remaining: 0,
            reset_after: Duration::from_secs(60),
        },
    })
}

/// Scripted facts, consumed in order; an empty script answers `Ok`.
#[derive(Default)]
struct Script {
    reserve: VecDeque<Result<(), Box<Refusal>>>,
    outcomes: VecDeque<Result<(), Failure>>,
    queue: VecDeque<Result<(), QueueReason>>,
    /// Seed of the rng lent to the machine.
    seed: u64,
}

/// Drives `d` to its end, settling every attempt as a real driver would (10 ms per attempt).
/// Returns every action polled, the last one being `Served` or `Respond`.
fn drive(
    d: &mut Dispatch,
    fleet: &mut LocalFleet,
    now: &mut Instant,
    script: &mut Script,
) -> Vec<Action> {
    let mut rng = ChaCha8Rng::seed_from_u64(script.seed);
    let mut trace = Vec::new();
    for _ in 0..100 {
        let action = d.poll(fleet, *now, &mut rng);
        trace.push(action.clone());
        match action {
            Action::Reserve { .. } => {
                let r = script.reserve.pop_front().unwrap_or(Ok(()));
                d.handle(fleet, Event::Reserved(r));
            }
            Action::Send { member, spill, .. } => {
                *now = *now + Duration::from_millis(10);
                let outcome = script.outcomes.pop_front().unwrap_or(Ok(()));
                let end = match &outcome {
                    Ok(()) => Settled::Success,
                    Err(f) => Settled::Failure(f.classification.class),
                };
                settle(fleet, member, spill, end, *now, Duration::from_millis(10));
                d.handle(fleet, Event::Finished(outcome));
            }
            Action::Wait { until } => {
                *now = until.max(*now);
                d.handle(fleet, Event::Woke);
            }
            Action::Queue { .. } => {
                let r = script.queue.pop_front().unwrap_or(Ok(()));
                d.handle(fleet, Event::Queue(r));
            }
            Action::Served { .. } | Action::Respond(_) => return trace,
        }
    }
    panic!("the machine did not finish in 100 steps: {trace:?}");
}

fn sends(trace: &[Action]) -> Vec<usize> {
    trace
        .iter()
        .filter_map(|a| match a {
            Action::Send { member, .. } => Some(*member),
            _ => None,
        })
        .collect()
}

fn chain_of(fleet: &mut LocalFleet, project: &str) -> Vec<usize> {
    let names: Vec<&str> = fleet.names.iter().map(String::as_str).collect();
    crate::chain::sticky_chain(project, &names, &fleet.weights)
}

fn run(policy: Policy, fleet: &mut LocalFleet, req: Request, script: &mut Script) -> Vec<Action> {
    let mut now = req.start;
    let mut d = Dispatch::new(policy, req);
    drive(&mut d, fleet, &mut now, script)
}

#[test]
fn a_healthy_chain_is_served_by_its_head_and_stays_pinned() {
    let mut f = fleet(3);
    let chain = chain_of(&mut f, "proj-a");
    let members: Vec<Member> = (0..3).map(member).collect();
    for i in 0..3 {
        let start = T0 + Duration::from_secs(i);
        let trace = run(
            Policy::default(),
            &mut f,
            request("proj-a", start, members.clone()),
            &mut Script::default(),
        );
        assert_eq!(sends(&trace), vec![chain[0]]);
        assert_eq!(
            trace.last(),
            Some(&Action::Served {
                member: chain[0],
                fallback: false,
                affinity_break: false
            })
        );
    }
    assert_eq!(f.tallies[chain[0]].successes, 3);
}

#[test]
fn health_filter_fails_open_when_it_would_leave_nobody() {
    let mut f = fleet(2);
    let mut members: Vec<Member> = (0..2).map(member).collect();
    members[0].healthy = false;
    members[1].healthy = false;
    let trace = run(
        Policy::default(),
        &mut f,
        request("p", T0, members.clone()),
        &mut Script::default(),
    );
    assert_eq!(sends(&trace).len(), 1, "all unhealthy: probes are doubted");

    // One healthy: only it is a candidate, whatever the chain says.
    members[1].healthy = true;
    for project in ["a", "b", "c", "d", "e", "f"] {
        let trace = run(
            Policy::default(),
            &mut f,
            request(project, T0, members.clone()),
            &mut Script::default(),
        );
        assert_eq!(sends(&trace), vec![1], "project {project}");
    }
}

#[test]
fn members_outside_the_regions_are_left_out_and_said_so() {
    let mut f = fleet(2);
    let mut members: Vec<Member> = (0..2).map(member).collect();
    members[0].fit = Fit::OutsideRegions;
    members[1].fit = Fit::Unsuitable;
    let trace = run(
        Policy::default(),
        &mut f,
        request("p", T0, members),
        &mut Script::default(),
    );
    assert_eq!(
        trace,
        vec![Action::Respond(Verdict::NoProvider {
            region_excluded: true
        })]
    );
}

#[test]
fn a_server_error_falls_back_and_the_project_follows_to_the_new_member() {
    let mut f = fleet(3);
    let chain = chain_of(&mut f, "proj");
    let members: Vec<Member> = (0..3).map(member).collect();
    let mut script = Script {
        outcomes: [Err(fail(ErrorClass::Server))].into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members.clone()),
        &mut script,
    );
    assert_eq!(sends(&trace), vec![chain[0], chain[1]]);
    assert_eq!(
        trace.last(),
        Some(&Action::Served {
            member: chain[1],
            fallback: true,
            affinity_break: true
        })
    );
    // The next request goes straight to where the cache now is.
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0 + Duration::from_secs(1), members),
        &mut Script::default(),
    );
    assert_eq!(sends(&trace), vec![chain[1]]);
    assert_eq!(f.tallies[chain[0]].provider_errors, 1);
}

#[test]
fn a_rate_limited_provider_is_paused_and_skipped_with_a_count() {
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    let members: Vec<Member> = (0..2).map(member).collect();
    let mut script = Script {
        outcomes: [Err(rate_limited(Duration::from_secs(30)))].into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members.clone()),
        &mut script,
    );
    assert_eq!(sends(&trace), vec![chain[0], chain[1]]);
    let head = &f.names[chain[0]];
    let until = f.pauses.paused_until(&[head], T0).expect("paused");
    assert!(until >= T0 + Duration::from_secs(30));
    // A 429 is a penalty, not a breaker failure.
    assert_eq!(
        f.breakers[chain[0]].state(T0 + Duration::from_secs(1)),
        BreakerState::Closed
    );

    // Another project whose chain starts at the paused provider skips it.
    let other = (0..200)
        .map(|i| format!("other-{i}"))
        .find(|p| chain_of(&mut f, p)[0] == chain[0])
        .expect("some project starts there");
    let trace = run(
        Policy::default(),
        &mut f,
        request(&other, T0 + Duration::from_secs(1), members),
        &mut Script::default(),
    );
    assert_eq!(sends(&trace), vec![chain[1]]);
    assert_eq!(f.tallies[chain[0]].skipped_paused, 1);
}

#[test]
fn every_member_paused_answers_with_the_earliest_end_or_waits_for_it() {
    let mut f = fleet(2);
    f.pauses
        .pause("p0", Duration::from_secs(20), T0, ErrorClass::Capacity);
    f.pauses
        .pause("p1", Duration::from_secs(8), T0, ErrorClass::Capacity);
    let members: Vec<Member> = (0..2).map(member).collect();
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members.clone()),
        &mut Script::default(),
    );
    assert_eq!(
        trace,
        vec![Action::Respond(Verdict::Unavailable {
            retry_after: Some(Duration::from_secs(8)),
            region_excluded: false
        })]
    );

    // With pauseWait ≥ 8 s the request waits and is then served by the probe of p1.
    let policy = Policy {
        pause_wait: Duration::from_secs(10),
        ..Policy::default()
    };
    let trace = run(
        policy,
        &mut f,
        request("proj2", T0, members),
        &mut Script::default(),
    );
    assert_eq!(
        trace[0],
        Action::Wait {
            until: T0 + Duration::from_secs(8)
        }
    );
    assert_eq!(sends(&trace), vec![1]);
}

#[test]
fn an_open_circuit_is_skipped_and_counted() {
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    f.breakers[chain[0]].force_open(T0 + Duration::from_secs(30), T0);
    let members: Vec<Member> = (0..2).map(member).collect();
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members),
        &mut Script::default(),
    );
    assert_eq!(sends(&trace), vec![chain[1]]);
    assert_eq!(f.tallies[chain[0]].skipped_open, 1);
    assert_eq!(f.tallies[chain[0]].skipped_paused, 0);
}

#[test]
fn the_first_request_after_a_pause_is_the_single_probe() {
    let mut f = fleet(2);
    let members: Vec<Member> = (0..2).map(member).collect();
    f.pauses
        .pause("p0", Duration::from_secs(5), T0, ErrorClass::Capacity);
    let after = T0 + Duration::from_secs(6);
    // Two projects that both start at p0, in flight together.
    let projects: Vec<String> = (0..400)
        .map(|i| format!("probe-{i}"))
        .filter(|p| chain_of(&mut f, p)[0] == 0)
        .take(2)
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut a = Dispatch::new(
        Policy::default(),
        request(&projects[0], after, members.clone()),
    );
    let mut b = Dispatch::new(Policy::default(), request(&projects[1], after, members));
    assert!(matches!(
        a.poll(&mut f, after, &mut rng),
        Action::Send { member: 0, .. }
    ));
    // While the probe is out, the second request goes elsewhere.
    assert!(matches!(
        b.poll(&mut f, after, &mut rng),
        Action::Send { member: 1, .. }
    ));
    // The probe's first byte opens the scope for everyone.
    a.handle(&mut f, Event::FirstByte);
    assert_eq!(
        f.pauses.admit(&["p0"], after + Duration::from_millis(1)),
        Admission::Open
    );
}

#[test]
fn a_provider_refusal_skips_on_and_a_full_fleet_answers_with_the_shortest_wait() {
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    let members: Vec<Member> = (0..2)
        .map(|i| Member {
            reservation: Reservation::Required,
            ..member(i)
        })
        .collect();
    let mut script = Script {
        reserve: [Err(refusal(
            Scope::Provider("x".into()),
            Wait::After(Duration::from_secs(3)),
        ))]
        .into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members.clone()),
        &mut script,
    );
    assert_eq!(sends(&trace), vec![chain[1]]);

    let mut script = Script {
        reserve: [
            Err(refusal(
                Scope::Provider("x".into()),
                Wait::After(Duration::from_secs(9)),
            )),
            Err(refusal(
                Scope::QuotaGroup("g".into()),
                Wait::After(Duration::from_secs(4)),
            )),
        ]
        .into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members),
        &mut script,
    );
    match trace.last() {
        Some(Action::Respond(Verdict::Quota {
            refusal,
            retry_after,
            queue: None,
        })) => {
            assert_eq!(refusal.scope, Scope::QuotaGroup("g".into()));
            assert_eq!(*retry_after, Some(Duration::from_secs(4)));
        }
        other => panic!("expected a quota verdict, got {other:?}"),
    }
}

#[test]
fn a_tenant_refusal_queues_unless_time_cannot_make_room_before_the_queue_deadline() {
    let members: Vec<Member> = (0..2)
        .map(|i| Member {
            reservation: Reservation::Required,
            ..member(i)
        })
        .collect();
    let queue = Some(QueueTerms {
        deadline: Duration::from_secs(10),
        join_first: false,
    });
    let tenant = |wait| refusal(Scope::Tenant("team".into()), wait);

    // Room in 2 s: queue, then a turn and a second reservation that succeeds.
    let mut f = fleet(2);
    let mut script = Script {
        reserve: [Err(tenant(Wait::After(Duration::from_secs(2))))].into(),
        ..Script::default()
    };
    let mut req = request("proj", T0, members.clone());
    req.queue = queue;
    let trace = run(Policy::default(), &mut f, req, &mut script);
    assert_eq!(
        trace[1],
        Action::Queue {
            deadline: T0 + Duration::from_secs(10),
            refill_after: Some(Duration::from_secs(2))
        }
    );
    assert!(matches!(trace.last(), Some(Action::Served { .. })));

    // Room only in 30 s, the queue waits 10 s: refused at once, not after 10 s.
    for wait in [Wait::After(Duration::from_secs(30)), Wait::Never] {
        let mut script = Script {
            reserve: [Err(tenant(wait))].into(),
            ..Script::default()
        };
        let mut req = request("proj", T0, members.clone());
        req.queue = queue;
        let trace = run(Policy::default(), &mut f, req, &mut script);
        assert_eq!(trace.len(), 2, "{trace:?}");
        assert!(matches!(
            trace[1],
            Action::Respond(Verdict::Quota { queue: None, .. })
        ));
    }

    // No queue: refused at once.
    let mut script = Script {
        reserve: [Err(tenant(Wait::After(Duration::from_secs(2))))].into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("proj", T0, members.clone()),
        &mut script,
    );
    assert!(matches!(
        trace.last(),
        Some(Action::Respond(Verdict::Quota { .. }))
    ));

    // Queued, and the wait expires: the refusal is the answer, with how the queue ended.
    let mut script = Script {
        reserve: [Err(tenant(Wait::OnRelease))].into(),
        queue: [Err(QueueReason::QueueDeadline)].into(),
        ..Script::default()
    };
    let mut req = request("proj", T0, members);
    req.queue = queue;
    let trace = run(Policy::default(), &mut f, req, &mut script);
    assert!(matches!(
        trace.last(),
        Some(Action::Respond(Verdict::Quota {
            queue: Some(QueueReason::QueueDeadline),
            ..
        }))
    ));
}

#[test]
fn joining_a_queue_that_has_others_waiting_comes_first() {
    let mut f = fleet(1);
    let mut req = request("proj", T0, vec![member(0)]);
    req.queue = Some(QueueTerms {
        deadline: Duration::from_secs(5),
        join_first: true,
    });
    let mut script = Script {
        queue: [Err(QueueReason::QueueFull)].into(),
        ..Script::default()
    };
    let trace = run(Policy::default(), &mut f, req, &mut script);
    assert_eq!(
        trace,
        vec![
            Action::Queue {
                deadline: T0 + Duration::from_secs(5),
                refill_after: None
            },
            Action::Respond(Verdict::QueueExpired {
                reason: QueueReason::QueueFull
            })
        ]
    );
}

#[test]
fn a_spend_limit_is_never_sent_to_an_unpriced_model() {
    let mut f = fleet(2);
    let members: Vec<Member> = (0..2)
        .map(|i| Member {
            reservation: Reservation::UnpricedSpend,
            ..member(i)
        })
        .collect();
    let trace = run(
        Policy::default(),
        &mut f,
        request("p", T0, members),
        &mut Script::default(),
    );
    assert_eq!(trace, vec![Action::Respond(Verdict::Unpriced)]);
}

#[test]
fn an_attempt_gets_half_of_the_time_left_while_a_fallback_is_possible() {
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    let members: Vec<Member> = (0..2).map(member).collect();
    let policy = Policy {
        deadline: Duration::from_secs(100),
        ..Policy::default()
    };
    let mut script = Script {
        outcomes: [Err(fail(ErrorClass::Timeout))].into(),
        ..Script::default()
    };
    let trace = run(policy, &mut f, request("proj", T0, members), &mut script);
    let deadlines: Vec<(usize, Instant)> = trace
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                member,
                attempt_deadline,
                ..
            } => Some((*member, *attempt_deadline)),
            _ => None,
        })
        .collect();
    assert_eq!(deadlines[0], (chain[0], T0 + Duration::from_secs(50)));
    // The last member has the whole request deadline.
    assert_eq!(deadlines[1], (chain[1], T0 + Duration::from_secs(100)));
}

#[test]
fn a_lone_provider_is_retried_after_a_backoff_and_a_request_error_is_returned() {
    let mut f = fleet(1);
    let mut script = Script {
        outcomes: [Err(fail(ErrorClass::Server))].into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("p", T0, vec![member(0)]),
        &mut script,
    );
    assert!(matches!(trace[1], Action::Wait { .. }), "{trace:?}");
    assert!(matches!(
        trace[2],
        Action::Send {
            member: 0,
            retry: true,
            ..
        }
    ));
    assert!(matches!(trace[3], Action::Served { member: 0, .. }));

    let mut f = fleet(2);
    let mut script = Script {
        outcomes: [Err(fail(ErrorClass::Request))].into(),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("p", T0, (0..2).map(member).collect()),
        &mut script,
    );
    assert_eq!(sends(&trace).len(), 1);
    assert!(matches!(
        trace.last(),
        Some(Action::Respond(Verdict::Rejected(f))) if f.classification.class == ErrorClass::Request
    ));
}

#[test]
fn a_class_outside_fallback_on_is_returned_as_given() {
    let mut f = fleet(2);
    let policy = Policy {
        fallback_on: [ErrorClass::Capacity].into_iter().collect(),
        ..Policy::default()
    };
    let mut script = Script {
        outcomes: [Err(fail(ErrorClass::Auth))].into(),
        ..Script::default()
    };
    let trace = run(
        policy,
        &mut f,
        request("p", T0, (0..2).map(member).collect()),
        &mut script,
    );
    assert_eq!(sends(&trace).len(), 1);
    assert!(matches!(
        trace.last(),
        Some(Action::Respond(Verdict::Rejected(_)))
    ));
}

#[test]
fn the_attempt_limit_the_retry_budget_and_the_fallback_throttle_stop_the_walk() {
    let members: Vec<Member> = (0..3).map(member).collect();
    let stopped = |f: &mut LocalFleet, policy: Policy| {
        let mut script = Script {
            outcomes: [
                Err(fail(ErrorClass::Timeout)),
                Err(fail(ErrorClass::Timeout)),
            ]
            .into(),
            ..Script::default()
        };
        let trace = run(policy, f, request("p", T0, members.clone()), &mut script);
        match trace.last() {
            Some(Action::Respond(Verdict::Exhausted { stop, .. })) => (sends(&trace).len(), *stop),
            other => panic!("{other:?}"),
        }
    };

    let mut f = fleet(3);
    let one = Policy {
        max_attempts: 1,
        ..Policy::default()
    };
    assert_eq!(stopped(&mut f, one), (1, Some(Stop::MaxAttempts)));

    let mut f = fleet(3);
    f.budget = Some(RetryBudget::new(0.0, Duration::from_secs(10), 0));
    assert_eq!(
        stopped(&mut f, Policy::default()),
        (1, Some(Stop::RetryBudget))
    );

    let mut f = fleet(3);
    f.throttle = Some(FallbackThrottle::new(0.0, 1));
    // One spill-over fits the burst; the second is throttled.
    assert_eq!(
        stopped(&mut f, Policy::default()),
        (2, Some(Stop::FallbackThrottled))
    );
}

#[test]
fn settle_opens_the_breaker_on_failures_but_not_on_capacity_answers() {
    let mut f = fleet(1);
    for i in 0..10 {
        let now = T0 + Duration::from_millis(i);
        assert!(f.breakers[0].try_acquire(now));
        settle(
            &mut f,
            0,
            false,
            Settled::Failure(ErrorClass::Capacity),
            now,
            Duration::from_millis(5),
        );
    }
    assert_eq!(f.breakers[0].state(T0), BreakerState::Closed);
    for i in 0..5 {
        let now = T0 + Duration::from_millis(100 + i);
        assert!(f.breakers[0].try_acquire(now));
        settle(
            &mut f,
            0,
            false,
            Settled::Failure(ErrorClass::Server),
            now,
            Duration::from_millis(5),
        );
    }
    assert!(matches!(
        f.breakers[0].state(T0 + Duration::from_millis(200)),
        BreakerState::Open { .. }
    ));
    assert_eq!(f.tallies[0].provider_errors, 15);
}

#[test]
fn cache_hold_waits_out_a_short_pause_of_a_pinned_head() {
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    let members: Vec<Member> = (0..2).map(member).collect();
    let policy = Policy {
        cache_hold: Some(Duration::from_secs(5)),
        ..Policy::default()
    };
    // Pin the project first.
    run(
        policy,
        &mut f,
        request("proj", T0, members.clone()),
        &mut Script::default(),
    );
    let head = f.names[chain[0]].clone();
    let at = T0 + Duration::from_secs(1);
    f.pauses
        .pause(&head, Duration::from_secs(3), at, ErrorClass::Capacity);
    let trace = run(
        policy,
        &mut f,
        request("proj", at, members.clone()),
        &mut Script::default(),
    );
    assert_eq!(
        trace[0],
        Action::Wait {
            until: at + Duration::from_secs(3)
        }
    );
    assert_eq!(sends(&trace), vec![chain[0]]);

    // A pause longer than the hold spills at once.
    let at = T0 + Duration::from_secs(100);
    f.pauses
        .pause(&head, Duration::from_secs(30), at, ErrorClass::Capacity);
    let trace = run(
        policy,
        &mut f,
        request("proj", at, members),
        &mut Script::default(),
    );
    assert_eq!(sends(&trace), vec![chain[1]]);
}

#[test]
fn cache_hold_spills_when_the_pause_outlasts_the_deadline() {
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    let members: Vec<Member> = (0..2).map(member).collect();
    let policy = Policy {
        cache_hold: Some(Duration::from_secs(5)),
        deadline: Duration::from_secs(1),
        ..Policy::default()
    };
    run(
        policy,
        &mut f,
        request("proj", T0, members.clone()),
        &mut Script::default(),
    );
    let head = f.names[chain[0]].clone();
    let at = T0 + Duration::from_secs(1);
    // Within the hold (3 s ≤ 5 s) but past the 1 s deadline: waiting could only fail.
    f.pauses
        .pause(&head, Duration::from_secs(3), at, ErrorClass::Capacity);
    let trace = run(
        policy,
        &mut f,
        request("proj", at, members),
        &mut Script::default(),
    );
    assert!(
        !trace.iter().any(|a| matches!(a, Action::Wait { .. })),
        "{trace:?}"
    );
    assert_eq!(sends(&trace), vec![chain[1]]);
}

#[test]
fn a_request_past_its_deadline_is_not_sent() {
    let mut f = fleet(2);
    let policy = Policy {
        deadline: Duration::from_secs(1),
        ..Policy::default()
    };
    let mut d = Dispatch::new(policy, request("p", T0, (0..2).map(member).collect()));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let late = T0 + Duration::from_secs(2);
    assert_eq!(
        d.poll(&mut f, late, &mut rng),
        Action::Respond(Verdict::Deadline { retry_after: None })
    );
    assert_eq!(d.attempts(), 0);
}

#[test]
fn p2c_skips_paused_members_and_prefers_the_less_loaded() {
    let mut f = fleet(3);
    f.pauses
        .pause("p0", Duration::from_secs(60), T0, ErrorClass::Capacity);
    let policy = Policy {
        order: Order::PowerOfTwoChoices,
        ..Policy::default()
    };
    let mut seen = [0u32; 3];
    for i in 0..40 {
        let trace = run(
            policy,
            &mut f,
            request(&format!("r{i}"), T0, (0..3).map(member).collect()),
            &mut Script {
                seed: i,
                ..Script::default()
            },
        );
        let s = sends(&trace);
        assert_eq!(s.len(), 1);
        seen[s[0]] += 1;
        assert!(matches!(
            trace.last(),
            Some(Action::Served {
                affinity_break: false,
                ..
            })
        ));
    }
    assert_eq!(seen[0], 0, "{seen:?}");
    assert_eq!(seen[1] + seen[2], 40);
    // Load on one member sends the picks to the other.
    for _ in 0..8 {
        f.p2c.on_start(1, T0);
    }
    for i in 0..10 {
        let trace = run(
            policy,
            &mut f,
            request(&format!("s{i}"), T0, (0..3).map(member).collect()),
            &mut Script {
                seed: i,
                ..Script::default()
            },
        );
        assert_eq!(sends(&trace), vec![2]);
    }
}

#[test]
fn polling_without_the_awaited_event_repeats_the_action() {
    let mut f = fleet(1);
    let mut d = Dispatch::new(Policy::default(), request("p", T0, vec![member(0)]));
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let first = d.poll(&mut f, T0, &mut rng);
    assert!(matches!(first, Action::Send { member: 0, .. }));
    assert_eq!(d.poll(&mut f, T0, &mut rng), first);
    // An event the phase does not wait for is ignored.
    d.handle(&mut f, Event::Woke);
    assert_eq!(d.poll(&mut f, T0, &mut rng), first);
    d.handle(&mut f, Event::Finished(Ok(())));
    let served = d.poll(&mut f, T0, &mut rng);
    assert!(matches!(served, Action::Served { member: 0, .. }));
    assert_eq!(d.poll(&mut f, T0, &mut rng), served);
}

#[test]
fn every_provider_refusing_before_anything_was_sent_queues_like_a_tenant_refusal() {
    let mut f = fleet(2);
    let members: Vec<Member> = (0..2)
        .map(|i| Member {
            reservation: Reservation::Required,
            ..member(i)
        })
        .collect();
    let full = || {
        refusal(
            Scope::Provider("x".into()),
            Wait::After(Duration::from_secs(1)),
        )
    };
    let mut script = Script {
        reserve: [Err(full()), Err(full())].into(),
        ..Script::default()
    };
    let mut req = request("proj", T0, members);
    req.queue = Some(QueueTerms {
        deadline: Duration::from_secs(10),
        join_first: false,
    });
    let trace = run(Policy::default(), &mut f, req, &mut script);
    assert!(
        trace.iter().any(|a| matches!(a, Action::Queue { .. })),
        "{trace:?}"
    );
    assert!(matches!(trace.last(), Some(Action::Served { .. })));
}

fn no_same_provider_retry() -> RetryPolicy {
    RetryPolicy {
        same_provider_retries: 0,
        ..RetryPolicy::default()
    }
}

#[test]
fn a_full_provider_is_waited_for_instead_of_failing_the_request() {
    // Both members answer 429 (Retry-After 2 s, then 3 s); with pauseWait the request waits
    // for the earliest pause end and is served there. Two refusals and one success = three
    // sends, yet `max_attempts: 2` is not used up: refusals for capacity do not count.
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "proj");
    let policy = Policy {
        max_attempts: 2,
        pause_wait: Duration::from_secs(30),
        retry: no_same_provider_retry(),
        ..Policy::default()
    };
    let mut script = Script {
        outcomes: VecDeque::from([
            Err(rate_limited(Duration::from_secs(2))),
            Err(rate_limited(Duration::from_secs(3))),
        ]),
        ..Script::default()
    };
    let trace = run(
        policy,
        &mut f,
        request("proj", T0, (0..2).map(member).collect()),
        &mut script,
    );
    // The third send goes to whichever pause ends first (pauses carry jitter).
    assert_eq!(sends(&trace)[..2], [chain[0], chain[1]], "{trace:?}");
    assert_eq!(sends(&trace).len(), 3, "{trace:?}");
    assert!(
        matches!(trace.last(), Some(Action::Served { .. })),
        "{trace:?}"
    );
    assert!(trace.iter().any(|a| matches!(a, Action::Wait { .. })));

    // Without pauseWait the same refusals answer the client at once.
    let mut f = fleet(2);
    let mut script = Script {
        outcomes: VecDeque::from([
            Err(rate_limited(Duration::from_secs(2))),
            Err(rate_limited(Duration::from_secs(3))),
        ]),
        ..Script::default()
    };
    let policy = Policy {
        max_attempts: 2,
        retry: no_same_provider_retry(),
        ..Policy::default()
    };
    let trace = run(
        policy,
        &mut f,
        request("proj", T0, (0..2).map(member).collect()),
        &mut script,
    );
    assert_eq!(sends(&trace).len(), 2);
    assert!(
        matches!(
            trace.last(),
            Some(Action::Respond(Verdict::Exhausted { .. }))
        ),
        "{trace:?}"
    );
}

#[test]
fn capacity_resends_are_capped() {
    // A provider that answers 429 forever: the request gives up after the free resends plus
    // its attempt limit, never loops.
    let mut f = fleet(1);
    let policy = Policy {
        max_attempts: 1,
        pause_wait: Duration::from_secs(3600),
        deadline: Duration::from_secs(3600),
        ..Policy::default()
    };
    let mut script = Script {
        outcomes: (0..20)
            .map(|_| Err(rate_limited(Duration::from_secs(1))))
            .collect(),
        ..Script::default()
    };
    let trace = run(
        policy,
        &mut f,
        request("proj", T0, vec![member(0)]),
        &mut script,
    );
    assert_eq!(
        sends(&trace).len() as u32,
        MAX_CAPACITY_RESENDS + 1,
        "{trace:?}"
    );
    assert!(matches!(
        trace.last(),
        Some(Action::Respond(Verdict::Exhausted { .. }))
    ));
}

#[test]
fn a_request_waiting_for_capacity_is_paced_not_dropped_by_the_retry_budget() {
    let mut f = fleet(2);
    // An empty budget: no retries at all, only first attempts.
    f.budget = Some(RetryBudget::new(0.0, Duration::from_secs(10), 0));
    let policy = Policy {
        pause_wait: Duration::from_secs(2),
        deadline: Duration::from_secs(5),
        ..Policy::default()
    };
    let mut script = Script {
        outcomes: VecDeque::from([Err(rate_limited(Duration::from_secs(1)))]),
        ..Script::default()
    };
    let trace = run(
        policy,
        &mut f,
        request("proj", T0, (0..2).map(member).collect()),
        &mut script,
    );
    // One send; every retry is refused by the budget, so the request waits for room until its
    // deadline (not only the 2 s of pauseWait: it met a full provider) and answers with the
    // provider's 429, not a budget stop.
    assert_eq!(sends(&trace).len(), 1, "{trace:?}");
    match trace.last() {
        Some(Action::Respond(Verdict::Exhausted { stop, .. })) => {
            assert_eq!(*stop, None, "{trace:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        trace
            .iter()
            .filter(|a| matches!(a, Action::Wait { .. }))
            .count()
            >= 2
    );
}

fn latency_sample(factor: f64, i: u64) -> crate::latency::LatencySample {
    let uncached = [1_000, 8_000, 30_000][(i % 3) as usize];
    let ttft = 0.5 + 0.03 * uncached as f64 / 1000.0;
    let jitter = 0.9 + 0.2 * ((i * 7919) % 100) as f64 / 100.0;
    crate::latency::LatencySample {
        total: Duration::from_secs_f64(factor * jitter * (ttft + 0.02 * 300.0)),
        first_token: Some(Duration::from_secs_f64(factor * jitter * ttft)),
        uncached_input: uncached,
        cached_input: 0,
        output: 300,
    }
}

#[test]
fn slow_successes_are_soft_errors_and_streams_get_an_adaptive_first_token_deadline() {
    let mut f = fleet(2);
    f.latency = vec![crate::latency::LatencyModel::new(); 2];
    // Cold: no judgement, no adaptive deadline.
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut req = request("proj", T0, vec![member(0), member(1)]);
    req.stream_input = Some(2_000);
    let mut m = Dispatch::new(Policy::default(), req.clone());
    match m.poll(&mut f, T0, &mut rng) {
        Action::Send {
            first_token_deadline,
            ..
        } => assert_eq!(first_token_deadline, None),
        other => panic!("{other:?}"),
    }
    for i in 0..200 {
        let at = T0 + Duration::from_secs(i);
        for p in 0..2 {
            let j = observe_latency(&mut f, p, &latency_sample(1.0, i), at).unwrap();
            assert!(!j.slow, "sample {i} of provider {p}: {j:?}");
        }
    }
    // Warm: a stream may wait 4 × the predicted first token (all input uncached), ≥ 2 s.
    let later = T0 + Duration::from_secs(300);
    let mut m = Dispatch::new(
        Policy::default(),
        Request {
            start: later,
            ..req
        },
    );
    match m.poll(&mut f, later, &mut rng) {
        Action::Send {
            first_token_deadline: Some(d),
            attempt_deadline,
            ..
        } => {
            let wait = d.saturating_since(later).as_secs_f64();
            // 4 × (0.5 s + 0.06 s) ≈ 2.24 s.
            assert!((2.0..2.6).contains(&wait), "{wait}");
            assert!(d <= attempt_deadline);
        }
        other => panic!("{other:?}"),
    }
    // Provider 0 three times slower, provider 1 as usual: only provider 0's answers are slow,
    // and each counts as a quarter of an error at the 0.5 % target.
    f.take_tallies();
    for i in 200..300 {
        let at = T0 + Duration::from_secs(i);
        assert!(
            observe_latency(&mut f, 0, &latency_sample(3.0, i), at)
                .unwrap()
                .slow
        );
        assert!(
            !observe_latency(&mut f, 1, &latency_sample(1.0, i), at)
                .unwrap()
                .slow
        );
    }
    let t = f.take_tallies();
    assert_eq!((t[0].slow, t[1].slow), (100, 0));
    assert_eq!(window_counts(&t[0], true, 0.005).provider_errors, 25);
    assert_eq!(window_counts(&t[1], true, 0.005).provider_errors, 0);
}

#[test]
fn a_full_provider_under_spill_over_is_counted_full_not_failed() {
    // Issue 18 item 1: the 429s of a provider that failures elsewhere filled are not errors of
    // that provider; the 429s of the traffic the weights sent it are.
    let mut f = fleet(2);
    let chain = chain_of(&mut f, "spilled");
    let (head, next) = (chain[0], chain[1]);
    let mut script = Script {
        outcomes: VecDeque::from([
            Err(fail(ErrorClass::Server)),
            Err(rate_limited(Duration::from_secs(1))),
        ]),
        ..Script::default()
    };
    let trace = run(
        Policy::default(),
        &mut f,
        request("spilled", T0, (0..2).map(member).collect()),
        &mut script,
    );
    assert_eq!(sends(&trace)[..2], [head, next], "{trace:?}");
    assert_eq!(f.tallies[head].provider_errors, 1);
    assert_eq!(f.tallies[next].provider_errors, 0, "{:?}", f.tallies[next]);
    assert_eq!(f.tallies[next].full_on_spill, 1);

    // A request skipping `next` while a 429 pause lasts, because its own head is down, is
    // counted the same way (not as a paused skip, which `skips_as_errors` would count).
    // ("spilled" itself now starts at `next`: it followed its cache there.)
    let other = (0..200)
        .map(|i| format!("other-{i}"))
        .find(|p| chain_of(&mut f, p)[0] == head)
        .expect("some project starts there");
    let later = T0 + Duration::from_secs(30);
    let (head_name, next_name) = (f.names[head].clone(), f.names[next].clone());
    f.pauses.pause(
        &head_name,
        Duration::from_secs(10),
        later,
        ErrorClass::Server,
    );
    f.pauses.pause(
        &next_name,
        Duration::from_secs(10),
        later,
        ErrorClass::Capacity,
    );
    let trace = run(
        Policy::default(),
        &mut f,
        request(&other, later, (0..2).map(member).collect()),
        &mut Script::default(),
    );
    assert!(sends(&trace).is_empty(), "{trace:?}");
    assert_eq!(f.tallies[head].skipped_paused, 1);
    assert_eq!(f.tallies[next].full_on_spill, 2, "{:?}", f.tallies[next]);
    assert_eq!(f.tallies[next].skipped_paused, 0);

    // A project whose first choice is `next` and meets its 429: an error of `next`.
    f.pauses.clear(&next_name);
    let own = (0..200)
        .map(|i| format!("own-{i}"))
        .find(|p| chain_of(&mut f, p)[0] == next)
        .expect("some project starts there");
    let mut script = Script {
        outcomes: VecDeque::from([Err(rate_limited(Duration::from_secs(1)))]),
        ..Script::default()
    };
    let _ = run(
        Policy::default(),
        &mut f,
        request(
            &own,
            later + Duration::from_secs(60),
            (0..2).map(member).collect(),
        ),
        &mut script,
    );
    assert_eq!(f.tallies[next].provider_errors, 1, "{:?}", f.tallies[next]);
    assert_eq!(f.tallies[next].full_on_spill, 2);
    let counts = window_counts(&f.tallies[next], true, 0.05);
    assert_eq!(counts.provider_errors, 1);
}

fn lined_fleet() -> LocalFleet {
    let mut f = fleet(1);
    // No single-probe gate: the lines alone decide who tries first after the pause.
    f.pauses = Pauses::with_probe(Duration::from_secs(10), Duration::ZERO);
    f.lines = Some(crate::waitline::WaitLines::default());
    f
}

fn waiting_policy() -> Policy {
    Policy {
        deadline: Duration::from_secs(60),
        pause_wait: Duration::from_secs(30),
        retry: no_same_provider_retry(),
        ..Policy::default()
    }
}

#[test]
fn waiters_of_a_full_provider_are_served_in_the_order_they_first_waited() {
    let mut f = lined_fleet();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let end = T0 + Duration::from_secs(10);
    f.pauses
        .pause("p0", Duration::from_secs(10), T0, ErrorClass::Capacity);
    let mut ds: Vec<Dispatch> = (0..3u64)
        .map(|i| {
            let at = T0 + Duration::from_secs(i);
            Dispatch::new(
                waiting_policy(),
                request(&format!("q{i}"), at, vec![member(0)]),
            )
            .with_waiter(i)
        })
        .collect();
    // The first waits to the pause end as the line's head; the others wait to be woken.
    for (i, d) in ds.iter_mut().enumerate() {
        let at = T0 + Duration::from_secs(i as u64);
        let action = d.poll(&mut f, at, &mut rng);
        let until = match action {
            Action::Wait { until } => until,
            other => panic!("request {i}: {other:?}"),
        };
        if i == 0 {
            assert_eq!(until, end);
        } else {
            assert_eq!(until, d.deadline(), "request {i} sleeps to its deadline");
        }
        assert!(d.in_wait_lines());
    }
    // A spurious wake-up does not let the last one jump the line.
    ds[2].handle(&mut f, Event::Woke);
    assert!(matches!(
        ds[2].poll(&mut f, end, &mut rng),
        Action::Wait { .. }
    ));
    // The head goes at the pause end, and its send wakes the next early.
    ds[0].handle(&mut f, Event::Woke);
    assert!(matches!(
        ds[0].poll(&mut f, end, &mut rng),
        Action::Send { .. }
    ));
    let lines = f.lines.as_mut().unwrap();
    assert_eq!(lines.take_woken(), vec![1]);
    ds[1].handle(&mut f, Event::Woke);
    assert!(matches!(
        ds[1].poll(&mut f, end, &mut rng),
        Action::Send { .. }
    ));
    assert_eq!(f.lines.as_mut().unwrap().take_woken(), vec![2]);
    ds[2].handle(&mut f, Event::Woke);
    assert!(matches!(
        ds[2].poll(&mut f, end, &mut rng),
        Action::Send { .. }
    ));
    // Served: every request leaves the lines, which are then empty.
    for d in &mut ds {
        d.handle(&mut f, Event::Finished(Ok(())));
        assert!(matches!(
            d.poll(&mut f, end, &mut rng),
            Action::Served { .. }
        ));
        assert!(!d.in_wait_lines());
    }
    assert!(f.lines.as_ref().unwrap().is_empty());
}

#[test]
fn a_waiter_whose_turn_comes_too_late_for_an_answer_gives_the_turn_away() {
    let mut f = lined_fleet();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // Served attempts from this line took 20 s.
    let lines = f.lines.as_mut().unwrap();
    lines.join("p0", 99, T0);
    lines.sent(99, "p0", T0);
    lines.attempt_done(99, T0 + Duration::from_secs(20), true);
    lines.leave(99);
    let start = T0 + Duration::from_secs(20);
    f.pauses
        .pause("p0", Duration::from_secs(45), start, ErrorClass::Capacity);
    let mut d =
        Dispatch::new(waiting_policy(), request("q", start, vec![member(0)])).with_waiter(1);
    assert!(matches!(
        d.poll(&mut f, start, &mut rng),
        Action::Wait { .. }
    ));
    // 45 s later it is the head with 15 s left: not sent, and it no longer waits there.
    let late = start + Duration::from_secs(45);
    d.handle(&mut f, Event::Woke);
    let action = d.poll(&mut f, late, &mut rng);
    assert!(matches!(action, Action::Respond(_)), "{action:?}");
    assert!(f.lines.as_ref().unwrap().is_empty());
}
