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

step "cargo test --workspace --exclude switchyard-e2e"
cargo test --workspace --exclude switchyard-e2e

e2e_targets=()
for f in tests/tests/*.rs; do
    name="$(basename "$f" .rs)"
    [[ "$name" == cluster ]] || e2e_targets+=(--test "$name")
done
step "cargo test -p switchyard-e2e (every end-to-end target but cluster)"
cargo test -p switchyard-e2e "${e2e_targets[@]}"

# Against the API server of $KUBECONFIG (.ci/run starts ../shared/kapi and sets
# SWITCHYARD_REQUIRE_CLUSTER=1, which turns every skip into a failure); without a cluster the
# scenarios skip with a note.
step "cluster tests (tests/tests/cluster.rs), KUBECONFIG=${KUBECONFIG:-<unset>}, SWITCHYARD_REQUIRE_CLUSTER=${SWITCHYARD_REQUIRE_CLUSTER:-0}"
cluster_log="$(mktemp)"
cargo test -p switchyard-e2e --test cluster -- --nocapture 2>&1 | tee "$cluster_log"
skipped="$(grep -c '^skipping ' "$cluster_log" || true)"
run="$(sed -n 's/^test result: ok\. \([0-9]*\) passed.*/\1/p' "$cluster_log" | tail -1)"
rm -f "$cluster_log"
echo "cluster tests: ${run:-0} passed, of which ${skipped} skipped for want of a cluster"
if [[ "${SWITCHYARD_REQUIRE_CLUSTER:-0}" == 1 && "$skipped" != 0 ]]; then
    echo "error: SWITCHYARD_REQUIRE_CLUSTER=1 but ${skipped} cluster tests skipped" >&2
    exit 1
fi

# The container image without a Docker daemon (mmdebstrap + buildah), run with podman as UID
# 65532 on a read-only root, answering the openai SDK from the standalone demo. CI installs
# the tools (.ci/run); elsewhere the step is skipped with a note when they are missing.
if command -v mmdebstrap >/dev/null && command -v buildah >/dev/null && command -v podman >/dev/null; then
    step "container image: build, inspect, run (scripts/image.sh)"
    bash scripts/image.sh
elif [[ "${CI:-}" == true ]]; then
    echo "error: CI=true but mmdebstrap, buildah or podman is missing (see .ci/run)" >&2
    exit 1
else
    step "container image: skipped (install mmdebstrap, buildah, podman and runc to run scripts/image.sh)"
fi

echo
echo "==> all checks passed"
