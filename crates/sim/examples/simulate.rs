//! Runs scenario files and writes the outputs, like `switchyard simulate`:
//! `cargo run --release -p switchyard-sim --example simulate -- OUT_DIR SCENARIO.yaml...`
//! Each scenario's `summary.md` is printed to stderr; summaries of all scenarios are merged
//! into `OUT_DIR/summary.{csv,md}`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: simulate OUT_DIR SCENARIO.yaml...")?,
    );
    let mut all = Vec::new();
    for path in args {
        let report = switchyard_sim::run_scenario_file(path.as_ref(), &out.join("runs"))?;
        eprintln!("{}", switchyard_sim::summary_markdown(&report.runs));
        all.extend(report.runs);
    }
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("summary.md"),
        switchyard_sim::summary_markdown(&all),
    )?;
    Ok(())
}
