//! Runs scenario files and writes the outputs, like `switchyard simulate`:
//! `cargo run --release -p switchyard-sim --example simulate -- OUT_DIR SCENARIO.yaml...`
//! Writes `OUT_DIR/<scenario>/<strategy>/{timeseries.csv,chart.svg}` and one
//! `OUT_DIR/summary.{csv,md}` for all scenarios, and prints the Markdown summary to stderr.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: simulate OUT_DIR SCENARIO.yaml...")?,
    );
    let paths: Vec<PathBuf> = args.map(PathBuf::from).collect();
    let reports = switchyard_sim::run_scenario_files(&paths, &out)?;
    let all: Vec<_> = reports.into_iter().flat_map(|r| r.runs).collect();
    eprintln!("{}", switchyard_sim::summary_markdown(&all));
    Ok(())
}
