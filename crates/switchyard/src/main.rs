//! The `switchyard` binary: one executable, a subcommand per process or tool.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// The global allocator: jemalloc (tikv-jemallocator) instead of glibc's malloc. In the
/// 2026-12-07 profile of the router under load `malloc`/`free` took about 9 % of its samples,
/// spread over hyper's buffers, header maps, tower's boxed services and our own small strings
/// (docs/profile.md). In an A/B on the bench (same build otherwise) jemalloc cut the router's
/// CPU per request by 11-14 % non-streaming and 8-19 % streaming at concurrency 16 and 64 for
/// +2 MiB resident at start; mimalloc cut about as much but added 12-18 MiB resident (its
/// per-thread segments), against the memory targets of issue 16.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod crdgen;
mod otel;
mod sim_serve;

/// Switchyard: an LLM-provider load balancer for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the router and its control loop in one process, configured from a manifest folder
    /// (the embedded default: no cluster needed).
    Standalone {
        /// Folder of multi-document YAML manifests (LLMProvider, RoutingPolicy, TenantQuota).
        #[arg(long, default_value = "config/demo")]
        manifests: PathBuf,
        /// Address to serve the client API on; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Folder of `<secret-name>/<key>` files for `secretRef`s (environment variables
        /// `SWITCHYARD_SECRET_<NAME>_<KEY>` are tried first).
        #[arg(long)]
        secrets_dir: Option<PathBuf>,
        /// Also start the mock providers described in this file (see `mock-provider`).
        #[arg(long)]
        mocks: Option<PathBuf>,
        /// Largest request body in bytes.
        #[arg(long, default_value_t = switchyard_router::app::DEFAULT_MAX_BODY_BYTES)]
        max_body_bytes: usize,
        /// Do not watch the manifest folder for changes.
        #[arg(long)]
        no_watch: bool,
        #[command(flatten)]
        redis: RedisArgs,
        #[command(flatten)]
        serve: ServeArgs,
        /// How long a completed non-streaming answer is replayed to a request repeating its
        /// `Idempotency-Key`.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        idempotency_ttl: std::time::Duration,
    },
    /// Run the router in Kubernetes mode: LLMProviders, RoutingPolicies, TenantQuotas and the
    /// Secrets they reference come from the cluster through reflectors; availability and
    /// weights come from their status, written by the operator. Keeps serving on the last
    /// configuration while the API server is away.
    Router {
        /// Namespace to watch (default: the client's namespace: the pod's own in a cluster,
        /// else the kubeconfig context's).
        #[arg(long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Watch every namespace (needs cluster-wide list/watch permissions).
        #[arg(long)]
        all_namespaces: bool,
        /// Address to serve the client API on.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// Kubeconfig file (default: in-cluster service account, else `$KUBECONFIG` or
        /// `~/.kube/config`).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Largest request body in bytes.
        #[arg(long, default_value_t = switchyard_router::app::DEFAULT_MAX_BODY_BYTES)]
        max_body_bytes: usize,
        /// Period of the full re-list of every watched kind (`60s`, `5m`), so a replica that
        /// missed a notification converges.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        resync: std::time::Duration,
        #[command(flatten)]
        redis: RedisArgs,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Print the computed status of a running router as tables.
    Status {
        /// Base URL of the router.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Print the raw JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Run mock LLM providers (OpenAI and Anthropic wire formats, fault injection).
    MockProvider(switchyard_mock::MockArgs),
    /// Run the operator: validate the resources, collect outcome counters from every router
    /// replica, write availability and weights into status (Lease leader election).
    Operator(switchyard_operator::cli::OperatorArgs),
    /// Run scenarios in virtual time with Switchyard's strategy and the baselines (ordered
    /// fallback, round robin, p2c); writes CSV time series, one SVG chart per run and a summary.
    ///
    /// With `--serve`: a web page at `http://ADDR/ui` to pick a scenario (the given files, else
    /// the shipped ones), change capacities, outages and traffic, run and watch the result.
    Simulate {
        /// Scenario files (YAML), e.g. `config/scenarios/*.yaml`.
        #[arg(required_unless_present = "serve")]
        scenarios: Vec<PathBuf>,
        /// Output folder.
        #[arg(long, default_value = "out/sim")]
        out: PathBuf,
        /// Serve the simulator's web page instead of writing files.
        #[arg(long)]
        serve: bool,
        /// Address the page is served on with `--serve`; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:8090", requires = "serve")]
        listen: SocketAddr,
    },
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let otel = match otel::init() {
        Ok(otel) => otel,
        Err(e) => {
            eprintln!("error: OpenTelemetry configuration: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    init_logging(otel.as_ref());
    let result = run(cli);
    // Flushes the spans still queued before the process ends.
    drop(otel);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr (`RUST_LOG`, default `info`) and, when `otel` exports, the request path's
/// spans (`switchyard_router::telemetry::TARGET`, never logged) to OpenTelemetry.
fn init_logging(otel: Option<&otel::Otel>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let otel_only = switchyard_router::telemetry::TARGET;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let filter = match format!("{otel_only}=off").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let traces = otel.map(|o| {
        switchyard_router::telemetry::enable_export();
        tracing_opentelemetry::layer()
            .with_tracer(o.tracer())
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(otel_only, tracing::Level::TRACE),
            )
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .init();
}

/// How long a shutdown waits for in-flight requests.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (what Kubernetes and most supervisors send).
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crdgen { out_dir } => crdgen::write(&out_dir)
            .with_context(|| format!("failed to write CRDs to {}", out_dir.display())),
        Command::Validate { manifests } => validate(&manifests),
        Command::Simulate {
            scenarios,
            out,
            serve,
            listen,
        } => {
            if serve {
                let sources = if scenarios.is_empty() {
                    sim_serve::SimServer::shipped()
                } else {
                    scenarios
                        .iter()
                        .map(|path| {
                            let yaml = std::fs::read_to_string(path)
                                .with_context(|| format!("failed to read {}", path.display()))?;
                            let name = switchyard_sim::Scenario::from_yaml(&yaml)
                                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                                .name;
                            Ok(sim_serve::Source { name, yaml })
                        })
                        .collect::<anyhow::Result<Vec<_>>>()?
                };
                runtime()?.block_on(sim_serve::serve(listen, sources, shutdown_signal()))
            } else {
                simulate(&scenarios, &out)
            }
        }
        Command::MockProvider(args) => runtime()?.block_on(switchyard_mock::run(args)),
        Command::Operator(args) => runtime()?
            .block_on(switchyard_operator::cli::main(args, shutdown_signal()))
            .map_err(anyhow::Error::from),
        Command::Status { url, json } => runtime()?.block_on(status(&url, json)),
        Command::Router {
            namespace,
            all_namespaces,
            listen,
            kubeconfig,
            max_body_bytes,
            resync,
            redis,
            serve,
        } => runtime()?.block_on(async move {
            use switchyard_router::kube_source;
            let (client, default_namespace) = kube_source::connect(kubeconfig.as_deref()).await?;
            let namespace = (!all_namespaces).then(|| namespace.unwrap_or(default_namespace));
            let mut options = kube_source::Options::new(namespace, listen);
            options.max_body_bytes = max_body_bytes;
            options.resync = resync;
            options.redis = redis.options();
            options.serve = serve.options();
            with_drain(|shutdown| kube_source::run(client, options, shutdown))
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))
        }),
        Command::Standalone {
            manifests,
            listen,
            secrets_dir,
            mocks,
            max_body_bytes,
            no_watch,
            redis,
            serve,
            idempotency_ttl,
        } => runtime()?.block_on(async move {
            let mut handles = Vec::new();
            if let Some(file) = mocks {
                let args = switchyard_mock::MockArgs {
                    config: Some(file),
                    ..Default::default()
                };
                for cfg in args.configs()? {
                    let name = cfg.name.clone();
                    let handle = switchyard_mock::MockProvider::start(cfg)
                        .await
                        .with_context(|| format!("failed to start mock provider {name}"))?;
                    eprintln!("mock provider {name} on {}", handle.base_url());
                    handles.push(handle);
                }
            }
            let options = switchyard_router::standalone::Options {
                manifests,
                listen,
                secrets: switchyard_router::config::SecretSource {
                    dir: secrets_dir,
                    ..Default::default()
                },
                max_body_bytes,
                watch: !no_watch,
                redis: redis.options(),
                idempotency_ttl,
                serve: serve.options(),
            };
            let served =
                with_drain(|shutdown| switchyard_router::standalone::run(options, shutdown)).await;
            for h in handles {
                h.shutdown().await;
            }
            served.map_err(|e| anyhow::anyhow!("{e}"))
        }),
    }
}

/// Where the router keeps quotas, pauses and breaker signals when several replicas share them.
#[derive(Debug, clap::Args)]
struct RedisArgs {
    /// Keep quota buckets, Retry-After pauses and open breakers in this Redis
    /// (`redis://host:port/db`) so router replicas share them; by default they live in this
    /// process.
    #[arg(long, env = "SWITCHYARD_REDIS_URL")]
    redis_url: Option<String>,
    /// Number of router replicas sharing the Redis: while Redis is unreachable each replica
    /// serves from local buckets holding 1/N of every limit.
    #[arg(long, env = "SWITCHYARD_REPLICAS", default_value_t = 1)]
    replicas: u32,
    /// Longest wait for one Redis operation before this replica serves from its local share
    /// instead (e.g. `50ms`, `1s`).
    #[arg(long, env = "SWITCHYARD_REDIS_TIMEOUT", default_value = "100ms", value_parser = parse_duration)]
    redis_timeout: std::time::Duration,
    /// How long a concurrency slot held in Redis stays taken without renewal; each replica
    /// renews its live slots every quarter of this, so a replica that dies frees its slots
    /// within one lease (e.g. `4s`).
    #[arg(long, env = "SWITCHYARD_REDIS_SLOT_LEASE", default_value = "4s", value_parser = parse_duration)]
    redis_slot_lease: std::time::Duration,
}

impl RedisArgs {
    /// The store options, when a Redis URL was given.
    fn options(self) -> Option<switchyard_store::RedisOptions> {
        self.redis_url.map(|url| switchyard_store::RedisOptions {
            local_share: self.replicas.max(1),
            op_timeout: self.redis_timeout,
            slot_lease: self.redis_slot_lease,
            ..switchyard_store::RedisOptions::new(url)
        })
    }
}

/// The client-facing server's process settings (shared by `standalone` and `router`).
#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Serve requests that carry no API key (as the `anonymous` project). Off by default:
    /// every request needs a TenantQuota's key, and with no TenantQuota every request gets
    /// 401. Shown in `/status` and as the `switchyard_anonymous_access_allowed` metric.
    #[arg(long, env = "SWITCHYARD_ALLOW_ANONYMOUS")]
    allow_anonymous: bool,
    /// Longest time a client may take to send a request's head, and to start its next
    /// request on a keep-alive connection (so also the idle keep-alive timeout); the
    /// connection is closed past it.
    #[arg(long, env = "SWITCHYARD_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    header_read_timeout: std::time::Duration,
    /// Longest time reading a request body may take; past it the client gets 408.
    #[arg(long, env = "SWITCHYARD_BODY_READ_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    body_read_timeout: std::time::Duration,
    /// Client connections served at once; further clients wait in the listen backlog.
    #[arg(long, env = "SWITCHYARD_MAX_CONNECTIONS", default_value_t = switchyard_router::app::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// How long after a provider's pause ends its first request is the only probe until it
    /// answers (field case 2); `0s` turns the gate off.
    #[arg(long, env = "SWITCHYARD_PROBE_GATE", default_value = "60s", value_parser = parse_duration)]
    probe_gate: std::time::Duration,
    /// Serve the read-only live view at `/ui` (per-route availability, weights, traffic,
    /// errors, pauses and open circuits over the last hour, and a project's chain);
    /// `--ui=false` turns it off (404) and keeps no history.
    #[arg(long, env = "SWITCHYARD_UI", default_value_t = true, action = clap::ArgAction::Set)]
    ui: bool,
    /// Threads that serve client connections, each a single-threaded runtime that keeps a
    /// connection and the upstream work of its requests on one core (no thread hop per
    /// request); default one per core; `0` serves connections on the shared runtime instead.
    #[arg(long, env = "SWITCHYARD_IO_THREADS")]
    io_threads: Option<usize>,
}

impl ServeArgs {
    fn options(self) -> switchyard_router::app::ServeOptions {
        switchyard_router::app::ServeOptions {
            allow_anonymous: self.allow_anonymous,
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            max_connections: self.max_connections,
            probe_gate: self.probe_gate,
            ui: self.ui,
            io_threads: self.io_threads.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            }),
        }
    }
}

/// A duration flag (`60s`, `5m`, `1h30m`).
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    switchyard_api::duration::parse(text)
        .ok_or_else(|| format!("{text:?} is not a duration such as 60s or 5m"))
}

/// Runs `serve` until the first SIGINT/SIGTERM, then lets it drain in-flight requests; a
/// second signal, or [`SHUTDOWN_GRACE`] running out, ends it with requests still in flight.
async fn with_drain<F, T>(
    serve: impl FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> F,
) -> Result<(), T>
where
    F: std::future::Future<Output = Result<(), T>>,
{
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        eprintln!(
            "shutting down: draining in-flight requests (up to {}s; signal again to stop now)",
            SHUTDOWN_GRACE.as_secs()
        );
        let _ = stop_tx.send(true);
    });
    let mut drain_rx = stop_rx.clone();
    let shutdown = Box::pin(async move {
        let _ = drain_rx.wait_for(|stop| *stop).await;
    });
    let mut forced_rx = stop_rx;
    let forced = async move {
        let _ = forced_rx.wait_for(|stop| *stop).await;
        tokio::select! {
            () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
            () = shutdown_signal() => {}
        }
    };
    tokio::select! {
        served = serve(shutdown) => served,
        () = forced => {
            eprintln!("shutting down now with requests still in flight");
            Ok(())
        }
    }
}

async fn status(url: &str, json: bool) -> anyhow::Result<()> {
    let endpoint = format!("{}/status", url.trim_end_matches('/'));
    let response = reqwest::get(&endpoint)
        .await
        .with_context(|| format!("failed to reach {endpoint}"))?;
    let response = response
        .error_for_status()
        .with_context(|| format!("{endpoint} answered with an error"))?;
    let doc: switchyard_router::status::StatusDocument = response
        .json()
        .await
        .context("the status document did not parse")?;
    let text = if json {
        serde_json::to_string_pretty(&doc)?
    } else {
        switchyard_router::status::render_table(&doc)
    };
    // The command's output. A closed pipe (`switchyard status | head`) ends it quietly rather
    // than panicking as `println!` would.
    use std::io::Write as _;
    match writeln!(std::io::stdout(), "{text}") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::from(e).context("failed to write the status"))
        }
        _ => Ok(()),
    }
}

fn simulate(scenarios: &[PathBuf], out: &std::path::Path) -> anyhow::Result<()> {
    let reports =
        switchyard_sim::run_scenario_files(scenarios, out).map_err(|e| anyhow::anyhow!("{e}"))?;
    for report in &reports {
        eprintln!(
            "{}: {} strategies simulated",
            report.scenario,
            report.runs.len()
        );
    }
    let summary = out.join("summary.md");
    eprintln!(
        "wrote {} (and CSV + SVG per run under {})",
        summary.display(),
        out.display()
    );
    Ok(())
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
