//! Field case 24 (p2c part): load-aware picks keep honest in-flight counts. Four identical
//! embedding providers with 1 s latency, 5 req/s for 40 min across two endpoints (embeddings and
//! rerank) that share one picker, with 50 client cancellations, 50 upstream errors and 50
//! instant cached answers injected. Virtual time, seeded RNG: deterministic.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_core::p2c::{P2c, P2cConfig, ScoringMode};
use switchyard_core::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Ok,
    Error,
    Cancelled,
}

#[test]
fn case24_p2c_even_split_honest_in_flight() {
    let mut p2c = P2c::new(
        4,
        P2cConfig {
            mode: ScoringMode::Latency,
            ..P2cConfig::default()
        },
    );
    let mut rng = ChaCha8Rng::seed_from_u64(24);
    let eligible = [0, 1, 2, 3];
    let total_requests = 5 * 60 * 40;
    // Which requests get a fault: 50 of each kind at distinct random positions.
    let mut fault = vec![0u8; total_requests];
    for kind in 1..=3u8 {
        let mut placed = 0;
        while placed < 50 {
            let i = rng.random_range(0..total_requests);
            if fault[i] == 0 {
                fault[i] = kind;
                placed += 1;
            }
        }
    }
    // Pending completions: (finish time, provider, outcome, started at).
    let mut pending: BinaryHeap<Reverse<(Instant, usize, Outcome, Instant)>> = BinaryHeap::new();
    let mut per_provider = [0u64; 4];
    let mut per_minute = vec![[0u64; 4]; 40];
    for (n, &f) in fault.iter().enumerate() {
        let now = Instant::from_millis(n as u64 * 200);
        while let Some(Reverse((t, i, outcome, started))) = pending.peek().copied() {
            if t > now {
                break;
            }
            pending.pop();
            match outcome {
                Outcome::Ok => p2c.on_finish(i, t, t.saturating_since(started), true),
                Outcome::Error => p2c.on_finish(i, t, t.saturating_since(started), false),
                Outcome::Cancelled => p2c.on_cancel(i, t),
            }
            assert!(p2c.in_flight(i) <= 100);
        }
        // Even requests are embeddings, odd ones rerank: both endpoints use this one picker, so
        // either moves the same in-flight counters.
        let i = p2c.pick(&eligible, now, &mut rng).unwrap();
        per_provider[i] += 1;
        per_minute[n / 300][i] += 1;
        p2c.on_start(i, now);
        let (after, outcome) = match f {
            1 => (Duration::from_millis(300), Outcome::Cancelled),
            2 => (Duration::from_millis(1_000), Outcome::Error),
            3 => (Duration::from_millis(2), Outcome::Ok),
            _ => (Duration::from_millis(1_000), Outcome::Ok),
        };
        pending.push(Reverse((now + after, i, outcome, now)));
    }
    // Drain.
    while let Some(Reverse((t, i, outcome, started))) = pending.pop() {
        match outcome {
            Outcome::Cancelled => p2c.on_cancel(i, t),
            o => p2c.on_finish(i, t, t.saturating_since(started), o == Outcome::Ok),
        }
    }
    for (i, &count) in per_provider.iter().enumerate() {
        assert_eq!(p2c.in_flight(i), 0, "provider {i} after drain");
        let share = count as f64 / total_requests as f64;
        assert!((0.20..=0.30).contains(&share), "provider {i}: {share:.3}");
    }
    for (m, bucket) in per_minute.iter().enumerate() {
        let sum: u64 = bucket.iter().sum();
        for (i, &c) in bucket.iter().enumerate() {
            assert!(
                c as f64 <= 0.4 * sum as f64,
                "minute {m} provider {i}: {c}/{sum}"
            );
        }
    }
    eprintln!("overall split {per_provider:?}");
}
