//! Leader election: only the holder of a `coordination.k8s.io/v1` Lease writes status and runs
//! the control loop; every replica watches and keeps its caches warm (STYLE pattern 4).
//!
//! The Lease is held with `kube-lease-manager` (maintained, built on kube 5 and k8s-openapi
//! 0.29): it renews the Lease by server-side apply before it expires and takes over an expired
//! one. Its state arrives on a `tokio::sync::watch` channel, which [`Leadership`] wraps so
//! the rest of the operator (and tests, through [`Leadership::fixed`]) only sees a flag.
//!
//! Caveat: a holder that cannot reach the API server keeps believing it leads until it can
//! reach it again; its writes fail meanwhile, and another replica takes over once the Lease
//! expires (duration 15 s, renewed 5 s before expiry).

use std::sync::Arc;

use kube::Client;
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use tokio::sync::watch;

use crate::error::Error;

/// How long a Lease stays valid without renewal, in seconds (client-go's default is 15).
pub const LEASE_DURATION_SECS: u64 = 15;
/// How long before expiry the holder renews, in seconds.
pub const LEASE_GRACE_SECS: u64 = 5;

/// Whether this replica is the leader now; cheap to clone and to query.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    // Keeps a fixed flag's channel open; the lease manager's task owns the sender otherwise.
    _keep: Option<Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// A flag that never changes: `true` for a single replica without election, `false` for a
    /// replica that must never write (and tests of both).
    pub fn fixed(leader: bool) -> Self {
        let (tx, rx) = watch::channel(leader);
        Leadership {
            rx,
            _keep: Some(Arc::new(tx)),
        }
    }

    /// A flag driven by a sender the caller holds (tests of leadership changes).
    pub fn from_channel(rx: watch::Receiver<bool>) -> Self {
        Leadership { rx, _keep: None }
    }

    /// Takes part in the election on Lease `namespace/name` as `identity` and returns the flag;
    /// the manager task runs until the process ends (the Lease then expires on its own).
    ///
    /// # Errors
    /// [`Error::Lease`] when the Lease cannot be read or created.
    pub async fn elect(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Result<Self, Error> {
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_DURATION_SECS)
            .with_grace(LEASE_GRACE_SECS)
            .with_create_mode(LeaseCreateMode::AutoCreate)
            .build()
            .await
            .map_err(|source| Error::Lease {
                lease: format!("{namespace}/{name}"),
                source,
            })?;
        let (rx, _task) = manager.watch().await;
        Ok(Leadership { rx, _keep: None })
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// A receiver that sees every change of the flag.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }
}
