#!/usr/bin/env bash
# Runs every benchmark of bench/ one after the other (never two at once: two
# cores, and two benchmarks would measure each other). Extra arguments (for
# example --json) are passed to each.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OPENBLAS_NUM_THREADS=1
export UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n
for b in gemm codec elementwise ops mlp_step gpt_step transport pipeline allreduce data_parallel parameter_server; do
  build/bench/$b "$@"
  echo
done
