#!/usr/bin/env bash
# Checks that bad flags are a clear error with exit 2, then runs the
# pipeline demo through the launcher with tracing on and checks that
# it ends well: exit 0, the loss of the last printed step below the first,
# one trace file per rank, and a trace summary with a bubble fraction for
# every stage actor.
#   run_pipeline_demo.sh BIN_DIR RANKS DEMO [ARGS...]
set -euo pipefail
bin=$1 ranks=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for bad in "--steps=0|--steps is '0' but must be an integer" "--schedule=zigzag|--schedule is 'zigzag'" \
           "--micro-batches=x|--micro-batches is 'x'" "--stpes=3|unknown argument '--stpes=3'"; do
  rc=0; out=$("$1" "${bad%%|*}" 2>&1) || rc=$?
  [ "$rc" -eq 2 ] && grep -qF -e "${bad#*|}" <<<"$out" ||
    { echo "FAIL: ${bad%%|*}: expected exit 2 and '${bad#*|}', got exit $rc: $out"; exit 1; }
  echo "ok: ${bad%%|*} -> $out"
done
# SIGINT: the launcher then stops every rank before it exits.
if ! TROUPE_TRACE_DIR="$dir/trace" timeout -s INT 100 "$bin/troupe-launch" -n "$ranks" -- "$@" >"$dir/out" 2>&1; then
  cat "$dir/out"; echo "FAIL: the demo failed"; exit 1
fi
cat "$dir/out"
# "step N  loss L  samples/s R" lines (the launcher may prefix them with [rank]).
awk '{ for (i = 1; i < NF; i++) if ($i == "loss") { if (first == "") first = $(i + 1); last = $(i + 1) } }
     END { if (first == "" || last + 0 >= first + 0) { print "FAIL: loss did not fall: " first " -> " last; exit 1 }
           print "loss " first " -> " last }' "$dir/out"
files=$(ls "$dir/trace"/trace-*.bin | wc -l)
[ "$files" -eq "$ranks" ] || { echo "FAIL: $files trace files for $ranks ranks"; exit 1; }
"$bin/troupe-trace" summary "$dir/trace" | tee "$dir/summary"
for ((s = 0; s < ranks; s++)); do
  # "stage<s>", or "r<k>.stage<j>" for replica k's stage j (--replicas).
  grep -Eq "^worker$s/cpu/(r[0-9]+\.)?stage[0-9]+ .*[0-9.]+%?\s*$" "$dir/summary" ||
    { echo "FAIL: no row with a bubble fraction for the stage on worker$s"; exit 1; }
done
"$bin/troupe-trace" svg -o "$dir/t.svg" "$dir/trace"
[ -s "$dir/t.svg" ] && grep -q "<svg" "$dir/t.svg" || { echo "FAIL: empty SVG"; exit 1; }
echo "OK: loss falls, $files trace files, every stage in the summary, SVG"
