#!/usr/bin/env bash
# The remote-module demo (2 data-parallel trainers and the head's host, 3
# processes) equals one process training the same model on the same
# batches: every trainer's loss at every step within float rounding; then a
# job saving every 10 steps stops at step 20, and a new job resumes from it
# (the host loads the head and its Adam state, the trainers their body,
# trainer 0 coordinating) with the one-process losses of steps 21-40. The
# trace shows the host handling the calls. A bad flag exits 2.
#   examples/check_remote_module_demo.sh BIN_DIR DEMO
set -uo pipefail
bin=$1 demo=$2
source "$(dirname "$0")/demo_checks.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
steps=40 half=20

"$demo" --one-process=1 --steps=$steps >"$dir/one.txt" 2>&1 || { cat "$dir/one.txt"; echo "FAIL: one process"; exit 1; }
[[ $(trainer_losses "$dir/one.txt" | wc -l) -eq $((2 * steps)) ]] || { cat "$dir/one.txt"; echo "FAIL: one process's losses"; exit 1; }
if ! (run_traced "$bin" 3 "$dir" "$demo" --steps=$steps >"$dir/traced.txt"); then cat "$dir/traced.txt"; exit 1; fi
same_losses "$dir/one.txt" "$dir/out" "the 3-process job"
# The trace merges, the host is an actor that handled the calls, and each
# caller's messages to it are matched with their receipts (all but the last
# step's end, which the job may finish before the host takes it).
"$bin/troupe-trace" summary "$dir/trace" >"$dir/summary" || { echo "FAIL: the trace does not merge"; exit 1; }
grep -qE "^worker2/cpu/module_head +worker2 +[1-9]" "$dir/summary" &&
  awk '$2 == "->" && $3 == "worker2/cpu/module_head" { n++; if ($4 < 2 * '"$steps"' || $6 < $4 - 1) bad = 1 }
       END { exit !(n == 2 && !bad) }' "$dir/summary" ||
  { cat "$dir/summary"; echo "FAIL: the trace lacks the host's handling or its calls' receipts"; exit 1; }
grep -E "trainer 0 step +(1|$steps) " "$dir/one.txt"
if ! timeout -s INT 100 "$bin/troupe-launch" -n 3 -- "$demo" --steps=$half --checkpoint-dir="$dir/ckpt" \
  >"$dir/save.txt" 2>&1; then
  tail -20 "$dir/save.txt"; echo "FAIL: the saving job failed"; exit 1
fi
[[ -d "$dir/ckpt/step-$half" ]] || { ls "$dir/ckpt"; echo "FAIL: no checkpoint of step $half"; exit 1; }
"$bin/troupe-checkpoint" inspect "$dir/ckpt/step-$half" >"$dir/inspect.txt" 2>&1 &&
  grep -q "optimizer.head.weight.exp_avg" "$dir/inspect.txt" && grep -q "remote-module.head" "$dir/inspect.txt" ||
  { cat "$dir/inspect.txt"; echo "FAIL: the checkpoint lacks the head's state written by its host"; exit 1; }
if ! timeout -s INT 100 "$bin/troupe-launch" -n 3 -- "$demo" --steps=$steps --checkpoint-dir="$dir/ckpt" \
  >"$dir/resumed.txt" 2>&1; then
  tail -20 "$dir/resumed.txt"; echo "FAIL: the resuming job failed"; exit 1
fi
trainer_losses "$dir/one.txt" | awk -v h=$half '$4 > h' >"$dir/one_after.txt"
same_losses "$dir/one_after.txt" "$dir/resumed.txt" "the resumed job"
check_bad_flags "$demo" "--steps=0|--steps"
echo "OK: 3 processes equal one process for $steps steps, and after resuming from step $half (within 2e-5)"
