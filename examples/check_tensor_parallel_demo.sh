#!/usr/bin/env bash
# Tensor x pipeline (x data) across processes equals one process (issue 20):
# the demo GPT with its layers split over tensor ranks, cut into stages and
# replicated, prints the losses of one process training the same batches
# (within the printed digits), for 2 stages x 2 tensor ranks (4 processes),
# 2 x 2 x 2 (8), and 3 tensor ranks with sequence parallelism (6: heads and
# vocabulary that 3 does not divide). Its checkpoints load at another
# layout and resume with the uninterrupted losses. A stopped stage process ends the job
# within the heartbeat timeout with an error naming its node, with no process left. A layout that does
# not fit the processes exits 2; one the model cannot take exits 1 naming why.
#   examples/check_tensor_parallel_demo.sh BIN_DIR DEMO
set -uo pipefail
source "$(dirname "$0")/demo_checks.sh"
bin=$1 demo=$2
dir=$(mktemp -d)
launcher=""
pids=""
cleanup() {
  for p in $pids; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  [[ -n $launcher ]] && kill -KILL "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
steps=8 resumed=12

"$demo" --tensor=1 --steps=$resumed --print-every=1 >"$dir/one.txt" 2>&1 || { cat "$dir/one.txt"; echo "FAIL: one process"; exit 1; }
losses() { grep -E 'step +[0-9]+ +loss' "$1" | sed 's/^\[[0-9]*\] //' | awk '{ print $2, $4 }'; }
[[ $(losses "$dir/one.txt" | wc -l) -eq $resumed ]] || { cat "$dir/one.txt"; echo "FAIL: one process printed no $resumed losses"; exit 1; }

layout() { # processes, flags...
  local n=$1 out="$dir/n$1.txt"
  shift
  if ! timeout -s INT 120 "$bin/troupe-launch" -n "$n" -- "$demo" --steps=$steps --print-every=1 "$@" >"$out" 2>&1; then
    tail -20 "$out"; echo "FAIL: -n $n $* failed"; exit 1
  fi
  if ! diff <(losses "$dir/one.txt" | head -$steps) <(losses "$out") >"$dir/diff.txt"; then
    cat "$dir/diff.txt"; echo "FAIL: -n $n $*: the losses differ from one process's"; exit 1
  fi
  grep -m1 'tensor_parallel_demo:' "$out"
}
layout 4 --tensor=2
layout 8 --tensor=2 --replicas=2
layout 6 --tensor=3 --sequence-parallel=1
echo "losses of one process: $(losses "$dir/one.txt" | awk '{ printf "%s ", $2 }')"

# Checkpoints reshard: saved by 2 stages x 2 tensor ranks over 4 processes
# (steps 4 and 8), resumed in one process and by 2 stages x 3 tensor ranks
# over 6: steps 9-12 are the uninterrupted run's.
if ! timeout -s INT 120 "$bin/troupe-launch" -n 4 -- "$demo" --tensor=2 --steps=$steps --checkpoint-dir="$dir/ckpt" \
  --checkpoint-every=4 >"$dir/save.txt" 2>&1; then
  tail -20 "$dir/save.txt"; echo "FAIL: the saving run failed"; exit 1
fi
cp -r "$dir/ckpt" "$dir/ckpt6"
resume() { # output, processes, flags...
  local out=$1 n=$2
  shift 2
  if ! timeout -s INT 120 "$bin/troupe-launch" -n "$n" -- "$demo" --steps=$resumed --print-every=1 "$@" >"$out" 2>&1; then
    tail -20 "$out"; echo "FAIL: resuming at -n $n $* failed"; exit 1
  fi
  if ! diff <(losses "$dir/one.txt" | tail -n +$((steps + 1))) <(losses "$out") >"$dir/diff.txt"; then
    cat "$dir/diff.txt"; echo "FAIL: resumed at -n $n $*: steps $((steps + 1))-$resumed differ from the uninterrupted run's"; exit 1
  fi
}
resume "$dir/resume1.txt" 1 --tensor=1 --checkpoint-dir="$dir/ckpt"
resume "$dir/resume6.txt" 6 --tensor=3 --checkpoint-dir="$dir/ckpt6"
echo "a checkpoint of 2 x 2 over 4 processes resumed in 1 process and at 2 x 3 over 6: one process's losses"

# A stopped stage process (rank 3: stage 1, tensor rank 1; SIGSTOP, so the
# launcher does not see it go and the driver must learn it from heartbeats).
"$bin/troupe-launch" -n 4 -- "$demo" --tensor=2 --steps=1000000 --print-every=1 --troupe.heartbeat-timeout=3s \
  >"$dir/kill.txt" 2>&1 &
launcher=$!
for _ in $(seq 1 600); do grep -q '^\[0\] step ' "$dir/kill.txt" && break; sleep 0.1; done
grep -q '^\[0\] step ' "$dir/kill.txt" || { tail "$dir/kill.txt"; echo "FAIL: the job did not train"; exit 1; }
pids=$(pgrep -P "$launcher" | tr '\n' ' ')
target=$(rank_pid "$launcher" 3)
[[ -n $target ]] || { echo "FAIL: no process for rank 3"; exit 1; }
start=$(date +%s.%N)
kill -STOP "$target"
for _ in $(seq 1 200); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$launcher" 2>/dev/null; then tail "$dir/kill.txt"; echo "FAIL: the job still runs 10 s after the stop"; exit 1; fi
took=$(echo "$(date +%s.%N) - $start" | bc)
status=0
wait "$launcher" || status=$?
launcher=""
[[ $status -ne 0 ]] || { echo "FAIL: the job exited 0 after rank 3 was stopped"; exit 1; }
echo "SIGSTOP of rank 3: the job ended $took s later (heartbeat timeout 3 s)"
(($(echo "$took <= 7" | bc))) || { echo "FAIL: $took s is over the heartbeat timeout + 4 s"; exit 1; }
grep -q '^\[0\] .*worker3' "$dir/kill.txt" || { tail "$dir/kill.txt"; echo "FAIL: the driver's error does not name worker3"; exit 1; }
grep -m1 '^\[0\] .*worker3' "$dir/kill.txt"
sleep 0.2
for p in $pids; do
  if kill -0 "$p" 2>/dev/null; then echo "FAIL: process $p of the job is still there"; exit 1; fi
done
pids=""

"$bin/troupe-launch" -n 3 -- "$demo" --tensor=2 >"$dir/bad.txt" 2>&1
status=$?
[[ $status -ne 0 ]] && grep -q "3 processes for --tensor=2" "$dir/bad.txt" || { cat "$dir/bad.txt"; echo "FAIL: 3 processes for 2 tensor ranks gave exit $status"; exit 1; }
# A degree the model cannot take (4 heads over 5 tensor ranks) is an error
# naming why on every rank, not an abort.
"$bin/troupe-launch" -n 5 -- "$demo" --tensor=5 >"$dir/heads.txt" 2>&1
status=$?
[[ $status -eq 1 ]] && grep -q "^\[[0-4]\] tensor_parallel_demo: tensor_parallel_pipeline: rank [0-4]: parallel_self_attention: 4 heads over 5 ranks leave a rank without a head" \
  "$dir/heads.txt" && ! grep -q "Aborted\|terminate called" "$dir/heads.txt" ||
  { cat "$dir/heads.txt"; echo "FAIL: 4 heads over 5 tensor ranks gave exit $status"; exit 1; }
echo "OK: 4, 8 and 6 processes print one process's losses, also after resharding a checkpoint; a stopped rank ends the job naming it; a degree the model cannot take is an error"
