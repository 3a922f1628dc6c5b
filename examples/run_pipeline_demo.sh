#!/usr/bin/env bash
# Checks that bad flags are a clear error with exit 2, then runs the
# pipeline demo through the launcher with tracing on and checks that
# it ends well: exit 0, the loss of the last printed step below the first,
# one trace file per rank, a trace summary with a bubble fraction for
# every stage actor, and an SVG.
#   run_pipeline_demo.sh BIN_DIR RANKS DEMO [ARGS...]
set -euo pipefail
source "$(dirname "$0")/demo_checks.sh"
bin=$1 ranks=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
check_bad_flags "$1" "--steps=0|--steps is '0' but must be an integer" "--schedule=zigzag|--schedule is 'zigzag'" \
                "--micro-batches=x|--micro-batches is 'x'" "--stpes=3|unknown argument '--stpes=3'" \
                "--overlap-update=2|--overlap-update is '2'"
run_traced "$bin" "$ranks" "$dir" "$@"
check_loss_falls "$dir/out"
summarize_trace "$bin" "$dir" "$ranks"
for ((s = 0; s < ranks; s++)); do
  # "stage<s>", or "r<k>.stage<j>" for replica k's stage j (--replicas).
  grep -Eq "^worker$s/cpu/(r[0-9]+\.)?stage[0-9]+ .*[0-9.]+%?\s*$" "$dir/summary" ||
    { echo "FAIL: no row with a bubble fraction for the stage on worker$s"; exit 1; }
done
echo "OK: loss falls, a trace file per rank, every stage in the summary, SVG"
