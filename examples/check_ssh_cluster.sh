#!/usr/bin/env bash
# troupe-launch --hosts over real ssh: four hosts made by
# scripts/netns_cluster.sh (network namespaces on a bridge, each with its own
# sshd, address, /dev/shm and IPC), the launcher on the first host, one rank
# per host. Checks that:
#  1. the pipeline, data-parallel and hybrid demos train across the four
#     hosts (exit 0, the loss falls), traced: one trace file per host,
#     merged into one Chrome trace that holds all four nodes;
#  2. while a job trains, each host runs exactly its one rank; Ctrl-C
#     (SIGINT to the launcher) ends the job, and within 3 s no process of
#     it is left on any host (only each host's sshd);
#  3. a rank killed on its host (SIGKILL) fails the job, naming the rank,
#     and again nothing is left on any host.
# The data plane is told to use TCP on eth0 (UCX_TLS, UCX_NET_DEVICES,
# forwarded to the remote ranks by the launcher), so tensors cross the links.
#
#   examples/check_ssh_cluster.sh BIN_DIR PIPELINE_DEMO DATA_PARALLEL_DEMO HYBRID_DEMO
#
# Exits 77 (skipped, with the reason) where namespaces or sshd are not
# available.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ ${1:-} != --inside ]]; then
  exec bash "$here/../scripts/netns_cluster.sh" --hosts 4 -- bash "$0" --inside "$@"
fi
shift
bin=$1 pipeline=$2 data_parallel=$3 hybrid=$4
source "$here/demo_checks.sh"
read -ra ns <<<"$TROUPE_CLUSTER_NAMESPACES"
read -ra address <<<"$TROUPE_CLUSTER_ADDRESSES"
work=$(mktemp -d)
launcher=""
cleanup() {
  [[ -n $launcher ]] && kill -KILL "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  rm -rf "$work" # the cluster script ends whatever is left on the hosts
}
trap cleanup EXIT

# launch OUT ARGS...: troupe-launch on the first host, in the background
# ($launcher), over the cluster's ssh, with the data plane on TCP over eth0.
launch() {
  local out=$1
  shift
  ip netns exec "${ns[0]}" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n \
    OPENBLAS_NUM_THREADS=1 "$bin/troupe-launch" -n 4 --hosts "$TROUPE_CLUSTER_DIR/hosts" \
    --ssh "$TROUPE_CLUSTER_SSH" --timeout 100 -- "$@" >"$out" 2>&1 &
  launcher=$!
}

# What runs on host I (0-based) besides its sshd, one "pid comm" a line.
left_on_host() {
  local sshd
  sshd=$(cat "$TROUPE_CLUSTER_DIR/h$(($1 + 1))/sshd.pid" 2>/dev/null)
  for p in $(ip netns pids "${ns[$1]}"); do
    [[ $p == "$sshd" ]] || echo "$p $(cat /proc/$p/comm 2>/dev/null)"
  done
}

# Every host is back to its sshd alone within 3 s, or the test fails naming
# what was left where.
expect_hosts_empty() {
  local what=$1 left=""
  for _ in $(seq 1 30); do
    left=""
    for i in "${!ns[@]}"; do
      local here_left
      here_left=$(left_on_host "$i" | tr '\n' ' ')
      [[ -n $here_left ]] && left+="host $((i + 1)) (${address[$i]}): $here_left; "
    done
    [[ -z $left ]] && { echo "ok: $what: no process left on any host"; return; }
    sleep 0.1
  done
  echo "FAIL: $what: processes left after 3 s: $left"
  exit 1
}

# 1. The three demos, traced, across the four hosts.
run_demo() { # NAME DEMO ARGS...
  local name=$1 out="$work/$1.out"
  shift
  export TROUPE_TRACE_DIR="$work/$name-trace"
  launch "$out" "$@"
  wait "$launcher"
  local rc=$?
  launcher=""
  unset TROUPE_TRACE_DIR
  cat "$out"
  [[ $rc -eq 0 ]] || { echo "FAIL: $name across 4 hosts exited with $rc"; exit 1; }
  check_loss_falls "$out"
  # Each rank's node is named after its host (troupe-launch names nodes
  # after the hosts file's entries); every one of them left a trace file.
  for a in "${address[@]}"; do
    ls "$work/$name-trace"/trace-"$a"-*.bin >/dev/null 2>&1 || { echo "FAIL: $name: no trace file from host $a"; exit 1; }
  done
  "$bin/troupe-trace" merge -o "$work/$name.json" "$work/$name-trace" || { echo "FAIL: $name: merge failed"; exit 1; }
  for a in "${address[@]}"; do
    grep -q "\"$a\"" "$work/$name.json" || grep -q "$a/" "$work/$name.json" ||
      { echo "FAIL: $name: the merged trace has nothing of $a"; exit 1; }
  done
  echo "ok: $name trained across 4 hosts over ssh; the merged trace holds all 4 nodes ($(wc -c <"$work/$name.json") bytes)"
  expect_hosts_empty "$name finished"
}
run_demo pipeline "$pipeline" --steps=6 --print-every=3
run_demo data_parallel "$data_parallel" --steps=6 --print-every=3
run_demo hybrid "$hybrid" --steps=6 --print-every=3 --replicas=2

# start_training NAME DEMO ARGS...: a long job, returned once rank 0 has
# printed a step and every host runs its rank.
start_training() {
  local name=$1 demo=$2 out="$work/$1.out"
  shift 2
  launch "$out" "$demo" --steps=1000000 --print-every=1 "$@"
  for _ in $(seq 1 600); do grep -q '^\[0\] step ' "$out" && break; sleep 0.1; done
  grep -q '^\[0\] step ' "$out" || { cat "$out"; echo "FAIL: $name: the job did not train"; exit 1; }
  local comm
  comm=$(basename "$demo" | cut -c1-15)
  for i in "${!ns[@]}"; do
    local ranks
    ranks=$(left_on_host "$i" | awk -v c="$comm" '$2 == c' | wc -l)
    [[ $ranks -eq 1 ]] || { left_on_host "$i"; echo "FAIL: $name: host $((i + 1)) runs $ranks ranks, not 1"; exit 1; }
  done
  echo "ok: $name: each of the 4 hosts runs its rank"
}

# launcher_exits WHAT BOUND_S: the launcher's status once it has exited,
# which it must within BOUND_S seconds.
launcher_exits() {
  local what=$1 bound=$2
  for _ in $(seq 1 $((bound * 10))); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then echo "FAIL: $what: the launcher still runs after $bound s"; exit 1; fi
  wait "$launcher"
  local rc=$?
  launcher=""
  return $rc
}

# 2. Ctrl-C.
start_training ctrl-c "$pipeline"
kill -INT "$launcher"
launcher_exits "Ctrl-C" 5
rc=$?
tail -n 4 "$work/ctrl-c.out"
[[ $rc -eq 130 ]] || { echo "FAIL: Ctrl-C: the launcher exited with $rc, not 130"; exit 1; }
expect_hosts_empty "after Ctrl-C"

# 3. A rank killed on its host.
start_training killed-rank "$data_parallel"
victim=$(left_on_host 2 | awk -v c="$(basename "$data_parallel" | cut -c1-15)" '$2 == c { print $1 }')
kill -KILL "$victim"
launcher_exits "a killed rank" 10
rc=$?
tail -n 6 "$work/killed-rank.out"
[[ $rc -ne 0 ]] || { echo "FAIL: a killed rank: the launcher exited 0"; exit 1; }
grep -q "troupe-launch: failed: rank 2 (${address[2]}) " "$work/killed-rank.out" ||
  grep -q "troupe-launch: failed: rank [0-9] " "$work/killed-rank.out" ||
  { echo "FAIL: a killed rank: the launcher did not name a failed rank"; exit 1; }
expect_hosts_empty "after a rank was killed"
echo "OK: 3 demos across 4 ssh hosts, traced and merged; Ctrl-C and a killed rank leave nothing on any host"
