//! Command-line flags of `switchyard operator` and the process entry point.
//!
//! The flag names match the Helm chart's operator Deployment (`--namespace` or
//! `--all-namespaces`, `--router-service`, `--lease-name`, `--metrics-listen`); the pod's
//! `POD_NAME` and `POD_NAMESPACE` fill the identity and the default namespaces.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::controllers::{LeaseOptions, Options, run};
use crate::error::Error;
use crate::outcomes::Targets;

/// Flags of `switchyard operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// Namespace to watch (default: `POD_NAMESPACE`, else the kubeconfig context's namespace).
    #[arg(long, conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// Watch every namespace (needs cluster-wide list/watch of the three kinds and Secrets).
    #[arg(long)]
    pub all_namespaces: bool,
    /// Router Service whose EndpointSlices list the replicas to scrape `GET /outcomes` from.
    #[arg(
        long,
        default_value = "switchyard-router",
        env = "SWITCHYARD_ROUTER_SERVICE"
    )]
    pub router_service: String,
    /// Namespace of the router Service (default: the operator's own namespace).
    #[arg(long)]
    pub router_namespace: Option<String>,
    /// Port name on the router Service to scrape (`""`: the first port).
    #[arg(long, default_value = "http")]
    pub router_port_name: String,
    /// Router base URLs to scrape instead of the Service, for routers outside the cluster
    /// (repeatable: `--router-address http://10.0.0.7:8080 --router-address ...`).
    #[arg(long = "router-address", value_name = "URL")]
    pub router_addresses: Vec<String>,
    /// Lease used for leader election (`coordination.k8s.io/v1`).
    #[arg(long, default_value = "switchyard-operator")]
    pub lease_name: String,
    /// Namespace of the Lease (default: the operator's own namespace).
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// Run without leader election: this replica always writes (only with one replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// This replica's identity in the Lease and on Events.
    #[arg(long, env = "POD_NAME", default_value = "switchyard-operator")]
    pub identity: String,
    /// Address of `/healthz`, `/readyz` and `/metrics`.
    #[arg(long, alias = "listen", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// Kubeconfig file (default: in-cluster service account, else `$KUBECONFIG` or
    /// `~/.kube/config`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Fixed control interval such as `30s` (default: the shortest `availability.interval` of
    /// any RoutingPolicy, 30 s when none sets one).
    #[arg(long, value_parser = parse_interval)]
    pub interval: Option<Duration>,
    /// Do not run active health probes (`healthCheck`); `status.health` is then left as is.
    #[arg(long)]
    pub no_probes: bool,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    switchyard_api::duration::parse(text)
        .ok_or_else(|| format!("{text:?} is not a duration such as 30s or 1m"))
}

/// A client from `kubeconfig`, or inferred (in-cluster, then `$KUBECONFIG`/`~/.kube/config`),
/// with its default namespace.
///
/// # Errors
/// [`Error::Client`] when no configuration can be loaded.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<(Client, String), Error> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Error::Client(kube::Error::InferKubeconfig(e)))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Client(kube::Error::InferKubeconfig(e)))?
        }
        None => Config::infer()
            .await
            .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?,
    };
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(Error::Client)?;
    Ok((client, namespace))
}

impl OperatorArgs {
    /// The run options, given the client's default namespace and `POD_NAMESPACE`.
    pub fn options(&self, default_namespace: &str, pod_namespace: Option<&str>) -> Options {
        let own = pod_namespace.unwrap_or(default_namespace).to_owned();
        let namespace =
            (!self.all_namespaces).then(|| self.namespace.clone().unwrap_or_else(|| own.clone()));
        let targets = if self.router_addresses.is_empty() {
            Targets::Service {
                namespace: self.router_namespace.clone().unwrap_or_else(|| own.clone()),
                name: self.router_service.clone(),
                port_name: Some(self.router_port_name.clone()).filter(|p| !p.is_empty()),
            }
        } else {
            Targets::Static(self.router_addresses.clone())
        };
        let lease = (!self.no_leader_election).then(|| LeaseOptions {
            namespace: self.lease_namespace.clone().unwrap_or_else(|| own.clone()),
            name: self.lease_name.clone(),
        });
        Options {
            namespace,
            targets,
            lease,
            identity: self.identity.clone(),
            listen: self.metrics_listen,
            interval: self.interval,
            probes: !self.no_probes,
        }
    }
}

/// Runs `switchyard operator` until `shutdown` resolves.
///
/// # Errors
/// Failures to start: no cluster configuration, or the listener cannot bind.
pub async fn main(
    args: OperatorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (client, default_namespace) = connect(args.kubeconfig.as_deref()).await?;
    let pod_namespace = std::env::var("POD_NAMESPACE").ok();
    let options = args.options(&default_namespace, pod_namespace.as_deref());
    tracing::info!(
        identity = %options.identity,
        listen = %options.listen,
        targets = ?options.targets,
        lease = ?options.lease,
        "starting the operator"
    );
    run(client, options, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: OperatorArgs,
    }

    #[test]
    fn options_chart_flags_map_to_service_targets_and_lease() {
        let cli = Cli::parse_from([
            "operator",
            "--namespace=ai-platform",
            "--router-service=sy-router",
            "--lease-name=sy-operator",
            "--metrics-listen=0.0.0.0:9191",
            "--identity=op-0",
        ]);
        let o = cli.args.options("default", Some("switchyard-system"));
        assert_eq!(o.namespace.as_deref(), Some("ai-platform"));
        assert_eq!(
            o.targets,
            Targets::Service {
                namespace: "switchyard-system".into(),
                name: "sy-router".into(),
                port_name: Some("http".into()),
            }
        );
        assert_eq!(
            o.lease,
            Some(LeaseOptions {
                namespace: "switchyard-system".into(),
                name: "sy-operator".into(),
            })
        );
        assert_eq!(o.listen, "0.0.0.0:9191".parse().unwrap());
        assert_eq!(o.identity, "op-0");
        assert!(o.probes, "probes run by default");
    }

    #[test]
    fn options_static_addresses_all_namespaces_no_election() {
        let cli = Cli::parse_from([
            "operator",
            "--all-namespaces",
            "--router-address=http://10.0.0.7:8080",
            "--router-address=http://10.0.0.8:8080",
            "--no-leader-election",
            "--interval=5s",
            "--no-probes",
        ]);
        let o = cli.args.options("default", None);
        assert!(!o.probes);
        assert_eq!(o.namespace, None);
        assert_eq!(
            o.targets,
            Targets::Static(vec![
                "http://10.0.0.7:8080".into(),
                "http://10.0.0.8:8080".into()
            ])
        );
        assert_eq!(o.lease, None);
        assert_eq!(o.interval, Some(Duration::from_secs(5)));
    }
}
