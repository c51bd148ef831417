# Sourced by the `lockstep rl` MPI tests (rl_mpi_test.sh, rl_stale_test.sh):
# a tiny MoE model (MODEL_ARCH=v4: the micro DeepSeek-V4 of
# tests/common/v4_micro_model.toml) made with `lockstep init` in $T/model, prompts in
# $T/train.jsonl and $T/test.jsonl, and $T/rl.toml (3 steps of 4 prompts x 8
# samples, GRPO with 2 updates per batch, eval every 2 steps). Needs T and BIN.
if [ "${MODEL_ARCH:-moe}" = v4 ]; then
  cp "$(dirname "${BASH_SOURCE[0]}")/../common/v4_micro_model.toml" "$T/model.toml"
else
cat > "$T/model.toml" <<'TOML'
[model]
precision = "f32"
architecture = "Qwen3MoeForCausalLM"
vocab_size = 272
hidden_size = 32
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 8
qk_norm = true
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 32
norm_topk_prob = true
max_position_embeddings = 256
init_seed = 5
init_std = 0.5
TOML
fi
"$BIN" init --config "$T/model.toml" --out "$T/model" --threads 1 > "$T/init.log" 2>&1 || { cat "$T/init.log"; exit 1; }
# Any single digit is a correct answer: a random model finds one now and then,
# so the groups' rewards differ and the policy gradient is not zero.
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/train.jsonl", "w") as f:
    for a in range(1, 9):
        f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
with open(f"{t}/test.jsonl", "w") as f:
    for a in range(1, 4):
        f.write(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n")
PY
cat > "$T/rl.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/train.jsonl"
eval_file = "$T/test.jsonl"
apply_chat_template = false

[rollout]
batch_size = 4
n = 8
temperature = 1.0
max_new_tokens = 8

[train]
steps = 3
lr = 1e-3
micro_batch_tokens = 64
seed = 3

[algo]
advantage = "grpo"
loss_agg = "token-mean"
num_steps_per_rollout = 2

[reward]
type = "math"
extractors = ["last_number"]
format_reward = 0.5

[eval]
name = "test"
n = 2
max_new_tokens = 8
interval = 2

[log]
progress = false

[dist]
timeout_s = 60
TOML
