#!/usr/bin/env bash
# Throughput of the gateway with request-path metrics on vs off, in one run.
# One instant simulator behind two gateways (identical but for GATEWAY_METRICS_ENABLED);
# wrk alternates between them ROUNDS times so drift on a shared machine hits both alike.
#   deploy/metrics-overhead.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-10}
PY=${PYTHON:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT

port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 100); do curl -fs "$1" >/dev/null && return; sleep 0.2; done; echo "no answer: $1" >&2; exit 1; }

SIM=$(port); ON=$(port); OFF=$(port)
"$PY" -m gateway sim --instant --port "$SIM" >"$WORK/sim.log" 2>&1 &
wait_up "http://127.0.0.1:$SIM/health"
for mode in on off; do
  p=$ON; [ "$mode" = off ] && p=$OFF
  mkdir -p "$WORK/$mode"
  cat >"$WORK/$mode/gateway.yaml" <<YAML
server: {access_log: false}
models: [{name: sim-model, backends: [{url: "http://127.0.0.1:$SIM"}]}]
database: {url: "sqlite:///$WORK/$mode/ledger.db"}
ledger: {spool_dir: "$WORK/$mode/spool"}
YAML
  enabled=true; [ "$mode" = off ] && enabled=false
  GATEWAY_METRICS_ENABLED=$enabled "$PY" -m gateway serve --config "$WORK/$mode/gateway.yaml" \
    --port "$p" >"$WORK/$mode/gateway.log" 2>&1 &
  wait_up "http://127.0.0.1:$p/health"
done

rps() { wrk -t1 -c16 -d"${SECONDS_PER_RUN}s" -s deploy/wrk/chat.lua "http://127.0.0.1:$1/v1/chat/completions" | awk '/Requests\/sec/ {print $2}'; }
rps "$ON" >/dev/null; rps "$OFF" >/dev/null   # warm up both
on_total=0; off_total=0
for i in $(seq "$ROUNDS"); do
  a=$(rps "$ON"); b=$(rps "$OFF")
  echo "round $i: metrics on $a req/s, metrics off $b req/s"
  on_total=$(echo "$on_total + $a" | bc -l); off_total=$(echo "$off_total + $b" | bc -l)
done
echo "mean: on $(echo "$on_total / $ROUNDS" | bc -l | xargs printf '%.1f') req/s," \
  "off $(echo "$off_total / $ROUNDS" | bc -l | xargs printf '%.1f') req/s," \
  "on/off $(echo "$on_total / $off_total" | bc -l | xargs printf '%.3f')"
