#!/usr/bin/env bash
# The project's one test command: formatting, lints, build, every test (unit, property,
# doctests, simulator, end-to-end with the official SDKs), and the Helm chart checks.
#
#   scripts/test.sh
#
# It creates the Python venv with the pinned SDKs when it is missing (scripts/setup-venv.sh),
# builds the `switchyard` binary that the end-to-end tests spawn, and stops at the first
# failing step with a non-zero exit code.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

step() {
    echo
    echo "==> $*"
}

step "python venv with the official SDKs"
bash scripts/setup-venv.sh

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# The e2e tests spawn target/debug/switchyard; build it before `cargo test` so they never run
# against a stale binary.
step "cargo build --workspace --bins"
cargo build --workspace --bins

# Renders and lints charts/switchyard with Helm's Go SDK (helm-python-sdk) for the default and
# HA values, validates every object with kubernetes-validate --strict (Kubernetes 1.33), checks
# RBAC, container hardening and the CRD copies, and parses every container's arguments with
# the binary just built. Needs no cluster and no helm binary.
step "helm chart: lint, render, kubernetes-validate --strict (tests/helm/check_chart.py)"
.venv/bin/python tests/helm/check_chart.py

step "cargo test --workspace"
cargo test --workspace

echo
echo "==> all checks passed"
