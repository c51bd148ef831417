#!/usr/bin/env bash
# Aligned at every precision, end to end on models lockstep did not write: a
# Python writer (below, json + struct only) makes Hugging Face directories of a
# dense Qwen3 and a Qwen3-MoE model. For f32, bf16 and fp8, `generate
# --precision P` then `score --precision P` give bitwise-equal logprobs, and
# `check-alignment --precision P` reports a gap of exactly 0; fast mode
# (--trainer-precision f32) reports a gap above 0, and --localise names where.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

python3 - "$T" <<'PY'
import json, math, os, random, struct, sys

def write_model(path, moe, seed):
    rnd = random.Random(seed)
    V, D, L, H, Hkv, Dh = 280, 48, 2, 4, 2, 12
    F, E, K, Fe = 96, 4, 2, 32
    cfg = {"architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
           "model_type": "qwen3_moe" if moe else "qwen3",
           "vocab_size": V, "hidden_size": D, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": Hkv, "head_dim": Dh,
           "intermediate_size": F, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 256, "tie_word_embeddings": False,
           "eos_token_id": 2, "torch_dtype": "float32"}
    if moe:
        cfg.update({"num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": Fe,
                    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []})
    tensors = {}
    def mat(name, rows, cols, std):
        tensors[name] = ([rows, cols], [rnd.gauss(0.0, std) for _ in range(rows * cols)])
    def vec(name, n):
        tensors[name] = ([n], [1.0 + rnd.gauss(0.0, 0.1) for _ in range(n)])
    mat("model.embed_tokens.weight", V, D, 1.0)
    for i in range(L):
        p = f"model.layers.{i}."
        vec(p + "input_layernorm.weight", D)
        mat(p + "self_attn.q_proj.weight", H * Dh, D, 0.2)
        mat(p + "self_attn.k_proj.weight", Hkv * Dh, D, 0.2)
        mat(p + "self_attn.v_proj.weight", Hkv * Dh, D, 0.2)
        vec(p + "self_attn.q_norm.weight", Dh)
        vec(p + "self_attn.k_norm.weight", Dh)
        mat(p + "self_attn.o_proj.weight", D, H * Dh, 0.2)
        vec(p + "post_attention_layernorm.weight", D)
        if moe:
            mat(p + "mlp.gate.weight", E, D, 0.5)
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                mat(q + "gate_proj.weight", Fe, D, 0.2)
                mat(q + "up_proj.weight", Fe, D, 0.2)
                mat(q + "down_proj.weight", D, Fe, 0.2)
        else:
            mat(p + "mlp.gate_proj.weight", F, D, 0.2)
            mat(p + "mlp.up_proj.weight", F, D, 0.2)
            mat(p + "mlp.down_proj.weight", D, F, 0.2)
    vec("model.norm.weight", D)
    mat("lm_head.weight", V, D, 0.3)
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        shape, vals = tensors[name]
        b = struct.pack(f"<{len(vals)}f", *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(path)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)

t = sys.argv[1]
write_model(os.path.join(t, "dense"), False, 1)
write_model(os.path.join(t, "moe"), True, 2)
with open(os.path.join(t, "p.jsonl"), "w") as f:
    for ids in ([5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17], [3]):
        f.write(json.dumps({"prompt_ids": ids}) + "\n")
PY

for model in dense moe; do
  for p in f32 bf16 fp8; do
    M="$T/$model"
    "$BIN" generate --model "$M" --input "$T/p.jsonl" --output "$T/g.jsonl" --n 3 --max-new-tokens 10 \
      --temperature 0.9 --precision "$p" --threads 2 2>/dev/null
    "$BIN" score --model "$M" --input "$T/g.jsonl" --output "$T/s.jsonl" --temperature 0.9 --precision "$p" \
      --threads 1 --micro-batch-tokens 16 2>/dev/null
    python3 - "$T" "$model" "$p" <<'PY'
import json, struct, sys
t, model, p = sys.argv[1:]
g = [json.loads(l) for l in open(f"{t}/g.jsonl")]
s = [json.loads(l) for l in open(f"{t}/s.jsonl")]
assert len(g) == 12 and len(s) == 12, (len(g), len(s))
n = 0
for a, b in zip(g, s):
    assert len(a["logprobs"]) == len(a["response_ids"]) > 0
    for x, y in zip(a["logprobs"], b["logprobs"]):
        # Compare the float32 bits, not the JSON text.
        assert struct.pack("<f", x) == struct.pack("<f", y), (model, p, x, y)
        n += 1
print(f"{model} {p}: generate and score agree bit for bit on {n} tokens")
PY
    "$BIN" check-alignment --model "$M" --data "$T/p.jsonl" --precision "$p" --n 4 --max-new-tokens 10 \
      --json "$T/a.json" >/dev/null
    python3 -c "import json; j=json.load(open('$T/a.json')); assert j['train/train_rollout_logprob_abs_diff']==0 and j['train/train_rollout_logprob_bitwise_equal_frac']==1, j"
    if [ "$p" != f32 ]; then
      "$BIN" check-alignment --model "$M" --data "$T/p.jsonl" --precision "$p" --trainer-precision f32 --n 4 \
        --max-new-tokens 10 --json "$T/f.json" >/dev/null
      python3 -c "import json; j=json.load(open('$T/f.json')); assert j['train/train_rollout_logprob_abs_diff']>0 and j['trainer_precision']=='f32', j"
    fi
  done
done
# --localise: nothing differs in aligned mode; fast mode names the first point.
out=$("$BIN" check-alignment --model "$T/moe" --data "$T/p.jsonl" --precision fp8 --n 2 --max-new-tokens 6 --localise)
echo "$out" | grep -q "localiser: no intermediate differs" || { echo "aligned localise: $out"; exit 1; }
out=$("$BIN" check-alignment --model "$T/moe" --data "$T/p.jsonl" --precision bf16 --trainer-precision f32 --n 2 \
  --max-new-tokens 6 --localise)
echo "$out" | grep -q "localiser: first divergence: layer 0 'q'" || { echo "fast-mode localise: $out"; exit 1; }
# eval takes the precision from --precision or from a config's [model] precision,
# and ignores the RL-only [rl] section of the same config.
"$BIN" init --config "$SRC/configs/bench/moe-tiny.toml" --out "$T/tiny" >/dev/null
printf '{"prompt": "1+1=", "label": "2"}\n{"prompt": "2+3=", "label": "5"}\n' > "$T/e.jsonl"
"$BIN" eval --model "$T/tiny" --data "$T/e.jsonl" --n 2 --max-new-tokens 4 --precision bf16 --no-chat-template \
  --summary "$T/e1.json" >/dev/null 2>&1
printf '[model]\npath = "%s"\nprecision = "fp8"\n[data]\neval_file = "%s"\napply_chat_template = false\n[rl]\non_gap = "warn"\n' \
  "$T/tiny" "$T/e.jsonl" > "$T/e.toml"
"$BIN" eval --config "$T/e.toml" --n 2 --max-new-tokens 4 --summary "$T/e2.json" >/dev/null 2>&1
python3 -c "import json; [json.load(open(f)) for f in ('$T/e1.json', '$T/e2.json')]"
# [rollout] precision is an error that says where the key went.
cat > "$T/old.toml" <<'TOML'
[model]
path = "unused"
[data]
train_file = "unused.jsonl"
[rollout]
precision = "bf16"
TOML
set +e
out=$("$BIN" rl --config "$T/old.toml" 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || { echo "[rollout] precision was accepted"; exit 1; }
echo "$out" | grep -q "moved to \[model\] precision" || { echo "unclear error: $out"; exit 1; }
echo "precision CLI checks passed"
