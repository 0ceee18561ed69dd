#!/usr/bin/env bash
# Load benchmark: the router against nginx and against the mock provider directly, in one run.
#
#   bench/load.sh                 # full run (~12 min), writes docs/benchmarks.md and bench/results/
#   REPS=5 DURATION=10 bench/load.sh
#   LIMITS=0 NGINX=0 MODES=plain bench/load.sh   # the short run: direct and router only
#   TRACED=1 bench/load.sh        # also a router exporting OpenTelemetry traces (~4 min more)
#   BASELINE_BIN=/tmp/old/switchyard BASELINE_LABEL=b808a34 bench/load.sh
#                                 # also an older build of the router, same manifests (before/after)
#   PROFILE=docs/img/flame LIMITS=0 NGINX=0 bench/load.sh
#                                 # no matrix: a flame graph of the router per mode (see below)
#
# What it does, in one run:
#   1. installs wrk and nginx-light (Debian packages) if missing, builds `switchyard` in release
#      mode;
#   2. writes a manifest folder in a temp dir: one OpenAI-kind LLMProvider pointing at the mock
#      with a chat and an embedding model, a RoutingPolicy for each (chat with affinity on
#      x-project-id), one TenantQuota with a key file;
#   3. starts the mock (latency 0, unpaced, short answers; it answers in microseconds, no timer
#      tick), nginx as a `proxy_pass` reverse proxy in front of it and the router as separate
#      processes on loopback; all are killed on exit;
#   4. matrix: MODES {non-streaming chat, streaming chat, embeddings} x concurrency {1, 16, 64} x
#      {direct, nginx, router, limits}, REPS interleaved repetitions of DURATION seconds per
#      cell (the order rotates every repetition) after a short warm-up of each target;
#   5. memory: a fresh router, RSS at start, after KEYS requests each with a distinct
#      x-project-id, and after a second batch of KEYS new ids; with LIMITS=1 also a fresh
#      limits router (token limits, so the vocabulary is loaded), at start and after KEYS ids;
#   6. bench/summarize.py takes medians and writes the Markdown report (with the ratios to nginx
#      and the issue 16 goals marked met or not) and the raw results.
#
# The "limits" target (LIMITS=1, the default) is the broker on: a second router runs from a
# second manifest folder that differs only in the tenant: its TenantQuota has a
# requests-per-minute and an input-tokens-per-minute token bucket, a concurrency limit and a
# daily spend fixed window (the models get list prices so spend is estimated), all far above
# what the run can use, so nothing is refused or queued but every request is estimated,
# reserved and reconciled on the in-process store. The plain "router" target is the broker off.
#
# nginx (NGINX=1, the default) runs one worker per core with keep-alive upstream connections
# and response buffering off; its CPU is its master's plus its workers'.
#
# With TRACED=1 another router runs on the same manifests with OTEL_EXPORTER_OTLP_ENDPOINT set,
# exporting a request span and an attempt span per request over OTLP/HTTP to a real receiver
# (tests/python/otlp_receiver.py --count, on the official opentelemetry-proto definitions, from
# the test venv): the "traced" target, whose router CPU per request is compared with the plain
# router's in the same cells (issue 17: at most +15 %). The receiver counts what arrives, so the
# report also says what share of the spans the exporter delivered rather than dropped.
#
# Environment knobs: SWITCHYARD_BIN (use this binary, skip the build), NICE (0; a negative
# value needs root), LIMITS (1; 0 drops the tenant-with-limits target), NGINX (1; 0 drops the
# nginx target), MODES ("plain stream embed"), TRACED (0; 1 adds the traced target), REPS (3),
# DURATION (5 s), WARMUP (1 s), KEYS (100000), IDLE_SETTLE (11 s of idling before a start
# RSS is read), CONCURRENCY ("1 16 64"), BASELINE_BIN (a second switchyard binary run as the
# "baseline" target: same manifests, interleaved like the others, its CPU per request compared
# with the router's), BASELINE_LABEL (what that binary is, for the
# report, e.g. a commit), OUTPUT_TOKENS (8), ROUTER_LOG (RUST_LOG of the router; default = as
# shipped), REPORT (docs/benchmarks.md), RESULTS (bench/results).
#
# PROFILE=PREFIX replaces the matrix and the memory run with profiles: for each of MODES, wrk
# drives the plain router at PROFILE_CONC (16) for PROFILE_SECONDS (8) while `perf record -F 999
# --call-graph dwarf` samples it; the stacks are folded (inferno, `cargo install inferno`),
# their names shortened (bench/fold_short.py: no hashes, no generic arguments) and drawn into
# PREFIX-MODE.svg (frames under 1 px left out); the folded stacks are kept in
# PREFIX-MODE.folded, for bench/fold_top.py (self and inclusive shares by function). With
# TRACED=1 the traced router is profiled the same way after the plain one (PREFIX-traced-MODE).
# Needs perf (Debian's linux-perf) and the binary's line tables (the release profile has them).
#
# Needs python3 and curl; the figures in docs/benchmarks.md were taken with NICE=-10.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The exact command, with the knobs that were set, for the report.
COMMAND_LINE="bench/load.sh"
for knob in IDLE_SETTLE SWITCHYARD_BIN BASELINE_BIN BASELINE_LABEL NICE LIMITS NGINX MODES TRACED PROFILE PROFILE_CONC PROFILE_SECONDS ROUTER_LOG OUTPUT_TOKENS CONCURRENCY KEYS WARMUP DURATION REPS; do
  if [[ -n "${!knob+x}" ]]; then
    COMMAND_LINE="$knob='${!knob}' $COMMAND_LINE"
  fi
done

REPS="${REPS:-3}"
DURATION="${DURATION:-5}"
WARMUP="${WARMUP:-1}"
KEYS="${KEYS:-100000}"
# Seconds a fresh router idles before its start RSS is read: past jemalloc's 10 s dirty-page
# decay, so start-up garbage (the vocabulary's decoding buffers) is not counted as idle memory.
IDLE_SETTLE="${IDLE_SETTLE:-11}"
CONCURRENCY="${CONCURRENCY:-1 16 64}"
OUTPUT_TOKENS="${OUTPUT_TOKENS:-8}"
LIMITS="${LIMITS:-1}"
NGINX="${NGINX:-1}"
MODES="${MODES:-plain stream embed}"
TRACED="${TRACED:-0}"
REPORT="${REPORT:-$ROOT/docs/benchmarks.md}"
RESULTS="${RESULTS:-$ROOT/bench/results}"
# NICE=-10 runs mock, router and wrk at a higher priority than other work on a shared machine.
NICE="${NICE:-0}"
RUN=(nice -n "$NICE")

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- tools -------------------------------------------------------------------------------
apt_install() { # package
  log "installing $1"
  local sudo=""
  [[ "$(id -u)" -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "$1"
}
command -v wrk >/dev/null || apt_install wrk
NGINX_BIN="$(command -v nginx || echo /usr/sbin/nginx)"
if [[ "$NGINX" == 1 && ! -x "$NGINX_BIN" ]]; then
  apt_install nginx-light
  NGINX_BIN="$(command -v nginx || echo /usr/sbin/nginx)"
fi
for tool in python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

if [[ -n "${SWITCHYARD_BIN:-}" ]]; then
  BIN="$SWITCHYARD_BIN"
  log "using $BIN (not rebuilt)"
else
  log "building switchyard (release)"
  cargo build --release -p switchyard --quiet
  TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  BIN="$TARGET_DIR/release/switchyard"
fi
BIN_BUILT="$(date -u -r "$BIN" +%FT%TZ)"

# --- configuration -----------------------------------------------------------------------
WORK="$(mktemp -d -t switchyard-bench.XXXXXX)"
PIDS=()
# The whole run uses one copy of the binary, even if a build replaces the original meanwhile.
cp "$BIN" "$WORK/switchyard"
BIN="$WORK/switchyard"
BASELINE="${BASELINE_BIN:-}"
BASELINE_BUILT=""
if [[ -n "$BASELINE" ]]; then
  BASELINE_BUILT="$(date -u -r "$BASELINE" +%FT%TZ)"
  cp "$BASELINE" "$WORK/switchyard-baseline"
  BASELINE="$WORK/switchyard-baseline"
fi
cleanup() {
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
# new_port VAR: sets VAR to a free loopback port no other process of this run was given.
USED_PORTS=" "
new_port() {
  local port
  port="$(free_port)"
  while [[ "$USED_PORTS" == *" $port "* ]]; do port="$(free_port)"; done
  USED_PORTS+="$port "
  printf -v "$1" '%s' "$port"
}
new_port MOCK_PORT
new_port ROUTER_PORT
new_port LIMITS_PORT
new_port BASELINE_PORT
new_port TRACED_PORT
new_port NGINX_PORT
KEY="sk-bench-$(date +%s)"

mkdir -p "$WORK/manifests" "$WORK/secrets/bench-keys"
printf '%s' "$KEY" >"$WORK/secrets/bench-keys/bench"
cat >"$WORK/manifests/bench.yaml" <<EOF
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata:
  name: bench-mock
spec:
  api: openai
  endpoint: http://127.0.0.1:$MOCK_PORT
  region: local
  models:
    - name: bench-chat
      upstreamName: bench-upstream
    - name: bench-embed
      upstreamName: bench-embed-upstream
      modalities: [embedding]
  timeouts: {connect: 2s, total: 60s}
---
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata:
  name: bench-chat
spec:
  model: bench-chat
  serviceType: chat
  providers:
    - name: bench-mock
  affinity: {header: x-project-id, pinDuration: 30m}
  deadline: 60s
---
apiVersion: switchyard.dev/v1alpha1
kind: RoutingPolicy
metadata:
  name: bench-embed
spec:
  model: bench-embed
  serviceType: embedding
  providers:
    - name: bench-mock
  deadline: 60s
---
apiVersion: switchyard.dev/v1alpha1
kind: TenantQuota
metadata:
  name: bench
spec:
  apiKeys:
    - name: bench
      secretRef: {name: bench-keys, key: bench}
EOF

# The tenant-with-limits variant: list prices on the model (so a spend limit has something to
# count) and limits no run of this script can reach, so the broker admits every request.
mkdir -p "$WORK/manifests-limits"
python3 - "$WORK/manifests/bench.yaml" "$WORK/manifests-limits/bench.yaml" <<'EOF_PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
text = text.replace(
    "      upstreamName: bench-upstream\n",
    "      upstreamName: bench-upstream\n"
    "      pricing: {inputPerMillion: \"2.50\", outputPerMillion: \"10\"}\n",
)
text = text.replace(
    "      upstreamName: bench-embed-upstream\n",
    "      upstreamName: bench-embed-upstream\n"
    "      pricing: {inputPerMillion: \"0.02\", outputPerMillion: \"0\"}\n",
)
text += (
    "  limits:\n"
    "    - {name: rpm, dimension: requests, amount: 100000000, period: 60s}\n"
    "    - {name: itpm, dimension: inputTokens, amount: 10000000000, period: 60s}\n"
    "    - {name: in-flight, dimension: concurrency, amount: 4096, rule: concurrency}\n"
    "    - {name: daily-spend, dimension: spendMicroUsd, amount: 1000000000000, rule: fixedWindow,"
    " period: 24h, resetAt: \"00:00\", timeZone: UTC}\n"
)
open(sys.argv[2], "w", encoding="utf-8").write(text)
EOF_PY

wait_http() { # url
  for _ in $(seq 1 200); do
    if curl -s -o /dev/null --max-time 1 "$1"; then return 0; fi
    sleep 0.05
  done
  echo "nothing answers at $1" >&2
  return 1
}

# wait_ready URL: until /readyz answers 200 (configuration and tokenizer vocabulary loaded), so
# the idle RSS includes the vocabulary and no timed request pays for loading it.
wait_ready() {
  for _ in $(seq 1 400); do
    if [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1/readyz")" == 200 ]]; then
      return 0
    fi
    sleep 0.05
  done
  echo "$1/readyz never answered 200" >&2
  return 1
}

# launch_router MANIFESTS PORT LOG [BINARY]: starts a router in the background (its pid in $!).
launch_router() {
  local bin="${4:-$BIN}"
  if [[ -n "${ROUTER_LOG:-}" ]]; then
    RUST_LOG="$ROUTER_LOG" "${RUN[@]}" "$bin" standalone --manifests "$1" \
      --listen "127.0.0.1:$2" --secrets-dir "$WORK/secrets" 2>>"$3" &
  else
    env -u RUST_LOG "${RUN[@]}" "$bin" standalone --manifests "$1" \
      --listen "127.0.0.1:$2" --secrets-dir "$WORK/secrets" 2>>"$3" &
  fi
}

ROUTER_PID=""
start_router() {
  launch_router "$WORK/manifests" "$ROUTER_PORT" "$WORK/router.log"
  ROUTER_PID=$!
  PIDS+=("$ROUTER_PID")
  wait_http "http://127.0.0.1:$ROUTER_PORT/healthz"
  wait_ready "http://127.0.0.1:$ROUTER_PORT"
}
LIMITS_PID=""
start_limits_router() {
  launch_router "$WORK/manifests-limits" "$LIMITS_PORT" "$WORK/router-limits.log"
  LIMITS_PID=$!
  PIDS+=("$LIMITS_PID")
  wait_http "http://127.0.0.1:$LIMITS_PORT/healthz"
  wait_ready "http://127.0.0.1:$LIMITS_PORT"
}
BASELINE_PID=""
start_baseline_router() {
  launch_router "$WORK/manifests" "$BASELINE_PORT" "$WORK/router-baseline.log" "$BASELINE"
  BASELINE_PID=$!
  PIDS+=("$BASELINE_PID")
  wait_http "http://127.0.0.1:$BASELINE_PORT/healthz"
  wait_ready "http://127.0.0.1:$BASELINE_PORT"
}
TRACED_PID=""
OTLP_PID=""
OTLP_COUNT="$WORK/otlp-spans.txt"
# The OTLP receiver (its port on its first stdout line), then the traced router exporting to it
# every 200 ms (the SDK default is 5 s; a shorter delay keeps its queue from overflowing).
start_traced_router() {
  bash "$ROOT/scripts/setup-venv.sh" >&2
  mkfifo "$WORK/otlp.fifo"
  "${RUN[@]}" "$ROOT/.venv/bin/python" "$ROOT/tests/python/otlp_receiver.py" --count "$OTLP_COUNT" \
    >"$WORK/otlp.fifo" 2>>"$WORK/otlp.log" &
  OTLP_PID=$!
  PIDS+=("$OTLP_PID")
  local line
  read -r line <"$WORK/otlp.fifo"
  local otlp_port="${line#listening }"
  OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$otlp_port" OTEL_SERVICE_NAME=switchyard-bench \
    OTEL_BSP_SCHEDULE_DELAY=200 \
    launch_router "$WORK/manifests" "$TRACED_PORT" "$WORK/router-traced.log"
  TRACED_PID=$!
  PIDS+=("$TRACED_PID")
  wait_http "http://127.0.0.1:$TRACED_PORT/healthz"
  wait_ready "http://127.0.0.1:$TRACED_PORT"
}
NGINX_PID=""
# nginx as a plain reverse proxy in front of the mock, the yardstick users compare a proxy with:
# one worker per core, keep-alive connections to the upstream, no buffering (so SSE frames pass
# as they come), no access log (the router writes none either). All its files live in $WORK.
start_nginx() {
  mkdir -p "$WORK/nginx"
  cat >"$WORK/nginx/nginx.conf" <<EOF_NGINX
worker_processes $(nproc);
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  upstream mock {
    server 127.0.0.1:$MOCK_PORT;
    keepalive 128;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF_NGINX
  "${RUN[@]}" "$NGINX_BIN" -p "$WORK/nginx" -e "$WORK/nginx/error.log" -c "$WORK/nginx/nginx.conf" &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  wait_http "http://127.0.0.1:$NGINX_PORT/v1/models"
}
# Sum of a counter family in a router's /metrics.
metric_sum() { # port name
  curl -s "http://127.0.0.1:$1/metrics" |
    awk -v n="$2" '$1 ~ "^"n"({|$)" {s += $NF} END {printf "%d", s}'
}
stop_router() {
  kill "$ROUTER_PID" 2>/dev/null || true
  wait "$ROUTER_PID" 2>/dev/null || true
}
# utime + stime of a process and its children still running (nginx's workers), in clock ticks
# (fields 14 and 15 of /proc/PID/stat).
cpu_ticks() {
  local files=("/proc/$1/stat") child
  for child in $(pgrep -P "$1" || true); do files+=("/proc/$child/stat"); done
  cat "${files[@]}" 2>/dev/null | awk '{s += $14 + $15} END {print s}'
}
TICKS="$(getconf CLK_TCK)"
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/${1:-$ROUTER_PID}/status"; }
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/${1:-$ROUTER_PID}/status"; }
# rss_split [PID]: {"anon_kib": .., "file_kib": ..}: heap and stacks vs pages of mapped files
# (mostly the binary), both counted in VmRSS.
rss_split() {
  awk '/^RssAnon:/ {a = $2} /^RssFile:/ {f = $2} END {printf "{\"anon_kib\": %d, \"file_kib\": %d}", a, f}' \
    "/proc/${1:-$ROUTER_PID}/status"
}

log "starting mock on 127.0.0.1:$MOCK_PORT and router on 127.0.0.1:$ROUTER_PORT"
env -u RUST_LOG "${RUN[@]}" "$BIN" mock-provider --listen "127.0.0.1:$MOCK_PORT" --name bench-mock \
  --latency-ms 0 --ttft-ms 0 --tokens-per-sec 0 --output-tokens "$OUTPUT_TOKENS" \
  2>>"$WORK/mock.log" &
MOCK_PID=$!
PIDS+=("$MOCK_PID")
wait_http "http://127.0.0.1:$MOCK_PORT/v1/models"
start_router
TARGETS=(direct)
PROBE_URLS=("http://127.0.0.1:$MOCK_PORT")
if [[ "$NGINX" == 1 ]]; then
  start_nginx
  TARGETS+=(nginx)
  PROBE_URLS+=("http://127.0.0.1:$NGINX_PORT")
fi
TARGETS+=(router)
PROBE_URLS+=("http://127.0.0.1:$ROUTER_PORT")
if [[ "$LIMITS" == 1 ]]; then
  start_limits_router
  TARGETS+=(limits)
  PROBE_URLS+=("http://127.0.0.1:$LIMITS_PORT")
fi
if [[ -n "$BASELINE" ]]; then
  start_baseline_router
  TARGETS+=(baseline)
  PROBE_URLS+=("http://127.0.0.1:$BASELINE_PORT")
fi
if [[ "$TRACED" == 1 ]]; then
  start_traced_router
  TARGETS+=(traced)
  PROBE_URLS+=("http://127.0.0.1:$TRACED_PORT")
fi

# A chat completion and an embedding through each path must succeed before anything is timed.
probe() { # url path body
  local code
  code="$(curl -s -o "$WORK/probe.json" -w '%{http_code}' "$1$2" \
    -H "Authorization: Bearer $KEY" -H 'content-type: application/json' -H 'x-project-id: probe' \
    -d "$3")"
  if [[ "$code" != 200 ]]; then
    echo "probe of $1$2 answered $code:" >&2
    cat "$WORK/probe.json" >&2
    exit 1
  fi
}
for url in "${PROBE_URLS[@]}"; do
  probe "$url" /v1/chat/completions \
    '{"model":"bench-chat","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}'
  probe "$url" /v1/embeddings '{"model":"bench-embed","input":"hi"}'
done

# --- profiles (PROFILE=PREFIX: instead of the matrix) -----------------------------------
if [[ -n "${PROFILE:-}" ]]; then
  for tool in perf inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "PROFILE needs $tool" >&2; exit 1; }
  done
  mkdir -p "$(dirname "$PROFILE")"
  # With TRACED=1 the traced router (exporting to the OTLP receiver) is profiled too, into
  # PREFIX-traced-MODE.svg, so the cost of tracing shows beside the plain router's.
  PROFILED=("router:$ROUTER_PORT:$ROUTER_PID:")
  [[ "$TRACED" == 1 ]] && PROFILED+=("traced router:$TRACED_PORT:$TRACED_PID:traced-")
  for target in "${PROFILED[@]}"; do
    IFS=: read -r what port pid infix <<<"$target"
    for mode in $MODES; do
      path=/v1/chat/completions
      [[ "$mode" == embed ]] && path=/v1/embeddings
      BENCH_MODE="$mode" BENCH_KEY="$KEY" "${RUN[@]}" wrk -t 2 -c "${PROFILE_CONC:-16}" \
        -d "$((${PROFILE_SECONDS:-8} + 2))s" -s "$ROOT/bench/chat.lua" \
        "http://127.0.0.1:$port$path" >"$WORK/profile-wrk.txt" &
      wrk_pid=$!
      sleep 1
      log "profiling the $what, $mode at concurrency ${PROFILE_CONC:-16}"
      perf record -q -F 999 --call-graph dwarf,32768 -p "$pid" -o "$WORK/perf.data" \
        -- sleep "${PROFILE_SECONDS:-8}" 2>>"$WORK/perf.log"
      wait "$wrk_pid"
      grep '^BENCH_RESULT ' "$WORK/profile-wrk.txt" >&2 || true
      out="$PROFILE-$infix$mode"
      perf script -i "$WORK/perf.data" 2>/dev/null | inferno-collapse-perf |
        python3 "$ROOT/bench/fold_short.py" >"$out.folded"
      inferno-flamegraph --minwidth 1 --title "switchyard $what, $mode, concurrency ${PROFILE_CONC:-16} ($(git rev-parse --short HEAD))" \
        <"$out.folded" >"$out.svg"
      log "wrote $out.svg ($(wc -l <"$out.folded") distinct stacks)"
    done
  done
  exit 0
fi

# --- matrix ------------------------------------------------------------------------------
mkdir -p "$RESULTS"
RAW="$WORK/raw.jsonl"
: >"$RAW"

# run_wrk TARGET MODE CONC SECONDS REP [extra env...]: one wrk run, its result line appended.
run_wrk() {
  local target="$1" mode="$2" conc="$3" seconds="$4" rep="$5"
  shift 5
  local port="$MOCK_PORT" threads=2 router_pid="$ROUTER_PID" path=/v1/chat/completions
  [[ "$target" == router ]] && port="$ROUTER_PORT"
  if [[ "$target" == nginx ]]; then
    port="$NGINX_PORT"
    router_pid="$NGINX_PID"
  fi
  if [[ "$target" == limits ]]; then
    port="$LIMITS_PORT"
    router_pid="$LIMITS_PID"
  fi
  if [[ "$target" == baseline ]]; then
    port="$BASELINE_PORT"
    router_pid="$BASELINE_PID"
  fi
  if [[ "$target" == traced ]]; then
    port="$TRACED_PORT"
    router_pid="$TRACED_PID"
  fi
  [[ "$conc" -lt 2 ]] && threads=1
  [[ "$mode" == embed ]] && path=/v1/embeddings
  local label
  label="$(printf '{"target":"%s","mode":"%s","concurrency":%d,"rep":%d}' "$target" "$mode" "$conc" "$rep")"
  local out cpu0 cpu1
  cpu0="$(cpu_ticks "$router_pid") $(cpu_ticks "$MOCK_PID")"
  out="$(env "$@" BENCH_MODE="$mode" BENCH_KEY="$KEY" BENCH_LABEL="$label" \
    "${RUN[@]}" wrk -t "$threads" -c "$conc" -d "${seconds}s" --timeout 10s -s "$ROOT/bench/chat.lua" \
    "http://127.0.0.1:$port$path")"
  local line
  line="$(grep '^BENCH_RESULT ' <<<"$out" | sed 's/^BENCH_RESULT //')"
  if [[ -z "$line" ]]; then
    echo "wrk printed no result:" >&2
    echo "$out" >&2
    exit 1
  fi
  cpu1="$(cpu_ticks "$router_pid") $(cpu_ticks "$MOCK_PID")"
  read -r r0 m0 <<<"$cpu0"
  read -r r1 m1 <<<"$cpu1"
  # CPU seconds (user + system) the proxy serving this target (for direct: the idle default
  # router; for nginx: its master and workers) and the mock spent during this run.
  printf '%s,"router_cpu_s":%s,"mock_cpu_s":%s}\n' "${line%\}}" \
    "$(awk -v a="$r0" -v b="$r1" -v t="$TICKS" 'BEGIN {printf "%.2f", (b - a) / t}')" \
    "$(awk -v a="$m0" -v b="$m1" -v t="$TICKS" 'BEGIN {printf "%.2f", (b - a) / t}')"
}

NGINX_VERSION=""
[[ "$NGINX" == 1 ]] && NGINX_VERSION="$("$NGINX_BIN" -v 2>&1 | sed 's|.*nginx/||')"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
RSS_START_KIB="$(rss_kib)"
LIMITS_RSS_START_KIB=null
[[ "$LIMITS" == 1 ]] && LIMITS_RSS_START_KIB="$(rss_kib "$LIMITS_PID")"
STARTED="$(date -u +%FT%TZ)"
log "matrix: modes {$MODES} x concurrency {$CONCURRENCY} x {${TARGETS[*]}}, $REPS reps of ${DURATION}s"
for mode in $MODES; do
  for conc in $CONCURRENCY; do
    for target in "${TARGETS[@]}"; do
      run_wrk "$target" "$mode" "$conc" "$WARMUP" 0 >/dev/null
    done
    for rep in $(seq 1 "$REPS"); do
      # Two targets: alternate the order. More: rotate it, so in N repetitions each target
      # runs once in every position.
      if ((${#TARGETS[@]} == 2)); then
        if ((rep % 2 == 1)); then order="direct router"; else order="router direct"; fi
      else
        shift_by=$(((rep - 1) % ${#TARGETS[@]}))
        order="${TARGETS[*]:shift_by} ${TARGETS[*]:0:shift_by}"
      fi
      for target in $order; do
        line="$(run_wrk "$target" "$mode" "$conc" "$DURATION" "$rep")"
        printf '%s\n' "$line" >>"$RAW"
        log "$mode c=$conc rep $rep $target: $(python3 "$ROOT/bench/summarize.py" --line "$line")"
      done
    done
  done
done
RSS_AFTER_MATRIX_KIB="$(rss_kib)"
LIMITS_RSS_AFTER_MATRIX_KIB=null
if [[ "$LIMITS" == 1 ]]; then
  LIMITS_RSS_AFTER_MATRIX_KIB="$(rss_kib "$LIMITS_PID")"
  kill "$LIMITS_PID" 2>/dev/null || true
  wait "$LIMITS_PID" 2>/dev/null || true
fi
if [[ -n "$BASELINE" ]]; then
  kill "$BASELINE_PID" 2>/dev/null || true
  wait "$BASELINE_PID" 2>/dev/null || true
fi
TRACED_SPANS_EXPECTED=null
TRACED_SPANS_RECEIVED=null
TRACED_RSS_AFTER_MATRIX_KIB=null
if [[ "$TRACED" == 1 ]]; then
  # Every request and attempt the traced router served is a span; after two export intervals
  # the receiver should have them all, unless the exporter's queue overflowed.
  TRACED_SPANS_EXPECTED=$(($(metric_sum "$TRACED_PORT" switchyard_requests_total) + \
    $(metric_sum "$TRACED_PORT" switchyard_attempts_total)))
  TRACED_RSS_AFTER_MATRIX_KIB="$(rss_kib "$TRACED_PID")"
  sleep 2
  TRACED_SPANS_RECEIVED="$(cat "$OTLP_COUNT" 2>/dev/null || echo 0)"
  log "traced router: $TRACED_SPANS_RECEIVED spans received of $TRACED_SPANS_EXPECTED requests + attempts"
  kill "$TRACED_PID" "$OTLP_PID" 2>/dev/null || true
  wait "$TRACED_PID" "$OTLP_PID" 2>/dev/null || true
fi
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- memory ------------------------------------------------------------------------------
mock_calls() {
  curl -s "http://127.0.0.1:$MOCK_PORT/admin/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["calls"])'
}
# distinct_batch PREFIX: KEYS requests through the router, each with a new x-project-id. Every
# wrk thread stops itself after its share; wrk itself only exits at -d, so once the mock has seen
# all the calls and the count stands still, wrk is interrupted (it reports on SIGINT).
distinct_batch() { # PREFIX [PORT]
  local prefix="$1" port="${2:-$ROUTER_PORT}" out="$WORK/batch-$1.txt" label before now last=-1
  label="$(printf '{"target":"router","mode":"plain","concurrency":64,"batch":"%s"}' "$prefix")"
  before="$(mock_calls)"
  env BENCH_DISTINCT=1 BENCH_PREFIX="$prefix" BENCH_LIMIT="$(((KEYS + 1) / 2))" BENCH_KEY="$KEY" \
    BENCH_LABEL="$label" "${RUN[@]}" wrk -t 2 -c 64 -d 300s --timeout 10s \
    -s "$ROOT/bench/chat.lua" "http://127.0.0.1:$port/v1/chat/completions" >"$out" &
  local wrk_pid=$!
  while kill -0 "$wrk_pid" 2>/dev/null; do
    sleep 0.5
    now="$(mock_calls)"
    if ((now - before >= KEYS && now == last)); then
      kill -INT "$wrk_pid" 2>/dev/null || true
      break
    fi
    last="$now"
  done
  wait "$wrk_pid" || true
  grep '^BENCH_RESULT ' "$out" | sed 's/^BENCH_RESULT //'
}

log "memory: fresh router, $KEYS requests with distinct x-project-id, twice"
stop_router
start_router
sleep "$IDLE_SETTLE"
MEM_RSS0="$(rss_kib)"
MEM_SPLIT0="$(rss_split)"
MEM_RUN1="$(distinct_batch a)"
sleep 1
MEM_RSS1="$(rss_kib)"
MEM_RUN2="$(distinct_batch b)"
sleep 1
MEM_RSS2="$(rss_kib)"
MEM_HWM="$(hwm_kib)"
MEM_SPLIT1="$(rss_split)"
log "router RSS: start $MEM_RSS0 KiB, after batch 1 $MEM_RSS1 KiB, after batch 2 $MEM_RSS2 KiB"
# The same with token limits (the tenant-with-limits manifests): a fresh limits router, idle
# with its vocabulary loaded, then one batch of KEYS new project keys.
MEM_LIMITS=null
if [[ "$LIMITS" == 1 ]]; then
  start_limits_router
  sleep "$IDLE_SETTLE"
  lim0="$(rss_kib "$LIMITS_PID")"
  lim0_split="$(rss_split "$LIMITS_PID")"
  lim_run="$(distinct_batch c "$LIMITS_PORT")"
  sleep 1
  lim1="$(rss_kib "$LIMITS_PID")"
  lim1_split="$(rss_split "$LIMITS_PID")"
  # The same keys still pinned, once the burst's allocator caches have decayed.
  sleep "$IDLE_SETTLE"
  lim2="$(rss_kib "$LIMITS_PID")"
  lim2_split="$(rss_split "$LIMITS_PID")"
  MEM_LIMITS="{\"rss_start_kib\": $lim0, \"split_start\": $lim0_split, \"rss_after_batch_kib\": $lim1, \"split_after_batch\": $lim1_split, \"rss_settled_kib\": $lim2, \"split_settled\": $lim2_split, \"hwm_kib\": $(hwm_kib "$LIMITS_PID"), \"batch\": $lim_run}"
  log "limits router RSS: start $lim0 KiB, after a batch $lim1 KiB, $IDLE_SETTLE s later $lim2 KiB"
  kill "$LIMITS_PID" 2>/dev/null || true
  wait "$LIMITS_PID" 2>/dev/null || true
fi

# --- machine and report ------------------------------------------------------------------
CPU_MODEL="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
MEM_TOTAL_KIB="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
cat >"$WORK/meta.json" <<EOF
{
  "started": "$STARTED",
  "finished": "$(date -u +%FT%TZ)",
  "command": "$COMMAND_LINE",
  "git_commit": "$(git describe --always --dirty 2>/dev/null || echo unknown)",
  "binary": "$BIN",
  "binary_built": "$BIN_BUILT",
  "nproc": $(nproc),
  "nice": $NICE,
  "cpu_model": "$CPU_MODEL",
  "mem_total_kib": $MEM_TOTAL_KIB,
  "kernel": "$(uname -r)",
  "wrk": "$(wrk -v 2>&1 | head -1 | awk '{print $2}')",
  "loadavg_before": "$LOAD_BEFORE",
  "loadavg_after": "$LOAD_AFTER",
  "reps": $REPS,
  "duration_s": $DURATION,
  "warmup_s": $WARMUP,
  "output_tokens": $OUTPUT_TOKENS,
  "router_log": "${ROUTER_LOG:-default (info)}",
  "router_rss_start_kib": $RSS_START_KIB,
  "router_rss_after_matrix_kib": $RSS_AFTER_MATRIX_KIB,
  "limits": $LIMITS,
  "nginx": $NGINX,
  "nginx_version": "$NGINX_VERSION",
  "modes": "$MODES",
  "traced": $TRACED,
  "traced_spans_expected": $TRACED_SPANS_EXPECTED,
  "traced_spans_received": $TRACED_SPANS_RECEIVED,
  "traced_rss_after_matrix_kib": $TRACED_RSS_AFTER_MATRIX_KIB,
  "baseline": "${BASELINE_BIN:-}",
  "baseline_label": "${BASELINE_LABEL:-}",
  "baseline_built": "$BASELINE_BUILT",
  "limits_rss_start_kib": $LIMITS_RSS_START_KIB,
  "limits_rss_after_matrix_kib": $LIMITS_RSS_AFTER_MATRIX_KIB,
  "memory": {
    "keys_per_batch": $KEYS,
    "idle_settle_s": $IDLE_SETTLE,
    "rss_start_kib": $MEM_RSS0,
    "rss_after_batch1_kib": $MEM_RSS1,
    "rss_after_batch2_kib": $MEM_RSS2,
    "hwm_kib": $MEM_HWM,
    "split_start": $MEM_SPLIT0,
    "split_after_batch1": $MEM_SPLIT1,
    "limits": $MEM_LIMITS,
    "batch1": $MEM_RUN1,
    "batch2": $MEM_RUN2
  }
}
EOF
python3 "$ROOT/bench/summarize.py" --raw "$RAW" --meta "$WORK/meta.json" \
  --results "$RESULTS" --report "$REPORT"
log "wrote $REPORT and $RESULTS/"
