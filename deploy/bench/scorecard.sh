#!/usr/bin/env bash
# Two simulated backends of one model that differ in speed and KV-cache size behind one
# gateway (round robin, so each serves half the calls), a bounded multi-turn load, then
# the ledger's scorecard by backend:
#
#   deploy/bench/scorecard.sh [requests] [concurrency]     # default 400 calls, 8 at once
#
# "fast" runs at twice the speed with 8192 KV blocks; "slow" at normal speed with 128,
# so it evicts the conversations it would otherwise reuse. Everything runs on loopback
# ports above 20000 with a throwaway SQLite ledger.
set -euo pipefail

REQUESTS=${1:-400}
CONCURRENCY=${2:-8}
WORK=$(mktemp -d)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_up() {
  for _ in $(seq 600); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
  echo "no answer from $1" >&2; return 1
}

FAST=$(port) SLOW=$(port) GW=$(port)
gateway sim --port "$FAST" --name fast --speed 2 --cache-blocks 8192 >"$WORK/fast.log" 2>&1 &
PIDS+=($!)
gateway sim --port "$SLOW" --name slow --speed 1 --cache-blocks 128 >"$WORK/slow.log" 2>&1 &
PIDS+=($!)
cat >"$WORK/gateway.yaml" <<EOF
server: {host: 127.0.0.1, port: $GW}
routing: {policy: round_robin}
database: {url: "sqlite:///$WORK/ledger.db"}
ledger: {spool_dir: "$WORK/spool"}
models:
  - name: sim-model
    price: {input: "3.00", cached_input: "0.30", output: "15.00"}
    backends:
      - {url: "http://127.0.0.1:$FAST", name: fast}
      - {url: "http://127.0.0.1:$SLOW", name: slow}
EOF
wait_up "http://127.0.0.1:$FAST/health"
wait_up "http://127.0.0.1:$SLOW/health"
gateway serve --config "$WORK/gateway.yaml" --port "$GW" >"$WORK/gateway.log" 2>&1 &
GATEWAY=$!
PIDS+=("$GATEWAY")
wait_up "http://127.0.0.1:$GW/health"

gateway bench run --base-url "http://127.0.0.1:$GW/v1" --workload multi-turn \
  --concurrency "$CONCURRENCY" --requests "$REQUESTS" >"$WORK/bench.log"
kill -TERM "$GATEWAY" && wait "$GATEWAY" || true   # a clean stop flushes the ledger
gateway report --database-url "sqlite:///$WORK/ledger.db" --group-by backend --format table
