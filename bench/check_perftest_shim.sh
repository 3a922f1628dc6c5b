#!/usr/bin/env bash
# The "buffers written" peer of bench/transport is ucx_perftest with
# perftest_written_buffers.so preloaded. Checks, on loopback, that the shim
# loads into both perftest processes, writes their buffers (it says so only
# after writing) and leaves the run intact; and that perftest without it
# prints no such line, so the benchmark's check of that line means something.
#   check_perftest_shim.sh SHIM
set -uo pipefail
shim=$1
if ! command -v ucx_perftest >/dev/null; then
  echo "SKIP: ucx_perftest not installed (ucx-utils)"; exit 77
fi
export UCX_TLS=tcp UCX_NET_DEVICES=lo UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bytes=4194304
fail=0
run() { # run NAME PRELOAD: a server and a client on a fresh port
  local name=$1 preload=$2 port=$((20000 + RANDOM % 20000))
  LD_PRELOAD=$preload timeout 30 ucx_perftest -p "$port" >"$out/$name.server" 2>&1 &
  local server=$!
  sleep 0.5
  LD_PRELOAD=$preload timeout 30 ucx_perftest 127.0.0.1 -p "$port" -t ucp_am_bw -s $bytes -n 20 -w 2 -O 4 \
    >"$out/$name.client" 2>&1
  local rc=$?
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  return $rc
}
mark="troupe-perftest-shim: wrote $bytes bytes"
if ! run shim "$shim"; then
  echo "FAIL: ucx_perftest with the shim failed:"; cat "$out/shim.client"; fail=1
fi
for side in client server; do
  if ! grep -q "$mark" "$out/shim.$side"; then
    echo "FAIL: the $side did not report writing its buffer:"; cat "$out/shim.$side"; fail=1
  fi
done
if ! grep -q "^Final:" "$out/shim.client"; then
  echo "FAIL: no Final line with the shim:"; cat "$out/shim.client"; fail=1
fi
run plain ""
if grep -q "troupe-perftest-shim" "$out/plain.client" || ! grep -q "^Final:" "$out/plain.client"; then
  echo "FAIL: perftest without the shim:"; cat "$out/plain.client"; fail=1
fi
[[ $fail -eq 0 ]] && echo "perftest shim: both processes wrote their $bytes-byte buffers; plain perftest unmarked"
exit $fail
