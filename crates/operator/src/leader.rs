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

/// How long a Lease stays valid without renewal, in seconds (client-go's default is 15).
pub const LEASE_DURATION_SECS: u64 = 15;
/// How long before expiry the holder renews, in seconds.
pub const LEASE_GRACE_SECS: u64 = 5;
/// Longest wait for the Lease release on shutdown.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// First wait after a failure to start the election.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest wait between attempts to start the election.
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether this replica is the leader now; cheap to clone and to query.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    // Keeps a fixed flag's channel open; the lease manager's task owns the sender otherwise.
    _keep: Option<Arc<watch::Sender<bool>>>,
    // Becomes true once the election task has released the Lease (after every flag is gone).
    released: Option<watch::Receiver<bool>>,
}

impl Leadership {
    /// A flag that never changes: `true` for a single replica without election, `false` for a
    /// replica that must never write (and tests of both).
    pub fn fixed(leader: bool) -> Self {
        let (tx, rx) = watch::channel(leader);
        Leadership {
            rx,
            _keep: Some(Arc::new(tx)),
            released: None,
        }
    }

    /// A flag driven by a sender the caller holds (tests of leadership changes).
    pub fn from_channel(rx: watch::Receiver<bool>) -> Self {
        Leadership {
            rx,
            _keep: None,
            released: None,
        }
    }

    /// Takes part in the election on Lease `namespace/name` as `identity` and returns the flag
    /// (false until the Lease is won). Runs in the background until every clone of the flag is
    /// dropped, then releases the Lease. Failures to reach or create the Lease are retried with
    /// backoff (1 s doubling to 60 s) and logged, rather than ending the process: an API server
    /// that is briefly away must not put the operator in a crash loop.
    pub fn elect(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        let (tx, rx) = watch::channel(false);
        let (released_tx, released) = watch::channel(false);
        let (namespace, name, identity) =
            (namespace.to_owned(), name.to_owned(), identity.to_owned());
        tokio::spawn(async move {
            let mut wait = RETRY_FIRST;
            loop {
                let built = LeaseManagerBuilder::new(client.clone(), &name)
                    .with_namespace(&namespace)
                    .with_identity(&identity)
                    .with_duration(LEASE_DURATION_SECS)
                    .with_grace(LEASE_GRACE_SECS)
                    .with_create_mode(LeaseCreateMode::AutoCreate)
                    .build()
                    .await;
                let manager = match built {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(lease = %format!("{namespace}/{name}"), error = %e, retry_in_s = wait.as_secs(), "failed to start leader election");
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = tx.closed() => {
                                released_tx.send_replace(true);
                                return;
                            }
                        }
                        wait = (wait * 2).min(RETRY_MAX);
                        continue;
                    }
                };
                wait = RETRY_FIRST;
                let (mut inner, task) = manager.watch().await;
                loop {
                    let leading = *inner.borrow_and_update();
                    tx.send_replace(leading);
                    tokio::select! {
                        changed = inner.changed() => {
                            if changed.is_err() {
                                // The manager stopped: not leading until a new one wins.
                                tx.send_replace(false);
                                break;
                            }
                        }
                        // Every flag is gone (shutdown): dropping `inner` makes the manager
                        // release the Lease, so a successor need not wait for it to expire.
                        () = tx.closed() => {
                            drop(inner);
                            let _ = tokio::time::timeout(RELEASE_TIMEOUT, task).await;
                            released_tx.send_replace(true);
                            return;
                        }
                    }
                }
            }
        });
        Leadership {
            rx,
            _keep: None,
            released: Some(released),
        }
    }

    /// Gives up this flag and waits (up to a few seconds) until the election task has released
    /// the Lease; effective once every other clone of the flag has been dropped too.
    pub async fn resign(self) {
        let Some(mut released) = self.released.clone() else {
            return;
        };
        drop(self);
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, released.wait_for(|r| *r)).await;
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
