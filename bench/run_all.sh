#!/usr/bin/env bash
# Runs every benchmark of bench/ one after the other (never two at once: two
# cores, and two benchmarks would measure each other). Extra arguments (for
# example --json) are passed to each.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OPENBLAS_NUM_THREADS=1
export UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n
for b in gemm codec elementwise ops mlp_step gpt_step cnn_step transport pipeline allreduce data_parallel parameter_server; do
  build/bench/$b "$@"
  echo
done
# Across namespace hosts on shaped links beside iperf3 (root only: it makes
# network namespaces; skipped with a line elsewhere). Its own output format
# (docs/scaling.md reads it with bench/scaling_model.py).
bash bench/links.sh --hosts "2 4 8" --rates "1gbit 10gbit 25gbit none" || echo "bench/links.sh: skipped or failed (exit $?)"
