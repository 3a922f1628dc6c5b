#!/usr/bin/env bash
# The Open MPI path: `mpirun -n 4` starts the data-parallel demo directly
# (no troupe-launch); each rank finds its rank and the world size in
# OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, and only TROUPE_COORDINATOR
# and the job's TROUPE_JOB_TOKEN are exported (-x). Checks that the job
# trains (the loss falls, the replicas end identical), and that a rank
# killed mid-training ends the job under mpirun with no rank left.
#
#   examples/check_mpirun.sh DATA_PARALLEL_DEMO
#
# Exits 77 (skipped) where Open MPI's mpirun is not installed.
set -uo pipefail
demo=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/demo_checks.sh"
command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun (Debian's openmpi-bin)"; exit 77; }
work=$(mktemp -d)
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
mpi=""
# Whether process $1's environment holds the line $2. Read whole before
# grep: `tr | grep -q` fails under pipefail when grep leaves early and tr's
# next write dies of SIGPIPE, as it does in a large environment.
has_env() {
  local env
  env=$({ tr '\0' '\n' <"/proc/$1/environ"; } 2>/dev/null) || return 1
  grep -qx -e "$2" <<<"$env"
}
# The job's processes: those with this run's token in their environment.
job_pids() {
  for p in $(pgrep -f "$demo"); do
    has_env "$p" "TROUPE_JOB_TOKEN=$token" && echo "$p"
  done
}
cleanup() {
  [[ -n $mpi ]] && kill -KILL "$mpi" 2>/dev/null && wait "$mpi" 2>/dev/null
  for p in $(job_pids); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# mpirun as root needs --allow-run-as-root; 4 ranks on 2 cores need
# --oversubscribe. The port is free when the coordinator binds it, or the
# run fails naming it (no other job on this machine picks from this range
# at the same moment).
port=$((30000 + $$ % 20000))
run_mpi() { # OUT ARGS... (in the background: $mpi)
  local out=$1
  shift
  mpirun -n 4 --allow-run-as-root --oversubscribe --tag-output \
    -x TROUPE_COORDINATOR="127.0.0.1:$port" -x TROUPE_JOB_TOKEN="$token" -x OPENBLAS_NUM_THREADS=1 \
    "$demo" "$@" >"$out" 2>&1 &
  mpi=$!
}

run_mpi "$work/train.out" --steps=8 --print-every=4
timeout 120 tail --pid="$mpi" -f /dev/null
wait "$mpi"
rc=$?
mpi=""
cat "$work/train.out"
[[ $rc -eq 0 ]] || { echo "FAIL: mpirun -n 4 exited with $rc"; exit 1; }
check_loss_falls "$work/train.out"
grep -q "replicas identical: yes" "$work/train.out" || { echo "FAIL: the replicas differ"; exit 1; }
echo "ok: mpirun -n 4 trained the data-parallel demo from OMPI_COMM_WORLD_* variables"

port=$((port + 1))
run_mpi "$work/killed.out" --steps=1000000 --print-every=1
for _ in $(seq 1 600); do grep -q 'step ' "$work/killed.out" && break; sleep 0.1; done
grep -q 'step ' "$work/killed.out" || { cat "$work/killed.out"; echo "FAIL: the long job did not train"; exit 1; }
victim=""
for p in $(job_pids); do
  has_env "$p" "OMPI_COMM_WORLD_RANK=2" && victim=$p
done
[[ -n $victim ]] || { echo "FAIL: no process of rank 2"; exit 1; }
kill -KILL "$victim"
for _ in $(seq 1 200); do kill -0 "$mpi" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$mpi" 2>/dev/null; then echo "FAIL: mpirun still runs 20 s after rank 2 was killed"; exit 1; fi
wait "$mpi"
rc=$?
mpi=""
tail -n 5 "$work/killed.out"
[[ $rc -ne 0 ]] || { echo "FAIL: mpirun exited 0 after a rank was killed"; exit 1; }
left=$(job_pids | tr '\n' ' ')
[[ -z $left ]] || { echo "FAIL: ranks left after mpirun exited: $left"; exit 1; }
echo "OK: mpirun -n 4 runs a troupe job; a killed rank ends it with no rank left (mpirun exit $rc)"
