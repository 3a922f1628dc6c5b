#!/usr/bin/env bash
# Runs an actor example through the launcher with tracing on, then checks
# that the trace tool merges the per-process files into a summary whose
# edges have matched flows, and draws a non-empty SVG timeline.
#   run_traced.sh BIN_DIR RANKS EXAMPLE [ARGS...]
set -euo pipefail
bin=$1 ranks=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# SIGINT: the launcher then stops every rank before it exits.
if ! TROUPE_TRACE_DIR="$dir/trace" timeout -s INT 90 "$bin/troupe-launch" -n "$ranks" -- "$@" >"$dir/out" 2>&1; then
  cat "$dir/out"; echo "FAIL: the example failed"; exit 1
fi
cat "$dir/out"
files=$(ls "$dir/trace"/trace-*.bin | wc -l)
[ "$files" -eq "$ranks" ] || { echo "FAIL: $files trace files for $ranks ranks"; exit 1; }
"$bin/troupe-trace" summary "$dir/trace" | tee "$dir/summary"
# Edge rows read "sender -> receiver messages bytes matched p50 p90 p99":
# there must be some, and every message must be matched send-to-receive.
awk '$2 == "->" { edges++; if ($4 == 0 || $6 != $4) { print "FAIL: unmatched flows on " $1 " -> " $3; bad = 1 } }
     END { if (edges == 0) { print "FAIL: no edges in the summary"; bad = 1 } exit bad }' "$dir/summary"
"$bin/troupe-trace" svg -o "$dir/t.svg" "$dir/trace"
[ -s "$dir/t.svg" ] && grep -q "<svg" "$dir/t.svg" || { echo "FAIL: empty SVG"; exit 1; }
echo "OK: $files trace files, summary and SVG"
