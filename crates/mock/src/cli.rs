//! `switchyard mock-provider`: run one or more mocks until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::config::{ConfigFile, MockConfig};
use crate::server::MockProvider;

/// Default listen address of a mock started without a config file.
const DEFAULT_LISTEN: ([u8; 4], u16) = ([127, 0, 0, 1], 9001);

/// Command-line options of `switchyard mock-provider`.
///
/// `--config` loads a YAML file holding one [`MockConfig`] or a list of them (`mocks: [...]` or
/// a bare list); the other flags override every loaded mock (`--listen` and `--name` only when the
/// file describes a single mock).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MockArgs {
    /// Address to listen on (single mock only). A lone mock without one binds 127.0.0.1:9001;
    /// mocks in a list without one bind an ephemeral port (logged at start).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Name of the mock (single mock only).
    #[arg(long)]
    pub name: Option<String>,
    /// YAML file with one MockConfig or a list of them.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Delay before response headers, milliseconds.
    #[arg(long)]
    pub latency_ms: Option<u64>,
    /// Time to first token, milliseconds.
    #[arg(long)]
    pub ttft_ms: Option<u64>,
    /// Streaming pace, tokens per second (0 = unpaced).
    #[arg(long)]
    pub tokens_per_sec: Option<f64>,
    /// Tokens in a full answer.
    #[arg(long)]
    pub output_tokens: Option<u64>,
    /// Prompt-cache lifetime, e.g. `5m`, `1h`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub cache_ttl: Option<Duration>,
}

impl MockArgs {
    /// The mock configs these options describe.
    ///
    /// # Errors
    /// Unreadable or invalid config file; `--listen`/`--name` with a multi-mock file.
    pub fn configs(&self) -> anyhow::Result<Vec<MockConfig>> {
        let mut mocks = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("failed to read {}", path.display()))?;
                ConfigFile::from_yaml(&text)
                    .with_context(|| format!("failed to parse {}", path.display()))?
                    .into_mocks()
            }
            None => vec![MockConfig {
                listen: Some(SocketAddr::from(DEFAULT_LISTEN)),
                ..MockConfig::default()
            }],
        };
        if mocks.is_empty() {
            bail!("the config file describes no mock");
        }
        if mocks.len() > 1 && (self.listen.is_some() || self.name.is_some()) {
            bail!("--listen and --name apply to a single mock; set them per mock in the file");
        }
        if let [only] = mocks.as_mut_slice()
            && only.listen.is_none()
        {
            only.listen = Some(SocketAddr::from(DEFAULT_LISTEN));
        }
        for m in &mut mocks {
            if let Some(l) = self.listen {
                m.listen = Some(l);
            }
            if let Some(n) = &self.name {
                m.name.clone_from(n);
            }
            if let Some(v) = self.latency_ms {
                m.latency_ms = v;
            }
            if let Some(v) = self.ttft_ms {
                m.ttft_ms = v;
            }
            if let Some(v) = self.tokens_per_sec {
                m.tokens_per_sec = v;
            }
            if let Some(v) = self.output_tokens {
                m.output_tokens = v;
            }
            if let Some(v) = self.cache_ttl {
                m.cache_ttl = v;
            }
        }
        Ok(mocks)
    }
}

/// Starts every configured mock and serves until Ctrl-C, then shuts them down.
///
/// # Errors
/// Config errors (see [`MockArgs::configs`]) and bind failures.
pub async fn run(args: MockArgs) -> anyhow::Result<()> {
    let mut handles = Vec::new();
    for cfg in args.configs()? {
        let name = cfg.name.clone();
        let handle = MockProvider::start(cfg)
            .await
            .with_context(|| format!("failed to start mock {name}"))?;
        tracing::info!(name = %name, url = %handle.base_url(), "mock provider ready");
        handles.push(handle);
    }
    tokio::signal::ctrl_c()
        .await
        .context("failed to wait for Ctrl-C")?;
    tracing::info!("shutting down mock providers");
    for h in handles {
        h.shutdown().await;
    }
    Ok(())
}
