#!/usr/bin/env bash
# `lockstep bench` end to end at a tiny size: with no benchmark name it runs
# train and rollout and ends with the table of every ratio (training and
# prefill over the FMA peak, decode over its roofline at each batch, GRPO with
# prefix sharing over without); an unknown name is refused, naming it. Speed
# itself is not checked (tests never assert on wall-clock time).
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" bench --config "$SRC/configs/bench/moe-tiny.toml" --steps 1 --seqs 2 --seq-len 32 --batches 1,4 \
  --new-tokens 4 --prefill-prompts 2 --prefill-len 16 --grpo-prompts 2 --grpo-samples 2 --grpo-prompt-len 8 \
  > "$T/out.txt" 2>&1 || { cat "$T/out.txt"; fail "lockstep bench"; }
grep -q "Every ratio above" "$T/out.txt" || { cat "$T/out.txt"; fail "no ratio table"; }
table=$(sed -n '/Every ratio above/,$p' "$T/out.txt")
for row in "training FLOP/s / FMA peak" "decode batch 1 / roofline" "decode batch 4 / roofline" \
           "prefill FLOP/s / FMA peak" "GRPO prefix sharing / none"; do
  echo "$table" | grep "moe-tiny" | grep -q "$row" || { echo "$table"; fail "ratio table lacks '$row'"; }
done
# Every value is a number followed by % or x.
n=$(echo "$table" | grep "moe-tiny" | grep -cE '[0-9.]+(%|x)$')
[ "$n" -eq 5 ] || { echo "$table"; fail "expected 5 ratio values, found $n"; }

if "$BIN" bench sprint > "$T/bad.txt" 2>&1; then fail "an unknown benchmark was accepted"; fi
grep -q "unknown benchmark 'sprint'" "$T/bad.txt" || { cat "$T/bad.txt"; fail "the refusal does not name it"; }
echo PASS
