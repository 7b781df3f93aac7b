# Shared by the on/off benchmark scripts in this directory (sourced, not run).

# CPU time of a process so far, in clock ticks (user + system).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The median of the numbers on stdin (space or newline separated).
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# Instructions callgrind counted in a process since its last dump (each dump zeroes the
# count). $1: the pid; $2: the --callgrind-out-file it was started with (dumps are that
# name with .1, .2, ... appended).
callgrind_count() {
  local dumps file
  dumps=$(find "$(dirname "$2")" -name "$(basename "$2").*" | wc -l)
  file="$2.$((dumps + 1))"
  callgrind_control -d "$1" >/dev/null 2>&1
  for _ in $(seq 300); do grep -q '^totals:' "$file" 2>/dev/null && break; sleep 0.1; done
  awk '/^totals:/ {print $2; exit}' "$file"
}

# Run "$@" (a load) with callgrind instrumenting process $1 only meanwhile ($2: its out
# file); prints the load's output, then the instructions it cost on the last line.
callgrind_during() {
  local pid=$1 out=$2 text
  shift 2
  callgrind_count "$pid" "$out" >/dev/null
  callgrind_control -i on "$pid" >/dev/null 2>&1
  text=$("$@")
  callgrind_control -i off "$pid" >/dev/null 2>&1
  echo "$text"
  callgrind_count "$pid" "$out"
}
