#!/usr/bin/env bash
# A bad command-line value or an unknown option is a clear error, exit code 2,
# and the demo does not start training.
set -uo pipefail
demo=$1
expect_error() {
  local pattern=$1; shift
  local output rc
  output=$("$demo" "$@" 2>&1); rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -e "$pattern" <<<"$output" || grep -q '^step' <<<"$output"; then
    echo "char_lm $*: expected exit 2 and '$pattern', got exit $rc:"; echo "$output"; exit 1
  fi
  echo "ok: char_lm $* -> $output"
}
expect_error "--steps is 'abc' but must be an integer in [1, 1000000]" --steps=abc
expect_error "--steps is '0' but must be an integer" --steps=0
expect_error "--seed is '-1' but must be an integer" --seed=-1
expect_error "unknown argument '--stpes=3'" --stpes=3
expect_error "no text files in '/nonexistent'" --data=/nonexistent
