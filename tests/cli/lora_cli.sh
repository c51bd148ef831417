#!/usr/bin/env bash
# LoRA from the command line ([lora], docs/rl.md "LoRA"):
#  1. `lockstep rl` with [lora] on the demo's SFT model: a gap of exactly 0 at
#     every step, the base unchanged, and checkpoints holding PEFT's
#     adapter_config.json and adapter_model.safetensors (PEFT names, shapes);
#  2. 4 steps straight and 2 steps + --resume + 2 steps end with the same
#     adapters, bit for bit;
#  3. fast mode (bf16 rollout, f32 trainer) runs with a small, measured gap;
#  4. `lockstep sft` with [lora] trains and writes the adapters too (its
#     target list as given);
#  5. bad [lora] values are refused with the key named (dropout says why),
#     and what LoRA does not support yet is refused with the reason.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" demo --out "$T/demo" --sft-steps 20 --rl-steps 1 --threads 2 --set eval.interval=0 \
  --set rollout.batch_size=4 > "$T/demo.log" 2>&1 || { cat "$T/demo.log"; exit 1; }
cfg="$T/demo/config.toml"
lora=(--set lora.rank=4 --set lora.alpha=8 --set 'lora.target_modules=["all-linear"]' --set lora.init_seed=3
      --set rollout.batch_size=4 --set eval.interval=0 --set train.save_interval=2 --set train.lr=1e-2
      --set log.samples_interval=0 --threads 2)

"$BIN" rl --config "$cfg" --out "$T/straight" --set train.steps=4 "${lora[@]}" > "$T/s.log" 2>&1 \
  || { cat "$T/s.log"; exit 1; }
"$BIN" rl --config "$cfg" --out "$T/split" --set train.steps=2 "${lora[@]}" > "$T/p1.log" 2>&1 \
  || { cat "$T/p1.log"; exit 1; }
"$BIN" rl --config "$cfg" --out "$T/split" --resume --set train.steps=4 "${lora[@]}" > "$T/p2.log" 2>&1 \
  || { cat "$T/p2.log"; exit 1; }
grep -q "resumed from" "$T/p2.log"

python3 - "$T" <<'PY'
import json, struct, sys
t = sys.argv[1]
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}
steps = [json.loads(l) for l in open(f"{t}/straight/metrics.jsonl")]
trained = [m for m in steps if "train/train_rollout_logprob_abs_diff" in m]
assert len(trained) == 4, [m.get("step") for m in steps]
for m in trained:
    assert m["train/train_rollout_logprob_abs_diff"] == 0, m
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, m
ck = f"{t}/straight/checkpoints/step_4"
cfg = json.load(open(f"{ck}/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM", cfg
assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and cfg["lora_dropout"] == 0 and cfg["bias"] == "none", cfg
assert set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                      "down_proj"}, cfg
a = tensors(f"{ck}/adapter_model.safetensors")
qa = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
qb = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
assert qa in a and qb in a, sorted(a)[:4]
assert a[qa][1][0] == 4 and a[qb][1][1] == 4, (a[qa][1], a[qb][1])
assert any(b != 0 for b in a[qb][2]), "B is still zero after 4 steps"
# The base is frozen: the checkpoint's base equals the model the run started from.
import os, tomllib
start = tomllib.load(open(f"{t}/demo/config.toml", "rb"))["model"]["path"]
if os.path.isfile(start):  # checkpoints/latest names the step directory
    start = os.path.join(os.path.dirname(start), open(start).read().strip())
w0 = tensors(os.path.join(start, "model.safetensors"))
w4 = tensors(f"{ck}/model.safetensors")
assert {k: v[2] for k, v in w0.items()} == {k: v[2] for k, v in w4.items()}, "the base moved"
# Straight vs split + resume: the same adapters and optimizer state.
b = tensors(f"{t}/split/checkpoints/step_4/adapter_model.safetensors")
assert a == b, "a resumed LoRA run ends with other adapters"
o1 = open(f"{ck}/optimizer.bin", "rb").read()
o2 = open(f"{t}/split/checkpoints/step_4/optimizer.bin", "rb").read()
assert o1 == o2, "a resumed LoRA run ends with another optimizer state"
PY

# Fast mode (bf16 rollout, f32 trainer): the engine packs its own bf16 base
# once and reads the trainer's adapters; the gap is measured, small, not 0.
"$BIN" rl --config "$cfg" --out "$T/fast" --set train.steps=2 "${lora[@]}" --set 'model.precision="bf16"' \
  --set 'model.trainer_precision="f32"' > "$T/fast.log" 2>&1 || { cat "$T/fast.log"; exit 1; }
python3 - "$T/fast/metrics.jsonl" <<'PY'
import json, sys
gaps = [json.loads(l).get("train/train_rollout_logprob_abs_diff") for l in open(sys.argv[1])]
gaps = [g for g in gaps if g is not None]
assert len(gaps) == 2 and all(0 < g < 0.05 for g in gaps), gaps
PY

# SFT with [lora] on the same model: trains the adapters and checkpoints them.
printf '{"prompt":"1+1=","response":"2"}\n{"prompt":"2+3=","response":"5"}\n' > "$T/sft.jsonl"
cat > "$T/sft.toml" <<EOF
[model]
path = "$T/demo/sft/checkpoints/latest"
[data]
train_file = "$T/sft.jsonl"
apply_chat_template = false
[train]
steps = 2
batch_size = 2
lr = 1e-2
save_interval = 2
out_dir = "$T/sftout"
[lora]
rank = 2
alpha = 4
target_modules = ["q_proj", "v_proj", "down_proj"]
EOF
"$BIN" sft --config "$T/sft.toml" --threads 2 > "$T/sft.log" 2>&1 || { cat "$T/sft.log"; exit 1; }
python3 - "$T/sftout/checkpoints/step_2" <<'PY'
import json, struct, sys
ck = sys.argv[1]
cfg = json.load(open(f"{ck}/adapter_config.json"))
assert cfg["r"] == 2 and cfg["target_modules"] == ["q_proj", "v_proj", "down_proj"], cfg
raw = open(f"{ck}/adapter_model.safetensors", "rb").read()
names = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
# The demo's model is a Qwen3-MoE: down_proj adapts every routed expert.
assert "base_model.model.model.layers.0.mlp.experts.0.down_proj.lora_A.weight" in names, sorted(names)[:4]
assert "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight" in names, sorted(names)[:4]
assert not any("o_proj" in n for n in names), sorted(names)
PY

# Bad values: named by key.
if "$BIN" rl --check-config "$cfg" --set lora.rank=4 --set lora.dropout=0.1 2> "$T/e1"; then
  echo "lora.dropout = 0.1 was accepted"; exit 1
fi
grep -q "dropout" "$T/e1" && grep -q "rollout" "$T/e1" || { cat "$T/e1"; exit 1; }
if "$BIN" rl --check-config "$cfg" --set 'lora.target_modules=["qproj"]' 2> "$T/e2"; then
  echo "an unknown target module was accepted"; exit 1
fi
grep -q "qproj" "$T/e2" || { cat "$T/e2"; exit 1; }
if "$BIN" rl --check-config "$cfg" --set lora.rnak=4 2> "$T/e3"; then
  echo "an unknown [lora] key was accepted"; exit 1
fi
grep -q "rnak" "$T/e3" || { cat "$T/e3"; exit 1; }
# Not yet with LoRA: a rollout one step ahead (and MPI ranks), refused with the reason.
if "$BIN" rl --config "$cfg" --out "$T/stale" --set lora.rank=4 --set dist.max_weight_staleness=1 2> "$T/e4"; then
  echo "[lora] with max_weight_staleness = 1 was accepted"; exit 1
fi
grep -q "max_weight_staleness" "$T/e4" || { cat "$T/e4"; exit 1; }
echo "lora_cli: OK"
