#!/usr/bin/env bash
# Checks that bad flags are a clear error with exit 2, then runs the
# data-parallel demo through the launcher with tracing on and checks that it
# ends well: exit 0, the loss of the last printed step below the first, the
# replicas identical, one trace file per rank, a summary row for every
# replica's backward and its reducer, the share of reduction hidden behind
# backward, and an SVG.
#   run_data_parallel_demo.sh BIN_DIR RANKS DEMO [ARGS...]
set -euo pipefail
source "$(dirname "$0")/demo_checks.sh"
bin=$1 ranks=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
check_bad_flags "$1" "--steps=0|--steps is '0' but must be an integer" "--bucket-kib=big|--bucket-kib is 'big'" \
                "--batch=-1|--batch is '-1'" "--stpes=3|unknown argument '--stpes=3'"
run_traced "$bin" "$ranks" "$dir" "$@"
check_loss_falls "$dir/out"
grep -q "replicas identical: yes" "$dir/out" || { echo "FAIL: the replicas differ"; exit 1; }
summarize_trace "$bin" "$dir" "$ranks"
for ((r = 0; r < ranks; r++)); do
  for who in replica reducer; do
    grep -Eq "^worker$r/cpu/$who$r +worker$r +[1-9]" "$dir/summary" ||
      { echo "FAIL: no busy row for worker$r/cpu/$who$r"; exit 1; }
  done
done
grep -Eq "^# gradient reduction hidden behind backward: [0-9.]+%" "$dir/summary" ||
  { echo "FAIL: the summary has no share of reduction hidden behind backward"; exit 1; }
echo "OK: loss falls, replicas identical, a trace file per rank, every replica and reducer in the summary, SVG"
