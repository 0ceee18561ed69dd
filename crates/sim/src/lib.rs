//! Switchyard simulator: the real `switchyard-core` decisions in virtual time against scripted
//! providers and traffic, compared with the baselines gateways ship.
//!
//! Method (DESIGN §6): a scenario file scripts providers (rate limits as RPM/ITPM token buckets
//! over uncached tokens, outages, background errors, latency with shifts, prompt-cache TTL) and
//! traffic (multi-turn agent sessions whose context grows every turn, or a Poisson stream of
//! small embedding requests). A discrete-event loop ([`engine`]) replays the same traffic and
//! the same provider dice against each strategy ([`StrategyKind`]) and measures client-visible
//! errors, affinity retention, uncached input tokens re-processed, latency percentiles and the
//! per-interval availability/weight/share of every provider ([`metrics`]). Sticky chains and
//! the PID availability controller come from seed 000 (Lovable), p2c with per-service scoring
//! from seed 002 (Pinecone).
//!
//! Alternatives rejected: replaying recorded traces (none exist yet, and scripted scenarios
//! make each mechanism's effect visible in isolation); running the router over loopback in
//! real time (an hour of traffic would take an hour; the router's HTTP path is the end-to-end
//! suite's job, the decisions are the same code either way).
//!
//! Entry points: [`run_scenario`] for one strategy in memory, [`run_scenario_file`] for the
//! `switchyard simulate` command (all strategies, files on disk).

use std::path::{Path, PathBuf};

mod engine;
pub mod metrics;
mod model;
mod output;
pub mod scenario;
mod strategy;
mod switchyard;

pub use metrics::{
    FailureCounts, IntervalRow, ProviderInterval, Replay, ReplayAttempt, RunResult, RunSummary,
};
pub use output::summary_markdown;
pub use scenario::{Scenario, ServiceType};
pub use strategy::StrategyKind;

/// Errors of the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario file could not be read or an output could not be written.
    #[error("failed to access {path}: {source}")]
    Io {
        /// File or folder.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The YAML does not match the scenario schema.
    #[error("failed to parse scenario: {0}")]
    Parse(String),
    /// The scenario parsed but breaks a rule (message says which).
    #[error("invalid scenario: {0}")]
    Invalid(String),
    /// A CSV or chart could not be produced.
    #[error("{0}")]
    Output(String),
}

/// What [`run_scenario_file`] produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Folder holding `summary.csv`, `summary.md` and `<scenario>/<strategy>/`.
    pub out_dir: PathBuf,
    /// One summary per strategy run, in run order.
    pub runs: Vec<RunSummary>,
}

impl Report {
    /// The summary of one strategy, if it ran.
    pub fn run(&self, kind: StrategyKind) -> Option<&RunSummary> {
        self.runs.iter().find(|r| r.strategy == kind)
    }
}

/// Runs one strategy over a scenario in memory. Deterministic: the same scenario (seed
/// included) and strategy always give the same result.
pub fn run_scenario(scenario: &Scenario, strategy: StrategyKind) -> RunResult {
    let s = switchyard::build(scenario, strategy);
    engine::Engine::new(scenario, strategy, s).run()
}

/// The strategies a scenario asks for (all four by default).
pub fn strategies_of(scenario: &Scenario) -> Vec<StrategyKind> {
    scenario
        .strategies
        .clone()
        .unwrap_or_else(|| StrategyKind::ALL.to_vec())
}

/// Runs every strategy of the scenario at `path` and writes
/// `out_dir/<scenario>/<strategy>/{timeseries.csv,chart.svg}` plus `out_dir/summary.csv` and
/// `out_dir/summary.md` (comparing the strategies of this scenario).
///
/// Errors: unreadable or invalid scenario ([`SimError::Io`], [`SimError::Parse`],
/// [`SimError::Invalid`]), or an output that cannot be written.
pub fn run_scenario_file(path: &Path, out_dir: &Path) -> Result<Report, SimError> {
    let scenario = Scenario::from_file(path)?;
    let runs = run_all(&scenario);
    write_outputs(&scenario, &runs, out_dir)?;
    Ok(Report {
        scenario: scenario.name.clone(),
        out_dir: out_dir.to_path_buf(),
        runs: runs.into_iter().map(|r| r.summary).collect(),
    })
}

/// Runs several scenario files like [`run_scenario_file`], then writes one `summary.csv` and
/// `summary.md` in `out_dir` covering all of them (each scenario's runs stay under
/// `out_dir/<scenario>/<strategy>/`). Stops at the first failing file.
pub fn run_scenario_files(paths: &[PathBuf], out_dir: &Path) -> Result<Vec<Report>, SimError> {
    let mut reports = Vec::with_capacity(paths.len());
    for path in paths {
        reports.push(run_scenario_file(path, out_dir)?);
    }
    let all: Vec<RunSummary> = reports.iter().flat_map(|r| r.runs.clone()).collect();
    write_summaries(&all, out_dir)?;
    Ok(reports)
}

/// Writes `out_dir/summary.csv` and `out_dir/summary.md` for the given runs (any scenarios).
pub fn write_summaries(runs: &[RunSummary], out_dir: &Path) -> Result<(), SimError> {
    std::fs::create_dir_all(out_dir).map_err(|e| SimError::Io {
        path: out_dir.display().to_string(),
        source: e,
    })?;
    output::write_summary_csv(&out_dir.join("summary.csv"), runs)?;
    output::write_summary_md(&out_dir.join("summary.md"), runs)
}

/// Runs every strategy of a scenario.
pub fn run_all(scenario: &Scenario) -> Vec<RunResult> {
    strategies_of(scenario)
        .into_iter()
        .map(|k| run_scenario(scenario, k))
        .collect()
}

/// Writes the files of [`run_scenario_file`] for runs already made.
pub fn write_outputs(
    scenario: &Scenario,
    runs: &[RunResult],
    out_dir: &Path,
) -> Result<(), SimError> {
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| SimError::Io { path: p, source: e }
    };
    for run in runs {
        let dir = out_dir
            .join(&scenario.name)
            .join(run.summary.strategy.as_str());
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        output::write_timeseries(&dir.join("timeseries.csv"), run)?;
        let title = format!("{} — {}", scenario.name, run.summary.strategy);
        output::write_chart(&dir.join("chart.svg"), &title, run)?;
    }
    let scenario_dir = out_dir.join(&scenario.name);
    std::fs::create_dir_all(&scenario_dir).map_err(io(&scenario_dir))?;
    let overlay = scenario_dir.join("overlay.svg");
    let title = format!("{} — strategies overlaid", scenario.name);
    output::write_overlay_chart(&overlay, &title, runs)?;
    let summaries: Vec<RunSummary> = runs.iter().map(|r| r.summary.clone()).collect();
    write_summaries(&summaries, out_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_PROVIDER: &str = r#"
name: single
service: chat
duration: 20m
seed: 3
providers:
  - name: only
    cache_ttl: 5m
    latency: {base: 500ms, per_1k_uncached: 10ms, per_output_token: 5ms}
traffic:
  kind: sessions
  projects: 50
  sessions_per_minute: 6
  turns: [5, 10]
  turn_gap: 10s
  initial_context: 1000
  tokens_per_turn: 100
  output_tokens: 50
"#;

    #[test]
    fn run_single_unlimited_provider_serves_all_with_full_affinity() {
        let sc = Scenario::from_yaml(ONE_PROVIDER).unwrap();
        for kind in StrategyKind::ALL {
            let r = run_scenario(&sc, kind);
            let s = &r.summary;
            assert!(s.requests > 500, "{kind}: {}", s.requests);
            assert_eq!(s.client_errors, 0, "{kind}");
            assert_eq!(s.affinity_retention, 1.0, "{kind}");
            // Attempts still in flight when the run ends are sent but not finished.
            assert_eq!(s.rate_limited + s.provider_errors, 0, "{kind}");
            assert!(
                s.attempts >= s.requests && s.attempts - s.requests < 20,
                "{kind}"
            );
            // 40 intervals of 30 s.
            assert_eq!(r.intervals.len(), 40, "{kind}");
        }
    }

    #[test]
    fn run_single_provider_uncached_tokens_are_first_turns_plus_deltas() {
        let sc = Scenario::from_yaml(ONE_PROVIDER).unwrap();
        let s = run_scenario(&sc, StrategyKind::Ordered).summary;
        // Every turn after the first reuses the previous prompt (gaps are far below the TTL),
        // so it only pays for the 150 tokens added since; first turns pay 1000.
        let later_turns = s.affinity_turns;
        let first_turns = s.requests - later_turns;
        assert_eq!(s.uncached_tokens, first_turns * 1000 + later_turns * 150);
    }

    #[test]
    fn write_outputs_creates_csv_chart_and_summaries() {
        let sc = Scenario::from_yaml(ONE_PROVIDER).unwrap();
        let runs = vec![
            run_scenario(&sc, StrategyKind::Switchyard),
            run_scenario(&sc, StrategyKind::Ordered),
        ];
        let dir = std::env::temp_dir().join(format!("switchyard-sim-test-{}", std::process::id()));
        write_outputs(&sc, &runs, &dir).unwrap();
        let run_dir = dir.join("single").join("switchyard");
        let csv = std::fs::read_to_string(run_dir.join("timeseries.csv")).unwrap();
        assert_eq!(csv.lines().count(), 41);
        assert!(csv.starts_with("interval_start_s,only_availability,only_weight"));
        let svg = std::fs::read_to_string(run_dir.join("chart.svg")).unwrap();
        assert!(svg.contains("<svg") && svg.contains("affinity"));
        // The overlay: one series per strategy in every panel.
        let overlay = std::fs::read_to_string(dir.join("single").join("overlay.svg")).unwrap();
        assert!(overlay.contains("client p95 latency"), "{overlay}");
        assert!(
            overlay.matches("\nswitchyard\n").count() >= 4,
            "legend per panel"
        );
        assert!(
            overlay.matches("\nordered\n").count() >= 4,
            "legend per panel"
        );
        let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert!(md.contains("| switchyard |"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
