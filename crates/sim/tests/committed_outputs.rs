//! The simulator's committed outputs (`docs/sim/`) are what a fresh run of the shipped
//! scenarios (`config/scenarios/*.yaml`) writes today, byte for byte: summary tables, every
//! per-strategy time series and chart. A change to `switchyard-core`'s dispatch machine, the
//! availability controller or the simulator that moves a figure fails here until the outputs are
//! regenerated (and the move explained in `docs/simulation.md`):
//!
//! ```text
//! cargo run --release -p switchyard-sim --example simulate -- docs/sim config/scenarios/*.yaml
//! ```
//!
//! The simulator uses no clock and seeds its RNG from the scenario, and Rust's floating point is
//! the same at every optimisation level, so a debug-build test and the release example agree.

// Test code: a missing value is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file under `dir`, as paths relative to it.
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.insert(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out
}

/// The first line where two texts differ, for the failure message.
fn first_difference(committed: &str, fresh: &str) -> String {
    for (n, (a, b)) in committed.lines().zip(fresh.lines()).enumerate() {
        if a != b {
            return format!("line {}:\n  committed: {a}\n  fresh:     {b}", n + 1);
        }
    }
    format!(
        "committed has {} lines, fresh run {}",
        committed.lines().count(),
        fresh.lines().count()
    )
}

#[test]
fn committed_simulation_outputs_match_a_fresh_run() {
    let mut scenarios: Vec<PathBuf> = std::fs::read_dir(repo().join("config/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    // The order the shell's glob gives `config/scenarios/*.yaml`, which sets the row order of
    // the summary tables.
    scenarios.sort();
    assert!(!scenarios.is_empty(), "no scenario files");

    let fresh_dir =
        std::env::temp_dir().join(format!("switchyard-sim-fresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh_dir);
    switchyard_sim::run_scenario_files(&scenarios, &fresh_dir).unwrap();

    let committed_dir = repo().join("docs/sim");
    let committed = files_under(&committed_dir);
    let fresh = files_under(&fresh_dir);
    let mut problems = Vec::new();
    for missing in fresh.difference(&committed) {
        problems.push(format!(
            "{}: written by a fresh run, not committed",
            missing.display()
        ));
    }
    for stale in committed.difference(&fresh) {
        problems.push(format!("{}: committed, no longer written", stale.display()));
    }
    for file in committed.intersection(&fresh) {
        let a = std::fs::read_to_string(committed_dir.join(file)).unwrap();
        let b = std::fs::read_to_string(fresh_dir.join(file)).unwrap();
        if a != b {
            problems.push(format!(
                "{} differs, {}",
                file.display(),
                first_difference(&a, &b)
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&fresh_dir);
    assert!(
        problems.is_empty(),
        "docs/sim is stale; regenerate it with \
         `cargo run --release -p switchyard-sim --example simulate -- docs/sim config/scenarios/*.yaml` \
         and explain moved figures in docs/simulation.md:\n{}",
        problems.join("\n")
    );
}
