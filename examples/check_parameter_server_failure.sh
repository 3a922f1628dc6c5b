#!/usr/bin/env bash
# A lost process ends a parameter-server job with an error naming it, within
# the heartbeat timeout, never a hang: the server process is stopped
# (SIGSTOP) mid-training and a trainer must report the lost shard; then a
# trainer is stopped and the server must report the lost trainer.
#   examples/check_parameter_server_failure.sh BIN_DIR DEMO
set -uo pipefail
bin=$1 demo=$2
dir=$(mktemp -d)
launcher=""
stopped=""
cleanup() {
  [[ -n $stopped ]] && kill -CONT "$stopped" 2>/dev/null
  [[ -n $launcher ]] && kill -TERM "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

source "$(dirname "$0")/demo_checks.sh"

# one run: stop rank $1, expect a line matching $2 within 30 s
run_and_stop() {
  local rank=$1 expect=$2 out="$dir/run$1.txt"
  OPENBLAS_NUM_THREADS=1 "$bin/troupe-launch" -n 4 -- "$demo" --epochs=100000 >"$out" 2>&1 &
  launcher=$!
  for _ in $(seq 1 200); do grep -q "trainer 1 step   50 " "$out" && break; sleep 0.1; done
  grep -q "trainer 1 step   50 " "$out" || { tail "$out"; echo "FAIL: the job did not train"; exit 1; }
  stopped=$(rank_pid "$launcher" "$rank")
  [[ -n $stopped ]] || { echo "FAIL: no process for rank $rank"; exit 1; }
  local start=$SECONDS
  kill -STOP "$stopped"
  local status=0
  for _ in $(seq 1 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    tail "$out"; echo "FAIL: the job still runs 30 s after rank $rank stopped"; exit 1
  fi
  wait "$launcher" || status=$?
  launcher=""
  kill -CONT "$stopped" 2>/dev/null; stopped=""
  [[ $status -ne 0 ]] || { echo "FAIL: the job exited 0 with rank $rank stopped"; exit 1; }
  if ! grep -E "$expect" "$out" | head -2; then
    tail -15 "$out"; echo "FAIL: nothing matched '$expect'"; exit 1
  fi
  echo "rank $rank stopped: the job ended after $((SECONDS - start)) s with status $status"
}

run_and_stop 1 "parameter server shard 0 \(worker1/cpu/ps0\) was lost"
run_and_stop 3 "worker1/cpu/ps0: trainer 1 \(worker3/cpu\) was lost"
echo "OK: a stopped server and a stopped trainer were each reported by name"
