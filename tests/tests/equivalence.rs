//! The router and the simulator make the same decisions (issue 13 item 5).
//!
//! For generated scripts of provider outcomes (successes, 429 with `Retry-After`, 500/502/503,
//! timeouts, streams cut before and after content), one script per seed:
//! - a real `switchyard standalone` router serves a fixed sequence of streaming requests from a
//!   handful of projects, in front of three mock providers whose per-attempt faults follow the
//!   script (rules of `next: 1`, in order; `pass` is the success step);
//! - the simulator runs the same requests, at the same arrival offsets, through its engine,
//!   whose providers take their fates from the same script (`ProviderSpec::script`).
//!
//! The test asserts that both sent the same attempts to the same providers in the same order,
//! request by request, and that the same requests were served by the same provider. That is
//! what lets the simulator's figures stand for the router. (Its first run found a real
//! difference: a stream that sent no headers held the request until its whole deadline in
//! the router, where the machine ends the attempt at its share of the deadline and fails
//! over; the router now honours the attempt deadline before a stream's first content.)
//!
//! The comparison holds only where both see the same clock. Everything time-dependent is kept
//! out of reach of the run, which lasts a few seconds: `Retry-After` is 600 s, the breaker's
//! cooldown 10 min (both sides read the same `circuitBreaker`), the controller interval 10 min,
//! so pauses, open circuits, pins and weights change only through outcomes. The 5 s overload
//! cooldown of a 503 and the 10 s windows of the retry budget and the breaker's failure ratio
//! are longer than a run; the simulator's requests arrive at the router's measured offsets, so
//! deadlines (1 s per request, half of what is left per attempt) run out alike.

// Test helpers outside #[test] fns are test code too; clippy.toml's test allowances miss them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fmt::Write as _;
use std::time::Duration;

use common::{Policy, Provider, Setup, Stack, chat_body, serial};
use switchyard_mock::{Fault, FaultRule, FaultSet, Trigger};
use switchyard_sim::{Scenario, StrategyKind, run_scenario};
use tokio::time::Instant;

const MODEL: &str = "e2e-chat";
const PATH: &str = "/v1/chat/completions";
const PROVIDERS: [&str; 3] = ["eq-a", "eq-b", "eq-c"];
/// Requests per script.
const REQUESTS: usize = 36;
/// Distinct project keys (`project-0` …), so pins and move-to-front are exercised.
const PROJECTS: u64 = 5;
/// Scripted attempts per provider (more than any script can use up).
const STEPS: usize = 3 * REQUESTS;
/// Scripts (seeds) run.
const SEEDS: u64 = 10;

/// One attempt's fate, spelled for both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Ok,
    RateLimited,
    Server(u16),
    Timeout,
    CutBeforeContent,
    CutAfterContent,
}

/// `Retry-After` of every scripted 429 (longer than any run).
const RETRY_AFTER_SECS: u64 = 600;

impl Step {
    fn fault(self) -> Fault {
        match self {
            Step::Ok => Fault::Pass,
            Step::RateLimited => Fault::RateLimited {
                retry_after: Some(RETRY_AFTER_SECS),
                http_date: false,
                retry_after_ms: None,
                // The reset header agrees with Retry-After, as a vendor's does.
                reset_requests: Some(format!("{RETRY_AFTER_SECS}s")),
                reset_tokens: None,
            },
            Step::Server(503) => Fault::ServiceUnavailable { retry_after: None },
            Step::Server(status) => Fault::ServerError { status },
            Step::Timeout => Fault::HangNoHeaders,
            Step::CutBeforeContent => Fault::CutMidStream { after_deltas: 0 },
            Step::CutAfterContent => Fault::CutMidStream { after_deltas: 2 },
        }
    }

    fn yaml(self) -> String {
        match self {
            Step::Ok => "{kind: ok}".to_owned(),
            Step::RateLimited => {
                format!("{{kind: rate_limited, retry_after: {RETRY_AFTER_SECS}s}}")
            }
            Step::Server(s) => format!("{{kind: server, status: {s}}}"),
            Step::Timeout => "{kind: timeout}".to_owned(),
            Step::CutBeforeContent => "{kind: cut_before_content}".to_owned(),
            Step::CutAfterContent => "{kind: cut_after_content}".to_owned(),
        }
    }
}

/// SplitMix64: the script generator's dice.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A script: per provider, the fates of its first [`STEPS`] attempts, and the project of every
/// request. Roughly 60 % successes; at most two timeouts per provider so a run stays short.
fn generate(seed: u64) -> (Vec<Vec<Step>>, Vec<u64>) {
    let mut h = mix(seed ^ 0x5157_4954_4348);
    let mut next = || {
        h = mix(h);
        h
    };
    let steps = (0..PROVIDERS.len())
        .map(|_| {
            let mut timeouts = 0;
            (0..STEPS)
                .map(|_| match next() % 100 {
                    0..=59 => Step::Ok,
                    60..=63 => Step::RateLimited,
                    64..=71 => Step::Server(500),
                    72..=75 => Step::Server(502),
                    76..=80 => Step::Server(503),
                    81..=83 if timeouts < 2 => {
                        timeouts += 1;
                        Step::Timeout
                    }
                    81..=90 => Step::CutBeforeContent,
                    _ => Step::CutAfterContent,
                })
                .collect()
        })
        .collect();
    let projects = (0..REQUESTS).map(|_| next() % PROJECTS).collect();
    (steps, projects)
}

/// What one side did: per request, the providers it sent attempts to (in order) and the one
/// that served it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trace {
    attempts: Vec<Vec<&'static str>>,
    served_by: Vec<Option<&'static str>>,
}

fn describe(a: &Trace, b: &Trace) -> String {
    let mut out = String::new();
    for i in 0..a.attempts.len().max(b.attempts.len()) {
        let mark =
            if a.attempts.get(i) == b.attempts.get(i) && a.served_by.get(i) == b.served_by.get(i) {
                " "
            } else {
                "✗"
            };
        let _ = writeln!(
            out,
            "{mark} #{i:02}: router {:?} → {:?} | sim {:?} → {:?}",
            a.attempts.get(i),
            a.served_by.get(i).copied().flatten(),
            b.attempts.get(i),
            b.served_by.get(i).copied().flatten(),
        );
    }
    out
}

fn provider_index(name: &str) -> &'static str {
    PROVIDERS
        .iter()
        .find(|p| **p == name)
        .copied()
        .unwrap_or_else(|| panic!("unknown provider {name:?}"))
}

fn setup(steps: &[Vec<Step>]) -> Setup {
    let mut setup = Setup::new();
    for (name, script) in PROVIDERS.iter().zip(steps) {
        // Only chat calls take a step (a credential check or model listing would not).
        let rules: Vec<FaultRule> = script
            .iter()
            .map(|s| {
                FaultRule::next(1, s.fault()).when(Trigger {
                    next: Some(1),
                    paths: vec![PATH.to_owned()],
                    ..Trigger::default()
                })
            })
            .collect();
        setup = setup.provider(
            Provider::openai(name)
                .mock(|m| m.faults = FaultSet::rules(rules))
                .with("circuitBreaker: {cooldown: 10m, maxCooldown: 10m}"),
        );
    }
    setup.policy(
        Policy::chat(MODEL, &PROVIDERS)
            .set("deadline", "1s")
            .set("availability", "{interval: 10m}"),
    )
}

/// Runs the script through a real router; returns its trace and the requests' arrival offsets.
async fn router_trace(steps: &[Vec<Step>], projects: &[u64]) -> (Trace, Vec<Duration>) {
    let mut stack = Stack::start(setup(steps)).await;
    stack.reset_mocks();
    let mut trace = Trace {
        attempts: Vec::new(),
        served_by: Vec::new(),
    };
    let mut offsets = Vec::new();
    let mut seen: Vec<usize> = PROVIDERS
        .iter()
        .map(|p| stack.mock(p).call_count())
        .collect();
    let t0 = Instant::now();
    for project in projects {
        offsets.push(t0.elapsed());
        let key = format!("project-{project}");
        let reply = stack
            .stream(PATH, Some(&key), chat_body(MODEL, "hello there", true))
            .await;
        // This request's attempts: every mock's new calls, in arrival order on the mocks'
        // common clock (the router sends one attempt at a time).
        let mut calls: Vec<(Duration, &'static str)> = Vec::new();
        for (i, p) in PROVIDERS.iter().enumerate() {
            let all = stack.mock(p).calls();
            calls.extend(
                all[seen[i]..]
                    .iter()
                    .filter(|c| c.path == PATH)
                    .map(|c| (c.at, *p)),
            );
            seen[i] = all.len();
        }
        calls.sort();
        trace
            .attempts
            .push(calls.into_iter().map(|(_, p)| p).collect());
        trace.served_by.push(if reply.status == 200 {
            reply.provider().map(|p| provider_index(&p))
        } else {
            None
        });
    }
    (trace, offsets)
}

/// The same script in the simulator, with requests at the router's arrival offsets.
fn sim_trace(seed: u64, steps: &[Vec<Step>], projects: &[u64], offsets: &[Duration]) -> Trace {
    let mut yaml = format!(
        "name: equivalence-{seed}\nservice: chat\nduration: 10m\ninterval: 10m\nseed: {seed}\n\
         switchyard: {{deadline: 1s, circuit_breaker: {{cooldown: 10m, max_cooldown: 10m}}}}\n\
         providers:\n"
    );
    for (name, script) in PROVIDERS.iter().zip(steps) {
        let script: Vec<String> = script.iter().map(|s| s.yaml()).collect();
        let _ = writeln!(
            yaml,
            "  - {{name: {name}, latency: {{base: 2ms}}, error_latency: 1ms, script: [{}]}}",
            script.join(", ")
        );
    }
    yaml.push_str("traffic:\n  kind: script\n  requests:\n");
    for (p, at) in projects.iter().zip(offsets) {
        let _ = writeln!(yaml, "    - {{at: {}us, project: {p}}}", at.as_micros());
    }
    let scenario = Scenario::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let run = run_scenario(&scenario, StrategyKind::Switchyard);
    let mut attempts = vec![Vec::new(); projects.len()];
    for a in &run.replay.attempts {
        attempts[a.request as usize].push(PROVIDERS[a.provider]);
    }
    Trace {
        attempts,
        served_by: run
            .replay
            .served_by
            .iter()
            .map(|p| p.map(|i| PROVIDERS[i]))
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_and_simulator_send_the_same_attempts_for_generated_scripts() {
    let _g = serial().await;
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for seed in 0..SEEDS {
        let (steps, projects) = generate(seed);
        let (router, offsets) = router_trace(&steps, &projects).await;
        let sim = sim_trace(seed, &steps, &projects, &offsets);
        assert_eq!(
            router,
            sim,
            "seed {seed}: the router and the simulator diverged\n{}",
            describe(&router, &sim)
        );
        // What the script exercised: the attempts both sides sent, by scripted fate.
        let mut used = vec![0usize; PROVIDERS.len()];
        for a in router.attempts.iter().flatten() {
            let p = PROVIDERS.iter().position(|n| n == a).unwrap();
            *kinds.entry(format!("{:?}", steps[p][used[p]])).or_default() += 1;
            used[p] += 1;
        }
        let fallbacks = router.attempts.iter().filter(|a| a.len() > 1).count();
        let failed = router.served_by.iter().filter(|s| s.is_none()).count();
        eprintln!("seed {seed}: {fallbacks} requests failed over, {failed} not served");
    }
    eprintln!("attempts by scripted fate over all seeds: {kinds:?}");
    // The scripts must reach every kind of fate, or the comparison proves less than it says.
    for kind in [
        "Ok",
        "RateLimited",
        "Server(500)",
        "Server(503)",
        "Timeout",
        "CutBeforeContent",
        "CutAfterContent",
    ] {
        assert!(
            kinds.get(kind).copied().unwrap_or(0) > 0,
            "no attempt met {kind}: {kinds:?}"
        );
    }
}
