//! Sans-IO balancing decisions for Switchyard.
//!
//! Nothing in this crate reads a clock, opens a socket or starts a runtime: time arrives as an
//! argument ([`time::Instant`], a monotonic reading taken by the caller) and randomness as
//! `&mut impl rand::Rng`, so every decision is a deterministic function of its inputs and can be
//! replayed by the simulator and by property tests. The router and operator measure and execute;
//! this crate decides. Algorithms follow `../shared/DESIGN.md` §4.

pub mod availability;
pub mod breaker;
pub mod budget;
pub mod chain;
pub mod classify;
pub mod dispatch;
pub mod estimate;
pub mod health;
pub mod latency;
pub mod p2c;
pub mod pause;
pub mod queue;
pub mod quota;
pub mod retry_after;
pub mod time;
pub mod waitline;
pub mod weights;
