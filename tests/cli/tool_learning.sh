#!/usr/bin/env bash
# The bundled calculator example (configs/examples/tool-math.toml with
# tool_math_env.py) learns to use its tool. The task, two-digit
# multiplication, is beyond a tiny model in one turn; with the tool it is two
# copies: the question into <calc>...</calc>, then the tool's <result> into
# the answer.
#  1. A tiny MoE model (lockstep init, byte-level tokenizer, ChatML) is warmed
#     up with `lockstep sft` on teacher conversations in which the teacher
#     calls the tool on only TOOL_RATE of the problems and answers the others
#     at once (right, but not learnable).
#  2. `lockstep rl` runs the example config unchanged but for the model size
#     knobs, on problems disjoint from the SFT ones: GRPO on the environment's
#     reward.
#  3. Checks, on the RL steps' metrics: the gap is exactly 0 on the model's
#     tokens at every step; the tool-use rate (turns_mean - 1) and the reward
#     both rise from the first steps to the last by a clear margin; direct
#     answers stay wrong (the tool is what made the difference).
# usage: tool_learning.sh LOCKSTEP_BINARY SOURCE_DIR [OUT_DIR]
# With OUT_DIR the run directories are kept there (for the figures in
# docs/agents.md); otherwise a temporary directory is used and removed.
set -euo pipefail
BIN=$1
SRC=$2
if [ $# -ge 3 ]; then
  T=$3
  mkdir -p "$T"
else
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
fi
SFT_STEPS=${SFT_STEPS:-300}
RL_STEPS=${RL_STEPS:-16}
TOOL_RATE=${TOOL_RATE:-0.3}
RL_LR=${RL_LR:-3e-4}

cat > "$T/model.toml" <<'TOML'
[model]
architecture = "Qwen3MoeForCausalLM"
vocab_size = 272
hidden_size = 96
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 24
qk_norm = true
max_position_embeddings = 160
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 96
norm_topk_prob = true
TOML
"$BIN" init --config "$T/model.toml" --out "$T/model" --seed 3 > "$T/init.log"

# Problems a*b with a, b in [10, 100): 1200 for SFT, 600 others for RL, 64
# others held out for the eval.
python3 - "$T" "$TOOL_RATE" <<'PY'
import json, random, sys
t, tool_rate = sys.argv[1], float(sys.argv[2])
rng = random.Random(11)
pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100)], 1864)
def user(a, b):
    return {"role": "user", "content": f"{a}*{b}"}
with open(f"{t}/sft.jsonl", "w") as f:
    for a, b in pairs[:1200]:
        call = {"role": "assistant", "content": f"<calc>{a}*{b}</calc>"}
        result = {"role": "user", "content": f"<result>{a * b}</result>"}
        answer = {"role": "assistant", "content": str(a * b)}
        if rng.random() < tool_rate:
            f.write(json.dumps({"messages": [user(a, b), call]}) + "\n")
        else:
            f.write(json.dumps({"messages": [user(a, b), answer]}) + "\n")
        # The second turn after a call is always shown: copy the result.
        f.write(json.dumps({"messages": [user(a, b), call, result, answer]}) + "\n")
for name, part in (("rl", pairs[1200:1800]), ("eval", pairs[1800:])):
    with open(f"{t}/{name}.jsonl", "w") as f:
        for a, b in part:
            f.write(json.dumps({"prompt": f"{a}*{b}", "label": str(a * b),
                                "metadata": {"question": f"{a}*{b}", "system": ""}}) + "\n")
PY

cat > "$T/sft.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/sft.jsonl"

[train]
steps = $SFT_STEPS
batch_size = 32
lr = 3e-3
warmup_steps = 20
min_lr = 3e-4
weight_decay = 0.01
seed = 1
save_interval = $SFT_STEPS
keep_last = 1
TOML
"$BIN" sft --config "$T/sft.toml" --out "$T/sft" > "$T/sft.log" 2>&1 || { cat "$T/sft.log"; exit 1; }

"$BIN" rl --config "$SRC/configs/examples/tool-math.toml" \
  --set model.path="\"$T/sft/checkpoints/latest\"" --set data.train_file="\"$T/rl.jsonl\"" --set data.eval_file="\"$T/eval.jsonl\"" \
  --set eval.n=4 --set eval.max_new_tokens=20 --set eval.interval=0 \
  --set train.out_dir="\"$T/rl\"" --set train.steps=$RL_STEPS --set train.lr=$RL_LR --set train.warmup_steps=2 \
  --set train.save_interval=$RL_STEPS --set rollout.batch_size=16 --set rollout.max_new_tokens=20 \
  --set rollout.max_total_tokens=120 --set rollout.kv_blocks=2048 --set rollout.env_workers=2 \
  --set data.max_prompt_len=64 --set log.samples_interval=1 --set log.samples_per_step=128 \
  > "$T/rl.log" 2>&1 || { cat "$T/rl.log"; exit 1; }

python3 - "$T/rl" <<'PY'
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
steps = [m for m in rows if m["step"] >= 1 and "rollout/turns_mean" in m]
# Held-out: 64 problems x 4 episodes before RL (step 0) and after.
evals = [m for m in rows if "eval/test/pass@1" in m]
assert len(evals) == 2 and evals[0]["step"] == 0 and evals[1]["step"] == steps[-1]["step"], evals
before, after = evals
print(f"tool_learning: held-out pass@1 {before['eval/test/pass@1']:.3f} -> {after['eval/test/pass@1']:.3f}, "
      f"turns {before['eval/test/turns_mean']:.3f} -> {after['eval/test/turns_mean']:.3f}")
assert after["eval/test/pass@1"] >= before["eval/test/pass@1"] + 0.3, (before, after)
assert after["eval/test/turns_mean"] >= before["eval/test/turns_mean"] + 0.25, (before, after)
assert after["eval/test/reward_failures"] == 0, after
assert len(steps) >= 8, steps
for m in steps:
    assert m["train/train_rollout_logprob_abs_diff"] == 0.0, m
    assert m["train/train_rollout_logprob_bitwise_equal_frac"] == 1.0, m
    assert m["rollout/env_failures"] == 0, m
k = 3
def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)
first, last = steps[:k], steps[-k:]
tool_first, tool_last = mean(first, "rollout/turns_mean") - 1, mean(last, "rollout/turns_mean") - 1
reward_first, reward_last = mean(first, "rollout/reward_mean"), mean(last, "rollout/reward_mean")
print(f"tool_learning: tool-call rate {tool_first:.3f} -> {tool_last:.3f}, "
      f"reward {reward_first:.3f} -> {reward_last:.3f} over {len(steps)} RL steps (first/last {k})")
assert tool_last >= tool_first + 0.2, (tool_first, tool_last)
assert reward_last >= reward_first + 0.2, (reward_first, reward_last)
# Direct answers (one turn, no call) are almost never right: the reward
# comes from the tool.
import glob
samples = [json.loads(l) for f in sorted(glob.glob(f"{run}/samples/step_*.jsonl")) for l in open(f)]
direct = [s for s in samples if s["turns"] == 1]
direct_right = sum(1 for s in direct if (s["reward"] or 0) > 0.5)
print(f"tool_learning: {len(samples)} episodes, {len(direct)} answered in one turn, {direct_right} of them right")
assert len(samples) == 128 * len(steps), len(samples)
assert direct and direct_right <= 0.05 * len(direct), (direct_right, len(direct))
PY
echo "tool_learning: OK"
