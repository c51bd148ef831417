#!/usr/bin/env bash
# --device interpret (the GPU kernel sources run on the CPU by the emulator)
# from the command line, against the CPU kernels:
#  1. a Qwen3-MoE checkpoint written here by an independent writer (numpy +
#     the safetensors layout by hand, bf16 and f32 tensors): `score --device
#     interpret` gives the same logprob bits as `score` on the CPU;
#  2. `generate --device interpret`, then `score` on the CPU: every logprob equal;
#     `check-alignment --device interpret` (rollout on the GPU kernels, trainer
#     on the CPU) reports a zero gap;
#  3. a short RL demo (SFT warm-up, GRPO steps, evaluation) with --device
#     interpret writes the CPU run's metrics and bitwise the same checkpoints;
#  4. --device cuda on a machine without a CUDA device (or in a build without
#     the CUDA runtime; tests/cli/device_cli.sh checks which message), and an
#     unknown device, fail with a clear message (exit 2).
# Every command runs in strict interpret mode: host code touching device
# memory stops it, as it would fault on a device (docs/gpu.md).
set -euo pipefail
unset LOCKSTEP_INTERPRET_HOST_ACCESS
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

/usr/bin/python3 - "$T/hf" <<'PY'
import json, os, struct, sys
import numpy as np
out = sys.argv[1]
os.makedirs(out)
V, D, L, H, KV, Dh, E, K, Fe = 96, 48, 2, 4, 2, 12, 4, 2, 40
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": V,
       "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
       "head_dim": Dh, "intermediate_size": 64, "moe_intermediate_size": Fe, "num_experts": E,
       "num_experts_per_tok": K, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
       "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
json.dump(cfg, open(f"{out}/config.json", "w"))
rng = np.random.default_rng(7)
tensors = {}
def mat(name, *shape, std=0.15):
    tensors[name] = (rng.standard_normal(shape) * std).astype(np.float32)
def norm(name, n):
    tensors[name] = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
mat("model.embed_tokens.weight", V, D, std=0.5)
for i in range(L):
    p = f"model.layers.{i}."
    mat(p + "self_attn.q_proj.weight", H * Dh, D); mat(p + "self_attn.k_proj.weight", KV * Dh, D)
    mat(p + "self_attn.v_proj.weight", KV * Dh, D); mat(p + "self_attn.o_proj.weight", D, H * Dh)
    norm(p + "self_attn.q_norm.weight", Dh); norm(p + "self_attn.k_norm.weight", Dh)
    norm(p + "input_layernorm.weight", D); norm(p + "post_attention_layernorm.weight", D)
    mat(p + "mlp.gate.weight", E, D, std=0.5)
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        mat(q + "gate_proj.weight", Fe, D); mat(q + "up_proj.weight", Fe, D); mat(q + "down_proj.weight", D, Fe)
norm("model.norm.weight", D)
mat("lm_head.weight", V, D, std=0.3)
# bf16 for the matrices (round to nearest even), f32 for the norms.
def bf16_bytes(a):
    u = a.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r.tobytes()
header, blobs, off = {}, [], 0
for name in sorted(tensors):
    a = tensors[name]
    if a.ndim == 2:
        b, dt = bf16_bytes(a), "BF16"
    else:
        b, dt = a.tobytes(), "F32"
    header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
header["__metadata__"] = {"format": "pt"}
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
PY

python3 - "$T/score_in.jsonl" <<'PY'
import json, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(5):
        p = [random.randrange(96) for _ in range(3 + 4 * i)]
        r = [random.randrange(96) for _ in range(2 + 3 * i)]
        f.write(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n")
PY
"$BIN" score --model "$T/hf" --input "$T/score_in.jsonl" --output "$T/cpu.jsonl" --entropy 2>/dev/null
"$BIN" score --model "$T/hf" --input "$T/score_in.jsonl" --output "$T/interp.jsonl" \
  --entropy --device interpret \
  --threads 2 2>/dev/null
printf '{"prompt_ids":[5,6,7,8]}\n{"prompt_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]}\n{"prompt_ids":[40]}\n' \
  > "$T/p.jsonl"
"$BIN" generate --model "$T/hf" --input "$T/p.jsonl" --output "$T/g.jsonl" --n 3 --max-new-tokens 10 \
  --temperature 0.9 --device interpret --max-prefill-chunk 5 2>/dev/null
"$BIN" score --model "$T/hf" --input "$T/g.jsonl" --output "$T/gs.jsonl" --temperature 0.9 2>/dev/null
python3 - "$T" <<'PY'
import json, struct, sys
t = sys.argv[1]
load = lambda p: [json.loads(l) for l in open(f"{t}/{p}")]
bits = lambda xs: [struct.unpack("<I", struct.pack("<f", x))[0] for x in xs]
cpu, interp = load("cpu.jsonl"), load("interp.jsonl")
assert len(cpu) == len(interp) == 5
for a, b in zip(cpu, interp):
    assert bits(a["logprobs"]) == bits(b["logprobs"]), "score --device interpret differs from the CPU"
    assert bits(a["entropy"]) == bits(b["entropy"]), "entropy differs"
g, s = load("g.jsonl"), load("gs.jsonl")
assert len(g) == len(s) == 9
n = 0
for a, b in zip(g, s):
    assert len(a["logprobs"]) == len(a["response_ids"]) > 0
    assert bits(a["logprobs"]) == bits(b["logprobs"]), "generate --device interpret vs score on the CPU differ"
    n += len(a["logprobs"])
print(f"interpret vs CPU: {sum(len(a['logprobs']) for a in cpu)} scored and {n} generated logprobs bitwise equal")
PY
"$BIN" check-alignment --model "$T/hf" --data "$T/p.jsonl" --n 2 --max-new-tokens 8 --device interpret \
  --json "$T/a.json" >/dev/null 2>&1
python3 -c "import json; j=json.load(open('$T/a.json')); assert j['train/train_rollout_logprob_abs_diff']==0 and j['train/train_rollout_logprob_bitwise_equal_frac']==1, j"

short=(--sft-steps 4 --rl-steps 2 --threads 2 --set eval.interval=2 --set rollout.batch_size=4 --set eval.n=1)
"$BIN" demo --out "$T/dcpu" "${short[@]}" > "$T/dcpu.log" 2>&1 || { cat "$T/dcpu.log"; exit 1; }
"$BIN" demo --out "$T/dint" "${short[@]}" --device interpret > "$T/dint.log" 2>&1 ||
  { cat "$T/dint.log"; exit 1; }
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def load(path):
    out = []
    for line in open(path):
        m = json.loads(line)
        out.append({k: v for k, v in m.items()
                    if not k.startswith("perf/") and "time" not in k and not k.endswith("per_s")})
    return out
for f in ("metrics.jsonl", "sft/metrics.jsonl"):
    a, b = load(f"{t}/dcpu/{f}"), load(f"{t}/dint/{f}")
    assert len(a) > 0 and a == b, f"demo {f}: --device interpret differs from the CPU"
print("demo metrics equal on the CPU and in interpret mode")
PY
for f in model/model.safetensors sft/checkpoints/step_4/model.safetensors checkpoints/step_2/model.safetensors; do
  cmp "$T/dcpu/$f" "$T/dint/$f" || { echo "demo checkpoint $f differs in interpret mode"; exit 1; }
done

for dev in cuda tpu; do
  set +e
  out=$("$BIN" score --model "$T/hf" --input "$T/score_in.jsonl" --output "$T/x.jsonl" --device $dev 2>&1)
  rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "--device $dev: expected exit 2, got $rc: $out"; exit 1; }
  echo "$out" | grep -q "device" || { echo "--device $dev: unclear error: $out"; exit 1; }
  [ ! -e "$T/x.jsonl" ] || { echo "--device $dev wrote output"; exit 1; }
done
echo "gpu interpret CLI checks passed"
