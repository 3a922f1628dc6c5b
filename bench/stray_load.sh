#!/usr/bin/env bash
# Training under a flood of stray connections: pipeline_demo across 2
# processes, undisturbed and while tests/actors/stray_clients.py opens as many
# malformed connections as it can to every port the ranks listen on,
# alternated ROUNDS times (default 3), plain and with mutual TLS. Prints per
# round the training samples/s of both runs, the connections per second the
# nodes absorbed, and whether the losses were equal.
#
#   bench/stray_load.sh [BUILD_DIR] [ROUNDS] [STEPS]
#
# The flood comes from one Python process on the same two cores as the two
# ranks: part of the loaded run's slowdown is that process's CPU time, not the
# nodes' work (the line says how much CPU the flood used).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
steps=${3:-600}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1 UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n
bash "$root/scripts/make_test_certs.sh" "$work/certs" >/dev/null || exit 1
echo "# OpenBLAS kernel: ${OPENBLAS_CORETYPE:-auto} (OPENBLAS_CORETYPE)"
echo "# stray_load: pipeline_demo, 2 processes, $steps steps, print-every 50; samples/s over the whole run"

samples_per_s() { grep -E "^\[0\] step +$steps " "$1" | awk '{print $NF}'; }
losses() { grep -E '^\[0\] step +[0-9]+ +loss' "$1" | awk '{print $3, $5}'; }

run() { # mode output [flood]
  local mode=$1 out=$2 flood=${3:-}
  (
    if [[ $mode == tls ]]; then
      export TROUPE_TLS_CERTIFICATE=$work/certs/node.pem TROUPE_TLS_KEY=$work/certs/node.key \
        TROUPE_TLS_CA=$work/certs/ca.pem
    fi
    exec timeout 300 "$build/bin/troupe-launch" -n 2 -- "$build/examples/pipeline_demo" --steps="$steps" \
      --print-every=50
  ) >"$out" 2>&1 &
  local launcher=$!
  pids=("$launcher")
  if [[ -n $flood ]]; then
    # The ranks, once both exist; the flood waits for all their ports.
    local tool ranks
    for _ in $(seq 1 300); do
      tool=$(pgrep -P "$launcher" | head -1)
      ranks=$(pgrep -d, -P "${tool:-0}")
      [[ $ranks == *,* ]] && break
      sleep 0.1
    done
    local ports=4
    [[ $mode == tls ]] && ports=2 # with TLS the data plane (UCX) is not used
    (
      TIMEFORMAT='%U %S'
      time python3 "$root/tests/actors/stray_clients.py" --pids "$ranks" --seconds 240 \
        --max-connections 10000000 --until-pid "$launcher" --wait-ports "$ports" >"$flood" 2>&1
    ) 2>"$flood.cpu" &
    local hammer=$!
    pids+=("$hammer")
    wait "$launcher"
    local status=$?
    wait "$hammer"
    pids=()
    return $status
  fi
  wait "$launcher"
  local status=$?
  pids=()
  return $status
}

for mode in plain tls; do
  for round in $(seq 1 "$rounds"); do
    # Alternate the order so that drift does not favour one side.
    if ((round % 2)); then order="quiet loaded"; else order="loaded quiet"; fi
    for kind in $order; do
      if [[ $kind == quiet ]]; then
        run "$mode" "$work/quiet.txt" || { echo "quiet run failed"; tail "$work/quiet.txt"; exit 1; }
      else
        run "$mode" "$work/loaded.txt" "$work/flood.txt" || { echo "loaded run FAILED"; tail "$work/loaded.txt"; exit 1; }
      fi
    done
    rate=$(grep -oE '\(([0-9]+)/s\)' "$work/flood.txt" | tr -dc '0-9')
    total=$(grep -oE '^stray_clients: [0-9]+ connections' "$work/flood.txt" | grep -oE '[0-9]+')
    refusals=$(grep -c "refused a control-plane connection" "$work/loaded.txt")
    flood_cpu=$(awk '{printf "%.1f", $1 + $2}' "$work/flood.txt.cpu")
    same=$([[ "$(losses "$work/quiet.txt")" == "$(losses "$work/loaded.txt")" ]] && echo equal || echo DIFFERENT)
    printf "%-5s round %d: samples/s quiet %8s  flooded %8s  ratio %5.3f  flood %6s conn/s (%s total, %s s CPU)  log lines %s  losses %s\n" \
      "$mode" "$round" "$(samples_per_s "$work/quiet.txt")" "$(samples_per_s "$work/loaded.txt")" \
      "$(echo "$(samples_per_s "$work/loaded.txt") / $(samples_per_s "$work/quiet.txt")" | bc -l)" \
      "$rate" "$total" "$flood_cpu" "$refusals" "$same"
  done
done
