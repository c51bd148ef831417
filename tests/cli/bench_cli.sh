#!/usr/bin/env bash
# `lockstep bench` end to end at a tiny size: with no benchmark name it runs
# train, rollout and rl and ends with the table of every ratio (training and
# prefill over the FMA peak, decode over its roofline at each batch, GRPO with
# prefix sharing over without); `bench rl` accounts for the memory each
# configuration holds (the KL reference, the rollout's own copies in fast mode
# and one step ahead, the KV cache, LoRA's adapter-only state); bad flags and an unknown name are
# refused, naming them. Speed itself is not checked (tests never assert on
# wall-clock time).
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" bench --config "$SRC/configs/bench/moe-tiny.toml" --steps 1 --seqs 2 --seq-len 32 --batches 1,4 \
  --new-tokens 4 --prefill-prompts 2 --prefill-len 16 --grpo-prompts 2 --grpo-samples 2 --grpo-prompt-len 8 \
  --prompts 2 --samples 2 --prompt-len 8 > "$T/out.txt" 2>&1 || { cat "$T/out.txt"; fail "lockstep bench"; }
grep -q "Every ratio above" "$T/out.txt" || { cat "$T/out.txt"; fail "no ratio table"; }
table=$(sed -n '/Every ratio above/,$p' "$T/out.txt")
for row in "training FLOP/s / FMA peak" "decode batch 1 / roofline" "decode batch 4 / roofline" \
           "prefill FLOP/s / FMA peak" "GRPO prefix sharing / none"; do
  echo "$table" | grep "moe-tiny" | grep -q "$row" || { echo "$table"; fail "ratio table lacks '$row'"; }
done
# Every value is a number followed by % or x.
n=$(echo "$table" | grep "moe-tiny" | grep -cE '[0-9.]+(%|x)$')
[ "$n" -eq 5 ] || { echo "$table"; fail "expected 5 ratio values, found $n"; }

# The RL memory table's row of moe-tiny: fields 10-13 are the reference, the
# rollout's master and packed copies and the KV cache, in bytes per parameter.
rl_memory_row() { awk '/rollout master/ { getline; getline; print; exit }' "$1"; }
field() { echo "$1" | awk -v f="$2" '{ print $f }'; }
positive() { awk -v x="$1" 'BEGIN { exit !(x > 0) }'; }
row=$(rl_memory_row "$T/out.txt")
echo "$row" | grep -q "^moe-tiny" || { cat "$T/out.txt"; fail "bench prints no RL memory row"; }
positive "$(field "$row" 13)" || fail "the aligned RL step has no KV cache: $row"
# After train and rollout in the same process, the RL step still measures a peak.
positive "$(field "$row" 3)" || fail "the RL step after the other benchmarks measured no peak: $row"
for f in 10 11 12; do
  [ "$(field "$row" $f)" = "0.00" ] || fail "aligned, no KL: field $f should be 0.00: $row"
done

# Fast mode, one step ahead, with a KL reference: each holds its own weights.
"$BIN" bench rl --config "$SRC/configs/bench/moe-tiny.toml" --steps 1 --prompts 2 --samples 2 --prompt-len 8 \
  --new-tokens 4 --precision bf16 --trainer-precision f32 --staleness 1 --rollout-threads 1 --kl-coef 0.01 \
  > "$T/rl.txt" 2>&1 || { cat "$T/rl.txt"; fail "lockstep bench rl"; }
grep -q "bf16/f32 *1 " "$T/rl.txt" || { cat "$T/rl.txt"; fail "the RL row does not name fast mode and staleness 1"; }
row=$(rl_memory_row "$T/rl.txt")
for f in 10 11 12 13; do
  positive "$(field "$row" $f)" || { cat "$T/rl.txt"; fail "fast mode, staleness 1, KL: field $f should be > 0: $row"; }
done
# --lora-rank 0,4: full fine-tuning and LoRA on the same model in one run; the LoRA
# row's gradients and moments are the adapters' only (fields 10 and 11: the name
# "moe-tiny lora r4" takes three), the full row's 4 and 8 bytes per parameter.
"$BIN" bench rl --config "$SRC/configs/bench/moe-tiny.toml" --steps 1 --prompts 2 --samples 2 --prompt-len 8 \
  --new-tokens 4 --lora-rank 0,4 > "$T/lora.txt" 2>&1 || { cat "$T/lora.txt"; fail "lockstep bench rl --lora-rank"; }
full=$(sed -n '/rollout master/,$p' "$T/lora.txt" | grep -E '^ *moe-tiny +[0-9]')
lora=$(sed -n '/rollout master/,$p' "$T/lora.txt" | grep -E '^ *moe-tiny lora r4 ')
[ "$(field "$full" 8)" = "4.00" ] && [ "$(field "$full" 9)" = "8.00" ] || { cat "$T/lora.txt"; fail "full row: $full"; }
awk -v g="$(field "$lora" 10)" -v m="$(field "$lora" 11)" 'BEGIN { exit !(g > 0 && g < 0.5 && m > 0 && m < 1) }' \
  || { cat "$T/lora.txt"; fail "LoRA row: gradients and moments should be the adapters' only: $lora"; }
grep -qE '^ *moe-tiny lora r4 +f32 ' "$T/lora.txt" || { cat "$T/lora.txt"; fail "no LoRA row in the step table"; }
if "$BIN" bench rl --lora-rank 4,-1 > "$T/bad.txt" 2>&1; then fail "--lora-rank -1 was accepted"; fi
grep -q "flag --lora-rank" "$T/bad.txt" || { cat "$T/bad.txt"; fail "the refusal does not name --lora-rank"; }
# --steps 0 --recompute: the warm-up step alone, memory only (the step table shows no
# times), with the trainer's activation recompute.
"$BIN" bench rl --config "$SRC/configs/bench/moe-tiny.toml" --steps 0 --recompute --prompts 1 --samples 2 \
  --prompt-len 40 --new-tokens 2 > "$T/mem.txt" 2>&1 || { cat "$T/mem.txt"; fail "lockstep bench rl --steps 0"; }
grep -qE '^ *moe-tiny +f32 +0 +2 +1 x 2 +- +- ' "$T/mem.txt" || { cat "$T/mem.txt"; fail "--steps 0 should time nothing"; }
positive "$(field "$(rl_memory_row "$T/mem.txt")" 3)" || { cat "$T/mem.txt"; fail "--steps 0 reports no peak"; }
"$BIN" bench train --config "$SRC/configs/bench/moe-tiny.toml" --steps 0 --seq-len 16 --seqs 1 > "$T/tmem.txt" 2>&1 \
  || { cat "$T/tmem.txt"; fail "lockstep bench train --steps 0"; }
grep -qE '^ *moe-tiny +2 +16 +16 +- +- ' "$T/tmem.txt" || { cat "$T/tmem.txt"; fail "train --steps 0 should time nothing"; }
if "$BIN" bench all --steps 0 > "$T/bad.txt" 2>&1; then fail "bench all --steps 0 was accepted"; fi
grep -q "memory only" "$T/bad.txt" || { cat "$T/bad.txt"; fail "bench all --steps 0: no reason given"; }
if "$BIN" bench rl --steps -1 > "$T/bad.txt" 2>&1; then fail "--steps -1 was accepted"; fi
grep -q "flag --steps" "$T/bad.txt" || { cat "$T/bad.txt"; fail "the refusal does not name --steps"; }
if "$BIN" bench rl --staleness 2 > "$T/bad.txt" 2>&1; then fail "--staleness 2 was accepted"; fi
grep -q "flag --staleness" "$T/bad.txt" || { cat "$T/bad.txt"; fail "the refusal does not name --staleness"; }

# --bf16-kv is a switch, as the help shows it (it once demanded a value).
"$BIN" bench rollout --config "$SRC/configs/bench/moe-tiny.toml" --batches 2 --new-tokens 4 --prefill-prompts 1 \
  --prefill-len 8 --grpo-prompts 1 --grpo-samples 2 --grpo-prompt-len 8 --precision bf16 --bf16-kv \
  > "$T/kv.txt" 2>&1 || { cat "$T/kv.txt"; fail "bench rollout --bf16-kv"; }
grep -qE "^ *moe-tiny +bf16 +[0-9]+ +2 " "$T/kv.txt" || { cat "$T/kv.txt"; fail "no bf16 decode row at batch 2"; }

if "$BIN" bench sprint > "$T/bad.txt" 2>&1; then fail "an unknown benchmark was accepted"; fi
grep -q "unknown benchmark 'sprint'" "$T/bad.txt" || { cat "$T/bad.txt"; fail "the refusal does not name it"; }
echo PASS
