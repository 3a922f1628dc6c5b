#!/usr/bin/env bash
# Packs the binaries that scripts/gpu_check.sh runs, stripped, with the
# shared libraries they need, into one compressed file that can be copied to
# a GPU machine which has the CUDA driver, cuBLAS and NCCL but not troupe's
# other dependencies (CAF, UCX, Cap'n Proto, oneDNN, SLEEF, ISA-L, fmt, OpenSSL).
#
#   bash scripts/gpu_bundle.sh [--build-dir=build] [--out=.gpu-bundle]
#
# writes <out>/bundle.tar.xz (about 20 MB). On the GPU machine, from the
# repository root:
#   tar -C .gpu-bundle -xJf .gpu-bundle/bundle.tar.xz
#   bash scripts/gpu_check.sh --no-build --build-dir=.gpu-bundle/build
# after putting the machine's CUDA libraries on LD_LIBRARY_PATH. The
# binaries find the carried libraries through their RPATH ($ORIGIN-relative),
# so programs they start (the PyTorch peer) keep the machine's own.
# Exit code: 0 packed, 1 a binary is missing or a tool failed, 2 bad argument.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
build=build
out=.gpu-bundle
for arg in "$@"; do
  case "$arg" in
    --build-dir=*) build=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    *) echo "gpu_bundle.sh: unknown argument '$arg' (see the comment at the top of the script)" >&2; exit 2 ;;
  esac
done
command -v patchelf >/dev/null || { echo "gpu_bundle.sh: needs patchelf (apt-get install patchelf)" >&2; exit 1; }

# The same list as gpu_check.sh runs: tests, demos, the launcher, the benchmarks.
binaries=(tests/tensor/tensor.cuda_backend_test tests/tensor/tensor.cuda_loading_test
          tests/tensor/tensor.cudnn_descriptors_test tests/tensor/tensor.vector_isa_test
          tests/autograd/autograd.cuda_training_test
          tests/parallel/parallel.cuda_pipeline_test tests/parallel/parallel.nccl_communicator_test
          tests/parallel/parallel.data_parallel_test tests/actors/actors.tensor_router_test
          tests/parallel/parallel.remote_module_test tests/parallel/parallel.remote_module_checkpoints_test
          tests/parallel/parallel.checkpoints_test tests/parallel/parallel.parameter_server_test
          tests/parallel/parallel.tensor_parallel_test tests/parallel/parallel.tensor_parallel_pipeline_test
          tests/parallel/parallel.tensor_parallel_equivalence_test
          examples/data_parallel_demo examples/pipeline_demo examples/tensor_parallel_demo examples/hybrid_demo
          bin/troupe-launch bin/troupe-trace
          bench/gpt_step bench/cnn_step bench/pipeline)

rm -rf "$out"
final=$out
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/lib" "$out/build"
for b in "${binaries[@]}"; do
  [[ -x $build/$b ]] || { echo "gpu_bundle.sh: $build/$b was not built" >&2; exit 1; }
  mkdir -p "$out/build/$(dirname "$b")"
  strip -o "$out/build/$b" "$build/$b"
  # From build/<dir>/<dir>/binary up to the bundle's lib/.
  up=$(dirname "$b" | sed 's|[^/]*|..|g')
  patchelf --force-rpath --set-rpath "\$ORIGIN/$up/../lib" "$out/build/$b"
  # Libraries the machine provides itself: the C library's and CUDA's.
  ldd "$build/$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      libcuda.so*|libcudart.so*|libcublas*|libnccl*|libcudnn*) ;;
      *) [[ -e $out/lib/$name ]] || cp -L "$path" "$out/lib/$name" ;;
    esac
  done
done
# UCX loads its transports at run time from a folder next to its library.
if [[ -d /usr/lib/x86_64-linux-gnu/ucx ]]; then
  mkdir -p "$out/lib/ucx"
  cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$out/lib/ucx/"
fi
strip --strip-unneeded "$out"/lib/*.so* "$out"/lib/ucx/*.so* 2>/dev/null || true
mkdir -p "$final"
tar -C "$out" -cf - build lib | xz -T0 -6 >"$final/bundle.tar.xz"
echo "gpu_bundle.sh: $(du -sh "$out" | cut -f1) packed into $final/bundle.tar.xz ($(du -h "$final/bundle.tar.xz" | cut -f1))"
