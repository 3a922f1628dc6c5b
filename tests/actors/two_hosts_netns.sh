#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces joined by a veth pair that
# this test creates (and always deletes), with addresses only inside them.
# The ping_pong example runs one rank in each namespace, so the rendezvous,
# the CAF control plane and the UCX data plane (tcp over the veth) all cross
# a real network interface instead of loopback.
#
#   tests/actors/two_hosts_netns.sh BUILD_DIR
#
# Exits 77 (skipped) when namespaces cannot be created (not root, no
# iproute2, or a sandbox that forbids them).
set -uo pipefail
build=${1:?usage: two_hosts_netns.sh BUILD_DIR}
suffix=$$
ns_a=troupe-a-$suffix ns_b=troupe-b-$suffix
veth_a=tra$((suffix % 100000)) veth_b=trb$((suffix % 100000))
# A private /24 picked from the pid, used only inside the two namespaces.
net="10.$((200 + suffix % 50)).$((suffix / 50 % 250 + 1))"
port=$((20000 + suffix % 20000))
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
}
trap cleanup EXIT

if ! command -v ip >/dev/null || ! ip netns add "$ns_a" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (needs root and iproute2)"
  exit 77
fi
ip netns add "$ns_b" || exit 77
ip link add "$veth_a" type veth peer name "$veth_b" || exit 77
ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" || exit 1
ip -n "$ns_a" addr add "$net.1/24" dev "$veth_a" && ip -n "$ns_b" addr add "$net.2/24" dev "$veth_b" || exit 1
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up || exit 1

run_rank() { # namespace device rank
  ip netns exec "$1" env TROUPE_COORDINATOR="$net.1:$port" TROUPE_RANK="$3" TROUPE_WORLD_SIZE=2 \
    TROUPE_NODE_NAME="worker$3" UCX_TLS=tcp UCX_NET_DEVICES="$2" UCX_LOG_LEVEL=error \
    UCX_WARN_UNUSED_ENV_VARS=n timeout 60 "$build/examples/ping_pong" --rounds=200 --bytes=1048576 \
    --troupe.listen-address="$4"
}
out=$(mktemp)
run_rank "$ns_a" "$veth_a" 0 "$net.1" >"$out" 2>&1 & pids+=($!)
run_rank "$ns_b" "$veth_b" 1 "$net.2" >"$out.b" 2>&1 & pids+=($!)
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
pids=()
cat "$out" "$out.b"
rm -f "$out" "$out.b"
[[ $status -eq 0 ]] || { echo "a rank failed (exit $status)"; exit 1; }
echo "two hosts: ping_pong crossed the veth pair"
