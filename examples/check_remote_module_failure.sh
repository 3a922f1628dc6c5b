#!/usr/bin/env bash
# A lost process ends a remote-module job with an error naming it, within
# the heartbeat timeout, never a hang: the head's host is stopped (SIGSTOP)
# mid-training and a trainer must report the lost module; then a trainer is
# stopped and the other trainer must report it (its data-parallel partner).
#   examples/check_remote_module_failure.sh BIN_DIR DEMO
set -uo pipefail
bin=$1 demo=$2
source "$(dirname "$0")/demo_checks.sh"
dir=$(mktemp -d)
trap 'release_stopped_rank; rm -rf "$dir"' EXIT

ready="trainer 1 step   50 "
stop_rank_midway "$bin" "$dir" 3 2 "$ready" "remote module 'head' \(worker2/cpu/module_head\) was lost" \
  "$demo" --steps=1000000
stop_rank_midway "$bin" "$dir" 3 1 "$ready" "replica 1 \(worker1/cpu/reducer1\) was lost|caller 1 \(worker1/cpu\) was lost" \
  "$demo" --steps=1000000
echo "OK: a stopped host and a stopped trainer were each reported by name"
