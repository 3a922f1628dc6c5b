#!/usr/bin/env bash
# Checks that bad flags are a clear error with exit 2, then runs the
# data-parallel demo through the launcher with tracing on and checks that it
# ends well: exit 0, the loss of the last printed step below the first, the
# replicas identical, one trace file per rank, a summary row for every
# replica's backward and its reducer, and an SVG.
#   run_data_parallel_demo.sh BIN_DIR RANKS DEMO [ARGS...]
set -euo pipefail
bin=$1 ranks=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for bad in "--steps=0|--steps is '0' but must be an integer" "--bucket-kib=big|--bucket-kib is 'big'" \
           "--batch=-1|--batch is '-1'" "--stpes=3|unknown argument '--stpes=3'"; do
  rc=0; out=$("$1" "${bad%%|*}" 2>&1) || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -e "${bad#*|}" <<<"$out" ||
    { echo "FAIL: ${bad%%|*}: expected exit 2 and '${bad#*|}', got exit $rc: $out"; exit 1; }
  echo "ok: ${bad%%|*} -> $out"
done
if ! TROUPE_TRACE_DIR="$dir/trace" timeout -s INT 100 "$bin/troupe-launch" -n "$ranks" -- "$@" >"$dir/out" 2>&1; then
  cat "$dir/out"; echo "FAIL: the demo failed"; exit 1
fi
cat "$dir/out"
awk '{ for (i = 1; i < NF; i++) if ($i == "loss") { if (first == "") first = $(i + 1); last = $(i + 1) } }
     END { if (first == "" || last + 0 >= first + 0) { print "FAIL: loss did not fall: " first " -> " last; exit 1 }
           print "loss " first " -> " last }' "$dir/out"
grep -q "replicas identical: yes" "$dir/out" || { echo "FAIL: the replicas differ"; exit 1; }
files=$(ls "$dir/trace"/trace-*.bin | wc -l)
[ "$files" -eq "$ranks" ] || { echo "FAIL: $files trace files for $ranks ranks"; exit 1; }
"$bin/troupe-trace" summary "$dir/trace" | tee "$dir/summary"
for ((r = 0; r < ranks; r++)); do
  for who in replica reducer; do
    grep -Eq "^worker$r/cpu/$who$r +worker$r +[1-9]" "$dir/summary" ||
      { echo "FAIL: no busy row for worker$r/cpu/$who$r"; exit 1; }
  done
done
grep -Eq "^# gradient reduction hidden behind backward: [0-9.]+%" "$dir/summary" ||
  { echo "FAIL: the summary has no share of reduction hidden behind backward"; exit 1; }
"$bin/troupe-trace" svg -o "$dir/t.svg" "$dir/trace"
[ -s "$dir/t.svg" ] && grep -q "<svg" "$dir/t.svg" || { echo "FAIL: empty SVG"; exit 1; }
echo "OK: loss falls, replicas identical, $files trace files, every replica and reducer in the summary, SVG"
