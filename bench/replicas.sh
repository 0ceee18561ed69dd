#!/usr/bin/env bash
# Three router replicas on one Redis, open-rate load: the added latency of the broker on Redis.
#
# Issue 16 item 5: "p99 added latency ≤ 5 ms at 2,000 requests/s through three replicas with
# the broker on Redis". What this script does:
#   1. installs hey and redis-server (Debian packages) if missing, builds `switchyard` in
#      release mode (or uses SWITCHYARD_BIN);
#   2. starts a throwaway redis-server (no persistence), `switchyard mock-provider` (answers
#      at once) and three `switchyard standalone` routers with `--redis-url` and `--replicas 3`
#      on the same manifests: one tenant with limits (requests, input tokens, concurrency and a
#      daily spend cap, sized never to refuse: every request reserves and settles in Redis) and
#      one without (no reservation);
#   3. for each rate in RATES and each target (the mock directly, the routers for the tenant
#      without limits, the routers for the tenant with limits), runs three hey processes at
#      rate/3 each for DURATION seconds, one per replica (direct: all three at the mock), and
#      collects every request's latency (`hey -o csv`);
#   4. prints p50/p99 per target and the added p99 (router minus direct at the same rate) and
#      appends the rows to bench/results/replicas.csv.
#
# Knobs: RATES (default "1000 2000"), DURATION (10), WORKERS per hey process (20; each worker
# is capped at rate/3/WORKERS requests per second, so the rate holds while latency stays below
# WORKERS×3/rate seconds), SWITCHYARD_BIN, LABEL (the build's name in the CSV; default the
# commit, for a binary built from elsewhere).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RATES="${RATES:-1000 2000}"
DURATION="${DURATION:-10}"
WORKERS="${WORKERS:-20}"
log() { printf '[%s] %s\n' "$(date -u +%T)" "$*" >&2; }

need() { # command package
  if ! command -v "$1" >/dev/null 2>&1; then
    log "installing $2"
    apt-get install -y -qq "$2" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }
  fi
}
need hey hey
need redis-server redis-server

BIN="${SWITCHYARD_BIN:-}"
if [[ -z "$BIN" ]]; then
  log "building switchyard (release)"
  (cd "$ROOT" && cargo build -q --release -p switchyard --bin switchyard)
  BIN="$ROOT/target/release/switchyard"
fi

WORK="$(mktemp -d -t switchyard-replicas.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
wait_ready() { # url path
  for _ in $(seq 1 400); do
    if [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1$2")" == 200 ]]; then return 0; fi
    sleep 0.05
  done
  echo "$1$2 never answered 200" >&2
  return 1
}

REDIS_PORT="$(free_port)"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
MOCK_PORT="$(free_port)"
"$BIN" mock-provider --listen "127.0.0.1:$MOCK_PORT" --name bench-mock \
  --latency-ms 0 --ttft-ms 0 --tokens-per-sec 0 --output-tokens 8 2>>"$WORK/mock.log" &
PIDS+=($!)
wait_ready "http://127.0.0.1:$MOCK_PORT" /v1/models

KEY_LIMITS="sk-limits-$RANDOM$RANDOM"
KEY_FREE="sk-free-$RANDOM$RANDOM"
mkdir -p "$WORK/manifests" "$WORK/secrets/bench-keys"
printf '%s' "$KEY_LIMITS" >"$WORK/secrets/bench-keys/limits"
printf '%s' "$KEY_FREE" >"$WORK/secrets/bench-keys/free"
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
      pricing: {inputPerMillion: "2.50", outputPerMillion: "10"}
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
kind: TenantQuota
metadata:
  name: limited
spec:
  apiKeys:
    - name: limits
      secretRef: {name: bench-keys, key: limits}
  limits:
    - {name: rpm, dimension: requests, amount: 100000000, period: 60s}
    - {name: itpm, dimension: inputTokens, amount: 10000000000, period: 60s}
    - {name: in-flight, dimension: concurrency, amount: 4096, rule: concurrency}
    - {name: daily-spend, dimension: spendMicroUsd, amount: 1000000000000, rule: fixedWindow, period: 24h, resetAt: "00:00", timeZone: UTC}
---
apiVersion: switchyard.dev/v1alpha1
kind: TenantQuota
metadata:
  name: free
spec:
  apiKeys:
    - name: free
      secretRef: {name: bench-keys, key: free}
EOF

ROUTER_PORTS=()
for i in 1 2 3; do
  port="$(free_port)"
  ROUTER_PORTS+=("$port")
  env -u RUST_LOG "$BIN" standalone --manifests "$WORK/manifests" --secrets-dir "$WORK/secrets" \
    --listen "127.0.0.1:$port" --redis-url "redis://127.0.0.1:$REDIS_PORT/0" --replicas 3 \
    2>>"$WORK/router-$i.log" &
  PIDS+=($!)
done
for port in "${ROUTER_PORTS[@]}"; do wait_ready "http://127.0.0.1:$port" /readyz; done
log "redis :$REDIS_PORT, mock :$MOCK_PORT, routers ${ROUTER_PORTS[*]}"

BODY='{"model":"bench-chat","messages":[{"role":"user","content":"Say hello to the benchmark, briefly."}],"max_tokens":8}'
# run TARGET RATE: three hey processes at RATE/3 each; every request's latency in
# $WORK/TARGET-RATE-*.csv.
run() {
  local target="$1" rate="$2" per q i url key
  per=$((rate / 3))
  q=$(((per + WORKERS - 1) / WORKERS))
  local hp=()
  for i in 0 1 2; do
    case "$target" in
      direct) url="http://127.0.0.1:$MOCK_PORT/v1/chat/completions"; key="unused" ;;
      free) url="http://127.0.0.1:${ROUTER_PORTS[$i]}/v1/chat/completions"; key="$KEY_FREE" ;;
      limits) url="http://127.0.0.1:${ROUTER_PORTS[$i]}/v1/chat/completions"; key="$KEY_LIMITS" ;;
    esac
    hey -z "${DURATION}s" -c "$WORKERS" -q "$q" -m POST -T application/json -d "$BODY" \
      -H "Authorization: Bearer $key" -H "x-project-id: p$i" -o csv "$url" \
      >"$WORK/$target-$rate-$i.csv" 2>>"$WORK/hey.log" &
    hp+=($!)
  done
  for i in "${hp[@]}"; do wait "$i"; done
}

mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/replicas.csv"
[[ -f "$OUT" ]] || echo "date,commit,rate,target,requests,achieved_rps,non_200,p50_ms,p99_ms,added_p50_ms,added_p99_ms" >"$OUT"
COMMIT="${LABEL:-$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD -- crates || echo -dirty)}"
for rate in $RATES; do
  for target in direct free limits; do
    log "rate $rate/s, $target"
    [[ "$target" == limits ]] && redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    run "$target" "$rate"
    if [[ "$target" == limits ]]; then
      # What the limited requests cost Redis: commands and script calls, with their mean time.
      redis-cli -p "$REDIS_PORT" info commandstats |
        awk -F'[:,=]' '/^cmdstat_(evalsha|eval|hmget|hgetall|get|ping)/ {printf "  redis %s: %s calls, %s us per call\n", $1, $3, $7}' >&2
    fi
  done
  python3 - "$WORK" "$rate" "$DURATION" "$COMMIT" "$OUT" <<'EOF_PY'
import csv, datetime, glob, sys
work, rate, duration, commit, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
def pct(xs, p):
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
stats = {}
for target in ("direct", "free", "limits"):
    lat, bad = [], 0
    for f in glob.glob(f"{work}/{target}-{rate}-*.csv"):
        for row in csv.DictReader(open(f)):
            lat.append(float(row["response-time"]) * 1000)
            bad += row["status-code"] != "200"
    lat.sort()
    stats[target] = (len(lat), len(lat) / duration, bad, pct(lat, 0.5), pct(lat, 0.99))
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
with open(out, "a") as f:
    for target, (n, rps, bad, p50, p99) in stats.items():
        d50 = p50 - stats["direct"][3]
        d99 = p99 - stats["direct"][4]
        print(f"rate {rate:>5}/s  {target:<7} {n:>7} requests ({rps:,.0f}/s, {bad} not 200)  "
              f"p50 {p50:.3f} ms  p99 {p99:.3f} ms  added p50 {d50:+.3f} ms  added p99 {d99:+.3f} ms")
        f.write(f"{now},{commit},{rate},{target},{n},{rps:.0f},{bad},{p50:.3f},{p99:.3f},{d50:.3f},{d99:.3f}\n")
EOF_PY
done
