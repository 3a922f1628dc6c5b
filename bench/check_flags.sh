#!/usr/bin/env bash
# Every benchmark refuses what it does not know before it measures anything:
# an unknown flag or a bad value ends it with exit code 2 and a message
# naming the argument; --help lists the options and exits 0.
#   check_flags.sh BENCH...
set -uo pipefail
fail=0
expect() { # expect RC PATTERN -- COMMAND...
  local rc=$1 pattern=$2; shift 3
  local out; out=$(timeout 20 "$@" 2>&1); local got=$?
  if [[ $got -ne $rc ]] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: '$*' exited $got (want $rc) and printed: $out (want /$pattern/)"; fail=1
  fi
}
for b in "$@"; do
  name=$(basename "$b")
  expect 2 "unknown argument '--bogus'" -- "$b" --bogus
  expect 2 "unknown argument 'stray'" -- "$b" stray
  expect 0 "usage: $name" -- "$b" --help
done
# Values are checked, not read with atoi (which made 'x' a zero).
for b in "$@"; do
  case $(basename "$b") in
    gemm|codec|mlp_step|elementwise|ops) expect 2 "\-\-rounds is 'x' but must be an integer" -- "$b" --rounds=x ;;
    pipeline) expect 2 "\-\-processes is '3' but must be an integer in \[1, 2\]" -- "$b" --processes=3
              expect 2 "\-\-model is 'gpt2' but must be one of mlp, gpt" -- "$b" --model=gpt2 ;;
    data_parallel) expect 2 "\-\-replicas: '0' is not a positive integer" -- "$b" --replicas=2,0
                   expect 2 "\-\-model is 'gpt2' but must be one of mlp, gpt" -- "$b" --model=gpt2 ;;
    allreduce) expect 2 "\-\-chunk-kib is '-1' but must be an integer" -- "$b" --chunk-kib=-1
               expect 2 "\-\-pass-kib is '1' but must be an integer in \[4," -- "$b" --pass-kib=1
               expect 2 "\-\-algorithm is 'fastest' but must be both, shared-memory or ring" -- "$b" --algorithm=fastest
               expect 2 "\-\-single-copy is 'yes' but must be on or off" -- "$b" --single-copy=yes ;;
    tensor_parallel) expect 2 "\-\-width is '4' but must be an integer in \[8," -- "$b" --width=4 ;;
    gpt_step) expect 2 "\-\-models: 'gpt2' is not one of" -- "$b" --models=gpt,gpt2
              expect 2 "\-\-device: 'cuda:1' is not cpu or cuda:0" -- "$b" --device=cuda:1
              expect 2 "\-\-drift-steps: '50' must be 0 (off) or at least 200" -- "$b" --drift-steps=50 ;;
    transport) expect 2 "\-\-rounds is '1e9' but must be an integer" -- "$b" --rounds=1e9 ;;
  esac
done
[[ $fail -eq 0 ]] && echo "OK: $# benchmarks check their command lines"
exit $fail
