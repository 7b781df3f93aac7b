#!/bin/bash
# Throughput with auth + limits on vs off: two gateways, identical but for auth.enabled,
# each in front of its own instant simulator, sharing Postgres (ledger) and Redis.
# Usage: [ROUNDS=N] [SECONDS_PER_RUN=S] [COMPARE=1] deploy/bench/auth-overhead.sh
# (Postgres and Redis on 127.0.0.1; ports PORTS01-12, PORTS=187 by default: 18701...).
# Each round loads both gateways at once
# (a wrk -t1 -c16 each, for SECONDS_PER_RUN), and the two share one core, so whatever
# slows the machine slows both in the same seconds; it prints req/s and each gateway
# process's CPU time per request, then the medians. ALTERNATE=1 loads one side at a time
# instead, in turn (on a machine whose speed swings from one run to the next, its
# per-round ratios swing by tens of percent).
# AA=1 turns auth off on both sides: what the method reads when there is no difference;
# AA=keyed turns it on on both (one key, its leases shared by the two gateways).
# PYTHONPATH_OFF / PYTHONPATH_ON run that side from another checkout (a git worktree): with
# AA=keyed, old code against new on the same work, measured the same paired way.
# COMPARE=1 also runs `gateway bench compare` both ways (a Python client, far slower than
# the gateways, so there it measures the client more than them).
# PROFILE=DIR first runs each side once under py-spy (400 Hz, --nonblocking) and writes
# collapsed stacks to DIR/off.txt and DIR/on.txt (flamegraph.pl or speedscope read them).
# MAX_TOKENS=N (default 8) sets the answers' length; STREAM=1 streams them (each chunk
# relayed costs the gateway more, so auth and limits are a smaller share of a call).
# SYSTEM_WORDS=N sends an N-word system prompt (the same on every call) before a numbered
# question (new on every call): app-shaped prompts instead of one tiny repeated body.
# SETTLE_INTERVAL (default 0.25, the setting's default) paces the spend/token settles.
# LEASE_PERIOD (default 1.0, the setting's default): how long leases and spend views live.
# Every RESTART_EVERY rounds (default 2) both gateways restart, the other one first each
# time (NO_SWAP=1: never).
# RATELIMIT_HEADERS=true: served calls carry the x-ratelimit-* headers too (auth setting;
# off by default, as in the gateway: only refusals carry them).
# CALLGRIND=1 runs both gateways under valgrind's callgrind, counting only while wrk runs,
# and reports instructions per request instead of CPU time: the same on a busy machine as
# on a quiet one, where CPU time per request drifts from one run to the next.
# At callgrind's ~100 req/s every interval of the gateway is stretched by SCALE (default
# 30) so that a Redis round, a ledger batch and a key reload serve as many calls as at
# full speed. CALLGRIND_ARGS adds valgrind options (--cache-sim=yes: simulated cache misses
# per function, which callgrind_annotate turns into a cycle estimate).
set -e
G=${GATEWAY:-gateway}
P=${PORTS:-187}
port() { [ $1 = off ] && echo ${P}11 || echo ${P}12; }
SIMARGS=${SIMARGS:---instant}
CONC=${CONC:-16}
ROUNDS=${ROUNDS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
REQUESTS=${REQUESTS:-3000}
MAX_TOKENS=${MAX_TOKENS:-8}
RESTART_EVERY=${RESTART_EVERY:-2}
# PIN=1 (the default with two or more cores) runs both gateways on core 0 and everything
# else (simulators, wrk) on core 1, so a gateway never shares its core with the load.
PIN=${PIN:-$([ "$(nproc)" -ge 2 ] && echo 1 || echo 0)}
GATEWAYS=""; OTHERS=""
[ "$PIN" = 1 ] && { GATEWAYS="taskset -c 0"; OTHERS="taskset -c 1"; }
CHAT_LUA=$(cd "$(dirname "$0")/../wrk" && pwd)/chat.lua
. "$(dirname "$0")/lib.sh"
TEAMLIMITS=${TEAMLIMITS:---rpm 1000000 --tpm 100000000 --budget 1000000}
KEYLIMITS=${KEYLIMITS:---rpm 1000000 --tpm 100000000 --budget 1000000}
PROFILE=${PROFILE:+$(realpath -m "$PROFILE")}
SCALE=${SCALE:-$([ -n "${CALLGRIND:-}" ] && echo 30 || echo 1)}
stretch() { python3 -c "print($1 * $SCALE)"; }
WORK=$(mktemp -d /tmp/gw-auth-bench-XXXXXX)
cd "$WORK"
DB=gw_keysbench_$$
PFX="gwbench:keys:$$:"
# SPLIT_DB=1: each side its own database (for old code against new across a migration;
# not with AA=keyed, whose key lives in one).
DBS="$DB"; [ -n "${SPLIT_DB:-}" ] && DBS="${DB}_off ${DB}_on"
for d in $DBS; do
  psql -h 127.0.0.1 -U postgres -d test -qc "CREATE DATABASE $d" 2>/dev/null || psql -h 127.0.0.1 -d test -qc "CREATE DATABASE $d"
done
db_url() { echo "postgresql://127.0.0.1:5432/$DB${SPLIT_DB:+_$1}"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; sleep 1;
  for d in $DBS; do psql -h 127.0.0.1 -d test -qc "DROP DATABASE IF EXISTS $d WITH (FORCE)"; done
  redis-cli --scan --pattern "${PFX}*" | xargs -r redis-cli del > /dev/null; }
trap cleanup EXIT
$OTHERS $G sim $SIMARGS --port ${P}01 > sim1.log 2>&1 & pids+=($!)
$OTHERS $G sim $SIMARGS --port ${P}02 > sim2.log 2>&1 & pids+=($!)
for side in off on; do
  port=$(port $side); sim=$([ $side = off ] && echo ${P}01 || echo ${P}02)
  case "${AA:-}:$side" in
    keyed:*|:on) enabled=true ;;
    *) enabled=false ;;
  esac
  cat > $side.yaml <<YAML
server: {access_log: false}
models: [{name: sim-model, backends: [{url: "http://127.0.0.1:$sim"}], price: {input: "0.15", cached_input: "0.075", output: "0.6"}}]
database: {url: "$(db_url $side)", auto_migrate: true}
ledger: {spool_dir: "$WORK/spool-$side", flush_interval: $(stretch 0.05)}
redis: {url: "redis://127.0.0.1:6379/0", key_prefix: "$PFX", timeout: 1.0,
        lease_period: $(stretch ${LEASE_PERIOD:-1.0}), settle_interval: $(stretch ${SETTLE_INTERVAL:-0.25})}
auth: {enabled: $enabled, admin_key: adm, pepper: bench-pepper, cache_ttl: $(stretch 5.0)
       ${RATELIMIT_HEADERS:+, ratelimit_headers: $RATELIMIT_HEADERS}}
YAML
done
wait_up() { for _ in $(seq 600); do curl -fs "$1" >/dev/null && return; sleep 0.2; done; echo "no answer: $1" >&2; exit 1; }
serve() {  # $1: off or on
  local path=PYTHONPATH_${1^^}
  [ -n "${!path:-}" ] && export PYTHONPATH="${!path}"
  exec $GATEWAYS ${CALLGRIND:+valgrind --tool=callgrind --instr-atstart=no --trace-children=yes \
    ${CALLGRIND_ARGS:-} --callgrind-out-file="$WORK/$1.cg"} $G serve --config $1.yaml --port "$(port $1)" >> $1.log 2>&1
}
# Two starts of the same code differ by 1-2 points (A/A runs), so both restart every
# RESTART_EVERY rounds, in turn in either order, and a run's median is over many starts of
# each side (not under callgrind). They warm up together, as the rounds load them: warmed
# up one after the other, the side warmed up last runs the next rounds 2-4 points slower,
# so off/on comes out at -3% or -7.5% by the order alone.
start() {  # $1 $2: the sides in the order they start
  serve $1 & pids+=($!); eval "${1^^}PID=$!"
  serve $2 & pids+=($!); eval "${2^^}PID=$!"
  wait_up "http://127.0.0.1:$(port $1)/health"; wait_up "http://127.0.0.1:$(port $2)/health"
}
restart() {  # $1 $2 as for start
  kill $OFFPID $ONPID
  for _ in $(seq 150); do kill -0 $OFFPID 2>/dev/null || kill -0 $ONPID 2>/dev/null || break; sleep 0.2; done
  kill -9 $OFFPID $ONPID 2>/dev/null || true
  start "$@"; warm_up
}
start off on
$G keys teams create bench $TEAMLIMITS --config on.yaml > /dev/null
KEY=$($G keys create --team bench $KEYLIMITS --config on.yaml 2>/dev/null | python3 -c "import sys,json;print(json.load(sys.stdin)['key'])")
curl -sf -o /dev/null http://127.0.0.1:${P}12/v1/chat/completions -H "authorization: Bearer $KEY" -H 'content-type: application/json' -d '{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}' && echo "key works"
pid() { [ $1 = off ] && echo $OFFPID || echo $ONPID; }
url() { echo "http://127.0.0.1:$(port $1)/v1"; }
HZ=$(getconf CLK_TCK)
load() { $OTHERS wrk -t1 -c$CONC -d${SECONDS_PER_RUN}s -s "$CHAT_LUA" "$(url $1)/chat/completions" -- sim-model "$KEY" "$MAX_TOKENS" "${STREAM:+stream}" "${SYSTEM_WORDS:-0}"; }
UNIT="us CPU/request"; [ -n "${CALLGRIND:-}" ] && UNIT="instructions/request"
run() {  # prints "req/s cost-per-request" (cost: CPU microseconds, or instructions)
  local before after out cost
  if [ -n "${CALLGRIND:-}" ]; then
    out=$(callgrind_during "$(pid $1)" "$WORK/$1.cg" load $1)
    cost=$(echo "$out" | tail -n 1)
  else
    before=$(cpu_ticks $(pid $1))
    out=$(load $1)
    after=$(cpu_ticks $(pid $1))
    cost=$(python3 -c "print(($after - $before) / $HZ * 1e6)")
  fi
  echo "$out" | per_request "$cost"; echo
}
per_request() {  # wrk's output on stdin, $1 the run's cost: prints "req/s cost-per-request"
  awk -v c="$1" '/requests in/ {n=$1} /Requests\/sec/ {rps=$2} /Non-2xx/ {bad=$NF}
    END {if (bad) print "non-2xx: " bad > "/dev/stderr"; printf "%.1f %.1f ", rps, c / n}'
}
together() {  # both sides at once; prints "rps_off cost_off rps_on cost_on"
  local a0 b0 a1 b1 first=$1 second=$2
  a0=$(cpu_ticks $OFFPID); b0=$(cpu_ticks $ONPID)
  load $first > "$WORK/$first.wrk" & local l1=$!
  load $second > "$WORK/$second.wrk" & local l2=$!
  wait $l1 $l2
  a1=$(cpu_ticks $OFFPID); b1=$(cpu_ticks $ONPID)
  per_request "$(python3 -c "print(($a1 - $a0) / $HZ * 1e6)")" < "$WORK/off.wrk"
  per_request "$(python3 -c "print(($b1 - $b0) / $HZ * 1e6)")" < "$WORK/on.wrk"
  echo
}
one_at_a_time=${CALLGRIND:-}${ALTERNATE:-}  # load one side at a time, not both at once
warm_up() {  # both sides at once (one alone, under callgrind: no sharing there)
  if [ -n "$one_at_a_time" ]; then run on >/dev/null; run off >/dev/null
  else together off on >/dev/null; fi
}
declare -A RPS CPU
warm_up
if [ -n "${PROFILE:-}" ]; then
  mkdir -p "$PROFILE"
  for side in off on; do
    py-spy record --nonblocking -r 400 -d $((SECONDS_PER_RUN + 1)) -f raw \
      -o "$PROFILE/$side.txt" -p "$(pid $side)" > /dev/null 2>&1 & spy=$!
    sleep 0.5
    echo "profiled auth+limits $side: $(run $side) (req/s, us CPU/request; py-spy slows it)"
    wait $spy
  done
fi
RATIO_RPS=""; RATIO_COST=""
for i in $(seq $ROUNDS); do
  if [ $i -gt 1 ] && [ $(((i - 1) % RESTART_EVERY)) = 0 ] && [ -z "${CALLGRIND:-}${NO_SWAP:-}" ]; then
    if [ $(((i - 1) / RESTART_EVERY % 2)) = 1 ]; then restart on off; else restart off on; fi
  fi
  order="off on"; [ $((i % 2)) = 0 ] && order="on off"  # neither side always goes first
  declare -A R C
  [ -z "$one_at_a_time" ] && read -r R[off] C[off] R[on] C[on] < <(together $order)
  for side in $order; do
    [ -n "$one_at_a_time" ] && read -r R[$side] C[$side] < <(run $side)
    RPS[$side]="${RPS[$side]:-} ${R[$side]}"; CPU[$side]="${CPU[$side]:-} ${C[$side]}"
    echo "round $i auth+limits $side: ${R[$side]} req/s, ${C[$side]} $UNIT"
  done
  RATIO_RPS="$RATIO_RPS $(python3 -c "print(${R[on]} / ${R[off]})")"
  RATIO_COST="$RATIO_COST $(python3 -c "print(${C[on]} / ${C[off]})")"
done
for side in off on; do
  echo "median auth+limits $side: $(echo "${RPS[$side]}" | median) req/s, $(echo "${CPU[$side]}" | median) $UNIT"
done
# The machine's speed drifts between rounds more than the two sides differ; each round's
# on/off ratio compares runs seconds apart, and their median is the figure to quote.
python3 -c "import sys; r, c = sys.argv[1:]; print(f'median of per-round ratios on/off: throughput {float(r) - 1:+.1%}, cost per request {float(c) - 1:+.1%}')" \
  "$(echo "$RATIO_RPS" | median)" "$(echo "$RATIO_COST" | median)"
[ "${COMPARE:-0}" = 1 ] || exit 0
for order in "off on" "on off"; do
  args=()
  for s in $order; do args+=(--target "$s=$(url $s)"); done
  a0=$(cpu_ticks $OFFPID); b0=$(cpu_ticks $ONPID)
  $G bench compare "${args[@]}" --api-key "$KEY" --workload tiny --concurrency $CONC --requests $REQUESTS --warmup 50 --no-progress
  a1=$(cpu_ticks $OFFPID); b1=$(cpu_ticks $ONPID)
  echo "gateway CPU per request (us): off $(( (a1-a0) * 1000000 / HZ / REQUESTS )) on $(( (b1-b0) * 1000000 / HZ / REQUESTS ))"
done
