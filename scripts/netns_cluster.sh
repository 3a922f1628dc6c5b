#!/usr/bin/env bash
# A test cluster on one machine: N "hosts", each a network namespace with its
# own interface (eth0), address, hostname, /dev/shm and System V IPC, joined
# by a bridge in a "switch" namespace, each running its own sshd that accepts
# only a key made for this cluster. Runs COMMAND with the cluster up, then
# tears everything down (every process in the namespaces, the namespaces
# with their links and qdiscs, the keys), whatever happens.
#
#   scripts/netns_cluster.sh [--hosts N] [--rate RATE] [--mtu BYTES] -- COMMAND [ARGS...]
#
#   --hosts N    hosts (default 4, at most 32)
#   --rate RATE  each host's link, both ways, shaped with tbf to RATE
#                (tc's units: 1gbit, 10gbit, 25gbit); default: unshaped veth
#   --mtu BYTES  the links' MTU (default 1500)
#
# COMMAND runs in this (the root) namespace with:
#   TROUPE_CLUSTER_DIR         the cluster's directory: hosts (an address a
#                              line, for troupe-launch --hosts), ssh_config,
#                              the key, each host's sshd_config
#   TROUPE_CLUSTER_SSH         "ssh -F DIR/ssh_config" (for troupe-launch --ssh)
#   TROUPE_CLUSTER_NAMESPACES  the hosts' namespaces, in order
#   TROUPE_CLUSTER_ADDRESSES   the hosts' addresses, in order
# and runs things on a host with `ip netns exec NAMESPACE ...`; the exit
# status is COMMAND's. Processes that COMMAND leaves on a host are killed.
#
# The namespaces share this machine's processes and files (as hosts share an
# NFS home), not its network, shared memory or IPC: a job's data plane and
# its same-host paths (shared arena, shared-memory allreduce) must cross the
# links, never a shortcut. Only private addresses inside these namespaces
# are used. Exits 77 (skipped) when namespaces or sshd are not available.
set -uo pipefail

hosts=4 rate="" mtu=1500
while (($#)); do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: netns_cluster.sh [--hosts N] [--rate RATE] [--mtu BYTES] -- COMMAND [ARGS...]" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "netns_cluster.sh: no command (put it after --)" >&2; exit 2; }
[[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1 && hosts <= 32)) || { echo "netns_cluster.sh: --hosts $hosts is not in [1, 32]" >&2; exit 2; }

id=$$
prefix="trc$((id % 100000))"
switch="$prefix-sw"
# A private /24 from the pid; only the namespaces below hold addresses in it.
net="10.$((150 + id % 50)).$((id / 50 % 250 + 1))"
namespaces=() addresses=() started=() sshd_wrappers=()
dir=""

# Kills every process in the namespace: TERM, then KILL what is left after
# at most a second (a rank's remote watcher or a session in its teardown).
empty_namespace() {
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  [[ -n $pids ]] || return 0
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 1 10); do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [[ -z $pids ]] && return 0
    sleep 0.1
  done
  kill -KILL $pids 2>/dev/null
}

teardown() {
  trap - EXIT INT TERM
  for ns in "${started[@]}"; do empty_namespace "$ns"; done
  for pid in "${sshd_wrappers[@]}"; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  for ns in "${started[@]}"; do ip netns del "$ns" 2>/dev/null; done
  [[ -n $dir ]] && rm -rf "$dir"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

skip() { echo "SKIPPED: $*"; exit 77; }
command -v ip >/dev/null || skip "no ip (iproute2)"
[[ -x /usr/sbin/sshd ]] || skip "no /usr/sbin/sshd (Debian's openssh-server)"
command -v ssh-keygen >/dev/null && command -v ssh >/dev/null || skip "no ssh client"
command -v unshare >/dev/null || skip "no unshare (util-linux)"
ip netns add "$switch" 2>/dev/null || skip "cannot create network namespaces here (needs root)"
started+=("$switch")

dir=$(mktemp -d /tmp/troupe-cluster.XXXXXX)
chmod 700 "$dir"
ssh-keygen -q -t ed25519 -N "" -C "troupe-cluster-$id" -f "$dir/id_ed25519" || exit 1
cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
# Privilege separation's empty directory (Debian's sshd refuses to start
# without it; the package's service would create it).
mkdir -p /run/sshd && chmod 755 /run/sshd

ip -n "$switch" link add br0 type bridge || exit 1
ip -n "$switch" link set br0 up
ip -n "$switch" link set lo up

# Both directions of a link shaped: the host's egress on its eth0, its
# ingress on the switch's port. tbf's bucket must hold a GSO packet (64 KiB)
# and about a millisecond at the rate, else it would cap the rate below it.
shape() { # namespace device
  [[ -n $rate ]] || return 0
  local bits
  bits=$(tc_rate_bits "$rate") || { echo "netns_cluster.sh: --rate $rate: use NNmbit or NNgbit" >&2; exit 2; }
  local burst=$((bits / 8 / 1000)) limit=$((bits / 8 / 200))
  ((burst < 131072)) && burst=131072
  ((limit < 2 * burst)) && limit=$((2 * burst))
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" limit "$limit" || exit 1
}
tc_rate_bits() {
  case "$1" in
    *gbit) echo $((${1%gbit} * 1000000000)) ;;
    *mbit) echo $((${1%mbit} * 1000000)) ;;
    *) return 1 ;;
  esac
}

for i in $(seq 1 "$hosts"); do
  ns="$prefix-h$i" address="$net.$i"
  ip netns add "$ns" || exit 1
  started+=("$ns")
  namespaces+=("$ns") addresses+=("$address")
  ip link add eth0 netns "$ns" mtu "$mtu" type veth peer name "p$i" netns "$switch" mtu "$mtu" || exit 1
  ip -n "$switch" link set "p$i" master br0 up
  ip -n "$ns" addr add "$address/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  shape "$ns" eth0
  shape "$switch" "p$i"
  mkdir -p "$dir/h$i"
  ssh-keygen -q -t ed25519 -N "" -f "$dir/h$i/host_key" || exit 1
  cat >"$dir/h$i/sshd_config" <<EOF
ListenAddress $address
Port 22
HostKey $dir/h$i/host_key
PidFile $dir/h$i/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
MaxStartups 64:30:128
MaxSessions 64
LogLevel ERROR
EOF
  # A host of its own: hostname, /dev/shm and IPC (unshare's mounts are
  # private, so the tmpfs is seen only by this host's processes).
  ip netns exec "$ns" unshare --mount --uts --ipc /bin/sh -c \
    "mount -t tmpfs -o mode=1777,size=50% troupe-shm /dev/shm && hostname h$i && exec /usr/sbin/sshd -D -e -f $dir/h$i/sshd_config" \
    >"$dir/h$i/sshd.log" 2>&1 &
  sshd_wrappers+=($!)
done

cat >"$dir/ssh_config" <<EOF
Host *
  User root
  IdentityFile $dir/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  ConnectTimeout 5
  ServerAliveInterval 2
  ServerAliveCountMax 3
  LogLevel ERROR
EOF
printf '%s\n' "${addresses[@]}" >"$dir/hosts"

# Every host answers ssh (from the first host, as the launcher will), within 10 s.
for i in $(seq 1 "$hosts"); do
  ok=0
  for _ in $(seq 1 100); do
    if ip netns exec "${namespaces[0]}" ssh -F "$dir/ssh_config" "${addresses[i - 1]}" true 2>/dev/null; then ok=1; break; fi
    sleep 0.1
  done
  if ((!ok)); then
    cat "$dir/h$i/sshd.log"
    echo "netns_cluster.sh: host $i's sshd did not answer within 10 s"
    exit 1
  fi
done

export TROUPE_CLUSTER_DIR=$dir
export TROUPE_CLUSTER_SSH="ssh -F $dir/ssh_config"
export TROUPE_CLUSTER_NAMESPACES="${namespaces[*]}"
export TROUPE_CLUSTER_ADDRESSES="${addresses[*]}"
"$@"
