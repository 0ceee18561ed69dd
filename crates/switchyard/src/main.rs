//! The `switchyard` binary: one executable, a subcommand per process or tool.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

mod crdgen;

/// Switchyard: an LLM-provider load balancer for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the CustomResourceDefinitions generated from the Rust types.
    Crdgen {
        /// Folder to write `*.yaml` into.
        #[arg(long, default_value = "crds")]
        out_dir: PathBuf,
    },
    /// Validate a folder of manifests as the API server would, and print what was found.
    Validate {
        /// Folder of multi-document YAML manifests.
        #[arg(long, default_value = "config/examples")]
        manifests: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crdgen { out_dir } => crdgen::write(&out_dir)
            .with_context(|| format!("failed to write CRDs to {}", out_dir.display())),
        Command::Validate { manifests } => validate(&manifests),
    }
}

fn validate(dir: &std::path::Path) -> anyhow::Result<()> {
    let loaded = switchyard_api::loader::load_dir(dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    for warning in &loaded.warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!(
        "{}: {} LLMProvider(s), {} RoutingPolicy(ies), {} TenantQuota(s): valid",
        dir.display(),
        loaded.providers.len(),
        loaded.policies.len(),
        loaded.tenants.len()
    );
    Ok(())
}
