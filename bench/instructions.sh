#!/usr/bin/env bash
# Instructions per request, before and after: two router binaries under valgrind's callgrind.
#
#   BASELINE_BIN=/tmp/old/switchyard BASELINE_LABEL=b808a34 bench/instructions.sh
#
# Why: CPU time per request from /proc ticks moves by ±10 % between runs on a shared VM, and this
# machine exposes no hardware counters (`perf stat -e instructions` is "not supported"), so a 5 %
# claim cannot be shown with wall-clock or tick figures. Callgrind counts the instructions the
# router executes (Ir) exactly; the same binary, manifests and request sequence give the same count
# to within a fraction of a percent, whatever else the machine is doing. Instructions are not
# time (cache misses, branch mispredictions and syscalls cost differently), so this complements
# the load runs in docs/benchmarks.md instead of replacing them.
#
# What it does: builds `switchyard` (release) unless SWITCHYARD_BIN is set; starts the mock
# provider natively; then for each binary (the current one, then BASELINE_BIN) starts a router on
# the same manifests under `valgrind --tool=callgrind --instr-atstart=no`, switches
# instrumentation on, sends WARM requests, zeroes the counters, sends COUNT requests per cell (non-streaming and streaming, one client
# connection each, keep-alive, each request with its own x-project-id drawn from 100 keys), dumps
# the counters and divides the Ir total by COUNT. Writes a Markdown table to REPORT
# (docs/benchmarks-instructions.md).
#
# Knobs: SWITCHYARD_BIN, BASELINE_BIN (required), BASELINE_LABEL, COUNT (2000), WARM (200),
# REPORT. Needs valgrind (Debian `valgrind`; installed if missing), python3, curl.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
COUNT="${COUNT:-2000}"
WARM="${WARM:-200}"
REPORT="${REPORT:-$ROOT/docs/benchmarks-instructions.md}"
BASELINE="${BASELINE_BIN:?set BASELINE_BIN to the older switchyard binary}"
BASELINE_LABEL="${BASELINE_LABEL:-baseline}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if ! command -v valgrind >/dev/null; then
  log "installing valgrind"
  SUDO=""
  [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq valgrind
fi
if [[ -n "${SWITCHYARD_BIN:-}" ]]; then
  BIN="$SWITCHYARD_BIN"
else
  log "building switchyard (release)"
  cargo build --release -p switchyard --quiet
  BIN="$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/switchyard"
fi
HEAD_LABEL="$(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"

WORK="$(mktemp -d -t switchyard-instr.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
cp "$BIN" "$WORK/after"
cp "$BASELINE" "$WORK/before"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MOCK_PORT="$(port)"
KEY="sk-instr-$$"
mkdir -p "$WORK/manifests" "$WORK/secrets/keys"
printf '%s' "$KEY" >"$WORK/secrets/keys/k"
cat >"$WORK/manifests/m.yaml" <<EOF
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata: {name: mock}
spec:
  api: openai
  endpoint: http://127.0.0.1:$MOCK_PORT
  region: local
  models: [{name: bench-chat, upstreamName: bench-upstream}]
---
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata: {name: chat}
spec:
  model: bench-chat
  serviceType: chat
  providers: [{name: mock}]
  affinity: {header: x-project-id, pinDuration: 30m}
---
apiVersion: switchyard.dev/v1alpha1
kind: TenantQuota
metadata: {name: t}
spec:
  apiKeys: [{name: k, secretRef: {name: keys, key: k}}]
EOF

wait_ready() { # url, tries of 0.25 s
  for _ in $(seq 1 "$2"); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1" || true)" == 200 ]] && return 0
    sleep 0.25
  done
  echo "$1 never answered 200" >&2
  exit 1
}

env -u RUST_LOG "$BIN" mock-provider --listen "127.0.0.1:$MOCK_PORT" --name mock \
  --latency-ms 0 --ttft-ms 0 --tokens-per-sec 0 --output-tokens 8 2>>"$WORK/mock.log" &
PIDS+=($!)
wait_ready "http://127.0.0.1:$MOCK_PORT/v1/models" 80

# send PORT MODE N: N requests on one keep-alive connection; fails on any non-200.
send() {
  python3 - "$1" "$2" "$3" "$KEY" <<'EOF_PY'
import http.client, json, sys
port, mode, n, key = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(n):
    body = {"model": "bench-chat", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello there, how are you today?"}]}
    if mode == "stream":
        body["stream"] = True
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={
        "authorization": "Bearer " + key, "content-type": "application/json",
        "x-project-id": "p%d" % (i % 100)})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        sys.exit("request %d answered %d: %s" % (i, resp.status, data[:300]))
EOF_PY
}

# ir_total FILE: the total instruction count a callgrind dump reports.
ir_total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }

RESULTS="$WORK/results.txt"
: >"$RESULTS"
for which in after before; do
  rport="$(port)"
  log "$which: router under callgrind on 127.0.0.1:$rport"
  env -u RUST_LOG valgrind -q --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$WORK/cg.$which.%p" "$WORK/$which" standalone \
    --manifests "$WORK/manifests" --listen "127.0.0.1:$rport" --secrets-dir "$WORK/secrets" \
    2>>"$WORK/router-$which.log" &
  rpid=$!
  PIDS+=("$rpid")
  wait_ready "http://127.0.0.1:$rport/readyz" 1200
  for mode in plain stream; do
    # Instrumentation on (it stays on), a warm-up, counters zeroed, the counted requests, a
    # dump. (Switching instrumentation off before the dump loses the counts.)
    callgrind_control -i on "$rpid" >/dev/null 2>&1
    send "$rport" "$mode" "$WARM"
    callgrind_control -z "$rpid" >/dev/null 2>&1
    send "$rport" "$mode" "$COUNT"
    callgrind_control -d "$which-$mode" "$rpid" >/dev/null 2>&1
    dump="$(ls -t "$WORK"/cg."$which"."$rpid".* | head -1)"
    ir="$(ir_total "$dump")"
    log "$which $mode: $ir instructions over $COUNT requests"
    printf '%s %s %s\n' "$which" "$mode" "$ir" >>"$RESULTS"
  done
  kill "$rpid"
  wait "$rpid" 2>/dev/null || true
done

python3 - "$RESULTS" "$COUNT" "$HEAD_LABEL" "$BASELINE_LABEL" "$REPORT" <<'EOF_PY'
import sys
path, count, head, base, report = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
ir = {}
for line in open(path):
    which, mode, total = line.split()
    ir[(which, mode)] = int(total) / count
rows = []
for mode, name in (("plain", "non-streaming"), ("stream", "streaming (SSE)")):
    b, a = ir[("before", mode)], ir[("after", mode)]
    change = (a - b) / b * 100
    verdict = "met" if change <= 5 else "NOT met"
    rows.append(f"| {name} | {b:,.0f} | {a:,.0f} | {change:+.1f} % | {verdict} |")
text = f"""# Instructions per request, before and after

Written by `bench/instructions.sh` (callgrind Ir, all router threads, {count} requests per
cell on one keep-alive connection after a warm-up, the mock provider outside valgrind).
Before: `{base}`; after: `{head}`. Target: at most 5 % more instructions per request.

| request | before, instructions/request | after | change | ≤ +5 % |
|---|---:|---:|---:|---|
""" + "\n".join(rows) + "\n"
open(report, "w", encoding="utf-8").write(text)
sys.stdout.write(text)
EOF_PY
