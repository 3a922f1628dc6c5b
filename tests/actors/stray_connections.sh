#!/usr/bin/env bash
# A stray connection must never disturb a job. Trains pipeline_demo across
# 2 processes twice: undisturbed, then while stray_clients.py opens
# thousands of connections to every TCP port either process listens on
# (found from the processes themselves) and sends them garbage, BASP-shaped
# headers with huge sizes, handshakes with made-up node ids, wrong job
# tokens, truncated frames, TLS garbage and anonymous TLS, or nothing at all.
# The losses of the two runs must be equal, and every node must have logged
# refusals.
#
#   tests/actors/stray_connections.sh BUILD_DIR SOURCE_DIR [tls]
set -uo pipefail
build=${1:?usage: stray_connections.sh BUILD_DIR SOURCE_DIR [tls]}
source_dir=${2:?usage: stray_connections.sh BUILD_DIR SOURCE_DIR [tls]}
mode=${3:-plain}
steps=${STRAY_STEPS:-600}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

export OPENBLAS_NUM_THREADS=1
if [[ $mode == tls ]]; then
  bash "$source_dir/scripts/make_test_certs.sh" "$work/certs" >/dev/null || exit 1
  export TROUPE_TLS_CERTIFICATE=$work/certs/node.pem TROUPE_TLS_KEY=$work/certs/node.key \
    TROUPE_TLS_CA=$work/certs/ca.pem
fi

train() { # output file
  timeout 120 "$build/bin/troupe-launch" -n 2 -- "$build/examples/pipeline_demo" --steps="$steps" \
    --print-every=1 >"$1" 2>&1 &
  pids+=($!)
}

train "$work/quiet.txt"
wait "${pids[-1]}" || { cat "$work/quiet.txt"; echo "the undisturbed run failed"; exit 1; }
pids=()

train "$work/noisy.txt"
launcher=${pids[0]}
# Start the strangers once both ranks train (every port is open by then).
for _ in $(seq 1 300); do
  grep -q "step    1 " "$work/noisy.txt" && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
tool=$(pgrep -P "$launcher" | head -1) # timeout -> troupe-launch -> the ranks
ranks=$(pgrep -d, -P "${tool:-0}")
if [[ -z $ranks ]]; then cat "$work/noisy.txt"; echo "no rank processes found"; exit 1; fi
ports=4
[[ $mode == tls ]] && ports=2 # with TLS the data plane (UCX) is not used
timeout 60 python3 "$source_dir/tests/actors/stray_clients.py" --pids "$ranks" --seconds 8 --wait-ports "$ports" \
  --expect-closed-within 12 --max-connections 60000 >"$work/strangers.txt" 2>&1 &
pids+=($!)
hammer=${pids[-1]}
status=0
wait "$launcher" || status=$?
hammer_status=0
wait "$hammer" || hammer_status=$?
cat "$work/strangers.txt"
pids=()

losses() { grep -E '^\[0\] step +[0-9]+ +loss' "$1" | awk '{print $3, $5}'; }
if [[ $status -ne 0 ]]; then
  grep -v "refused a control-plane connection" "$work/noisy.txt" | tail -20
  echo "FAILED: the job ended with status $status while strangers connected"
  exit 1
fi
# Equal within float rounding: two undisturbed-looking runs once differed in
# one printed 4th decimal (step 211, 2.0360 against 2.0361, same partition,
# every later step equal); where the rounding difference arises is not yet
# known. More than one unit of that digit, a missing step, or a failed job
# is a disturbance.
if ! paste -d' ' <(losses "$work/quiet.txt") <(losses "$work/noisy.txt") |
  awk '$1 != $3 || ($2 - $4 > 0.00011) || ($4 - $2 > 0.00011) { print; bad = 1 } END { exit bad }' \
    >"$work/diff.txt" || [[ $(losses "$work/quiet.txt" | wc -l) -ne $(losses "$work/noisy.txt" | wc -l) ]]; then
  head -20 "$work/diff.txt"
  grep -h "stage [0-9]: layers" "$work/quiet.txt" "$work/noisy.txt"
  echo "FAILED: the losses differ from the undisturbed run"
  exit 1
fi
n=$(losses "$work/quiet.txt" | wc -l)
[[ $n -eq $steps ]] || { echo "FAILED: $n loss lines, expected $steps"; exit 1; }
connections=$(grep -oE '^stray_clients: [0-9]+ connections' "$work/strangers.txt" | grep -oE '[0-9]+')
[[ ${connections:-0} -ge 1000 ]] || { echo "FAILED: only ${connections:-0} stray connections were made"; exit 1; }
for rank in 0 1; do
  if ! grep -q "^\[$rank\] troupe: node worker$rank refused a control-plane connection" "$work/noisy.txt"; then
    echo "FAILED: rank $rank logged no refusal"
    exit 1
  fi
done
if [[ $hammer_status -ne 0 ]]; then
  echo "FAILED: silent or slow connections were not closed by the nodes (stray_clients exit $hammer_status)"
  exit 1
fi
if [[ $mode == plain ]]; then # UCX's listener, guarded by the data plane's handshake deadline
  for rank in 0 1; do
    if ! grep -q "^\[$rank\] troupe data plane \[worker$rank\]: closed [0-9]* connection(s) to UCX's listener" \
      "$work/noisy.txt"; then
      echo "FAILED: rank $rank closed no silent connection to UCX's listener"
      exit 1
    fi
  done
fi
echo "refusal lines: $(grep -c 'refused a control-plane connection' "$work/noisy.txt") (rate-limited)"
grep -E '^\[0\] step +'"$steps"' ' "$work/quiet.txt" "$work/noisy.txt"
echo "PASSED ($mode): $steps losses equal (within 1e-4) with $connections stray connections during training"
