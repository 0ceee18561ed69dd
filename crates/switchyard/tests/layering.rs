//! The crates' layering (STYLE.md: dependencies point one way), checked on `cargo metadata`.
//!
//! Each workspace crate may depend (normal or build dependencies; dev-dependencies are free)
//! only on the workspace crates listed for it here. A new edge fails this test until the table
//! is changed on purpose: `switchyard-core` stays at the bottom with no workspace dependency,
//! the simulator sees only core (so its figures come from the same decisions the router runs),
//! and the operator and the router never depend on each other.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Workspace crate → the workspace crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    ("switchyard-core", &[]),
    ("switchyard-testkit", &[]),
    ("switchyard-mock", &[]),
    ("switchyard-api", &["switchyard-core"]),
    ("switchyard-sim", &["switchyard-core"]),
    ("switchyard-store", &["switchyard-core"]),
    (
        "switchyard-providers",
        &["switchyard-api", "switchyard-core"],
    ),
    (
        "switchyard-operator",
        &["switchyard-api", "switchyard-core", "switchyard-providers"],
    ),
    (
        "switchyard-router",
        &[
            "switchyard-api",
            "switchyard-core",
            "switchyard-providers",
            "switchyard-store",
        ],
    ),
    (
        "switchyard",
        &[
            "switchyard-api",
            "switchyard-core",
            "switchyard-mock",
            "switchyard-operator",
            "switchyard-router",
            "switchyard-sim",
            "switchyard-store",
        ],
    ),
    (
        "switchyard-e2e",
        &[
            "switchyard-mock",
            "switchyard-providers",
            "switchyard-router",
            "switchyard-sim",
            "switchyard-testkit",
        ],
    ),
];

/// Workspace crate → its workspace dependencies (normal and build), from `cargo metadata`.
fn workspace_edges() -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|n| names.contains(n))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

#[test]
fn workspace_crates_depend_only_in_the_allowed_direction() {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(k, v)| (*k, v.iter().copied().collect()))
        .collect();
    let edges = workspace_edges();
    let mut problems = Vec::new();
    for (krate, deps) in &edges {
        let Some(ok) = allowed.get(krate.as_str()) else {
            problems.push(format!("{krate} is not in the layering table"));
            continue;
        };
        for dep in deps {
            if !ok.contains(dep.as_str()) {
                problems.push(format!("{krate} must not depend on {dep}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "layering broken:\n{}",
        problems.join("\n")
    );
    // The table is not vacuous: the crates it names exist and the central edges are there.
    assert!(edges["switchyard-core"].is_empty());
    assert!(edges["switchyard-sim"].contains("switchyard-core"));
    assert!(edges["switchyard-router"].contains("switchyard-core"));
    assert!(!edges["switchyard-router"].contains("switchyard-operator"));
    assert!(!edges["switchyard-operator"].contains("switchyard-router"));
}
