#!/usr/bin/env bash
# Runs the demo twice with the same seed and checks that every loss and the
# sample agree (samples/s may differ), and that the loss falls.
set -euo pipefail
demo=$1
run() { "$demo" --steps=60 --seed=3 | sed -E 's/samples\/s [0-9.]+//'; }
first=$(run)
second=$(run)
if [[ "$first" != "$second" ]]; then
  echo "char_lm is not deterministic:"; diff <(echo "$first") <(echo "$second") || true; exit 1
fi
losses=($(echo "$first" | grep -oE '^step +[0-9]+ +loss [0-9.]+' | awk '{print $4}'))
echo "$first"
awk -v a="${losses[0]}" -v b="${losses[-1]}" 'BEGIN { exit !(b < a - 0.5) }' || {
  echo "loss did not fall: ${losses[0]} -> ${losses[-1]}"; exit 1; }
