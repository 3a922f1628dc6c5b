#!/usr/bin/env bash
# The whole CUDA check in one command, for a machine with a GPU: builds with
# the CUDA backend (scripts/setup.sh), runs every test that exercises CUDA
# (the convolutions twice: on cuDNN where the machine has it, and on
# troupe's own kernels), the data-parallel, pipeline, tensor-parallel and
# hybrid demos across two processes on cuda:0, the GPU benchmarks (GPT and
# convolutional network training beside PyTorch, pipelines) and the share
# of communication hidden behind compute in a traced two-process pipeline,
# and writes one report file.
#
#   bash scripts/gpu_check.sh [--no-build] [--no-bench] [--build-dir=build] [--report=FILE] [--python=python3]
#
# --no-build   use the binaries already in the build directory (a build made
#              on another machine of the same architecture and copied here)
# --no-bench   the tests only (a lent device's first call: the benchmarks
#              take longer than one call may run)
# --report     where the report goes (default: <build-dir>/gpu-report.txt)
# --python     the interpreter that has PyTorch with CUDA, for the peer
#
# The tests run as binaries rather than through ctest, so a copied build
# tree works too. Exit code: 0 when every test passed and the benchmark's
# correctness column has no WRONG; 1 otherwise; 2 for a bad argument.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
build=build
report=""
python=python3
do_build=1
do_bench=1
for arg in "$@"; do
  case "$arg" in
    --no-build) do_build=0 ;;
    --no-bench) do_bench=0 ;;
    --build-dir=*) build=${arg#*=} ;;
    --report=*) report=${arg#*=} ;;
    --python=*) python=${arg#*=} ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (see the comment at the top of the script)" >&2; exit 2 ;;
  esac
done
report=${report:-$build/gpu-report.txt}

if ((do_build)); then
  bash scripts/setup.sh build || { echo "gpu_check.sh: the build failed" >&2; exit 1; }
fi

# Every test binary with CUDA cases; each skips, naming why, what its machine lacks.
# And the CPU kernels' AVX2 / AVX-512 comparison: the device machine's CPU
# is one more on which it runs.
tests=(tensor/tensor.cuda_backend_test tensor/tensor.cuda_loading_test tensor/tensor.cudnn_descriptors_test
       tensor/tensor.vector_isa_test
       autograd/autograd.cuda_training_test
       parallel/parallel.cuda_pipeline_test parallel/parallel.nccl_communicator_test
       parallel/parallel.data_parallel_test actors/actors.tensor_router_test
       parallel/parallel.remote_module_test parallel/parallel.remote_module_checkpoints_test
       parallel/parallel.checkpoints_test parallel/parallel.parameter_server_test
       parallel/parallel.tensor_parallel_test parallel/parallel.tensor_parallel_pipeline_test
       parallel/parallel.tensor_parallel_equivalence_test)
# cuDNN: the machine's own, else the copy PyTorch's wheels carry (the
# CUDA backend opens libcudnn.so.9 on first use and runs its own kernels
# without it; the loading test then fails, saying it could not load it).
on_library_path() {
  local d dirs
  IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
  for d in "${dirs[@]}"; do [[ -n $d && -e $d/$1 ]] && return 0; done
  ldconfig -p 2>/dev/null | grep -q "$1 "
}
cudnn_dir=""
if ! on_library_path libcudnn.so.9; then
  cudnn_dir=$("$python" -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
  if [[ -n $cudnn_dir && -e $cudnn_dir/libcudnn.so.9 ]]; then
    export LD_LIBRARY_PATH=$cudnn_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  else
    cudnn_dir="none found"
  fi
fi

status=0
mkdir -p "$(dirname "$report")"
{
  echo "# troupe GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "## devices"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
  [[ -n $cudnn_dir ]] && echo "cuDNN (not on the library path) from PyTorch's wheels: $cudnn_dir"
} >"$report"

# Runs one test binary with a gtest filter, in an environment of NAME=VALUE
# words (may be empty), into the report.
run_test() {
  local t=$1 filter=$2 environment=$3
  local binary=$build/tests/$t
  echo "## test $(basename "$t")${environment:+ with $environment}" >>"$report"
  if [[ ! -x $binary ]]; then
    echo "MISSING: $binary was not built" | tee -a "$report"
    status=1
    return
  fi
  local out rc
  # shellcheck disable=SC2086 # the environment is words on purpose
  out=$(env $environment timeout 900 "$binary" --gtest_filter="$filter" 2>&1)
  rc=$?
  # The summary, every failure and every skip with its reason, what ran the
  # convolutions and every shape cuDNN declined.
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Skipped|Failure|error|^conv2d on CUDA|cuDNN does not run' \
    <<<"$out" | awk '!seen[$0]++' >>"$report"
  echo "exit code $rc" >>"$report"
  if ((rc != 0)); then
    status=1
    echo "FAILED: $(basename "$t") (exit $rc); output follows" >>"$report"
    tail -n 80 <<<"$out" >>"$report"
  fi
  echo "$(basename "$t")${environment:+ with $environment}: exit $rc"
}

for t in "${tests[@]}"; do
  filter='*'
  # Only the CUDA cases of the data-parallel suite (the rest is CPU, run by CI).
  [[ $t == */parallel.data_parallel_test ]] && filter='DataParallelCuda*'
  # Only the device maps, on the real backend (CI runs them on an emulated device; the
  # TLS case needs the source tree's certificate script, so it stays with CI).
  [[ $t == */actors.tensor_router_test ]] && filter='TensorRouter.DeviceMapsPlaceTensorsAtTheReceiver'
  # Only the cases with GPU places (the rest is CPU, run by CI).
  [[ $t == */parallel.remote_module_test || $t == */parallel.remote_module_checkpoints_test ||
     $t == */parallel.parameter_server_test ]] && filter='*OnACudaPlace*'
  [[ $t == */parallel.checkpoints_test ]] && filter='*cuda*:*Cuda*'
  [[ $t == */parallel.tensor_parallel* ]] && filter='*OnCuda*'
  run_test "$t" "$filter" ""
done
# Every op again on cuda:1, the thread's current device left at cuda:0
# (skips, saying so, on a machine with one GPU).
run_test tensor/tensor.cuda_backend_test 'CudaBackend.*' TROUPE_TEST_CUDA_DEVICE=1
run_test autograd/autograd.cuda_training_test 'CudaTraining.*' TROUPE_TEST_CUDA_DEVICE=1
# The convolutions again on troupe's own kernels (the runs above used cuDNN
# where the machine has it).
run_test tensor/tensor.cuda_backend_test '*Convolution*' TROUPE_CUDNN=off
run_test autograd/autograd.cuda_training_test '*Convolutional*' TROUPE_CUDNN=off

# The demos across two processes on cuda:0, beside the same runs on the CPU:
# each must exit 0, and its last loss must be the CPU run's within 0.01
# (float32 sums in another order; a wrong kernel or a lost update moves it
# by much more).
last_loss() { grep -E 'step +[0-9]+ +loss' <<<"$1" | tail -1 | sed -E 's/.*loss +([0-9.]+).*/\1/'; }
run_demo() {
  local name=$1
  shift
  echo "## demo $name $*" >>"$report"
  local gpu cpu rc
  gpu=$(timeout 300 "$build/bin/troupe-launch" -n 2 -- "$build/examples/$name" --device=cuda:0 --steps=5 \
        --print-every=1 "$@" 2>&1)
  rc=$?
  echo "$gpu" >>"$report"
  if grep -q "this machine has no CUDA device" <<<"$gpu"; then
    echo "Skipped: no CUDA device" >>"$report"
    echo "demo $name $*: skipped (no CUDA device)"
    return
  fi
  cpu=$(timeout 300 "$build/bin/troupe-launch" -n 2 -- "$build/examples/$name" --steps=5 --print-every=1 "$@" 2>&1)
  local want got
  want=$(last_loss "$cpu")
  got=$(last_loss "$gpu")
  echo "last loss: cuda:0 ${got:-none}, cpu ${want:-none}; exit code $rc" >>"$report"
  if ((rc != 0)) || [[ -z $got || -z $want ]] ||
     ! awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d < 0.01 && d > -0.01) }'; then
    status=1
    echo "FAILED: demo $name $*" >>"$report"
  fi
  echo "demo $name $*: exit $rc, last loss ${got:-none} (cpu ${want:-none})"
}
run_demo data_parallel_demo
run_demo pipeline_demo
run_demo tensor_parallel_demo --tensor=2
run_demo hybrid_demo --replicas=2 # two processes: one stage, two replicas sharing the GPU

# Runs a benchmark into the report; a failure or a WRONG correctness column fails the check.
run_bench() {
  local limit=$1
  shift
  echo "## bench ${*#"$build/bench/"}" >>"$report"
  local out rc
  out=$(timeout "$limit" "$@" 2>&1)
  rc=$?
  echo "$out" >>"$report"
  echo "exit code $rc" >>"$report"
  if ((rc != 0)) || grep -q WRONG <<<"$out"; then
    status=1
  fi
  echo "$out"
}

if ((!do_bench)); then
  echo "gpu_check.sh: report in $report ($([[ $status == 0 ]] && echo all tests passed || echo FAILURES); no benchmarks: --no-bench)"
  exit $status
fi
run_bench 1200 "$build/bench/gpt_step" --device=cuda:0 --models=char_lm,gpt,gpt_wide --rounds=3 --steps=5 \
  --python="$python" --peer="$here/bench/peers/gpt_step_torch.py"
# A convolutional network beside PyTorch's (cuDNN on both sides where the
# machine has it), then troupe's side again on its own kernels.
run_bench 600 "$build/bench/cnn_step" --device=cuda:0 --models=convnet,convnet_wide --rounds=3 --steps=5 \
  --python="$python" --peer="$here/bench/peers/cnn_step_torch.py"
run_bench 600 env TROUPE_CUDNN=off "$build/bench/cnn_step" --device=cuda:0 --models=convnet,convnet_wide \
  --rounds=3 --steps=5 --no-peers
# Two pipeline stages on the GPU, in one process and in two, beside the
# whole model trained on the same GPU in one process.
run_bench 900 "$build/bench/pipeline" --model=gpt --device=cuda:0 --processes=2 --micro-batches=1,2,4,8 --steps=5
# The share of communication hidden behind compute, from the trace: the
# same bench traced at 4 micro-batches; only its two-process rows move
# tensors over the data plane, so the summary's share is theirs.
trace_dir=$(mktemp -d)
export TROUPE_TRACE_DIR=$trace_dir
run_bench 600 "$build/bench/pipeline" --model=gpt --device=cuda:0 --processes=2 --micro-batches=4 --steps=5 \
  --no-peers >/dev/null
unset TROUPE_TRACE_DIR
{
  echo "## trace of the pipeline at 4 micro-batches"
  "$build/bin/troupe-trace" summary "$trace_dir" 2>&1 | head -3
} | tee -a "$report"
rm -rf "$trace_dir"
echo "gpu_check.sh: report in $report ($([[ $status == 0 ]] && echo all passed || echo FAILURES))"
exit $status
