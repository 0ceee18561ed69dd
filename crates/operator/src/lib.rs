//! The Switchyard operator (DESIGN §2, issue 6): validates `LLMProvider`, `RoutingPolicy` and
//! `TenantQuota`, collects outcome counters from every router replica, runs the availability
//! controller per provider and the priority-cascade weights per policy, and writes both into
//! status.
//!
//! Pipeline (STYLE pattern 2; only the ends touch the cluster):
//!
//! ```text
//! watch caches + Secret index ──► validate ──► compute status ──► apply (SSA, leader only,
//!        (controllers)            (validate)      (status)          only when changed)
//! router /outcomes ──► deltas ──► availability controllers ──┘
//!      (outcomes)                  (control)
//! ```
//!
//! - [`validate`]: reference and Secret checks (the loader's, reused), per object.
//! - [`status`]: the wanted CRD status, same shapes and meanings as the standalone router's.
//! - [`outcomes`]: replica discovery (EndpointSlices or a static list), scraping, deltas, resets.
//! - [`tenants`]: TenantQuota throttled / rejected totals and usage from the replicas' reports.
//! - [`control`]: one `AvailabilityController` per provider; the interval.
//! - [`operator`]: the shared state and the two writers (per-object sync, control tick).
//! - [`controllers`]: kube-runtime controllers, triggers, Secret index, health and metrics.
//! - [`probes`]: active health probes (the router's) and the `status.health` write rule.
//! - [`leader`]: Lease-based leader election (`kube-lease-manager`).
//! - [`cli`]: the `switchyard operator` flags and entry point.
//!
//! Status convention: every kind reports validity on the summary condition `Ready` (field case
//! 29's `Accepted` is this `Ready`), with reasons `SecretNotFound`, `DanglingReference` or
//! `InvalidSpec` and a message naming what is missing, and `observedGeneration` at the top and
//! on every condition.

pub mod cli;
pub mod control;
pub mod controllers;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod operator;
pub mod outcomes;
pub mod probes;
pub mod status;
pub mod tenants;
pub mod validate;

pub use controllers::{LeaseOptions, Options, run, run_with};
pub use error::Error;
pub use leader::Leadership;
pub use operator::{Operator, Settings, Stores, Synced, TickReport};
pub use outcomes::Targets;
