#!/usr/bin/env bash
# Install the peer routers the routing benchmark compares against, from PyPI, into their
# own virtualenv (their pins never touch the gateway's):
#
#   deploy/bench/peers.sh            # -> $PEERS_HOME/bin/sglang-router, vllm-router
#
# PEERS_HOME (default /work/peers/routers) is where `python -m gateway.bench.routing`
# looks by default (--routers overrides it). Idempotent: a stamp records the versions.
set -euo pipefail

PEERS_HOME=${PEERS_HOME:-/work/peers/routers}
PYTHON=${PEERS_PYTHON:-python3}
SGLANG_ROUTER=${SGLANG_ROUTER_VERSION:-0.3.2}
VLLM_ROUTER=${VLLM_ROUTER_VERSION:-0.1.17}
STAMP="sglang-router==$SGLANG_ROUTER vllm-router==$VLLM_ROUTER"

log() { printf '[peers %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

if [[ "$(cat "$PEERS_HOME/.stamp" 2>/dev/null)" == "$STAMP" ]]; then
  log "reusing $PEERS_HOME ($STAMP)"
  exit 0
fi
log "installing $STAMP into $PEERS_HOME"
rm -rf "$PEERS_HOME"
"$PYTHON" -m venv "$PEERS_HOME"
"$PEERS_HOME/bin/python" -m pip install --quiet $STAMP
for exe in sglang-router vllm-router; do
  [[ -x "$PEERS_HOME/bin/$exe" ]] || { log "no $exe in $PEERS_HOME/bin"; exit 1; }
done
"$PEERS_HOME/bin/vllm-router" --help >/dev/null
"$PEERS_HOME/bin/sglang-router" launch --help >/dev/null
echo "$STAMP" >"$PEERS_HOME/.stamp"
log "ready: $PEERS_HOME/bin/{sglang-router,vllm-router}"
