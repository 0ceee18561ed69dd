//! Routing strategies compared by the simulator.
//!
//! Each strategy answers one question per attempt: which provider next, given the project key
//! and the providers this request already tried. The engine owns time, providers and metrics;
//! a strategy only sees what a router would see (its own attempts and their outcomes).
//!
//! - `switchyard`: the real `switchyard-core` decisions (see [`crate::switchyard`]).
//! - `ordered`: the ordered fallback list most gateways ship: always try the first provider, on
//!   any retryable error the next one, until the list is exhausted. No memory, no pauses.
//! - `round_robin`: a global rotation over providers; a retry takes the next untried one.
//! - `p2c`: two random untried providers, the one with fewer requests in flight wins; no
//!   stickiness, no error memory (the "least loaded of two" of Mitzenmacher 1996).

use std::fmt;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use switchyard_core::time::Instant;

use crate::model::Outcome;

/// Which strategy a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// switchyard-core: sticky chains over controller weights (chat) or latency p2c (embedding).
    Switchyard,
    /// Ordered fallback list.
    Ordered,
    /// Round robin.
    RoundRobin,
    /// Plain power of two choices on in-flight counts.
    P2c,
}

impl StrategyKind {
    /// All strategies, switchyard first.
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::Switchyard,
        StrategyKind::Ordered,
        StrategyKind::RoundRobin,
        StrategyKind::P2c,
    ];

    /// The name used in folders and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::Switchyard => "switchyard",
            StrategyKind::Ordered => "ordered",
            StrategyKind::RoundRobin => "round_robin",
            StrategyKind::P2c => "p2c",
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A strategy's answer for the next attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Pick {
    /// Send to this provider index.
    Send(usize),
    /// No candidate left: the request fails.
    GiveUp,
}

/// The contract between the engine and a strategy.
pub(crate) trait Strategy {
    /// Called at the end of every interval `T` (controller step).
    fn tick(&mut self, _now: Instant) {}
    /// Per-provider availability after the last tick, if the strategy has one.
    fn availability(&self) -> Option<&[f64]> {
        None
    }
    /// Per-provider weight after the last tick, if the strategy has one.
    fn weights(&self) -> Option<&[f64]> {
        None
    }
    /// Chooses the provider for the next attempt; `tried` is a bit mask of providers this
    /// request already attempted.
    fn pick(&mut self, project: u32, tried: u64, now: Instant, rng: &mut ChaCha8Rng) -> Pick;
    /// An attempt was sent.
    fn on_start(&mut self, _provider: usize, _now: Instant) {}
    /// The first byte of a successful attempt arrived (end of prefill).
    fn on_first_byte(&mut self, _provider: usize, _now: Instant) {}
    /// An attempt finished (latency as measured by the router).
    fn on_finish(&mut self, _provider: usize, _now: Instant, _latency: Duration, _o: Outcome) {}
    /// A request of `project` was served by `provider` (switchyard pins a failover target to
    /// the front of the project's chain here).
    fn on_served(&mut self, _project: u32, _provider: usize, _now: Instant) {}
    /// Attempts per request including the first.
    fn max_attempts(&self) -> u32;
}

pub(crate) fn untried(n: usize, tried: u64) -> impl Iterator<Item = usize> {
    (0..n).filter(move |i| tried & (1u64 << i) == 0)
}

/// Ordered fallback list.
#[derive(Debug)]
pub(crate) struct Ordered {
    pub(crate) n: usize,
}

impl Strategy for Ordered {
    fn pick(&mut self, _: u32, tried: u64, _: Instant, _: &mut ChaCha8Rng) -> Pick {
        untried(self.n, tried)
            .next()
            .map_or(Pick::GiveUp, Pick::Send)
    }
    fn max_attempts(&self) -> u32 {
        self.n as u32
    }
}

/// Global round robin; retries take the next untried provider in rotation.
#[derive(Debug)]
pub(crate) struct RoundRobin {
    pub(crate) n: usize,
    pub(crate) next: usize,
}

impl Strategy for RoundRobin {
    fn pick(&mut self, _: u32, tried: u64, _: Instant, _: &mut ChaCha8Rng) -> Pick {
        for k in 0..self.n {
            let i = (self.next + k) % self.n;
            if tried & (1u64 << i) == 0 {
                self.next = (i + 1) % self.n;
                return Pick::Send(i);
            }
        }
        Pick::GiveUp
    }
    fn max_attempts(&self) -> u32 {
        self.n as u32
    }
}

/// Plain p2c on in-flight counts.
#[derive(Debug)]
pub(crate) struct P2cInFlight {
    pub(crate) in_flight: Vec<u32>,
}

impl Strategy for P2cInFlight {
    fn pick(&mut self, _: u32, tried: u64, _: Instant, rng: &mut ChaCha8Rng) -> Pick {
        let n = self.in_flight.len();
        let free: Vec<usize> = untried(n, tried).collect();
        match free.len() {
            0 => Pick::GiveUp,
            1 => Pick::Send(free[0]),
            m => {
                let a = rng.random_range(0..m);
                let mut b = rng.random_range(0..m - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (free[a], free[b]);
                Pick::Send(if self.in_flight[b] < self.in_flight[a] {
                    b
                } else {
                    a
                })
            }
        }
    }
    fn on_start(&mut self, p: usize, _: Instant) {
        self.in_flight[p] += 1;
    }
    fn on_finish(&mut self, p: usize, _: Instant, _: Duration, _: Outcome) {
        self.in_flight[p] = self.in_flight[p].saturating_sub(1);
    }
    fn max_attempts(&self) -> u32 {
        self.in_flight.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ordered_retry_takes_next_untried() {
        let mut s = Ordered { n: 3 };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(s.pick(0, 0, Instant::ZERO, &mut rng), Pick::Send(0));
        assert_eq!(s.pick(0, 0b001, Instant::ZERO, &mut rng), Pick::Send(1));
        assert_eq!(s.pick(0, 0b111, Instant::ZERO, &mut rng), Pick::GiveUp);
    }

    #[test]
    fn round_robin_rotates_and_skips_tried() {
        let mut s = RoundRobin { n: 3, next: 0 };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let picks: Vec<_> = (0..4)
            .map(|_| s.pick(0, 0, Instant::ZERO, &mut rng))
            .collect();
        assert_eq!(
            picks,
            [Pick::Send(0), Pick::Send(1), Pick::Send(2), Pick::Send(0)]
        );
        assert_eq!(s.pick(0, 0b010, Instant::ZERO, &mut rng), Pick::Send(2));
    }

    #[test]
    fn p2c_prefers_fewer_in_flight() {
        let mut s = P2cInFlight {
            in_flight: vec![5, 0],
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..10 {
            assert_eq!(s.pick(0, 0, Instant::ZERO, &mut rng), Pick::Send(1));
        }
    }
}
