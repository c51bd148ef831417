#!/usr/bin/env bash
# Peak resident memory of a short `lockstep rl` run (2 steps) on a ~25M-parameter
# dense Qwen3 model made by `lockstep init`, for each [model] precision given and
# with and without a KL reference (algo.kl_coef = 0 and 0.01).
#
#   scripts/rl-peak-memory.sh build/release/lockstep [f32 bf16 fp8]
#
# Prints one line per run: precision, kl_coef, peak RSS in MB (GNU time -v).
set -euo pipefail
BIN=$(readlink -f "$1")
shift
precisions=("$@")
[ ${#precisions[@]} -gt 0 ] || precisions=(f32)
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (Debian package: time)"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat > "$T/model.toml" <<'TOML'
[model]
architecture = "Qwen3ForCausalLM"
vocab_size = 272
hidden_size = 512
num_layers = 8
num_heads = 8
num_kv_heads = 4
head_dim = 64
intermediate_size = 1536
qk_norm = true
max_position_embeddings = 256
init_seed = 5
init_std = 0.02
TOML
"$BIN" init --config "$T/model.toml" --out "$T/model" --threads 2 > /dev/null
for a in 1 2 3 4 5 6 7 8; do
  printf '{"prompt": "%d+%d=", "label": "%d"}\n' "$a" $((a % 3)) $((a + a % 3))
done > "$T/train.jsonl"
for p in "${precisions[@]}"; do
  cat > "$T/rl.toml" <<TOML
[model]
path = "$T/model"
precision = "$p"
[data]
train_file = "$T/train.jsonl"
apply_chat_template = false
[rollout]
batch_size = 2
n = 4
max_new_tokens = 8
[train]
steps = 2
lr = 1e-4
micro_batch_tokens = 256
seed = 3
threads = 2
[reward]
type = "math"
[log]
progress = false
TOML
  for kl in 0 0.01; do
    rm -rf "$T/run"
    /usr/bin/time -v "$BIN" rl --config "$T/rl.toml" --out "$T/run" --set algo.kl_coef=$kl > "$T/log" 2> "$T/time" ||
      { cat "$T/log" "$T/time"; exit 1; }
    kb=$(awk -F': ' '/Maximum resident/ {print $2}' "$T/time")
    printf '%-5s kl_coef=%-5s peak RSS %6d MB\n' "$p" "$kl" $((kb / 1024))
  done
done
