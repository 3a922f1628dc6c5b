#!/usr/bin/env bash
# The parameter-server demo (master, server, 2 data-parallel trainers over 4
# processes), traced, in synchronous mode equals one process training the
# same model on the same batches: every trainer's loss at every step within
# float rounding, also after resuming from a checkpoint. Bad flags exit 2.
#   examples/check_parameter_server_demo.sh BIN_DIR DEMO
set -uo pipefail
bin=$1 demo=$2
source "$(dirname "$0")/demo_checks.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
epochs=10

"$demo" --one-process=1 --epochs=$epochs >"$dir/one.txt" 2>&1 || { cat "$dir/one.txt"; echo "FAIL: one process"; exit 1; }
if ! TROUPE_TRACE_DIR="$dir/trace" timeout -s INT 120 "$bin/troupe-launch" -n 4 -- "$demo" --epochs=$epochs \
  >"$dir/four.txt" 2>&1; then
  tail -20 "$dir/four.txt"; echo "FAIL: the 4-process job failed"; exit 1
fi
n=$(trainer_losses "$dir/one.txt" | wc -l)
[[ $n -eq $((epochs * 20)) ]] || { echo "FAIL: $n loss lines in one process"; exit 1; }
same_losses "$dir/one.txt" "$dir/four.txt" "the 4-process job"
grep -E "trainer 0 step +(1|$((epochs * 10))) " "$dir/one.txt"
# Checkpoints: a job saving every 25 steps stops at step 50; a new job
# resumes from it (the server loads its table and optimizer state, the
# trainers their layer, trainer 0 coordinating) and prints the one-process
# losses of steps 51-100.
half=$((epochs * 5))
if ! timeout -s INT 120 "$bin/troupe-launch" -n 4 -- "$demo" --epochs=$((epochs / 2)) --checkpoint-dir="$dir/ckpt" \
  --checkpoint-every=25 >"$dir/save.txt" 2>&1; then
  tail -20 "$dir/save.txt"; echo "FAIL: the saving job failed"; exit 1
fi
[[ -d "$dir/ckpt/step-$half" ]] || { ls "$dir/ckpt"; echo "FAIL: no checkpoint of step $half"; exit 1; }
if ! timeout -s INT 120 "$bin/troupe-launch" -n 4 -- "$demo" --epochs=$epochs --checkpoint-dir="$dir/ckpt" \
  >"$dir/resumed.txt" 2>&1; then
  tail -20 "$dir/resumed.txt"; echo "FAIL: the resuming job failed"; exit 1
fi
trainer_losses "$dir/one.txt" | awk -v h=$half '$4 > h' >"$dir/one_after.txt"
same_losses "$dir/one_after.txt" "$dir/resumed.txt" "the resumed job"
echo "resumed from step $half: steps $((half + 1))-$((2 * half)) equal one process's"
"$bin/troupe-trace" summary "$dir/trace" >"$dir/summary" || { echo "FAIL: the trace does not merge"; exit 1; }
grep -q "ps0" "$dir/summary" || { cat "$dir/summary"; echo "FAIL: no parameter-server flow in the trace"; exit 1; }
"$demo" --consistency=sometimes >"$dir/bad.txt" 2>&1
status=$?
[[ $status -eq 2 ]] && grep -q -- "--consistency" "$dir/bad.txt" || { cat "$dir/bad.txt"; echo "FAIL: a bad flag gave exit $status"; exit 1; }
echo "OK: $n losses of 2 trainers over 4 processes equal one process's (within 2e-5); trace merged"
