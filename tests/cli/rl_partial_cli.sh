#!/usr/bin/env bash
# Partial rollouts from the command line: the [rollout] keys reach the loop
# through `lockstep demo --set`, samples finish across steps with each token's
# weight version in samples/*.jsonl and a zero gap over every token (the
# older ones at their own version), and the keys' errors name the key.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

if "$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set rollout.partial_token_budget=100 2> "$T/err"; then
  echo "partial_token_budget without partial = true was accepted"; exit 1
fi
grep -q "partial_token_budget" "$T/err" || { cat "$T/err"; exit 1; }
if "$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set rollout.partial=true \
    --set algo.dynamic_sampling=true 2> "$T/err"; then
  echo "partial with dynamic_sampling was accepted"; exit 1
fi
grep -q "dynamic_sampling" "$T/err" || { cat "$T/err"; exit 1; }
"$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set rollout.partial=true \
  --set rollout.partial_token_budget=512 | grep -q ": OK"
"$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set rollout.partial=true \
  --set rollout.partial_gap='"current"' | grep -q ": OK"
if "$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set rollout.partial=true \
    --set rollout.partial_gap='"older"' 2> "$T/err"; then
  echo "partial_gap = \"older\" was accepted"; exit 1
fi
grep -q "partial_gap" "$T/err" || { cat "$T/err"; exit 1; }

# 8 prompts x 8 samples of up to 16 tokens on a budget of 512: a share of 8
# tokens, so the responses longer than 8 tokens finish in a later step.
"$BIN" demo --out "$T/run" --sft-steps 40 --rl-steps 4 --threads 2 --set eval.interval=0 \
  --set rollout.batch_size=8 --set eval.n=2 --set rollout.partial=true \
  --set rollout.partial_token_budget=512 --set algo.rollout_is='"token"' > "$T/log" 2>&1 || { cat "$T/log"; exit 1; }
python3 - "$T/run" <<'PY'
import glob, json, sys
run = sys.argv[1]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
steps = [m for m in lines if m["step"] > 0]
assert len(steps) == 4, [m["step"] for m in lines]
assert sum(m["rollout/partial_paused"] for m in steps) > 0, "nothing was paused"
assert sum(m["rollout/partial_resumed_tokens"] for m in steps) > 0, "nothing resumed"
trained = [m for m in steps if "train/pg_loss" in m]
assert trained, "no step trained"
for m in trained:
    # partial_gap = "all" (the default): every token, older ones at their own version.
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, m
    assert m["train/partial_gap_left_out_tokens"] == 0, m
    assert m["train/partial_gap_rescored_abs_diff_max"] == 0, m
    assert "train/partial_gap_rescored_tokens" in m, m
seen = 0
for f in glob.glob(f"{run}/samples/*.jsonl"):
    for l in open(f):
        s = json.loads(l)
        assert len(s["versions"]) == s["response_len"], s
        seen += 1
assert seen > 0, "no samples written"
PY
# The resolved config keeps the keys, and reads back.
grep -q "partial_token_budget = 512" "$T/run/config.toml"
grep -q "partial_gap = 'all'" "$T/run/config.toml"
"$BIN" rl --check-config "$T/run/config.toml" | grep -q ": OK"
