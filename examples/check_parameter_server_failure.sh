#!/usr/bin/env bash
# A lost process ends a parameter-server job with an error naming it, within
# the heartbeat timeout, never a hang: the server process is stopped
# (SIGSTOP) mid-training and a trainer must report the lost shard; then a
# trainer is stopped and the server must report the lost trainer.
#   examples/check_parameter_server_failure.sh BIN_DIR DEMO
set -uo pipefail
bin=$1 demo=$2
source "$(dirname "$0")/demo_checks.sh"
dir=$(mktemp -d)
trap 'release_stopped_rank; rm -rf "$dir"' EXIT

ready="trainer 1 step   50 "
stop_rank_midway "$bin" "$dir" 4 1 "$ready" "parameter server shard 0 \(worker1/cpu/ps0\) was lost" "$demo" --epochs=100000
stop_rank_midway "$bin" "$dir" 4 3 "$ready" "worker1/cpu/ps0: trainer 1 \(worker3/cpu\) was lost" "$demo" --epochs=100000
echo "OK: a stopped server and a stopped trainer were each reported by name"
