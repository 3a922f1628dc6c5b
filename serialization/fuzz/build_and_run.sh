#!/usr/bin/env bash
# Builds the libFuzzer target (fuzz_decode.cpp) with clang and runs it over a
# generated seed corpus for a bounded time. Exits 77 (ctest: SKIPPED) when
# clang or libFuzzer is missing. Run by `ctest -R serialization.fuzz`, or by
# hand with the same arguments; FUZZ_SECONDS (default 20) bounds the run.
set -euo pipefail
extra_libs=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --source) source_dir=$2; shift 2 ;;
    --generated) generated_dir=$2; shift 2 ;;
    --tensor-lib) tensor_lib=$2; shift 2 ;;
    --extra-lib) extra_libs+=("$2"); shift 2 ;; # what the tensor library needs (CUDA runtime, cuBLAS)
    --seeds) seeds_tool=$2; shift 2 ;;
    --work) work_dir=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$seeds_tool" ]]; then
  echo "error: $seeds_tool is missing; build the serialization.fuzz_seeds target first" >&2
  exit 1
fi
cxx=${TROUPE_FUZZ_CXX:-clang++}
mkdir -p "$work_dir"
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx not found; the libFuzzer run needs clang"
  exit 77
fi
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$work_dir/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer "$work_dir/probe.cpp" -o "$work_dir/probe" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx cannot link -fsanitize=fuzzer (libFuzzer runtime missing)"
  exit 77
fi

ser="$source_dir/serialization"
sources=("$ser"/src/*.cpp "$generated_dir/troupe.capnp.c++" "$ser/fuzz/fuzz_decode.cpp")
target="$work_dir/fuzz_decode"
# Rebuild only when a source is newer than the binary (compiling is slow).
rebuild=1
if [[ -x "$target" ]]; then
  rebuild=0
  for f in "${sources[@]}" "$ser"/src/*.hpp "$ser"/include/troupe/serialization/*.hpp "$tensor_lib"; do
    [[ "$f" -nt "$target" ]] && rebuild=1
  done
fi
if [[ $rebuild == 1 ]]; then
  echo "building $target with $cxx (-fsanitize=fuzzer,address,undefined)"
  "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I "$ser/include" -I "$ser/src" -I "$source_dir/tensor/include" -I "$(dirname "$generated_dir")" \
    "${sources[@]}" "$tensor_lib" ${extra_libs[@]+"${extra_libs[@]}"} -lfmt -lcapnp -lkj -lisal -lopenblas -lpthread \
    -o "$target"
fi

corpus="$work_dir/corpus"
rm -rf "$corpus"
"$seeds_tool" "$corpus"
seconds=${FUZZ_SECONDS:-20}
cd "$work_dir"
"$target" -max_total_time="$seconds" -runs=2000000 -max_len=8192 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 "$corpus"
