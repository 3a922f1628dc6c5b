#!/usr/bin/env bash
# Builds the control-plane preamble libFuzzer target (fuzz_preamble.cpp)
# with clang and runs it over a seed corpus for a bounded time. Exits 77
# (ctest: SKIPPED) when clang or libFuzzer is missing. FUZZ_SECONDS
# (default 10) bounds the run.
#
#   actors/fuzz/build_and_run.sh SOURCE_DIR WORK_DIR
set -euo pipefail
source_dir=${1:?usage: build_and_run.sh SOURCE_DIR WORK_DIR}
work_dir=${2:?usage: build_and_run.sh SOURCE_DIR WORK_DIR}
cxx=${TROUPE_FUZZ_CXX:-clang++}
mkdir -p "$work_dir"
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx not found; the libFuzzer run needs clang"
  exit 77
fi
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$work_dir/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer "$work_dir/probe.cpp" -o "$work_dir/probe" >/dev/null 2>&1; then
  echo "SKIPPED: $cxx cannot link -fsanitize=fuzzer (libFuzzer runtime missing)"
  exit 77
fi
sources=("$source_dir/actors/src/control_plane_preamble.cpp" "$source_dir/actors/fuzz/fuzz_preamble.cpp")
target="$work_dir/fuzz_preamble"
rebuild=1
if [[ -x "$target" ]]; then
  rebuild=0
  for f in "${sources[@]}" "$source_dir/actors/src/control_plane_preamble.hpp"; do
    [[ "$f" -nt "$target" ]] && rebuild=1
  done
fi
if [[ $rebuild == 1 ]]; then
  echo "building $target with $cxx (-fsanitize=fuzzer,address,undefined)"
  "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I "$source_dir/actors/src" -I "$source_dir/tensor/include" "${sources[@]}" -lfmt -o "$target"
fi
# Seeds: the real preamble for the target's token, one with a wrong token,
# one cut short, one with a bad version, and BASP's first bytes.
corpus="$work_dir/corpus"
rm -rf "$corpus" && mkdir -p "$corpus"
python3 - "$corpus" <<'PY'
import struct, sys
d = sys.argv[1]
token = 0x0123456789abcdef
good = b"TROUPEcp" + struct.pack("<HHIQQ", 1, 0, 0, token, 0)
seeds = {"good": good, "wrong_token": good[:16] + struct.pack("<Q", token ^ 1) + good[24:],
         "short": good[:20], "version": good[:8] + b"\x02" + good[9:], "zero_token": good[:16] + bytes(16),
         "basp": bytes([1, 0, 0, 0, 0, 0, 0, 24]) + bytes(24)}
for name, data in seeds.items():
    open(f"{d}/{name}", "wb").write(data)
PY
cd "$work_dir"
"$target" -max_total_time="${FUZZ_SECONDS:-10}" -runs=5000000 -max_len=256 -timeout=10 -print_final_stats=1 "$corpus"
