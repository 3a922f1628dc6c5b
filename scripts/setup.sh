#!/usr/bin/env bash
# troupe's one-command set-up: installs the Debian packages troupe needs (only
# those missing), configures and builds into build/, then runs what was asked.
#
#   bash scripts/setup.sh demo    # set up, build, run the demo
#   bash scripts/setup.sh test    # set up, build, run every test
#   bash scripts/setup.sh bench   # set up (with the peers), build, run benchmarks
#   bash scripts/setup.sh build   # set up and build only
#
# Idempotent and non-interactive; with everything installed and built it only
# checks and returns within seconds.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
action=${1:-build}
case "$action" in
  demo|test|bench|build) ;;
  *) echo "usage: bash scripts/setup.sh demo|test|bench|build (got '$action')" >&2; exit 2 ;;
esac

# Packages to build and test troupe.
packages=(
  g++ cmake ninja-build pkg-config
  libfmt-dev libopenblas-dev libsleef-dev libdnnl-dev libxsmm-dev libcapnp-dev capnproto
  libisal-dev                 # CRC32C of checkpoint files (ISA-L's folded PCLMUL loops)
  libgtest-dev libgmock-dev libbenchmark-dev
  libcaf-dev libucx-dev ucx-utils
  libssl-dev openssl          # TLS between nodes (CAF OpenSSL module)
  iproute2                    # network namespaces for the multi-host tests
  openssh-server              # each namespace host's sshd (examples/check_ssh_cluster.sh)
  openmpi-bin                 # mpirun -n 4 starting a job (examples/check_mpirun.sh)
  clang libclang-rt-14-dev   # libFuzzer for the decoder fuzz test
  patchelf                    # scripts/gpu_bundle.sh: the CUDA binaries packed for a GPU machine
)
# The peers the benchmarks run beside troupe in the same run.
if [[ "$action" == bench ]]; then
  packages+=(python3-torch python3-numpy openmpi-bin libopenmpi-dev python3-mpi4py python3-venv python3-pip
             iperf3)  # beside troupe on emulated links (bench/links.sh)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Ray, the actor framework Python users pick for parameter servers, from PyPI
# into a virtual environment of the repository's (never into the system);
# it sees Debian's torch (--system-site-packages). Idempotent.
if [[ "$action" == bench ]] && ! .peers-venv/bin/python -c "import ray" 2>/dev/null; then
  echo "setup: creating .peers-venv with Ray from PyPI"
  /usr/bin/python3 -m venv --system-site-packages .peers-venv
  .peers-venv/bin/pip install -q ray
fi

jobs=$(nproc)
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WERROR=ON >/dev/null
fi
if [[ $action == demo ]]; then
  # Only what the demo runs: a first run need not wait for every test and benchmark.
  cmake --build build -j "$jobs" --target pipeline_demo troupe-launch troupe-trace
else
  cmake --build build -j "$jobs"
fi

# One compute thread per process, as in every figure in docs/baselines.md.
export OPENBLAS_NUM_THREADS=1

case "$action" in
  demo)
    # The small GPT of examples/char_lm.cpp split over four stage actors in
    # four processes (pipeline parallelism, 1F1B), traced; then the trace's
    # summary (bubble fraction per stage) and its picture.
    trace_dir=build/demo-trace
    rm -rf "$trace_dir"
    TROUPE_TRACE_DIR=$trace_dir UCX_LOG_LEVEL=error UCX_WARN_UNUSED_ENV_VARS=n \
      build/bin/troupe-launch -n 4 --timeout 600 -- build/examples/pipeline_demo "${@:2}"
    build/bin/troupe-trace summary -q "$trace_dir"
    build/bin/troupe-trace svg -q -o build/demo-trace.svg "$trace_dir"
    echo "trace: $trace_dir (timeline: build/demo-trace.svg; Perfetto: build/bin/troupe-trace merge -o t.json $trace_dir)"
    ;;
  test) exec ctest --test-dir build --output-on-failure -j "$jobs" --timeout 300 ;;
  bench) exec bash bench/run_all.sh "${@:2}" ;;
  build) ;;
esac
