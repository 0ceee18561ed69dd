//! Files written by a simulation: per-run `timeseries.csv` and `chart.svg`, and the
//! cross-strategy `summary.csv` and `summary.md`.

use std::fs;
use std::path::Path;

use plotters::prelude::*;

use crate::SimError;
use crate::metrics::{IntervalRow, RunResult, RunSummary};

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SimError + '_ {
    move |e| SimError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

fn csv_err(path: &Path) -> impl FnOnce(csv::Error) -> SimError + '_ {
    move |e| SimError::Output(format!("failed to write {}: {e}", path.display()))
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| format!("{v:.4}"))
}

/// Writes one run's interval rows as CSV (wide: a column group per provider).
pub(crate) fn write_timeseries(path: &Path, run: &RunResult) -> Result<(), SimError> {
    let mut w = csv::Writer::from_path(path).map_err(csv_err(path))?;
    let mut header = vec!["interval_start_s".to_string()];
    for p in &run.providers {
        for col in [
            "availability",
            "weight",
            "share",
            "attempts",
            "errors",
            "429s",
        ] {
            header.push(format!("{p}_{col}"));
        }
    }
    header.extend(
        [
            "requests",
            "client_errors",
            "client_error_rate",
            "affinity_retention",
            "uncached_input_tokens",
            "input_tokens",
            "p50_ms",
            "p95_ms",
        ]
        .map(String::from),
    );
    w.write_record(&header).map_err(csv_err(path))?;
    for r in &run.intervals {
        let mut rec = vec![r.start.as_secs().to_string()];
        for p in &r.providers {
            rec.push(opt(p.availability));
            rec.push(opt(p.weight));
            rec.push(format!("{:.4}", p.share));
            rec.push(p.attempts.to_string());
            rec.push(p.errors.to_string());
            rec.push(p.rate_limited.to_string());
        }
        rec.push(r.requests.to_string());
        rec.push(r.client_errors.to_string());
        rec.push(format!("{:.6}", r.client_error_rate));
        rec.push(opt(r.affinity));
        rec.push(r.uncached_tokens.to_string());
        rec.push(r.input_tokens.to_string());
        rec.push(opt(r.p50_ms));
        rec.push(opt(r.p95_ms));
        w.write_record(&rec).map_err(csv_err(path))?;
    }
    w.flush().map_err(io_err(path))
}

const SUMMARY_HEADER: [&str; 18] = [
    "scenario",
    "strategy",
    "requests",
    "client_errors",
    "client_error_rate",
    "affinity_retention",
    "uncached_input_tokens",
    "input_tokens",
    "attempts",
    "rate_limited",
    "provider_errors",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "attempts_per_request",
    "failed_attempts_exhausted",
    "failed_queue_timeout",
    "failed_no_candidate",
];

/// Writes `summary.csv`.
pub(crate) fn write_summary_csv(path: &Path, rows: &[RunSummary]) -> Result<(), SimError> {
    let mut w = csv::Writer::from_path(path).map_err(csv_err(path))?;
    w.write_record(SUMMARY_HEADER).map_err(csv_err(path))?;
    for s in rows {
        w.write_record([
            s.scenario.clone(),
            s.strategy.to_string(),
            s.requests.to_string(),
            s.client_errors.to_string(),
            format!("{:.6}", s.client_error_rate),
            format!("{:.4}", s.affinity_retention),
            s.uncached_tokens.to_string(),
            s.input_tokens.to_string(),
            s.attempts.to_string(),
            s.rate_limited.to_string(),
            s.provider_errors.to_string(),
            format!("{:.0}", s.p50_ms),
            format!("{:.0}", s.p95_ms),
            format!("{:.0}", s.p99_ms),
            format!("{:.3}", s.attempts as f64 / s.requests.max(1) as f64),
            s.failures.attempts_exhausted.to_string(),
            s.failures.queue_timeout.to_string(),
            s.failures.no_candidate.to_string(),
        ])
        .map_err(csv_err(path))?;
    }
    w.flush().map_err(io_err(path))
}

/// Renders the summary as a Markdown table per scenario; uncached tokens are also shown
/// relative to the `ordered` baseline of the same scenario.
pub fn summary_markdown(rows: &[RunSummary]) -> String {
    let mut out = String::from("# Simulation summary\n");
    let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    for sc in scenarios {
        let runs: Vec<&RunSummary> = rows.iter().filter(|r| r.scenario == sc).collect();
        let base = runs
            .iter()
            .find(|r| r.strategy == crate::StrategyKind::Ordered)
            .map(|r| r.uncached_tokens as f64);
        out.push_str(&format!(
            "\n## {sc}\n\n| strategy | requests | client errors | exhausted / queue / refused | affinity | uncached input tokens | vs ordered | 429s | other provider errors | attempts/req | p50 ms | p95 ms | p99 ms |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        ));
        for r in runs {
            let rel = base.filter(|b| *b > 0.0).map_or_else(
                || "–".into(),
                |b| format!("{:+.1} %", (r.uncached_tokens as f64 / b - 1.0) * 100.0),
            );
            out.push_str(&format!(
                "| {} | {} | {} ({:.3} %) | {} / {} / {} | {} | {} | {} | {} | {} | {:.3} | {:.0} | {:.0} | {:.0} |\n",
                r.strategy,
                r.requests,
                r.client_errors,
                r.client_error_rate * 100.0,
                r.failures.attempts_exhausted,
                r.failures.queue_timeout,
                r.failures.no_candidate,
                if r.affinity_turns > 0 {
                    format!("{:.2} %", r.affinity_retention * 100.0)
                } else {
                    "–".into()
                },
                r.uncached_tokens,
                rel,
                r.rate_limited,
                r.provider_errors,
                r.attempts as f64 / r.requests.max(1) as f64,
                r.p50_ms,
                r.p95_ms,
                r.p99_ms,
            ));
        }
    }
    out
}

/// Writes `summary.md`.
pub(crate) fn write_summary_md(path: &Path, rows: &[RunSummary]) -> Result<(), SimError> {
    fs::write(path, summary_markdown(rows)).map_err(io_err(path))
}

type Series = Vec<(String, Vec<(f64, f64)>)>;
/// One chart panel: title, series, fixed y range (or auto).
type Panel<'a> = (&'a str, Series, Option<(f64, f64)>);

/// One series per provider; `shift` (minutes) moves the points, e.g. to the interval end for
/// values computed there (availability, weight).
fn per_provider(
    run: &RunResult,
    shift: f64,
    f: impl Fn(&IntervalRow, usize) -> Option<f64>,
) -> Series {
    run.providers
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let pts = run
                .intervals
                .iter()
                .filter_map(|r| f(r, i).map(|v| (r.start.as_secs_f64() / 60.0 + shift, v)))
                .collect();
            (name.clone(), pts)
        })
        .collect()
}

fn single(run: &RunResult, name: &str, f: impl Fn(&IntervalRow) -> Option<f64>) -> Series {
    vec![(
        name.to_string(),
        run.intervals
            .iter()
            .filter_map(|r| f(r).map(|v| (r.start.as_secs_f64() / 60.0, v)))
            .collect(),
    )]
}

fn draw_err<E: std::fmt::Debug>(e: E) -> SimError {
    SimError::Output(format!("failed to draw chart: {e:?}"))
}

/// Draws the run's chart: availability, weight, traffic share, errors, 429s, affinity,
/// uncached tokens and p95 latency over time, one panel each.
pub(crate) fn write_chart(path: &Path, title: &str, run: &RunResult) -> Result<(), SimError> {
    // Counts are plotted at the start of their interval, availability and weight at its end
    // (where the controller computed them).
    let t = run
        .intervals
        .get(1)
        .map_or(0.0, |r| r.start.as_secs_f64() / 60.0);
    let panels: Vec<Panel<'_>> = vec![
        (
            "availability",
            per_provider(run, t, |r, i| r.providers[i].availability),
            Some((0.0, 1.05)),
        ),
        (
            "weight",
            per_provider(run, t, |r, i| r.providers[i].weight),
            Some((0.0, 1.05)),
        ),
        (
            "traffic share",
            per_provider(run, 0.0, |r, i| Some(r.providers[i].share)),
            Some((0.0, 1.05)),
        ),
        (
            "provider errors (5xx, timeouts) per interval",
            per_provider(run, 0.0, |r, i| Some(r.providers[i].errors as f64)),
            None,
        ),
        (
            "429s per interval",
            per_provider(run, 0.0, |r, i| Some(r.providers[i].rate_limited as f64)),
            None,
        ),
        (
            "affinity retention / client error rate",
            {
                let mut s = single(run, "affinity", |r| r.affinity);
                s.extend(single(run, "client errors", |r| Some(r.client_error_rate)));
                s
            },
            Some((0.0, 1.05)),
        ),
        (
            "uncached input tokens per interval (millions)",
            single(run, "uncached", |r| Some(r.uncached_tokens as f64 / 1e6)),
            None,
        ),
        (
            "client latency (ms)",
            {
                let mut s = single(run, "p50", |r| r.p50_ms);
                s.extend(single(run, "p95", |r| r.p95_ms));
                s
            },
            None,
        ),
    ];
    let x_max = run
        .intervals
        .last()
        .map_or(1.0, |r| r.start.as_secs_f64() / 60.0 + t)
        .max(1.0);
    draw_panels(path, title, (1200, 1400), (4, 2), x_max, panels)
}

/// Draws `panels` on a `rows × columns` grid into an SVG of `size` pixels; every panel's x axis
/// is minutes `0..x_max`, its y axis the panel's fixed range or `0..` 110 % of its largest value.
fn draw_panels(
    path: &Path,
    title: &str,
    size: (u32, u32),
    grid: (usize, usize),
    x_max: f64,
    panels: Vec<Panel<'_>>,
) -> Result<(), SimError> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(draw_err)?;
    let areas = root.split_evenly(grid);
    for (area, (name, series, range)) in areas.iter().zip(panels) {
        let y_max = range.map_or_else(
            || {
                series
                    .iter()
                    .flat_map(|(_, p)| p.iter().map(|x| x.1))
                    .fold(0.0f64, f64::max)
                    .max(1e-9)
                    * 1.1
            },
            |r| r.1,
        );
        let mut chart = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(48)
            .build_cartesian_2d(0.0..x_max, range.map_or(0.0, |r| r.0)..y_max)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .light_line_style(WHITE)
            .draw()
            .map_err(draw_err)?;
        let has_data = series.iter().any(|(_, p)| !p.is_empty());
        for (k, (label, pts)) in series.into_iter().enumerate() {
            if pts.is_empty() {
                continue;
            }
            let color = Palette99::pick(k).to_rgba();
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(draw_err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        if has_data {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(draw_err)?;
        }
    }
    root.present().map_err(draw_err)
}

/// Draws one chart per scenario overlaying its strategies: client error rate, affinity
/// retention, uncached input tokens and p95 latency per interval, one series per strategy.
pub(crate) fn write_overlay_chart(
    path: &Path,
    title: &str,
    runs: &[RunResult],
) -> Result<(), SimError> {
    let per_strategy = |f: &dyn Fn(&IntervalRow) -> Option<f64>| -> Series {
        runs.iter()
            .map(|run| {
                let pts = run
                    .intervals
                    .iter()
                    .filter_map(|r| f(r).map(|v| (r.start.as_secs_f64() / 60.0, v)))
                    .collect();
                (run.summary.strategy.as_str().to_owned(), pts)
            })
            .collect()
    };
    let panels: Vec<Panel<'_>> = vec![
        (
            "client error rate",
            per_strategy(&|r| Some(r.client_error_rate)),
            None,
        ),
        (
            "affinity retention",
            per_strategy(&|r| r.affinity),
            Some((0.0, 1.05)),
        ),
        (
            "uncached input tokens per interval (millions)",
            per_strategy(&|r| Some(r.uncached_tokens as f64 / 1e6)),
            None,
        ),
        ("client p95 latency (ms)", per_strategy(&|r| r.p95_ms), None),
    ];
    let x_max = runs
        .iter()
        .filter_map(|run| run.intervals.last())
        .map(|r| r.start.as_secs_f64() / 60.0)
        .fold(1.0, f64::max);
    draw_panels(path, title, (1200, 800), (2, 2), x_max, panels)
}
