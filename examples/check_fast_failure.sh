#!/usr/bin/env bash
# A lost process ends a job fast (issue 21): a rank stopped with SIGSTOP
# mid-training is declared lost after the heartbeat timeout, the rank that
# learns it stops, and troupe-launch ends the job within heartbeat timeout +
# 4 s of the stop; a rank killed with SIGKILL ends the job within 2 s (its
# connection breaks at once). Every case ends with no process of the job
# left: each pid is checked, and killed by the trap if it is still there.
#   examples/check_fast_failure.sh BIN_DIR PIPELINE_DEMO DATA_PARALLEL_DEMO HYBRID_DEMO
set -uo pipefail
bin=$1 pipeline=$2 data_parallel=$3 hybrid=$4
heartbeat_timeout_s=3 # short, so the test is quick; long enough not to misfire on a busy machine
dir=$(mktemp -d)
launcher=""
pids=""
cleanup() {
  for p in $pids; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  [[ -n $launcher ]] && kill -KILL "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { echo "$(now) - $1" | bc; } # seconds since $1, as a decimal

source "$(dirname "$0")/demo_checks.sh"

# one case: RANKS SIGNAL RANK BOUND_S DEMO ARGS...: start the job, wait until
# it trains, send SIGNAL to RANK, and require the launcher to exit non-zero
# within BOUND_S seconds with no process of the job left.
run_case() {
  local ranks=$1 sig=$2 rank=$3 bound=$4 demo=$5 out="$dir/out.txt"
  shift 5
  OPENBLAS_NUM_THREADS=1 "$bin/troupe-launch" -n "$ranks" -- "$demo" --steps=1000000 --print-every=1 \
    --troupe.heartbeat-timeout=${heartbeat_timeout_s}s "$@" >"$out" 2>&1 &
  launcher=$!
  for _ in $(seq 1 600); do grep -q '^\[0\] step ' "$out" && break; sleep 0.1; done
  grep -q '^\[0\] step ' "$out" || { tail "$out"; echo "FAIL: the job did not train"; exit 1; }
  pids=$(pgrep -P "$launcher" | tr '\n' ' ')
  local target
  target=$(rank_pid "$launcher" "$rank")
  [[ -n $target ]] || { echo "FAIL: no process for rank $rank"; exit 1; }
  local start
  start=$(now)
  kill "-$sig" "$target"
  # Poll 50 ms at a time, for at most twice the bound: a hang is reported, not waited out.
  local limit=$((bound * 2 * 20))
  for _ in $(seq 1 $limit); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
  local took
  took=$(elapsed "$start")
  if kill -0 "$launcher" 2>/dev/null; then
    tail -15 "$out"; echo "FAIL: $sig of rank $rank: the job still runs $took s later"; exit 1
  fi
  local status=0
  wait "$launcher" || status=$?
  launcher=""
  grep -v '\] step ' "$out" | tail -8
  echo "$sig of rank $rank ($(basename "$demo") -n $ranks): troupe-launch exited $took s later with status $status"
  [[ $status -ne 0 ]] || { echo "FAIL: the job exited 0 after $sig of rank $rank"; exit 1; }
  (($(echo "$took <= $bound" | bc))) || { echo "FAIL: $took s is over the bound of $bound s"; exit 1; }
  sleep 0.2 # the launcher has reaped its ranks; let the kernel finish with them
  for p in $pids; do
    if kill -0 "$p" 2>/dev/null; then echo "FAIL: process $p of the job is still there"; exit 1; fi
  done
  pids=""
}

stopped_bound=$((heartbeat_timeout_s + 4))
run_case 3 STOP 1 $stopped_bound "$pipeline"      # a stage: the driver learns and fails
run_case 3 STOP 0 $stopped_bound "$pipeline"      # the driver: every stage learns and leaves
run_case 3 STOP 2 $stopped_bound "$data_parallel" # a replica: its ring learns
# A stage of replica 1: the other replica's stage, whose ring partner never
# reaches the reduction, must not hold its node's stop until the ring's timeout.
run_case 4 STOP 3 $stopped_bound "$hybrid" --replicas=2
run_case 3 KILL 1 2 "$pipeline"
run_case 3 KILL 2 2 "$data_parallel"
echo "OK: every lost process ended its job within the bounds, with none left behind"
