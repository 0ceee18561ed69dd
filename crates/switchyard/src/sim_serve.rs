//! `switchyard simulate --serve`: the simulator as a small web app (issue 17 item 4). A person
//! picks a scenario, edits provider capacities (RPM/ITPM), outage windows and traffic in the
//! browser, presses Run and watches availability, weights, traffic share, stickiness, errors
//! and latency over simulated time for each strategy. The page is
//! [`switchyard_router::ui::SIMULATOR_PAGE`] (the router's chart code).
//!
//! Endpoints: `GET /ui` (the page), `GET /ui/scenarios` (the scenarios with their editable
//! values), `POST /ui/run` (one run of every chosen strategy; JSON in and out).
//!
//! Bounds, so one click cannot eat the machine: simulated duration 1 min to [`MAX_DURATION`],
//! at most [`MAX_POINTS`] intervals, [`MAX_SESSIONS`] sessions or [`MAX_REQUESTS`] Poisson
//! requests per run, capacities and outage windows within the limits below, and one run at a
//! time (a second gets 429). A run goes to the blocking pool; out-of-bounds input gets 400
//! with a message naming the field. Overrides are applied to the scenario's YAML and the
//! result is parsed and validated by [`switchyard_sim::Scenario::from_yaml`], the same path
//! as a file.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use switchyard_sim::{Scenario, StrategyKind};

/// Longest simulated duration of one run.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(2 * 3600);
/// Most intervals (points per series) of one run.
pub(crate) const MAX_POINTS: u64 = 1000;
/// Most agent sessions one run may start (sessions per minute × minutes).
pub(crate) const MAX_SESSIONS: f64 = 5000.0;
/// Most Poisson requests one run may send (requests per second × seconds).
pub(crate) const MAX_REQUESTS: f64 = 300_000.0;
/// Highest RPM a provider may be given.
pub(crate) const MAX_RPM: f64 = 100_000.0;
/// Highest ITPM a provider may be given.
pub(crate) const MAX_ITPM: f64 = 100_000_000.0;
/// Most outage windows per provider.
pub(crate) const MAX_OUTAGES: usize = 10;
/// Most distinct projects.
pub(crate) const MAX_PROJECTS: u64 = 10_000;

/// The scenarios shipped in `config/scenarios/`, embedded so the command needs no checkout.
pub(crate) const SHIPPED: &[(&str, &str)] = &[
    (
        "primary-outage",
        include_str!("../../../config/scenarios/primary-outage.yaml"),
    ),
    (
        "primary-60pct",
        include_str!("../../../config/scenarios/primary-60pct.yaml"),
    ),
    (
        "flapping-primary",
        include_str!("../../../config/scenarios/flapping-primary.yaml"),
    ),
    (
        "over-capacity",
        include_str!("../../../config/scenarios/over-capacity.yaml"),
    ),
    (
        "slow-degradation",
        include_str!("../../../config/scenarios/slow-degradation.yaml"),
    ),
    (
        "slow-primary",
        include_str!("../../../config/scenarios/slow-primary.yaml"),
    ),
    (
        "embeddings-two-slow",
        include_str!("../../../config/scenarios/embeddings-two-slow.yaml"),
    ),
];

/// One scenario the page can run: its name and YAML text.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// Scenario name (from the YAML).
    pub(crate) name: String,
    /// The YAML text.
    pub(crate) yaml: String,
}

/// The server's state.
#[derive(Debug)]
pub(crate) struct SimServer {
    scenarios: Vec<Source>,
    running: tokio::sync::Semaphore,
}

impl SimServer {
    /// A server offering `scenarios` (each must parse).
    ///
    /// # Errors
    /// A scenario that does not parse or validate, naming it.
    pub(crate) fn new(scenarios: Vec<Source>) -> anyhow::Result<Arc<SimServer>> {
        for s in &scenarios {
            Scenario::from_yaml(&s.yaml)
                .map_err(|e| anyhow::anyhow!("scenario {}: {e}", s.name))?;
        }
        Ok(Arc::new(SimServer {
            scenarios,
            running: tokio::sync::Semaphore::new(1),
        }))
    }

    /// The embedded scenarios of `config/scenarios/`.
    pub(crate) fn shipped() -> Vec<Source> {
        SHIPPED
            .iter()
            .map(|(name, yaml)| Source {
                name: (*name).to_owned(),
                yaml: (*yaml).to_owned(),
            })
            .collect()
    }
}

/// The routes.
pub(crate) fn router(server: Arc<SimServer>) -> axum::Router {
    axum::Router::new()
        .route(
            "/",
            axum::routing::get(|| async { axum::response::Redirect::to("/ui") }),
        )
        .route("/ui", axum::routing::get(page))
        .route("/ui/scenarios", axum::routing::get(scenarios))
        .route("/ui/run", axum::routing::post(run))
        .with_state(server)
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        switchyard_router::ui::SIMULATOR_PAGE,
    )
        .into_response()
}

/// An outage window in seconds since the scenario start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OutageView {
    /// Start, s.
    pub(crate) start_s: u64,
    /// End, s.
    pub(crate) end_s: u64,
    /// HTTP status answered during the outage.
    pub(crate) status: u16,
}

/// A provider's editable values.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProviderView {
    /// Name.
    pub(crate) name: String,
    /// Constant RPM, when the scenario gives a constant.
    pub(crate) rpm: Option<f64>,
    /// The RPM schedule as written, when it is not a constant.
    pub(crate) rpm_text: Option<String>,
    /// Constant ITPM.
    pub(crate) itpm: Option<f64>,
    /// The ITPM schedule as written, when it is not a constant.
    pub(crate) itpm_text: Option<String>,
    /// Outage windows.
    pub(crate) outages: Vec<OutageView>,
}

/// What `GET /ui/scenarios` lists per scenario.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScenarioView {
    /// Name.
    pub(crate) name: String,
    /// One line.
    pub(crate) description: String,
    /// Simulated duration, s.
    pub(crate) duration_s: u64,
    /// Interval, s.
    pub(crate) interval_s: f64,
    /// Traffic: `kind` and its editable numbers.
    pub(crate) traffic: serde_json::Value,
    /// Providers.
    pub(crate) providers: Vec<ProviderView>,
}

fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
}

fn schedule_text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(v) if !v.is_number() && !v.is_null() => {
            serde_yaml::to_string(v).ok().map(|s| s.trim().to_owned())
        }
        _ => None,
    }
}

fn view(source: &Source) -> Option<ScenarioView> {
    let scenario = Scenario::from_yaml(&source.yaml).ok()?;
    let doc: Value = serde_yaml::from_str(&source.yaml).ok()?;
    let traffic = doc.get("traffic");
    let kind = traffic
        .and_then(|t| t.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let traffic = serde_json::json!({
        "kind": kind,
        "projects": traffic.and_then(|t| t.get("projects")).and_then(Value::as_u64),
        "sessions_per_minute": number(traffic.and_then(|t| t.get("sessions_per_minute"))),
        "requests_per_second": number(traffic.and_then(|t| t.get("requests_per_second"))),
    });
    let providers = scenario
        .providers
        .iter()
        .zip(doc.get("providers").and_then(Value::as_sequence)?)
        .map(|(p, raw)| ProviderView {
            name: p.name.clone(),
            rpm: number(raw.get("rpm")),
            rpm_text: schedule_text(raw.get("rpm")),
            itpm: number(raw.get("itpm")),
            itpm_text: schedule_text(raw.get("itpm")),
            outages: p
                .outages
                .iter()
                .map(|o| OutageView {
                    start_s: o.start.as_secs(),
                    end_s: o.end.as_secs(),
                    status: o.status,
                })
                .collect(),
        })
        .collect();
    Some(ScenarioView {
        name: scenario.name.clone(),
        description: scenario.description.clone(),
        duration_s: scenario.duration.as_secs(),
        interval_s: scenario.interval.as_secs_f64(),
        traffic,
        providers,
    })
}

async fn scenarios(State(server): State<Arc<SimServer>>) -> Response {
    let views: Vec<ScenarioView> = server.scenarios.iter().filter_map(view).collect();
    axum::Json(views).into_response()
}

/// Traffic overrides.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TrafficOverride {
    /// Session starts per minute (sessions traffic).
    pub(crate) sessions_per_minute: Option<f64>,
    /// Distinct projects (sessions traffic).
    pub(crate) projects: Option<u64>,
    /// Requests per second (Poisson traffic).
    pub(crate) requests_per_second: Option<f64>,
}

/// One provider's overrides; an absent field keeps the scenario's value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProviderOverride {
    /// Provider name (must exist in the scenario).
    pub(crate) name: String,
    /// Requests per minute; 0 removes the limit.
    pub(crate) rpm: Option<f64>,
    /// Input tokens per minute; 0 removes the limit.
    pub(crate) itpm: Option<f64>,
    /// Replaces the outage windows when given.
    pub(crate) outages: Option<Vec<OutageView>>,
}

/// The body of `POST /ui/run`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRequest {
    /// Scenario name.
    pub(crate) scenario: String,
    /// Simulated duration, s.
    pub(crate) duration_s: Option<u64>,
    /// Traffic overrides.
    #[serde(default)]
    pub(crate) traffic: TrafficOverride,
    /// Provider overrides.
    #[serde(default)]
    pub(crate) providers: Vec<ProviderOverride>,
    /// Strategies to run (default: the scenario's, else all four).
    #[serde(default)]
    pub(crate) strategies: Vec<StrategyKind>,
}

/// One provider in one interval of a run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProviderPoint {
    /// Availability at the interval's end (switchyard chat only).
    pub(crate) availability: Option<f64>,
    /// Weight at the interval's end (switchyard chat only).
    pub(crate) weight: Option<f64>,
    /// Share of the interval's served requests.
    pub(crate) share: f64,
    /// Requests served.
    pub(crate) served: u64,
    /// Provider errors other than 429.
    pub(crate) errors: u64,
    /// 429 answers.
    pub(crate) rate_limited: u64,
}

/// One interval of a run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    /// Interval start, simulated seconds.
    pub(crate) t_s: f64,
    /// Requests finished.
    pub(crate) requests: u64,
    /// Client-visible errors.
    pub(crate) client_errors: u64,
    /// Affinity retention, when a turn was counted.
    pub(crate) affinity: Option<f64>,
    /// Median latency, ms.
    pub(crate) p50_ms: Option<f64>,
    /// 95th percentile latency, ms.
    pub(crate) p95_ms: Option<f64>,
    /// Per provider, in scenario order.
    pub(crate) providers: Vec<ProviderPoint>,
}

/// A run's totals.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Totals {
    /// Requests finished.
    pub(crate) requests: u64,
    /// Client-visible errors.
    pub(crate) client_errors: u64,
    /// Their rate.
    pub(crate) client_error_rate: f64,
    /// Affinity retention.
    pub(crate) affinity_retention: f64,
    /// Uncached input tokens processed.
    pub(crate) uncached_tokens: u64,
    /// 429 answers.
    pub(crate) rate_limited: u64,
    /// Other provider errors.
    pub(crate) provider_errors: u64,
    /// Latency percentiles, ms.
    pub(crate) p50_ms: f64,
    /// 95th.
    pub(crate) p95_ms: f64,
    /// 99th.
    pub(crate) p99_ms: f64,
}

/// One strategy's run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunView {
    /// Strategy.
    pub(crate) strategy: String,
    /// Totals.
    pub(crate) summary: Totals,
    /// Intervals.
    pub(crate) intervals: Vec<Point>,
}

/// What `POST /ui/run` returns.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunDocument {
    /// Scenario name.
    pub(crate) scenario: String,
    /// Interval, s.
    pub(crate) interval_s: f64,
    /// Provider names in scenario order.
    pub(crate) providers: Vec<String>,
    /// One per strategy.
    pub(crate) runs: Vec<RunView>,
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(serde_json::json!({"error": {"message": message.into()}})),
    )
        .into_response()
}

fn secs(s: f64) -> Value {
    Value::String(format!("{}s", s.round()))
}

/// Applies `req` to the scenario text and checks every bound; the message names the field.
///
/// # Errors
/// An unknown scenario or provider, or a value out of bounds, or a scenario that no longer
/// validates.
pub(crate) fn prepare(
    server: &SimServer,
    req: &RunRequest,
) -> Result<(Scenario, Vec<StrategyKind>), String> {
    let source = server
        .scenarios
        .iter()
        .find(|s| s.name == req.scenario)
        .ok_or_else(|| format!("no scenario named {:?}", req.scenario))?;
    let mut doc: Value = serde_yaml::from_str(&source.yaml).map_err(|e| e.to_string())?;
    let map = doc.as_mapping_mut().ok_or("scenario is not a mapping")?;
    if let Some(d) = req.duration_s {
        if d < 60 || d > MAX_DURATION.as_secs() {
            return Err(format!(
                "duration_s must be 60..={} (got {d})",
                MAX_DURATION.as_secs()
            ));
        }
        map.insert("duration".into(), secs(d as f64));
    }
    let finite_in = |name: &str, v: f64, lo: f64, hi: f64| {
        if v.is_finite() && v > lo && v <= hi {
            Ok(())
        } else {
            Err(format!(
                "{name} must be above {lo} and at most {hi} (got {v})"
            ))
        }
    };
    if let Some(traffic) = map.get_mut("traffic").and_then(Value::as_mapping_mut) {
        let kind = traffic
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let t = &req.traffic;
        if let Some(v) = t.sessions_per_minute {
            if kind != "sessions" {
                return Err("sessions_per_minute applies to sessions traffic only".into());
            }
            finite_in("traffic.sessions_per_minute", v, 0.0, 600.0)?;
            traffic.insert("sessions_per_minute".into(), v.into());
        }
        if let Some(v) = t.projects {
            if kind != "sessions" {
                return Err("projects applies to sessions traffic only".into());
            }
            if v == 0 || v > MAX_PROJECTS {
                return Err(format!(
                    "traffic.projects must be 1..={MAX_PROJECTS} (got {v})"
                ));
            }
            traffic.insert("projects".into(), v.into());
        }
        if let Some(v) = t.requests_per_second {
            if kind != "poisson" {
                return Err("requests_per_second applies to Poisson traffic only".into());
            }
            finite_in("traffic.requests_per_second", v, 0.0, 1000.0)?;
            traffic.insert("requests_per_second".into(), v.into());
        }
    }
    if let Some(list) = map.get_mut("providers").and_then(Value::as_sequence_mut) {
        for o in &req.providers {
            let p = list
                .iter_mut()
                .find(|p| p.get("name").and_then(Value::as_str) == Some(o.name.as_str()))
                .and_then(Value::as_mapping_mut)
                .ok_or_else(|| format!("no provider named {:?} in the scenario", o.name))?;
            for (field, value, max) in [("rpm", o.rpm, MAX_RPM), ("itpm", o.itpm, MAX_ITPM)] {
                match value {
                    None => {}
                    Some(0.0) => {
                        p.remove(field);
                    }
                    Some(v) => {
                        finite_in(&format!("{}.{field}", o.name), v, 0.0, max)?;
                        p.insert(field.into(), v.into());
                    }
                }
            }
            if let Some(outages) = &o.outages {
                if outages.len() > MAX_OUTAGES {
                    return Err(format!("{}: at most {MAX_OUTAGES} outages", o.name));
                }
                let mut seq = Vec::new();
                for w in outages {
                    if w.start_s >= w.end_s || !(400..=599).contains(&w.status) {
                        return Err(format!(
                            "{}: an outage needs start < end and a status 400..=599 (got {}-{} s, {})",
                            o.name, w.start_s, w.end_s, w.status
                        ));
                    }
                    let mut m = serde_yaml::Mapping::new();
                    m.insert("start".into(), secs(w.start_s as f64));
                    m.insert("end".into(), secs(w.end_s as f64));
                    m.insert("status".into(), u64::from(w.status).into());
                    seq.push(Value::Mapping(m));
                }
                p.insert("outages".into(), Value::Sequence(seq));
            }
        }
    }
    let text = serde_yaml::to_string(&doc).map_err(|e| e.to_string())?;
    let scenario = Scenario::from_yaml(&text).map_err(|e| e.to_string())?;
    // Bounds on the whole run.
    if scenario.duration > MAX_DURATION {
        return Err(format!(
            "the simulated duration is capped at {} s",
            MAX_DURATION.as_secs()
        ));
    }
    let points = scenario.duration.as_secs_f64() / scenario.interval.as_secs_f64().max(1e-3);
    if points > MAX_POINTS as f64 {
        return Err(format!(
            "at most {MAX_POINTS} intervals per run (duration / interval is {points:.0})"
        ));
    }
    for p in &scenario.providers {
        if p.outages.iter().any(|o| o.end > scenario.duration) {
            return Err(format!("{}: an outage ends after the run", p.name));
        }
    }
    let seconds = scenario.duration.as_secs_f64();
    let probes = 200;
    let peak = |s: &switchyard_sim::scenario::Schedule| {
        (0..=probes)
            .map(|i| s.at(scenario.duration.mul_f64(f64::from(i) / f64::from(probes))))
            .fold(0.0, f64::max)
    };
    match &scenario.traffic {
        switchyard_sim::scenario::Traffic::Sessions(t) => {
            let sessions = peak(&t.sessions_per_minute) * seconds / 60.0;
            if sessions > MAX_SESSIONS {
                return Err(format!(
                    "at most {MAX_SESSIONS} sessions per run (sessions per minute × minutes is {sessions:.0})"
                ));
            }
        }
        switchyard_sim::scenario::Traffic::Poisson(t) => {
            let requests = peak(&t.requests_per_second) * seconds;
            if requests > MAX_REQUESTS {
                return Err(format!(
                    "at most {MAX_REQUESTS} requests per run (requests per second × seconds is {requests:.0})"
                ));
            }
        }
        switchyard_sim::scenario::Traffic::Script(_) => {}
    }
    let mut strategies = if req.strategies.is_empty() {
        switchyard_sim::strategies_of(&scenario)
    } else {
        req.strategies.clone()
    };
    strategies.dedup();
    Ok((scenario, strategies))
}

/// Runs every strategy (on the calling thread) and shapes the result.
pub(crate) fn simulate(scenario: &Scenario, strategies: &[StrategyKind]) -> RunDocument {
    let runs: Vec<_> = strategies
        .iter()
        .map(|&k| switchyard_sim::run_scenario(scenario, k))
        .collect();
    RunDocument {
        scenario: scenario.name.clone(),
        interval_s: scenario.interval.as_secs_f64(),
        providers: scenario.providers.iter().map(|p| p.name.clone()).collect(),
        runs: runs
            .into_iter()
            .map(|r| RunView {
                strategy: r.summary.strategy.as_str().to_owned(),
                summary: Totals {
                    requests: r.summary.requests,
                    client_errors: r.summary.client_errors,
                    client_error_rate: r.summary.client_error_rate,
                    affinity_retention: r.summary.affinity_retention,
                    uncached_tokens: r.summary.uncached_tokens,
                    rate_limited: r.summary.rate_limited,
                    provider_errors: r.summary.provider_errors,
                    p50_ms: r.summary.p50_ms,
                    p95_ms: r.summary.p95_ms,
                    p99_ms: r.summary.p99_ms,
                },
                intervals: r
                    .intervals
                    .iter()
                    .map(|i| Point {
                        t_s: i.start.as_secs_f64(),
                        requests: i.requests,
                        client_errors: i.client_errors,
                        affinity: i.affinity,
                        p50_ms: i.p50_ms,
                        p95_ms: i.p95_ms,
                        providers: i
                            .providers
                            .iter()
                            .map(|p| ProviderPoint {
                                availability: p.availability,
                                weight: p.weight,
                                share: p.share,
                                served: p.served,
                                errors: p.errors,
                                rate_limited: p.rate_limited,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

async fn run(
    State(server): State<Arc<SimServer>>,
    body: Result<axum::Json<RunRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let axum::Json(req) = match body {
        Ok(b) => b,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let (scenario, strategies) = match prepare(&server, &req) {
        Ok(s) => s,
        Err(message) => return refuse(StatusCode::BAD_REQUEST, message),
    };
    let Ok(_permit) = server.running.try_acquire() else {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "a run is in progress; try again when it has finished",
        );
    };
    match tokio::task::spawn_blocking(move || simulate(&scenario, &strategies)).await {
        Ok(doc) => axum::Json(doc).into_response(),
        Err(e) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the run failed: {e}"),
        ),
    }
}

/// Serves the simulator on `listen` until SIGINT/SIGTERM; prints
/// `switchyard simulator on http://ADDR/ui` to stderr once bound.
///
/// # Errors
/// A socket that cannot be bound, or a scenario that does not parse.
pub(crate) async fn serve(
    listen: std::net::SocketAddr,
    scenarios: Vec<Source>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let server = SimServer::new(scenarios)?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("failed to bind {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    eprintln!("switchyard simulator on http://{addr}/ui");
    axum::serve(listener, router(server))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
