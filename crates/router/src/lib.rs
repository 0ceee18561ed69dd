//! switchyard-router: the data plane.
//!
//! A config source builds a [`config::RoutingTable`]; the [`state::Runtime`] pairs it with the
//! live state (breakers, availability, pins) that outlives reloads; the [`server`] serves the
//! client API and hands each request to [`dispatch`], the executor of `switchyard-core`'s
//! dispatch machine. [`standalone`] is the embedded default: manifests from a folder, the
//! control loop in-process.
//!
//! Modules import in one direction only, lower layers never naming higher ones (checked by
//! `tests/layering.rs`):
//!
//! 1. wire formats and request facts: `wire`, `upstream` (from `switchyard-providers`),
//!    [`protocol_errors`], [`estimate`], [`metrics`], [`responses`];
//! 2. configuration and shared state: [`config`], [`state`], [`conditions`], [`request`],
//!    [`transcription`], [`idempotency`], [`broker`], [`telemetry`];
//! 3. the process: [`app`];
//! 4. the executor and the process's views and loops: [`dispatch`], [`signals`],
//!    [`status`], [`outcomes`], [`probe`], [`control`], [`ui`];
//! 5. the client-facing server: [`server`];
//! 6. the two ways to run it: [`standalone`], [`kube_source`].

pub mod app;
pub mod broker;
pub mod conditions;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod estimate;
pub mod history;
pub mod idempotency;
pub mod kube_source;
pub mod metrics;
pub mod outcomes;
pub mod probe;
pub mod protocol_errors;
pub mod request;
pub mod responses;
pub mod server;
pub mod shards;
pub mod signals;
pub mod standalone;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod transcription;
pub mod ui;

// Vendor adapters, wire formats, the upstream client and health probes live in
// `switchyard-providers` (shared with the operator); re-exported under their old paths.
pub use switchyard_providers::{clock, health, upstream, wire};
