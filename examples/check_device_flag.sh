#!/usr/bin/env bash
# --device names what is wrong with it (exit code 2, before any training):
# a value that is no device, and a CUDA ordinal this machine lacks; the CPU
# runs. Every rank checks its own machine.
#   examples/check_device_flag.sh DEMO [FLAGS...]
set -uo pipefail
demo=$1
shift
name=$(basename "$demo")
expect_error() {
  local pattern=$1 value=$2 output rc
  shift 2
  output=$("$demo" --device="$value" --steps=1 "$@" 2>&1); rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -e "$pattern" <<<"$output" || grep -q 'step ' <<<"$output"; then
    echo "FAIL: $name --device=$value: expected exit 2 and '$pattern', got exit $rc:"; echo "$output"; exit 1
  fi
  echo "ok: $name --device=$value -> $output"
}
expect_error "--device is 'gpu' but must be cpu or cuda:N" gpu "$@"
expect_error "--device is 'cuda:99' but this machine has" cuda:99 "$@"
output=$("$demo" --device=cpu --steps=1 --print-every=1 "$@" 2>&1) || { echo "$output"; echo "FAIL: --device=cpu"; exit 1; }
grep -qE 'step +1 +loss' <<<"$output" || { echo "$output"; echo "FAIL: --device=cpu trained no step"; exit 1; }
echo "ok: $name --device=cpu trains"
