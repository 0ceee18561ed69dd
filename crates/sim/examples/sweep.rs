//! Sweeps two RoutingPolicy settings of the `switchyard` strategy over scenario files and seeds,
//! the evidence behind their defaults (docs/simulation.md, "Choosing the defaults"):
//!
//! ```text
//! cargo run --release -p switchyard-sim --example sweep -- \
//!     --cache-hold 0s,2s,5s,10s --pause-wait 0s,10s,30s --seeds 1,2,3,4,5 config/scenarios/*.yaml
//! ```
//!
//! For every scenario and every (`affinity.cacheHold`, `fallback.pauseWait`) pair, the scenario
//! runs once per seed with only those two settings replaced (whatever the file sets for them is
//! overridden); the Markdown table printed to stdout gives, over the seeds, the mean and worst
//! client error rate, the mean affinity retention, uncached input tokens relative to the first
//! pair of the sweep, and the mean p95 latency. `--deadline D` also replaces the RoutingPolicy
//! `deadline` in every cell; `--wait-lines on,off` adds the FIFO wait lines
//! (`switchyard_core::waitline`) as a third dimension (unset: as the file says).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use switchyard_sim::{Scenario, StrategyKind, run_scenario};

fn durations(arg: &str) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    arg.split(',')
        .map(|s| humantime::parse_duration(s.trim()).map_err(Into::into))
        .collect()
}

struct Row {
    lines: Option<bool>,
    cache_hold: Duration,
    pause_wait: Duration,
    errors_mean: f64,
    errors_max: f64,
    affinity: f64,
    uncached: f64,
    p95_ms: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut holds = vec![Duration::ZERO];
    let mut waits = vec![Duration::ZERO];
    let mut seeds: Vec<u64> = vec![1, 2, 3];
    let mut deadline = None;
    let mut lines: Vec<Option<bool>> = vec![None];
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--cache-hold" => holds = durations(&value()?)?,
            "--pause-wait" => waits = durations(&value()?)?,
            "--wait-lines" => {
                lines = value()?
                    .split(',')
                    .map(|v| match v.trim() {
                        "on" => Ok(Some(true)),
                        "off" => Ok(Some(false)),
                        other => Err(format!("--wait-lines: on or off, not {other}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--deadline" => deadline = Some(humantime::parse_duration(&value()?)?),
            "--seeds" => {
                seeds = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            _ => files.push(PathBuf::from(a)),
        }
    }
    if files.is_empty() || seeds.is_empty() {
        return Err(
            "usage: sweep [--cache-hold D,..] [--pause-wait D,..] [--deadline D] [--wait-lines on,off] [--seeds N,..] \
             SCENARIO.yaml..."
                .into(),
        );
    }
    let mut out = String::new();
    writeln!(
        out,
        "Seeds {}; each cell is the `switchyard` strategy with only `cacheHold` and `pauseWait` \
         replaced.\n",
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    for file in &files {
        let base = Scenario::from_file(file)?;
        let mut rows = Vec::new();
        for &cache_hold in &holds {
            for &pause_wait in &waits {
                for &wait_lines in &lines {
                    let n = seeds.len() as f64;
                    let (mut em, mut ex, mut aff, mut unc, mut p95) = (0.0, 0.0f64, 0.0, 0.0, 0.0);
                    for &seed in &seeds {
                        let mut sc = base.with_seed(seed);
                        sc.switchyard.cache_hold = Some(cache_hold);
                        sc.switchyard.pause_wait = pause_wait;
                        if let Some(on) = wait_lines {
                            sc.switchyard.wait_lines = on;
                        }
                        if let Some(d) = deadline {
                            sc.switchyard.deadline = d;
                        }
                        let s = run_scenario(&sc, StrategyKind::Switchyard).summary;
                        em += s.client_error_rate / n;
                        ex = ex.max(s.client_error_rate);
                        aff += s.affinity_retention / n;
                        unc += s.uncached_tokens as f64 / n;
                        p95 += s.p95_ms / n;
                    }
                    eprintln!(
                        "{}: cacheHold {cache_hold:?} pauseWait {pause_wait:?} done",
                        base.name
                    );
                    rows.push(Row {
                        lines: wait_lines,
                        cache_hold,
                        pause_wait,
                        errors_mean: em,
                        errors_max: ex,
                        affinity: aff,
                        uncached: unc,
                        p95_ms: p95,
                    });
                }
            }
        }
        let reference = rows.first().map_or(1.0, |r| r.uncached.max(1.0));
        writeln!(out, "### {}\n", base.name)?;
        writeln!(
            out,
            "| cacheHold | pauseWait | wait lines | client errors, mean | worst seed | affinity | uncached vs first row | p95 ms |"
        )?;
        writeln!(out, "|---:|---:|:---:|---:|---:|---:|---:|---:|")?;
        for r in &rows {
            writeln!(
                out,
                "| {} | {} | {} | {:.3} % | {:.3} % | {:.2} % | {:+.1} % | {:.0} |",
                humantime::format_duration(r.cache_hold),
                humantime::format_duration(r.pause_wait),
                match r.lines {
                    Some(true) => "on",
                    Some(false) => "off",
                    None => "file",
                },
                r.errors_mean * 100.0,
                r.errors_max * 100.0,
                r.affinity * 100.0,
                (r.uncached / reference - 1.0) * 100.0,
                r.p95_ms
            )?;
        }
        writeln!(out)?;
    }
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}
