//! Weighted priority tiers in the simulator (issue 18 item 4, "Must show"): scenarios whose
//! providers set `priority` and `weight` run the router's dispatch machine with the tiered
//! cascade. For three list orders of the same providers over 10,000 project keys, each
//! provider's share of served requests is within 2 points of weight × availability normalised
//! in its tier; the weight-0 provider gets no attempt while another can serve and serves when
//! every other provider is down.

#![allow(clippy::unwrap_used, clippy::panic)]

use switchyard_sim::{RunResult, Scenario, StrategyKind, run_scenario};

/// Provider entries by name: alpha and beta share tier 0 on a 70/30 split, zeta sits in tier 0
/// at weight 0, gamma is the fallback tier. `outage` is added to every provider but zeta.
fn provider(name: &str, outage: &str) -> String {
    let (priority, weight) = match name {
        "alpha" => (0, 70),
        "beta" => (0, 30),
        "zeta" => (0, 0),
        _ => (1, 1),
    };
    let outages = if name == "zeta" { "" } else { outage };
    format!(
        "  - name: {name}\n    priority: {priority}\n    weight: {weight}\n    \
         latency: {{base: 500ms, jitter: 0.1}}\n{outages}"
    )
}

fn scenario(order: &[&str], outage: &str) -> Scenario {
    let providers: String = order.iter().map(|n| provider(n, outage)).collect();
    let text = format!(
        "name: tiers\nservice: chat\nduration: 30m\ninterval: 30s\nseed: 7\n\
         request_timeout: 60s\nproviders:\n{providers}\
         traffic:\n  kind: sessions\n  projects: 10000\n  sessions_per_minute: 800\n  \
         turns: [1, 1]\n  turn_gap: 10s\n  initial_context: 1000\n  tokens_per_turn: 100\n  \
         output_tokens: 50\n"
    );
    Scenario::from_yaml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Served requests and attempts per provider name over intervals `from..to`.
fn totals(run: &RunResult, name: &str, from: usize, to: usize) -> (u64, u64) {
    let p = run.providers.iter().position(|n| n == name).unwrap();
    run.intervals[from..to].iter().fold((0, 0), |(s, a), row| {
        (s + row.providers[p].served, a + row.providers[p].attempts)
    })
}

const ORDERS: [[&str; 4]; 3] = [
    ["alpha", "beta", "zeta", "gamma"],
    ["gamma", "zeta", "beta", "alpha"],
    ["zeta", "alpha", "gamma", "beta"],
];

#[test]
fn tiers_served_shares_follow_weights_for_any_list_order() {
    for order in ORDERS {
        let run = run_scenario(&scenario(&order, ""), StrategyKind::Switchyard);
        let n = run.intervals.len();
        let all: u64 = order.iter().map(|p| totals(&run, p, 0, n).0).sum();
        assert!(all > 20_000, "{all} requests served");
        assert_eq!(run.summary.client_errors, 0);
        for (name, want) in [("alpha", 0.7), ("beta", 0.3), ("gamma", 0.0), ("zeta", 0.0)] {
            let (served, attempts) = totals(&run, name, 0, n);
            let share = served as f64 / all as f64;
            eprintln!(
                "order {order:?}: {name} served {served} of {all} = {share:.4} (rule {want})"
            );
            assert!(
                (share - want).abs() <= 0.02,
                "order {order:?}: {name} {share:.4} vs {want}"
            );
            if name == "zeta" {
                assert_eq!(attempts, 0, "order {order:?}: weight-0 zeta got attempts");
            }
        }
    }
}

#[test]
fn tiers_weight_zero_serves_only_while_every_other_provider_is_down() {
    let outage = "    outages:\n      - {start: 10m, end: 20m, status: 503}\n";
    let sc = scenario(&ORDERS[0], outage);
    let per_minute = (60 / sc.interval.as_secs()) as usize;
    let run = run_scenario(&sc, StrategyKind::Switchyard);
    let (before, _) = (10 * per_minute, ());
    let (zeta_before, zeta_attempts_before) = totals(&run, "zeta", 0, before);
    assert_eq!((zeta_before, zeta_attempts_before), (0, 0));
    // From two minutes into the outage until it ends, zeta carries the traffic.
    let (from, to) = (12 * per_minute, 20 * per_minute);
    let (zeta_during, _) = totals(&run, "zeta", from, to);
    let others: u64 = ["alpha", "beta", "gamma"]
        .iter()
        .map(|p| totals(&run, p, from, to).0)
        .sum();
    eprintln!("outage: zeta served {zeta_during}, the others {others}");
    assert!(
        zeta_during > 5_000,
        "zeta served {zeta_during} during the outage"
    );
    assert_eq!(others, 0);
    // Once the others are back and have recovered, zeta gets nothing again.
    let (zeta_after, zeta_attempts_after) =
        totals(&run, "zeta", 25 * per_minute, run.intervals.len());
    eprintln!("after: zeta served {zeta_after}, attempts {zeta_attempts_after}");
    assert_eq!(zeta_attempts_after, 0);
}
