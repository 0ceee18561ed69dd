//! switchyard-router: the data plane.
//!
//! A config source builds a [`config::RoutingTable`]; the [`state::Runtime`] pairs it with the
//! live state (breakers, availability, pins) that outlives reloads; the [`server`] serves the
//! client API and hands each request to [`dispatch`], which walks the project's sticky chain
//! (or a p2c pick) with the decisions of `switchyard-core`. [`standalone`] is the embedded
//! default: manifests from a folder, the control loop in-process.

pub mod broker;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod estimate;
pub mod idempotency;
pub mod kube_source;
pub mod metrics;
pub mod outcomes;
pub mod probe;
pub mod protocol_errors;
pub mod server;
pub mod signals;
pub mod standalone;
pub mod state;
pub mod status;
pub mod transcription;

// Vendor adapters, wire formats, the upstream client and health probes live in
// `switchyard-providers` (shared with the operator); re-exported under their old paths.
pub use switchyard_providers::{clock, health, upstream, wire};
