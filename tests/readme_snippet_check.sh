#!/usr/bin/env bash
# The README's C++ program is a copy of a compiled example's main(): this
# check fails when the two differ, so the README's code cannot rot.
#   readme_snippet_check.sh README.md examples/data_parallel_demo.cpp
set -euo pipefail
readme=$1 example=$2
snippet=$(awk '/^```cpp$/ {inside = 1; next} /^```$/ {if (inside) exit} inside' "$readme")
compiled=$(sed -n '/^int main/,/^}/p' "$example")
if [[ -z $snippet ]]; then
  echo "FAIL: $readme has no \`\`\`cpp block"
  exit 1
fi
if [[ $snippet != "$compiled" ]]; then
  echo "FAIL: the README's program differs from main() in $example:"
  diff <(echo "$snippet") <(echo "$compiled") || true
  exit 1
fi
echo "OK: the README's program is main() of $example"
