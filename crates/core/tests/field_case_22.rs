//! Field case 22 (chain-stability part): project affinity lasts as long as the prompt cache and
//! moves only on failure. Two providers at equal priority and weight; one 10-turn conversation
//! with gaps 30 s, 30 s, 6 min, 30 s, 12 min, 30 s, 45 min, 30 s, 30 s, served by 3 router
//! replicas in rotation (each with its own pin cache).

use std::time::Duration;

use switchyard_core::chain::{ChainPins, DEFAULT_PIN, first_eligible, sticky_chain};
use switchyard_core::time::Instant;

const NAMES: [&str; 2] = ["P-A", "P-B"];
const EQUAL: [f64; 2] = [0.5, 0.5];

/// Turn times from the case's gaps.
fn turn_times() -> Vec<Instant> {
    let s = Duration::from_secs;
    let gaps = [
        s(30),
        s(30),
        s(360),
        s(30),
        s(720),
        s(30),
        s(2_700),
        s(30),
        s(30),
    ];
    let mut t = Instant::ZERO;
    let mut out = vec![t];
    for g in gaps {
        t = t + g;
        out.push(t);
    }
    out
}

/// ±0.05 jitter on the equal weights, alternating with the turn number.
fn jittered(turn: usize) -> [f64; 2] {
    let j = if turn.is_multiple_of(2) { 0.05 } else { -0.05 };
    [0.5 + j, 0.5 - j]
}

#[test]
fn case22_run1_same_provider_all_turns_across_replicas_and_expired_pins() {
    let mut replicas: Vec<ChainPins> = (0..3).map(|_| ChainPins::new(1_000, DEFAULT_PIN)).collect();
    let times = turn_times();
    for key in (0..200).map(|i| format!("p{i}")) {
        let mut served = Vec::new();
        let mut expired_before_some_turn = false;
        for (turn, &now) in times.iter().enumerate() {
            let pins = &mut replicas[turn % 3];
            if turn >= 3 && pins.peek(&key, now).is_none() {
                expired_before_some_turn = true;
            }
            let chain = pins.chain(&key, &NAMES, &EQUAL, now);
            // With unchanged weights a recomputed chain is the same chain: rendezvous needs no
            // shared state and no unexpired pin to agree.
            assert_eq!(chain, sticky_chain(&key, &NAMES, &EQUAL));
            served.push(first_eligible(&chain, |_| true));
        }
        // The 5-minute pins did expire along the way (6, 12 and 45 minute gaps)…
        assert!(expired_before_some_turn, "{key}");
        // …and every turn still went to the provider of turn 1.
        assert!(served.iter().all(|&p| p == served[0]), "{key}: {served:?}");
    }
}

#[test]
fn case22_jitter_between_turns_pinned_chain_unchanged() {
    let times = turn_times();
    let keys: Vec<String> = (0..1_000).map(|i| format!("p{i}")).collect();
    // Pin at least as long as the longest gap (the 1 h prompt-cache TTL of the case).
    let mut pins = ChainPins::new(10_000, Duration::from_secs(3_600));
    let mut unpinned_flips = 0;
    for key in &keys {
        let first = pins.chain(key, &NAMES, &jittered(0), times[0]);
        for (turn, &now) in times.iter().enumerate().skip(1) {
            let w = jittered(turn);
            assert_eq!(pins.chain(key, &NAMES, &w, now), first, "{key} turn {turn}");
            if sticky_chain(key, &NAMES, &w)[0] != first[0] {
                unpinned_flips += 1;
            }
        }
    }
    // Without the pin the jitter would have moved some projects: the pin is doing the work.
    assert!(unpinned_flips > 0);
}

#[test]
fn case22_run2_failover_on_turn6_affinity_moves_and_stays() {
    let times = turn_times();
    for key in (0..200).map(|i| format!("p{i}")) {
        let mut pins = ChainPins::new(1_000, Duration::from_secs(3_600));
        let sticky = pins.chain(&key, &NAMES, &EQUAL, times[0])[0];
        let other = 1 - sticky;
        let mut served = Vec::new();
        for (turn, &now) in times.iter().enumerate() {
            let chain = pins.chain(&key, &NAMES, &EQUAL, now);
            let first = first_eligible(&chain, |_| true).unwrap();
            let provider = if turn == 5 && first == sticky {
                // Turn 6: the sticky provider answers 429; the router walks on down the chain
                // (without re-sampling) and moves the affinity to where the turn was served.
                let next = first_eligible(&chain, |p| p != sticky).unwrap();
                assert!(pins.move_to_front(&key, next, now));
                next
            } else {
                first
            };
            served.push(provider);
        }
        assert!(
            served[..5].iter().all(|&p| p == sticky),
            "{key}: {served:?}"
        );
        // Turns 6-10 on the other provider: no flip-flop back once the 429 has passed.
        assert!(served[5..].iter().all(|&p| p == other), "{key}: {served:?}");
    }
}
