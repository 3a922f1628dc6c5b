#!/usr/bin/env bash
# Restart after a failure (issue 21): a job under `troupe-launch --restarts 1`
# whose rank is killed (SIGKILL) after a checkpoint exists is stopped and
# started again by the launcher, resumes by itself from the latest complete
# checkpoint, and prints the losses of an uninterrupted run. Then a save cut
# short: a rank killed while the job saves every step leaves the previous
# checkpoint loadable (troupe-checkpoint verify), and the restarted job
# resumes from it; and a rank killed half-way through writing its shard.
# Prints the time from the kill to the first resumed step.
#   examples/check_restart.sh BIN_DIR DEMO RANKS
set -uo pipefail
bin=$1 demo=$2 ranks=$3
dir=$(mktemp -d)
launcher=""
cleanup() {
  if [[ -n $launcher ]]; then
    for p in $(pgrep -P "$launcher"); do kill -KILL "$p" 2>/dev/null; done
    kill -KILL "$launcher" 2>/dev/null
    wait "$launcher" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
now() { date +%s.%N; }
source "$(dirname "$0")/demo_checks.sh"
# Whether rank 0 printed a step after the launcher's restart line. One awk,
# not awk piped into `grep -q`: grep leaving at its first match kills awk's
# next write (SIGPIPE), and under pipefail that pipeline then fails whenever
# more than a pipe write of output follows the restart.
stepped_after_restart() {
  awk '/restarting the job/ {seen = 1} seen && /^\[0\] step / {found = 1; exit} END {exit !found}' "$1"
}
losses() { grep -E '^\[0\] step +[0-9]+  loss' "$1" | sed -E 's/^\[0\] step +([0-9]+)  loss ([0-9.]+).*/\1 \2/'; }

steps=60
export OPENBLAS_NUM_THREADS=1
"$bin/troupe-launch" -n "$ranks" -- "$demo" --steps=$steps --print-every=1 >"$dir/plain" 2>&1 ||
  { tail "$dir/plain"; echo "FAIL: the uninterrupted run failed"; exit 1; }

# run_case NAME EVERY WAIT_FOR: kill rank 1 once WAIT_FOR exists under the
# checkpoint directory (WAIT_FOR "self": rank 1 kills itself through the
# TROUPE_CHECKPOINT_TEST_KILL_* hook in the environment), then require a
# restart that resumes with the uninterrupted losses.
run_case() {
  local name=$1 every=$2 wait_for=$3 ck="$dir/ck-$1" out="$dir/out-$1"
  "$bin/troupe-launch" -n "$ranks" --restarts 1 -- "$demo" --steps=$steps --print-every=1 \
    --checkpoint-dir="$ck" --checkpoint-every="$every" --troupe.heartbeat-timeout=3s >"$out" 2>&1 &
  launcher=$!
  local killed_at
  if [[ $wait_for == self ]]; then
    for _ in $(seq 1 1200); do grep -q "restarting the job" "$out" && break; sleep 0.05; done
    killed_at=$(now)
  else
    for _ in $(seq 1 1200); do [[ -e $ck/$wait_for ]] && break; sleep 0.05; done
    [[ -e $ck/$wait_for ]] || { tail "$out"; echo "FAIL ($name): no $wait_for"; exit 1; }
    local target
    target=$(rank_pid "$launcher" 1)
    [[ -n $target ]] || { echo "FAIL ($name): no process for rank 1"; exit 1; }
    killed_at=$(now)
    kill -KILL "$target"
  fi
  # The first step printed by the restarted job (after the launcher's line).
  local resumed_at=""
  for _ in $(seq 1 1200); do
    if stepped_after_restart "$out"; then
      resumed_at=$(now); break
    fi
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.05
  done
  local status=0
  wait "$launcher" || status=$?
  launcher=""
  [[ $status -eq 0 ]] || { tail -20 "$out"; echo "FAIL ($name): the restarted job exited $status"; exit 1; }
  grep -q "restarting the job" "$out" || { tail "$out"; echo "FAIL ($name): no restart"; exit 1; }
  [[ -n $resumed_at ]] || { tail "$out"; echo "FAIL ($name): no step after the restart"; exit 1; }
  # After the restart the job printed steps from its checkpoint on: each must
  # equal the uninterrupted run's loss at that step.
  local after first
  after=$(awk '/restarting the job/ {seen = 1} seen' "$out" | grep -E '^\[0\] step ' |
          sed -E 's/^\[0\] step +([0-9]+)  loss ([0-9.]+).*/\1 \2/')
  first=$(head -1 <<<"$after" | cut -d' ' -f1)
  [[ $first -gt 1 ]] || { echo "FAIL ($name): the restarted job began at step $first, not after a checkpoint"; exit 1; }
  diff <(losses "$dir/plain" | awk -v f="$first" '$1 >= f') <(sort -n -k1,1 -u <<<"$after") >"$dir/diff" ||
    { cat "$dir/diff"; echo "FAIL ($name): losses after the resume differ from the uninterrupted run's"; exit 1; }
  # A self-killed rank's clock starts at the launcher's restart line, not at
  # the kill, so its figure is named for what it measures.
  local clock="kill to first resumed step"
  [[ $wait_for == self ]] && clock="restart to first resumed step"
  echo "$name: killed rank 1, restarted, resumed at step $first with the uninterrupted losses;" \
       "$clock $(echo "$resumed_at - $killed_at" | bc) s"
}

run_case after-a-checkpoint 10 step-20
# Saving every step: the kill lands while a save may be in flight; whatever
# it cut short, the latest complete checkpoint verifies and the job resumes.
run_case during-saves 1 step-8
# Every "step-N" left (not a staging "step-N.tmp") is a complete checkpoint,
# even one the stopped job was pruning when the launcher stopped it.
kept=0
for c in "$dir"/ck-during-saves/step-*; do
  [[ $c == *.tmp ]] && continue
  "$bin/troupe-checkpoint" verify "$c" >/dev/null ||
    { echo "FAIL: $c of the during-saves case does not verify"; exit 1; }
  kept=$((kept + 1))
done
[[ $kept -gt 0 ]] || { echo "FAIL: the during-saves case kept no checkpoint"; exit 1; }
# Rank 1 killed by the hook half-way through writing its shard of step 20
# (its first 100,000 bytes written): step 20 never commits, the restarted
# job resumes from step 10, and the checkpoints it then keeps verify.
TROUPE_CHECKPOINT_TEST_KILL_AFTER_BYTES=100000 TROUPE_CHECKPOINT_TEST_KILL_RANK=1 TROUPE_CHECKPOINT_TEST_KILL_STEP=20 \
  run_case mid-shard 10 self
grep -q "rank 1 (worker1) was killed by signal 9" "$dir/out-mid-shard" ||
  { tail "$dir/out-mid-shard"; echo "FAIL (mid-shard): rank 1 was not killed by the hook"; exit 1; }
[[ $(awk '/restarting the job/ {seen = 1} seen' "$dir/out-mid-shard" | grep -m1 -E '^\[0\] step ' | awk '{ print $3 }') -eq 11 ]] ||
  { echo "FAIL (mid-shard): the restarted job did not resume after step 10"; exit 1; }
for c in "$dir"/ck-mid-shard/step-*; do
  "$bin/troupe-checkpoint" verify "$c" >/dev/null || { echo "FAIL: $c of the mid-shard case does not verify"; exit 1; }
done
echo "OK: the three restarts resumed from the latest complete checkpoint with the uninterrupted losses"
