#!/usr/bin/env bash
# troupe-checkpoint on a checkpoint that examples/sharded_checkpoint writes:
# inspect and verify succeed, consolidate writes one file, the safetensors
# export reads back in Python with the same values; bad arguments exit 2
# with a message; a corrupted shard makes verify exit 1 naming the piece.
#   checkpoint_tool.sh TROUPE_CHECKPOINT SHARDED_CHECKPOINT_EXAMPLE READ_SAFETENSORS_PY
set -uo pipefail
tool=$1 example=$2 reader=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$example" --dir="$dir/ckpt" >"$dir/example.out" || fail "the example failed: $(cat "$dir/example.out")"
step=$dir/ckpt/step-100

out=$("$tool" inspect "$dir/ckpt" 2>&1) || fail "inspect exited $?: $out"
for text in "step 100, 3 tensors in 6 pieces" "fc1.weight  float32  [6, 5]  2 pieces" \
            "fc2.weight  float64  [4, 9]  3 pieces" "optimizer.steps  int64  [5]  1 piece" \
            "offset [0, 3] shape [4, 3]  rank-1.shard" 'data_position: "batch 1600"'; do
  grep -qF -- "$text" <<<"$out" || fail "inspect does not show '$text': $out"
done
echo "ok: inspect"

out=$("$tool" verify "$step" 2>&1) || fail "verify of an intact checkpoint exited $?: $out"
grep -qF "6 pieces of 3 tensors checked, 0 bad" <<<"$out" || fail "verify: $out"
echo "ok: verify"

out=$("$tool" consolidate "$dir/ckpt" "$dir/whole.ckpt" 2>&1) || fail "consolidate exited $?: $out"
[[ -s $dir/whole.ckpt ]] || fail "consolidate wrote no file"
echo "ok: consolidate"

out=$("$tool" export --safetensors "$dir/ckpt" "$dir/model.safetensors" 2>&1) || fail "export exited $?: $out"
/usr/bin/python3 "$reader" "$dir/model.safetensors" fc1.weight:F32:6x5 fc2.weight:F64:4x9 optimizer.steps:I64:5 \
  step=100 "data_position=batch 1600" || fail "Python read back different values"
echo "ok: export --safetensors"

expect_usage_error() {
  local pattern=$1; shift
  local output rc
  output=$("$tool" "$@" 2>&1); rc=$?
  [[ $rc -eq 2 ]] && grep -qF -- "$pattern" <<<"$output" ||
    fail "troupe-checkpoint $*: expected exit 2 and '$pattern', got exit $rc: $output"
  echo "ok: $* -> exit 2: $(head -1 <<<"$output")"
}
expect_usage_error "no command"
expect_usage_error "unknown command 'frob'" frob "$step"
expect_usage_error "inspect takes DIR but got 0" inspect
expect_usage_error "verify takes DIR but got 2" verify "$step" "$step"
expect_usage_error "consolidate takes DIR OUT but got 1" consolidate "$step"
expect_usage_error "export needs a format: --safetensors" export "$step" "$dir/x"
expect_usage_error "unknown option '--fast'" verify --fast "$step"
[[ -e $dir/x ]] && fail "an output was written despite a usage error"

out=$("$tool" inspect "$dir/nothing-here" 2>&1); rc=$?
[[ $rc -eq 1 ]] && grep -qF "holds no manifest and no complete checkpoint" <<<"$out" ||
  fail "inspect of a missing directory: exit $rc: $out"

# Flip one byte inside fc2.weight's piece in rank-1.shard.
offset=$(grep -F "offset [0, 3] shape [4, 3]" <<<"$("$tool" inspect "$step")" | sed -E 's/.*bytes \[([0-9]+),.*/\1/')
printf '\x55' | dd of="$step/rank-1.shard" bs=1 seek=$((offset + 5)) conv=notrunc status=none
verified=$("$tool" verify "$step" 2>&1); rc=$?
out=$verified
[[ $rc -eq 1 ]] || fail "verify of a corrupted checkpoint exited $rc: $out"
grep -qF "tensor 'fc2.weight' piece 1 (offset [0, 3], shape [4, 3]) in file 'rank-1.shard'" <<<"$out" ||
  fail "verify does not name the bad piece: $out"
grep -qF "1 bad" <<<"$out" || fail "verify: $out"
out=$("$tool" consolidate "$step" "$dir/bad.ckpt" 2>&1); rc=$?
[[ $rc -eq 1 && ! -e $dir/bad.ckpt ]] || fail "consolidate of a corrupted checkpoint: exit $rc: $out"
echo "ok: corruption -> verify exit 1: $(grep bad: <<<"$verified" | head -1)"
echo "OK: troupe-checkpoint"
