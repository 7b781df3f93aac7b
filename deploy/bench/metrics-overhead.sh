#!/usr/bin/env bash
# Throughput of the gateway with request-path metrics on vs off, in one run.
# One instant simulator behind two gateways (identical but for GATEWAY_METRICS_ENABLED);
# wrk alternates between them ROUNDS times so drift on a shared machine hits both alike.
# Besides requests/s it reports the gateway process's CPU time per request, which other
# load on the machine disturbs far less than throughput.
#   deploy/bench/metrics-overhead.sh [ROUNDS] [SECONDS]
# SWITCH names the setting toggled (default GATEWAY_METRICS_ENABLED); for the ledger:
#   SWITCH=GATEWAY_LEDGER__ENABLED deploy/bench/metrics-overhead.sh
# DATABASE_URL: the ledger's database (default: a SQLite file per gateway).
# CALLGRIND=1 runs both gateways under valgrind's callgrind, instrumented only while wrk
# runs, and reports instructions per request instead of CPU time: slow (~100 req/s) but
# the same on a busy machine as on a quiet one. Batches then hold a few rows, not
# hundreds; LEDGER_FLUSH=1.5 (seconds) brings them back to the size they have at full speed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-10}
SWITCH=${SWITCH:-GATEWAY_METRICS_ENABLED}
PY=${PYTHON:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT

port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 600); do curl -fs "$1" >/dev/null && return; sleep 0.2; done; echo "no answer: $1" >&2; exit 1; }
. deploy/bench/lib.sh

SIM=$(port)
"$PY" -m gateway sim --instant --port "$SIM" >"$WORK/sim.log" 2>&1 &
wait_up "http://127.0.0.1:$SIM/health"
declare -A PORT PID
for mode in on off; do
  PORT[$mode]=$(port)
  mkdir -p "$WORK/$mode"
  cat >"$WORK/$mode/gateway.yaml" <<YAML
server: {access_log: false}
models: [{name: sim-model, backends: [{url: "http://127.0.0.1:$SIM"}]}]
database: {url: "${DATABASE_URL:-sqlite:///$WORK/$mode/ledger.db}", auto_migrate: true}
ledger: {spool_dir: "$WORK/$mode/spool", flush_interval: ${LEDGER_FLUSH:-0.05}}
auth: {enabled: false}
YAML
  enabled=true; [ "$mode" = off ] && enabled=false
  env "$SWITCH=$enabled" ${CALLGRIND:+valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$WORK/$mode/callgrind.out"} \
    "$PY" -m gateway serve --config "$WORK/$mode/gateway.yaml" \
    --port "${PORT[$mode]}" >"$WORK/$mode/gateway.log" 2>&1 &
  PID[$mode]=$!
  wait_up "http://127.0.0.1:${PORT[$mode]}/health"
done

HZ=$(getconf CLK_TCK)
declare -A RPS CPU
load() { wrk -t1 -c16 -d"${SECONDS_PER_RUN}s" -s deploy/wrk/chat.lua "http://127.0.0.1:${PORT[$1]}/v1/chat/completions"; }
UNIT="us CPU/request"; [ -n "${CALLGRIND:-}" ] && UNIT="instructions/request"
run() {  # prints "req/s cost-per-request" (cost: CPU microseconds, or instructions)
  local before after out cost
  if [ -n "${CALLGRIND:-}" ]; then
    out=$(callgrind_during "${PID[$1]}" "$WORK/$1/callgrind.out" load "$1")
    cost=$(echo "$out" | tail -n 1)
  else
    before=$(cpu_ticks "${PID[$1]}")
    out=$(load "$1")
    after=$(cpu_ticks "${PID[$1]}")
    cost=$(( (after - before) * 1000000 / HZ ))
  fi
  echo "$out" | awk -v c="$cost" \
    '/requests in/ {n=$1} /Requests\/sec/ {rps=$2} END {printf "%.1f %.1f\n", rps, c / n}'
}
run on >/dev/null; run off >/dev/null   # warm up both
for i in $(seq "$ROUNDS"); do
  for mode in on off; do
    read -r rps cpu < <(run "$mode")
    RPS[$mode]="${RPS[$mode]:-} $rps"; CPU[$mode]="${CPU[$mode]:-} $cpu"
    echo "round $i $SWITCH $mode: $rps req/s, $cpu $UNIT"
  done
done
for mode in on off; do
  echo "median $SWITCH $mode: $(echo "${RPS[$mode]}" | median) req/s," \
    "$(echo "${CPU[$mode]}" | median) $UNIT"
done
