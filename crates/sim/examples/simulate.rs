//! Runs scenario files and writes the outputs, like `switchyard simulate`:
//! `cargo run --release -p switchyard-sim --example simulate -- OUT_DIR [--seeds 1,2,3] SCENARIO.yaml...`
//! Writes `OUT_DIR/<scenario>/<strategy>/{timeseries.csv,chart.svg}` and one
//! `OUT_DIR/summary.{csv,md}` for all scenarios, and prints the Markdown summary to stderr.
//! With `--seeds`, every scenario is run once per listed seed instead of its own seed
//! (folders `<scenario>-seed<N>`), to check that a result does not hinge on one seed.

use std::path::PathBuf;

use switchyard_sim::{Scenario, run_all, summary_markdown, write_outputs, write_summaries};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        return Err("usage: simulate OUT_DIR [--seeds 1,2,3] SCENARIO.yaml...".into());
    }
    let out = PathBuf::from(args.remove(0));
    let mut seeds: Option<Vec<u64>> = None;
    if args.first().map(String::as_str) == Some("--seeds") && args.len() > 1 {
        seeds = Some(
            args[1]
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()?,
        );
        args.drain(..2);
    }
    let mut all = Vec::new();
    for path in &args {
        let base = Scenario::from_file(path.as_ref())?;
        let variants = match &seeds {
            Some(s) => s.iter().map(|&seed| base.with_seed(seed)).collect(),
            None => vec![base],
        };
        for sc in variants {
            let runs = run_all(&sc);
            write_outputs(&sc, &runs, &out)?;
            all.extend(runs.into_iter().map(|r| r.summary));
        }
    }
    write_summaries(&all, &out)?;
    eprintln!("{}", summary_markdown(&all));
    Ok(())
}
