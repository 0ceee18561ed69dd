//! Active health probes in the router (standalone mode): the probe requests, plans and loop are
//! [`switchyard_providers::probe`]'s (the operator runs the same ones); this module feeds them
//! the providers of the router's own snapshot.

use std::sync::Arc;

pub use switchyard_providers::probe::*;

/// The probe jobs of a routing table: providers with an enabled `healthCheck` whose client
/// could be built (a provider without credentials is not probed; its status says why).
pub fn jobs_of(table: &crate::config::RoutingTable) -> Vec<ProbeJob> {
    table
        .providers
        .iter()
        .filter_map(|p| {
            let plan = p.probes.clone()?;
            let client = p.client.as_ref().ok()?.clone();
            Some(ProbeJob {
                provider: p.key.clone(),
                client,
                plan,
            })
        })
        .collect()
}

/// [`run`] over the router's own configuration and board: the providers of the snapshot
/// being served, re-read on every tick so reloads apply. Runs until dropped.
pub async fn run_for_app(app: Arc<crate::app::App>) {
    let clock = app.clock;
    run(&app.runtime.health, clock, || {
        jobs_of(&app.runtime.live().table)
    })
    .await;
}
