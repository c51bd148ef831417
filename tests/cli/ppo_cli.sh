#!/usr/bin/env bash
# PPO with a learned critic and GAE ([algo] advantage = "gae") from the command line:
#  1. the demo's task learned with a critic: the reward goes up over the RL
#     steps, the aligned gap is 0 at every step, the critic/ metrics are
#     written and every checkpoint holds a critic/ folder;
#  2. `lockstep rl` stopped after a checkpoint and resumed gives the policy
#     and the critic (body, value head and their optimizer) of an unbroken
#     run bit for bit;
#  3. the configuration errors name what they refuse.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" rl --check-config "$SRC/configs/recipes/qwen3-0.6b-math-ppo.toml" | grep -q ": OK"

ppo=(--set 'algo.advantage="gae"' --set critic.lr=1e-4)
"$BIN" demo --out "$T/a" --sft-steps 200 --rl-steps 8 --threads 2 --set eval.interval=0 --set eval.n=2 \
  --set rollout.batch_size=32 "${ppo[@]}" > "$T/a.log" 2>&1 || { cat "$T/a.log"; exit 1; }
python3 - "$T/a" <<'PY'
import json, math, sys
run = sys.argv[1]
m = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
steps = [x for x in m if "rollout/reward_mean" in x]
assert [x["step"] for x in steps] == list(range(1, 9)), [x["step"] for x in steps]
for x in steps:
    assert x["train/train_rollout_logprob_abs_diff_max"] == 0, x
    for k in ("critic/vf_loss", "critic/vpred_mean", "critic/vf_clipfrac", "critic/vf_explained_var",
              "critic/grad_norm", "critic/lr", "critic/values_mean", "critic/returns_mean"):
        assert k in x and math.isfinite(x[k]), (k, x)
r = [x["rollout/reward_mean"] for x in steps]
first, last = sum(r[:2]) / 2, sum(r[-2:]) / 2
assert last > first + 0.2, f"the reward did not go up with PPO and a critic: {r}"
PY
test -s "$T/a/checkpoints/step_8/critic/model.safetensors"
test -s "$T/a/checkpoints/step_8/critic/value_head.safetensors"
test -s "$T/a/checkpoints/step_8/critic/optimizer.bin"

# Resume: 2 steps, then --resume to 4, against 4 in one go.
short=(--set rollout.batch_size=8 --set eval.interval=0 --set train.save_interval=2)
"$BIN" rl --config "$T/a/config.toml" --out "$T/full" "${short[@]}" --set train.steps=4 > "$T/full.log" 2>&1 \
  || { cat "$T/full.log"; exit 1; }
"$BIN" rl --config "$T/a/config.toml" --out "$T/part" "${short[@]}" --set train.steps=2 > "$T/p1.log" 2>&1 \
  || { cat "$T/p1.log"; exit 1; }
"$BIN" rl --config "$T/a/config.toml" --out "$T/part" "${short[@]}" --set train.steps=4 --resume > "$T/p2.log" 2>&1 \
  || { cat "$T/p2.log"; exit 1; }
grep -q "resumed from" "$T/p2.log"
for f in model.safetensors critic/model.safetensors critic/value_head.safetensors critic/optimizer.bin \
  critic/value_head_optimizer.safetensors; do
  cmp "$T/full/checkpoints/step_4/$f" "$T/part/checkpoints/step_4/$f" || { echo "resumed $f differs"; exit 1; }
done

# What is refused, and why.
if "$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set critic.lr=1e-5 2> "$T/err1"; then
  echo "[critic] without advantage = gae was accepted"; exit 1
fi
grep -q 'advantage = "gae"' "$T/err1" || { cat "$T/err1"; exit 1; }
if "$BIN" rl --check-config "$SRC/configs/recipes/qwen3-0.6b-math-ppo.toml" --set critic.cliprange=0.2 2> "$T/err2"; then
  echo "an unknown [critic] key was accepted"; exit 1
fi
grep -q "cliprange" "$T/err2" || { cat "$T/err2"; exit 1; }
if "$BIN" rl --check-config "$SRC/configs/recipes/qwen3-0.6b-math-ppo.toml" --set algo.lam=1.5 2> "$T/err3"; then
  echo "lam = 1.5 was accepted"; exit 1
fi
grep -q "lam" "$T/err3" || { cat "$T/err3"; exit 1; }
echo ok
