#!/usr/bin/env bash
# `lockstep sft`, `rl`, `eval` and `serve` on the GPU kernel sources (strict
# interpret mode: the host cannot touch device memory) give the CPU's bits:
#  1. sft with [model] device = "interpret" writes checkpoint files
#     byte-identical to the CPU run's, for a dense and a MoE model, and for
#     the dense model with [lora] adapters;
#  2. rl (GRPO, 2 steps, a checkpoint each step, then --resume for a third)
#     on interpret writes the same checkpoints and metrics (timings aside)
#     as on the CPU, with a gap of 0, for a dense and a MoE model at f32,
#     bf16 and fp8, and for the MoE model with [lora] adapters at f32;
#  3. eval --device interpret writes the CPU's samples and scores;
#  4. serve --device interpret answers a completion with logprobs equal to
#     the CPU server's.
set -euo pipefail
BIN=$1
T=$(mktemp -d)
SERVER=""
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; fi
  rm -rf "$T"
}
trap cleanup EXIT

cat > "$T/dense.toml" <<'TOML'
[model]
architecture = "Qwen3ForCausalLM"
vocab_size = 320
hidden_size = 32
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 8
intermediate_size = 48
qk_norm = true
rope_theta = 10000.0
max_position_embeddings = 256
tie_word_embeddings = true
TOML
cat > "$T/moe.toml" <<'TOML'
[model]
architecture = "Qwen3MoeForCausalLM"
vocab_size = 320
hidden_size = 32
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 8
qk_norm = true
rope_theta = 10000.0
max_position_embeddings = 256
tie_word_embeddings = false
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 24
router_scoring = "softmax"
norm_topk_prob = true
TOML
for m in dense moe; do "$BIN" init --config "$T/$m.toml" --out "$T/$m" --seed 7 > /dev/null; done

mkdir -p "$T/data"
for i in 1 2 3 4 5 6; do echo "{\"prompt\": \"$i+$i=\", \"response\": \"$((i + i))\"}"; done > "$T/data/sft.jsonl"
for i in 1 2 3 4 5 6 7 8; do echo "{\"prompt\": \"$i+$((i + 1))=\", \"label\": \"$((i + i + 1))\"}"; done \
  > "$T/data/rl.jsonl"

# Every file of two checkpoint trees, byte for byte.
same_tree() {
  (cd "$1" && find . -type f | sort) > "$T/files_a"
  (cd "$2" && find . -type f | sort) > "$T/files_b"
  diff "$T/files_a" "$T/files_b" > /dev/null || { echo "$3: different files"; diff "$T/files_a" "$T/files_b"; exit 1; }
  [ -s "$T/files_a" ] || { echo "$3: no checkpoint files"; exit 1; }
  while read -r f; do
    cmp -s "$1/$f" "$2/$f" || { echo "$3: $f differs between cpu and interpret"; exit 1; }
  done < "$T/files_a"
}

# 1. SFT.
for m in dense moe; do
  cat > "$T/sft_$m.toml" <<TOML
[model]
path = "$T/$m"
[data]
train_file = "$T/data/sft.jsonl"
apply_chat_template = false
[train]
steps = 2
batch_size = 3
lr = 1e-3
save_interval = 2
TOML
  for dev in cpu interpret; do
    "$BIN" sft --config "$T/sft_$m.toml" --out "$T/sft_${m}_$dev" --threads 2 --set "model.device=\"$dev\"" \
      > "$T/sft_${m}_$dev.log" 2>&1 || { cat "$T/sft_${m}_$dev.log"; exit 1; }
  done
  grep -q "device interpret" "$T/sft_${m}_interpret.log" || { cat "$T/sft_${m}_interpret.log"; exit 1; }
  same_tree "$T/sft_${m}_cpu/checkpoints" "$T/sft_${m}_interpret/checkpoints" "sft $m"
done
# SFT with [lora] on the dense model.
for dev in cpu interpret; do
  "$BIN" sft --config "$T/sft_dense.toml" --out "$T/sft_lora_$dev" --threads 2 --set "model.device=\"$dev\"" \
    --set lora.rank=4 --set lora.alpha=8 --set 'lora.target_modules=["q_proj", "down_proj"]' \
    > "$T/sft_lora_$dev.log" 2>&1 || { cat "$T/sft_lora_$dev.log"; exit 1; }
done
same_tree "$T/sft_lora_cpu/checkpoints" "$T/sft_lora_interpret/checkpoints" "sft dense lora"

# 2. RL: 2 steps, then --resume for a third.
LORA=(--set lora.rank=4 --set lora.alpha=8 --set 'lora.target_modules=["all-linear"]' --set lora.init_seed=3)
rl_run() {  # model precision device [lora]
  local out="$T/rl_$1_$2_$3${4:+_$4}"
  cat > "$T/rl_$1.toml" <<TOML
[model]
path = "$T/$1"
[data]
train_file = "$T/data/rl.jsonl"
apply_chat_template = false
[rollout]
batch_size = 2
n = 4
max_new_tokens = 6
kv_blocks = 64
block_size = 4
[train]
steps = 2
lr = 1e-3
save_interval = 1
keep_last = 5
seed = 3
[reward]
type = "math"
TOML
  local set=(--set "model.device=\"$3\"" --set "model.precision=\"$2\"")
  if [ "${4:-}" = lora ]; then set+=("${LORA[@]}"); fi
  "$BIN" rl --config "$T/rl_$1.toml" --out "$out" --threads 2 "${set[@]}" > "$out.log" 2>&1 ||
    { cat "$out.log"; exit 1; }
  "$BIN" rl --config "$T/rl_$1.toml" --out "$out" --threads 2 "${set[@]}" --resume --set train.steps=3 \
    >> "$out.log" 2>&1 || { cat "$out.log"; exit 1; }
  grep -q "resumed from" "$out.log" || { cat "$out.log"; echo "rl $1 $2 $3 did not resume"; exit 1; }
}
same_metrics() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def load(run):
    out = []
    for line in open(f"{run}/metrics.jsonl"):
        m = json.loads(line)
        out.append({k: v for k, v in m.items() if not k.startswith("perf/") and not k.endswith("time_s")
                    and not k.endswith("tokens_per_s") and k != "time"})
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert [m["step"] for m in a] == [1, 2, 3], (sys.argv[3], [m["step"] for m in a])
assert a == b, f"{sys.argv[3]}: metrics differ between cpu and interpret"
for m in a:
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, (sys.argv[3], m)
PY
}
for case in "dense f32" "dense bf16" "dense fp8" "moe f32" "moe bf16" "moe fp8"; do
  read -r m p <<< "$case"
  rl_run "$m" "$p" cpu
  rl_run "$m" "$p" interpret
  same_tree "$T/rl_${m}_${p}_cpu/checkpoints" "$T/rl_${m}_${p}_interpret/checkpoints" "rl $m $p"
  same_metrics "$T/rl_${m}_${p}_cpu" "$T/rl_${m}_${p}_interpret" "rl $m $p"
done
# With [lora] (adapters on every projection, the experts' included; the
# base frozen): the adapters, their optimizer state and the metrics.
rl_run moe f32 cpu lora
rl_run moe f32 interpret lora
same_tree "$T/rl_moe_f32_cpu_lora/checkpoints" "$T/rl_moe_f32_interpret_lora/checkpoints" "rl moe f32 lora"
same_metrics "$T/rl_moe_f32_cpu_lora" "$T/rl_moe_f32_interpret_lora" "rl moe f32 lora"
[ -f "$T/rl_moe_f32_interpret_lora/checkpoints/step_3/adapter_model.safetensors" ] ||
  { echo "rl moe f32 lora: no adapter in the checkpoint"; exit 1; }

# 3. eval.
for dev in cpu interpret; do
  "$BIN" eval --model "$T/moe" --data "$T/data/rl.jsonl" --n 3 --max-new-tokens 6 --reward math --no-chat-template \
    --output "$T/eval_$dev.jsonl" --summary "$T/eval_$dev.json" --device "$dev" --threads 2 \
    > "$T/eval_$dev.log" 2>&1 || { cat "$T/eval_$dev.log"; exit 1; }
done
python3 - "$T/eval_cpu" "$T/eval_interpret" <<'PY'
import json, sys
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if "time" not in k and "per_s" not in k and not k.endswith("_s")}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
a, b = sys.argv[1], sys.argv[2]
ra = [strip(json.loads(l)) for l in open(a + ".jsonl")]
rb = [strip(json.loads(l)) for l in open(b + ".jsonl")]
assert len(ra) == 8 and ra == rb, "eval: per-problem lines differ between cpu and interpret"
assert strip(json.load(open(a + ".json"))) == strip(json.load(open(b + ".json"))), "eval: summaries differ"
PY

# 4. serve.
port_of() {  # log file -> the port the server printed
  for _ in $(seq 1 300); do
    p=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1")
    if [ -n "$p" ]; then echo "$p"; return; fi
    sleep 0.1
  done
  cat "$1"; echo "the server did not start" >&2; exit 1
}
for dev in cpu interpret; do
  "$BIN" serve --model "$T/moe" --port 0 --threads 2 --device "$dev" > "$T/serve_$dev.log" 2>&1 &
  SERVER=$!
  port=$(port_of "$T/serve_$dev.log")
  python3 - "$port" "$T/serve_$dev.json" <<'PY'
import json, sys, urllib.request
body = {"prompt": "3+4=", "max_tokens": 8, "temperature": 0.8, "seed": 5, "logprobs": 2, "n": 2}
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
out = [{"text": c["text"], "logprobs": c["logprobs"]["token_logprobs"], "top": c["logprobs"]["top_logprobs"]}
       for c in r["choices"]]
assert all(len(c["logprobs"]) > 0 for c in out), r
json.dump(out, open(sys.argv[2], "w"))
PY
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
done
cmp -s "$T/serve_cpu.json" "$T/serve_interpret.json" || {
  echo "serve: cpu and interpret answers differ"; cat "$T/serve_cpu.json" "$T/serve_interpret.json"; exit 1; }
echo "sft, rl, eval and serve on interpret: the CPU's bits"
