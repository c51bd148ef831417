#!/usr/bin/env bash
# `lockstep rl` fails loudly and reads verl's data as it is:
#  1. a dataset with "answer" instead of "label" is refused by --check-config,
#     rl and eval, naming the file, the line and data.label_key (and sft's
#     step line counts step N/TOTAL);
#  2. a Python reward that starts returning the string "1.0" stops the run
#     with the reason; the metrics and checkpoints written before are kept,
#     the samples carry each failure's reason, the step line shows it;
#  3. verl rows (message-list prompt, reward_model.ground_truth, top-level
#     data_source and extra_info) run with a verl compute_score unchanged,
#     from JSONL and from a verl parquet file (written by hyparquet-writer:
#     tests/data/fixtures/verl_small.parquet).
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

"$BIN" demo --out "$T/d" --sft-steps 2 --rl-steps 0 --threads 2 > "$T/demo.log" 2>&1 || { cat "$T/demo.log"; exit 1; }
head -n 8 "$T/d/data/train.jsonl" > "$T/train.jsonl"
grep -q "^step 2/2 | loss .* | elapsed .*, left 0s" "$T/demo.log" || { cat "$T/demo.log"; exit 1; }  # sft's line
cat > "$T/base.toml" <<EOF
[model]
path = "$T/d/sft/checkpoints/latest"
precision = "f32"

[data]
train_file = "$T/train.jsonl"
apply_chat_template = false

[rollout]
batch_size = 2
n = 2
max_new_tokens = 4
kv_blocks = 256
block_size = 16

[train]
steps = 3
save_interval = 1
out_dir = "$T/run"
threads = 2

[reward]
type = "math"
EOF

# 1. "answer" instead of "label".
sed 's/"label"/"answer"/' "$T/train.jsonl" > "$T/answer.jsonl"
for mode in --check-config --config; do
  rc=0
  "$BIN" rl $mode "$T/base.toml" --set data.train_file="\"$T/answer.jsonl\"" > "$T/a.out" 2> "$T/a.err" || rc=$?
  [ "$rc" != 0 ] || { cat "$T/a.out" "$T/a.err"; echo "rl $mode accepted rows without a label"; exit 1; }
  grep -q "answer.jsonl:1: missing field 'label' (chosen by data.label_key; the math reward needs a label)" \
    "$T/a.err" || { cat "$T/a.err"; exit 1; }
done
test ! -e "$T/run"
rc=0
"$BIN" eval --model "$T/d/sft/checkpoints/latest" --data "$T/answer.jsonl" --n 1 > "$T/e.out" 2> "$T/e.err" || rc=$?
[ "$rc" != 0 ] || { cat "$T/e.out" "$T/e.err"; echo "eval accepted rows without a label"; exit 1; }
grep -q "answer.jsonl:1: missing field 'label' (chosen by data.label_key" "$T/e.err" || { cat "$T/e.err"; exit 1; }
"$BIN" rl --check-config "$T/base.toml" | grep -q ": OK (.*data: 8 rows in $T/train.jsonl"

# 2. A reward that returns a string from the second step on (4 samples a step).
cat > "$T/late.py" <<'PY'
import os
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    path = os.path.join(os.path.dirname(__file__), "calls")
    with open(path, "a") as f:
        f.write(".")
    return 1.0 if os.path.getsize(path) <= 4 else "1.0"
PY
rc=0
"$BIN" rl --config "$T/base.toml" --set reward.type='"python"' --set reward.path="\"$T/late.py\"" \
  --set reward.workers=1 --set reward.python="\"$PY\"" > "$T/late.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || { cat "$T/late.log"; echo "a run whose rewards all failed exited 0"; exit 1; }
grep -q "every reward failed (4 of 4).*the first failure: bad_return: compute_score (late.py:2) returned str" \
  "$T/late.log" || { cat "$T/late.log"; exit 1; }
grep -q "^step 1/3 | reward 1 | .*| elapsed .*, left " "$T/late.log" || { cat "$T/late.log"; exit 1; }
grep -q "^step 2/3 | reward - (4/4 failed) | " "$T/late.log" || { cat "$T/late.log"; exit 1; }
test -d "$T/run/checkpoints/step_1"
test ! -e "$T/run/checkpoints/step_2"
python3 - "$T/run" <<'PY'
import json, sys
run = sys.argv[1]
ms = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert [m["step"] for m in ms] == [1, 2], ms
assert ms[0]["rollout/reward_mean"] == 1.0 and ms[0]["rollout/reward_failures"] == 0, ms[0]
assert "rollout/reward_mean" not in ms[1] and ms[1]["rollout/reward_failures"] == 4, ms[1]
samples = [json.loads(l) for l in open(run + "/samples/step_000002.jsonl")]
assert len(samples) == 4, samples
for s in samples:
    assert s["reward"] is None and "label" in s, s
    assert s["reward_failure"].startswith("bad_return: compute_score (late.py:2) returned str"), s
ok = [json.loads(l) for l in open(run + "/samples/step_000001.jsonl")]
assert ok and all("reward_failure" not in s for s in ok), ok
PY

# 3. verl's layout with a verl compute_score that checks what it is given.
python3 - "$T/train.jsonl" "$T/verl.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as out:
    for i, line in enumerate(open(sys.argv[1])):
        row = json.loads(line)
        out.write(json.dumps({"data_source": "demo/add",
                              "prompt": [{"role": "user", "content": row["prompt"]}],
                              "ability": "math",
                              "reward_model": {"style": "rule", "ground_truth": row["label"]},
                              "extra_info": {"split": "train", "index": i}}) + "\n")
PY
cat > "$T/verl_score.py" <<'PY'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "demo/add", data_source
    assert extra_info["split"] == "train" and isinstance(extra_info["index"], int), extra_info
    assert isinstance(ground_truth, str) and ground_truth, ground_truth
    return 1.0 if ground_truth in solution_str else 0.0
PY
"$BIN" rl --config "$T/base.toml" --out "$T/verl" --set train.steps=2 --set data.train_file="\"$T/verl.jsonl\"" \
  --set data.label_key='"reward_model.ground_truth"' --set reward.type='"python"' \
  --set reward.path="\"$T/verl_score.py\"" --set reward.python="\"$PY\"" > "$T/verl.log" 2>&1 \
  || { cat "$T/verl.log"; exit 1; }
grep -q "^step 2/2 | reward " "$T/verl.log" || { cat "$T/verl.log"; exit 1; }
python3 - "$T/verl" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert [m["step"] for m in ms] == [1, 2], ms
for m in ms:
    assert m["rollout/reward_failures"] == 0 and "rollout/reward_mean" in m, m
PY

# The same from verl's parquet layout, with its own compute_score checks.
cat > "$T/verl_parquet_score.py" <<'PY'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "openai/gsm8k", data_source
    assert extra_info["split"] in ("train", "test") and isinstance(extra_info["index"], int), extra_info
    assert isinstance(ground_truth, str) and ground_truth, ground_truth
    return 1.0 if ground_truth in solution_str else 0.0
PY
"$BIN" rl --config "$T/base.toml" --out "$T/verl_parquet" --set train.steps=2 \
  --set data.train_file="\"$SRC/tests/data/fixtures/verl_small.parquet\"" --set data.apply_chat_template=true \
  --set data.label_key='"reward_model.ground_truth"' --set reward.type='"python"' \
  --set reward.path="\"$T/verl_parquet_score.py\"" --set reward.python="\"$PY\"" > "$T/verl_parquet.log" 2>&1 \
  || { cat "$T/verl_parquet.log"; exit 1; }
grep -q "^step 2/2 | reward " "$T/verl_parquet.log" || { cat "$T/verl_parquet.log"; exit 1; }
python3 - "$T/verl_parquet" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert [m["step"] for m in ms] == [1, 2], ms
for m in ms:
    assert m["rollout/reward_failures"] == 0 and "rollout/reward_mean" in m, m
PY
echo OK
