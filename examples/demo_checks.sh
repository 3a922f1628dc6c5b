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
