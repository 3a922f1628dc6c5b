#!/usr/bin/env bash
# Installs troupe from BUILD_DIR into a temporary prefix, configures and
# builds examples/consumer against it, and runs the consumer.
#   check_install.sh BUILD_DIR
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/lib/cmake/troupe/troupeConfig.cmake" || { echo "FAIL: no package config installed"; exit 1; }
test -x "$work/prefix/bin/troupe-launch" || { echo "FAIL: troupe-launch not installed"; exit 1; }
cmake -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
      -DCMAKE_CXX_COMPILER="$(grep '^CMAKE_CXX_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)" > "$work/configure.log" ||
  { cat "$work/configure.log"; echo "FAIL: the consumer does not configure against the install"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; echo "FAIL: the consumer does not build against the install"; exit 1; }
# The consumer must not have picked anything from the source or build tree.
if grep -q -- "-I$(cd "$here/../.." && pwd)" "$work/consumer/build.ninja"; then
  echo "FAIL: the consumer's build uses troupe's source tree"; exit 1
fi
"$work/consumer/consumer" --rows=16
echo "OK: installed, the consumer configured, built and ran against $work/prefix"
