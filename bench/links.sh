#!/usr/bin/env bash
# troupe across emulated links: for each host count and link rate, a
# cluster of network-namespace hosts (scripts/netns_cluster.sh, tbf on both
# ends of every host's link) and, in the same cluster run:
#   iperf3      one TCP stream host 1 -> host 2, the link's practical rate
#   stream      troupe's data plane from host 1 to host 2: build/bench/job_stream,
#               4 MiB tensors, 8 in flight, 3 s, the shape of iperf3's stream
#   ping_pong   the same two hosts, 4 MiB tensors as round trips ("throughput"
#               counts both directions, so on a half-used full-duplex link it
#               approaches the link rate)
#   allreduce   build/bench/job_allreduce on every host (the ring, which
#               docs/scaling.md models; busbw, the mean of at least 10
#               iterations and 8 MiB, so tbf's burst does not count)
#   allreduce_auto  the same with the default algorithm, automatic
#               (halving-doubling up to 256 KiB), 64 KiB - 1 MiB, over 2 hosts
#   data-par.   examples/data_parallel_demo on every host (samples/s)
#   pipeline    examples/pipeline_demo on every host, up to 4 (samples/s;
#               its 6 layers make more stages pointless)
# Every rank is started by troupe-launch over ssh from host 1, with the data
# plane on TCP over eth0. Prints one line per figure:
#   hosts=N rate=R what=... value=... unit=...
#
#   bash bench/links.sh [--hosts "2 4 8"] [--rates "1gbit 10gbit 25gbit"] [--max-kib 16384] [--steps 12] [--repeats 1]
#
# --repeats N runs every measurement of a cluster N times in turn (a line
# per pass); bench/scaling_model.py takes the median of a row's passes.
#
# Take the benchmark lock first on a shared machine (flock /work/bench.lock
# bash bench/links.sh ...). Exits 77 where namespaces or sshd are missing.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${TROUPE_BUILD_DIR:-$here/build}

if [[ ${1:-} == --inside ]]; then
  hosts=$2 rate=$3 max_kib=$4 steps=$5 repeats=$6
  read -ra ns <<<"$TROUPE_CLUSTER_NAMESPACES"
  read -ra address <<<"$TROUPE_CLUSTER_ADDRESSES"
  work=$(mktemp -d)
  server=""
  trap '[[ -n $server ]] && kill -KILL $server 2>/dev/null; rm -rf "$work"' EXIT
  say() { echo "hosts=$hosts rate=$rate what=$1 value=$2 unit=$3"; }
  launch() { # RANKS PROGRAM ARGS...
    local ranks=$1
    shift
    ip netns exec "${ns[0]}" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n \
      OPENBLAS_NUM_THREADS=1 "$build/bin/troupe-launch" -n "$ranks" --hosts "$TROUPE_CLUSTER_DIR/hosts" \
      --ssh "$TROUPE_CLUSTER_SSH" --timeout 300 -- "$@"
  }
  # median of the numbers on stdin
  median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

  for ((pass = 1; pass <= repeats; pass++)); do
    if ((hosts >= 2)); then
      ip netns exec "${ns[1]}" iperf3 -s -1 -B "${address[1]}" >/dev/null 2>&1 &
      server=$!
      sleep 0.5
      mbits=$(ip netns exec "${ns[0]}" iperf3 -c "${address[1]}" -t 3 -f m 2>&1 | awk '/receiver/ { for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") print $i }')
      wait "$server" 2>/dev/null
      server=""
      say iperf3 "${mbits:-0}" Mbit/s

      out=$(launch 2 "$build/bench/job_stream" --bytes=4194304 --window=8 --seconds=3 --json=yes 2>&1)
      mbits=$(grep -o '"mbits":[0-9.]*' <<<"$out" | cut -d: -f2)
      [[ -n $mbits ]] || echo "$out" | tail -5 >&2
      say stream_4MiB "${mbits:-0}" Mbit/s

      out=$(launch 2 "$build/examples/ping_pong" --rounds=60 --bytes=4194304 2>&1)
      gbs=$(awk '/throughput:/ { for (i = 1; i < NF; i++) if ($(i + 1) == "GB/s") print $i }' <<<"$out")
      [[ -n $gbs ]] || echo "$out" | tail -5 >&2
      say ping_pong_4MiB "$(awk -v g="${gbs:-0}" 'BEGIN { print g * 8000 }')" Mbit/s
    fi

    allreduces() { # ALGORITHM PREFIX MAX_KIB
      out=$(launch "$hosts" "$build/bench/job_allreduce" --troupe.collectives="$1" --min-kib=64 --max-kib="$3" \
        --iterations=10 --min-timed-kib=8192 --json=yes 2>&1)
      grep -q '"busbw_gbs"' <<<"$out" || echo "$out" | tail -5 >&2
      grep -o '{"bench":"job_allreduce".*}' <<<"$out" | while read -r line; do
        bytes=$(grep -o '"bytes":[0-9]*' <<<"$line" | cut -d: -f2)
        busbw=$(grep -o '"busbw_gbs":[0-9.]*' <<<"$line" | cut -d: -f2)
        t=$(grep -o '"time_us":[0-9.]*' <<<"$line" | cut -d: -f2)
        wrong=$(grep -o '"wrong":[0-9]*' <<<"$line" | cut -d: -f2)
        say "$2${bytes}B_busbw" "$(awk -v g="$busbw" 'BEGIN { print g * 8000 }')" "Mbit/s"
        say "$2${bytes}B_time" "$t" "us (wrong $wrong)"
      done
    }
    allreduces ring allreduce_ "$max_kib"
    # The default, where it differs from the ring (halving-doubling up to 256 KiB).
    ((hosts > 2)) && allreduces automatic allreduce_auto_ 1024

    samples() { # from a demo's output: the median samples/s after the first two steps
      awk '/samples\/s/ { for (i = 1; i < NF; i++) if ($i == "samples/s") { n++; if (n > 2) print $(i + 1) } }' | median
    }
    out=$(launch "$hosts" "$build/examples/data_parallel_demo" --steps="$steps" --print-every=1 2>&1)
    sps=$(samples <<<"$out")
    [[ -n $sps ]] || echo "$out" | tail -5 >&2
    say data_parallel_samples "${sps:-0}" samples/s
    if ((hosts >= 2 && hosts <= 4)); then
      out=$(launch "$hosts" "$build/examples/pipeline_demo" --steps="$steps" --print-every=1 2>&1)
      sps=$(samples <<<"$out")
      [[ -n $sps ]] || echo "$out" | tail -5 >&2
      say pipeline_samples "${sps:-0}" samples/s
    fi
  done
  exit 0
fi

host_counts="2 4 8" rates="1gbit 10gbit 25gbit" max_kib=16384 steps=12 repeats=1
while (($#)); do
  case "$1" in
    --hosts) host_counts=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --max-kib) max_kib=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    *) echo "usage: bench/links.sh [--hosts \"2 4 8\"] [--rates \"1gbit 10gbit 25gbit\"] [--max-kib N] [--steps N] [--repeats N]" >&2; exit 2 ;;
  esac
done
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "bench/links.sh: --repeats must be a positive count, not '$repeats'" >&2; exit 2; }
command -v iperf3 >/dev/null || { echo "SKIPPED: no iperf3 (bash scripts/setup.sh bench installs it)"; exit 77; }
for n in $host_counts; do
  for rate in $rates; do
    shape=(--rate "$rate")
    [[ $rate == none ]] && shape=()
    bash "$here/scripts/netns_cluster.sh" --hosts "$n" "${shape[@]}" -- bash "$0" --inside "$n" "$rate" "$max_kib" "$steps" "$repeats"
    rc=$?
    ((rc == 77)) && exit 77
    ((rc == 0)) || echo "hosts=$n rate=$rate FAILED (exit $rc)"
  done
done
