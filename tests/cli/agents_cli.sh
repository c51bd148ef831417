#!/usr/bin/env bash
# Multi-turn RL through `lockstep rl` (docs/agents.md): a tiny model from a
# short `lockstep demo`, a Python environment that answers every turn twice
# and then rewards the episode by its last turn's length, and the bundled
# calculator example's config. Checks: three turns per episode, no env
# failures, a gap of exactly 0 on the model's tokens at every step, the
# samples' turns; an environment that raises fails its samples, counted.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" rl --check-config "$SRC/configs/examples/tool-math.toml" | grep -q ": OK"
"$BIN" demo --out "$T/d" --sft-steps 2 --rl-steps 0 --threads 2 > "$T/demo.log" 2>&1 || { cat "$T/demo.log"; exit 1; }

cat > "$T/env.py" <<'PY'
class Env:
    def __init__(self):
        self.turn = 0

    def reset(self, sample):
        return [{"role": "user", "content": sample["prompt"]}]

    def step(self, messages, completion):
        self.turn += 1
        if self.turn < 3:
            return {"observation": f"tool result {self.turn}", "reward": None, "done": False}
        return {"observation": None, "reward": float(len(completion) % 3), "done": True}
PY
sed -e '/^\[eval\]/,/^$/d' -e 's|^eval_file.*||' \
    -e "s|\"../../runs/demo/sft/checkpoints/latest\"|\"$T/d/sft/checkpoints/latest\"|" \
    -e "s|\"../../runs/demo/data/train.jsonl\"|\"$T/d/data/train.jsonl\"|" \
    -e "s|\"../../runs/demo-rl\"|\"$T/rl\"|" -e 's|^steps = 50|steps = 2|' -e 's|^batch_size = 64|batch_size = 4|' \
    -e 's|^n = 8 .*|n = 4|' -e 's|^max_new_tokens = 16|max_new_tokens = 6|' \
    -e 's|^\[rollout\]|[rollout]\nenv = "python"\nenv_path = "env.py"\nenv_workers = 2\nmax_turns = 5\nmax_total_tokens = 200|' \
    "$SRC/configs/demo/rl.toml" > "$T/rl.toml"
"$BIN" rl --config "$T/rl.toml" > "$T/rl.log" 2>&1 || { cat "$T/rl.log"; exit 1; }
python3 - "$T/rl" <<'PY'
import json, sys
run = sys.argv[1]
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
steps = [m for m in lines if m["step"] >= 1]
assert len(steps) == 2, lines
for m in steps:
    assert m["rollout/turns_mean"] == 3.0, m
    assert m["rollout/env_failures"] == 0, m
    assert m["train/train_rollout_logprob_abs_diff"] == 0.0, m
    assert m["train/train_rollout_logprob_bitwise_equal_frac"] == 1.0, m
    assert m["rollout/env_time_s"] >= 0.0, m
samples = [json.loads(l) for l in open(run + "/samples/step_000002.jsonl")]
assert samples and all(s["turns"] == 3 for s in samples), samples
assert "tool result 1" in samples[0]["response"], samples[0]
PY

# A step that raises fails its samples: counted, not scored.
sed -i 's|        self.turn += 1|        self.turn += 1\n        if self.turn == 2:\n            raise RuntimeError("tool down")|' "$T/env.py"
sed -i "s|^out_dir = .*|out_dir = \"$T/rl-fail\"|" "$T/rl.toml"
"$BIN" rl --config "$T/rl.toml" > "$T/fail.log" 2>&1 || { cat "$T/fail.log"; exit 1; }
python3 - "$T/rl-fail" <<'PY'
import json, sys
run = sys.argv[1]
steps = [json.loads(l) for l in open(run + "/metrics.jsonl")]
steps = [m for m in steps if m["step"] >= 1]
for m in steps:
    assert m["rollout/env_failures"] == 16, m
    assert m["rollout/reward_failures"] == 0, m
samples = [json.loads(l) for l in open(run + "/samples/step_000002.jsonl")]
assert all("RuntimeError: tool down" in s["env_error"] and s["reward"] is None for s in samples), samples
PY
echo "agents_cli: OK"
