//! Sans-IO balancing decisions for Switchyard.
//!
//! Nothing in this crate reads a clock, opens a socket or starts a runtime: time arrives as an
//! argument and randomness as `&mut impl rand::Rng`, so every decision is a deterministic function
//! of its inputs and can be replayed by the simulator and by property tests.
