#!/usr/bin/env bash
# Start or stop real vLLM OpenAI servers (CPU) on loopback, serving the tiny model as `tiny`.
#
#   deploy/vllm-cpu/serve.sh start N BASEPORT   # ports BASEPORT..BASEPORT+N-1; waits for /v1/models
#   deploy/vllm-cpu/serve.sh stop               # SIGTERM every server this run dir started
#   deploy/vllm-cpu/serve.sh status
#
# Run setup.sh first. Pid files and logs go to VLLM_CPU_RUN (default $VLLM_CPU_HOME/run);
# give each concurrent user its own run dir. Each server runs in its own session, so a
# stop reaches its engine processes too. A server already answering on its port is reused.
# VLLM_CPU_NICE (default 0) lowers the servers' CPU priority: on a busy machine the
# clients under test then keep up with the engine. VLLM_CPU_PIN=1 pins the i-th server
# of a start to core i (modulo the cores there are) with taskset and binds its OpenMP
# threads there: two CPU servers sharing cores stall each other (vLLM's shared-memory
# queue spins after each read), which a routing comparison must not measure.
set -euo pipefail

VLLM_CPU_HOME=${VLLM_CPU_HOME:-/var/tmp/gateway-vllm-cpu}
RUN=${VLLM_CPU_RUN:-$VLLM_CPU_HOME/run}
PY=$VLLM_CPU_HOME/venv/bin/python
MODEL=$VLLM_CPU_HOME/model
START_TIMEOUT=${VLLM_CPU_START_TIMEOUT:-240}

log() { printf '[vllm-cpu serve %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "$*"; exit 1; }
answers() { curl -fsS -m 2 -o /dev/null "http://127.0.0.1:$1/v1/models" 2>/dev/null; }
alive() { [[ -f "$RUN/$1.pid" ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

launch() {
  local port=$1 index=$2 pin=()
  if [[ "${VLLM_CPU_PIN:-0}" == 1 ]]; then
    local core=$((index % $(nproc)))
    pin=(taskset -c "$core" env VLLM_CPU_OMP_THREADS_BIND="$core")
  fi
  # setsid: the server leads its own process group, so stop can signal the whole group.
  # Our own VLLM_CPU_* knobs are dropped: vLLM warns about VLLM_* names it does not know.
  env -u VLLM_CPU_HOME -u VLLM_CPU_RUN -u VLLM_CPU_START_TIMEOUT -u VLLM_CPU_NICE \
    -u VLLM_CPU_PIN \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
    nice -n "${VLLM_CPU_NICE:-0}" setsid "${pin[@]}" "$PY" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name tiny --host 127.0.0.1 --port "$port" \
    --dtype bfloat16 --max-model-len 4096 --max-num-seqs 8 --enforce-eager \
    --enable-prefix-caching --enable-prompt-tokens-details --block-size 32 \
    >"$RUN/$port.log" 2>&1 </dev/null &
  echo $! >"$RUN/$port.pid"
}

wait_ready() {
  local port deadline=$((SECONDS + START_TIMEOUT))
  for port in "$@"; do
    until answers "$port"; do
      if ! alive "$port"; then
        tail -n 40 "$RUN/$port.log" >&2 || true
        die "server on port $port exited before answering (log: $RUN/$port.log)"
      fi
      ((SECONDS < deadline)) || die "server on port $port not ready after ${START_TIMEOUT} s"
      sleep 0.5
    done
    log "port $port ready"
  done
}

start() {
  local n=${1:?usage: serve.sh start N BASEPORT} base=${2:?usage: serve.sh start N BASEPORT}
  [[ -x "$PY" && -f "$MODEL/.stamp" ]] || die "not prepared: run deploy/vllm-cpu/setup.sh"
  mkdir -p "$RUN"
  local i port ports=() todo=()
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    ports+=("$port")
    if alive "$port" && answers "$port"; then
      log "port $port already serving (pid $(cat "$RUN/$port.pid"))"
    elif answers "$port"; then
      die "port $port is taken by a server this run dir did not start"
    else
      todo+=("$i")
    fi
  done
  # Checked first, launched after: a taken port leaves no half-started set behind.
  for i in "${todo[@]}"; do launch "$((base + i))" "$i"; done
  local t0=$SECONDS
  wait_ready "${ports[@]}"
  log "${#ports[@]} server(s) ready in $((SECONDS - t0)) s"
}

stop() {
  [[ -d "$RUN" ]] || return 0
  local f pid pids=()
  for f in "$RUN"/*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f")
    kill -TERM -- "-$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  # Give them 15 s to drain, then kill what is left of each group.
  for pid in "${pids[@]}"; do
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  log "stopped ${#pids[@]} server(s)"
}

status() {
  local f port
  for f in "$RUN"/*.pid; do
    [[ -e "$f" ]] || continue
    port=$(basename "$f" .pid)
    if answers "$port"; then echo "$port up (pid $(cat "$f"))"; else echo "$port down"; fi
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: serve.sh start N BASEPORT | stop | status" ;;
esac
