#!/usr/bin/env bash
# troupe-trace svg's window options: a bad value is a usage error (exit 2)
# naming the option, before any input is read.
#   trace_tool_arguments.sh path/to/troupe-trace
set -uo pipefail
tool=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
expect_usage_error() {
  local pattern=$1; shift
  local output rc
  output=$("$tool" svg -o "$dir/out.svg" "$@" "$dir" 2>&1); rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -e "$pattern" <<<"$output"; then
    echo "FAIL: troupe-trace svg $*: expected exit 2 and '$pattern', got exit $rc: $output"; exit 1
  fi
  echo "ok: $* -> $output"
}
expect_usage_error "--steps is 'x' but must be a number >= 0" --steps x
expect_usage_error "--steps is '1.5' but must be a whole number" --steps 1.5
expect_usage_error "--from-ms is '-3' but must be a number >= 0" --from-ms -3
expect_usage_error "--from-ms (5) must be below --to-ms (2)" --from-ms 5 --to-ms 2
expect_usage_error "--to-ms is '1e400' but must be a number >= 0" --to-ms 1e400
test -e "$dir/out.svg" && { echo "FAIL: an SVG was written despite the usage error"; exit 1; }
echo "OK: every bad window option is a usage error"
