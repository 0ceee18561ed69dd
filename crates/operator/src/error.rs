//! The operator's error type: one variant per failing stage, each with a metric label; every
//! error is retried (reconciles requeue with backoff, the control loop tries again next tick),
//! none ends the process except a failure to start.

/// Everything that can go wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing an object's status failed (API server unreachable, conflict, RBAC).
    #[error("failed to write the status of {object}: {source}")]
    WriteStatus {
        /// `Kind namespace/name`.
        object: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Building the Kubernetes client failed (no kubeconfig or in-cluster config).
    #[error("failed to build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The health and metrics listener could not bind.
    #[error("failed to serve health and metrics on {addr}: {source}")]
    Serve {
        /// The listen address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Low-cardinality label for `switchyard_operator_errors_total{error=...}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::WriteStatus { .. } => "write_status",
            Error::Client(_) => "client",
            Error::Serve { .. } => "serve",
        }
    }
}
