# Checks shared by the distributed demos' ctest scripts (sourced, not run).
# Each function prints what it checked and exits 1 with "FAIL: ..." otherwise.

# check_bad_flags DEMO "FLAG|EXPECTED MESSAGE"...: each flag alone must exit
# 2 with the message.
check_bad_flags() {
  local demo=$1 bad rc out
  shift
  for bad in "$@"; do
    rc=0; out=$("$demo" "${bad%%|*}" 2>&1) || rc=$?
    [ "$rc" -eq 2 ] && grep -qF -e "${bad#*|}" <<<"$out" ||
      { echo "FAIL: ${bad%%|*}: expected exit 2 and '${bad#*|}', got exit $rc: $out"; exit 1; }
    echo "ok: ${bad%%|*} -> $out"
  done
}

# run_traced BIN_DIR RANKS DIR DEMO [ARGS...]: the demo through the launcher
# with TROUPE_TRACE_DIR=DIR/trace, output in DIR/out (SIGINT after 100 s: the
# launcher then stops every rank before it exits).
run_traced() {
  local bin=$1 ranks=$2 dir=$3
  shift 3
  if ! TROUPE_TRACE_DIR="$dir/trace" timeout -s INT 100 "$bin/troupe-launch" -n "$ranks" -- "$@" >"$dir/out" 2>&1; then
    cat "$dir/out"; echo "FAIL: the demo failed"; exit 1
  fi
  cat "$dir/out"
}

# check_loss_falls FILE: the last "loss L" printed is below the first (the
# launcher may prefix lines with [rank]).
check_loss_falls() {
  awk '{ for (i = 1; i < NF; i++) if ($i == "loss") { if (first == "") first = $(i + 1); last = $(i + 1) } }
       END { if (first == "" || last + 0 >= first + 0) { print "FAIL: loss did not fall: " first " -> " last; exit 1 }
             print "loss " first " -> " last }' "$1"
}

# summarize_trace BIN_DIR DIR RANKS: one trace file per rank, the summary in
# DIR/summary (printed), and a non-empty SVG.
summarize_trace() {
  local bin=$1 dir=$2 ranks=$3 files
  files=$(ls "$dir/trace"/trace-*.bin | wc -l)
  [ "$files" -eq "$ranks" ] || { echo "FAIL: $files trace files for $ranks ranks"; exit 1; }
  "$bin/troupe-trace" summary "$dir/trace" | tee "$dir/summary"
  "$bin/troupe-trace" svg -o "$dir/t.svg" "$dir/trace"
  [ -s "$dir/t.svg" ] && grep -q "<svg" "$dir/t.svg" || { echo "FAIL: empty SVG"; exit 1; }
}

# rank_pid LAUNCHER_PID RANK: the pid of the launcher's child that runs RANK
# (from its TROUPE_RANK), or nothing.
rank_pid() { # launcher pid, rank -> that rank's pid
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TROUPE_RANK=$2" && { echo "$p"; return; }
  done
}

# trainer_losses FILE: the "trainer T step S  loss L" lines, without the
# launcher's [rank] prefix, sorted.
trainer_losses() { grep -E 'trainer [0-9]+ step' "$1" | sed 's/^\[[0-9]*\] //' | sort; }

# same_losses EXPECTED OTHER WHAT: OTHER printed the same trainers' steps as
# EXPECTED (a file of trainer_losses lines, or a demo's output), every loss
# within 2e-5.
same_losses() {
  local n m diffs
  n=$(trainer_losses "$1" | wc -l) m=$(trainer_losses "$2" | wc -l)
  [[ $n -gt 0 && $m -eq $n ]] || { echo "FAIL: $3 printed $m losses, one process $n"; exit 1; }
  if ! diffs=$(paste -d' ' <(trainer_losses "$1") <(trainer_losses "$2") |
    awk '$2 != $8 || $4 != $10 || ($6 - $12 > 2e-5) || ($12 - $6 > 2e-5) { print; bad = 1 } END { exit bad }'); then
    head <<<"$diffs"; echo "FAIL: $3's losses differ from one process's"; exit 1
  fi
}

# stop_rank_midway BIN_DIR DIR RANKS RANK READY EXPECT DEMO [ARGS...]: runs
# the demo through the launcher and, once its output matches READY, stops
# rank RANK (SIGSTOP). The job must end within 30 s, with a status other
# than 0 and a line matching EXPECT. A script using it calls
# release_stopped_rank from its EXIT trap.
launcher="" stopped=""
release_stopped_rank() {
  [[ -n $stopped ]] && kill -CONT "$stopped" 2>/dev/null
  [[ -n $launcher ]] && kill -TERM "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
}
stop_rank_midway() {
  local bin=$1 dir=$2 ranks=$3 rank=$4 ready=$5 expect=$6
  shift 6
  local out="$dir/stop$rank.txt" status=0 start
  OPENBLAS_NUM_THREADS=1 "$bin/troupe-launch" -n "$ranks" -- "$@" >"$out" 2>&1 &
  launcher=$!
  for _ in $(seq 1 200); do grep -q -- "$ready" "$out" && break; sleep 0.1; done
  grep -q -- "$ready" "$out" || { tail "$out"; echo "FAIL: the job did not train"; exit 1; }
  stopped=$(rank_pid "$launcher" "$rank")
  [[ -n $stopped ]] || { echo "FAIL: no process for rank $rank"; exit 1; }
  start=$SECONDS
  kill -STOP "$stopped"
  for _ in $(seq 1 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    tail "$out"; echo "FAIL: the job still runs 30 s after rank $rank stopped"; exit 1
  fi
  wait "$launcher" || status=$?
  launcher=""
  kill -CONT "$stopped" 2>/dev/null; stopped=""
  [[ $status -ne 0 ]] || { echo "FAIL: the job exited 0 with rank $rank stopped"; exit 1; }
  if ! grep -E "$expect" "$out" >"$out.matched"; then
    tail -15 "$out"; echo "FAIL: nothing matched '$expect'"; exit 1
  fi
  head -2 "$out.matched"
  echo "rank $rank stopped: the job ended after $((SECONDS - start)) s with status $status"
}
