#!/usr/bin/env bash
# `lockstep export --merge-lora` on an adapter lockstep did not write: Python
# (json + struct only) writes a PEFT adapter for a tiny Qwen3-MoE, as PEFT
# would (its adapter_config.json keys; lora_A in F32, lora_B in BF16), with
# random A and B for q, v, o and the dense and expert MLP projections. The
# merged export is checked weight by weight against W + alpha/r * B·A
# computed in Python doubles (k in order, one rounding to f32: bit for bit),
# every other tensor byte for byte against the base; `--dtype bf16` gives
# each merged f32 value rounded to nearest even; `score` reads the export
# and its logprobs differ from the base's. An adapter with B = 0 exports the
# base's weights exactly (same logprobs); an rsLoRA adapter is refused with
# the file and key named, and nothing is written.
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat > "$T/model.toml" <<'TOML'
[model]
architecture = "Qwen3MoeForCausalLM"
vocab_size = 300
hidden_size = 32
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 8
qk_norm = true
intermediate_size = 48
mlp_only_layers = [1]
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 16
norm_topk_prob = true
max_position_embeddings = 128
init_std = 0.05
TOML
"$BIN" init --config "$T/model.toml" --out "$T/m" --seed 5 >/dev/null

cat > "$T/tensors.py" <<'PY'
import json, struct
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (e, raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]]) for k, e in h.items()}
def write(path, tensors):  # name -> (dtype, shape, bytes)
    h, off = {}, 0
    for name, (dt, shape, b) in tensors.items():
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    hb = json.dumps(h).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(t[2] for t in tensors.values()))
PY

# make_adapter.py BASE OUT ZERO_B: a rank-3, alpha-5 adapter of BASE in OUT.
cat > "$T/make_adapter.py" <<'PY'
import json, os, random, struct, sys
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import tensors
base, out, zero_b = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
targets = ["v_proj", "q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # a set, as PEFT writes it
r, alpha = 3, 5
os.makedirs(out)
json.dump({"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": base, "bias": "none",
           "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
           "layer_replication": None, "layers_pattern": None, "layers_to_transform": None,
           "loftq_config": {}, "lora_alpha": alpha, "lora_dropout": 0.05, "megatron_config": None,
           "megatron_core": "megatron.core", "modules_to_save": None, "peft_type": "LORA", "r": r,
           "rank_pattern": {}, "revision": None, "target_modules": targets, "task_type": "CAUSAL_LM",
           "use_dora": False, "use_rslora": False}, open(f"{out}/adapter_config.json", "w"), indent=2)
rng = random.Random(7)
def bf16_value():  # a random value a bf16 holds exactly, and its bits
    bits = struct.unpack("<I", struct.pack("<f", rng.gauss(0, 0.1)))[0] >> 16
    return bits
ts = {}
for name, (e, _) in sorted(tensors.read(f"{base}/model.safetensors").items()):
    mod = name.split(".")[-2]
    if mod not in targets or not name.endswith(".weight"):
        continue
    o, i = e["shape"]
    stem = "base_model.model." + name[:-len(".weight")]
    a = [rng.gauss(0, 0.2) for _ in range(r * i)]
    ts[stem + ".lora_A.weight"] = ("F32", [r, i], struct.pack(f"<{r * i}f", *a))
    b = [0 if zero_b else bf16_value() for _ in range(o * r)]
    ts[stem + ".lora_B.weight"] = ("BF16", [o, r], struct.pack(f"<{o * r}H", *b))
# 2 layers x (q, v, o) + 4 experts x 3 + one dense MLP x 3, A and B each
assert len(ts) == 2 * (6 + 12 + 3), len(ts)
tensors.write(f"{out}/adapter_model.safetensors", ts)
PY

# check_merge.py BASE ADAPTER MERGED: every weight as the documented merge gives it.
cat > "$T/check_merge.py" <<'PY'
import json, os, struct, sys
sys.path.insert(0, os.path.dirname(sys.argv[0]))
import tensors
base, adapter, merged = (tensors.read(f"{d}/{f}") for d, f in zip(sys.argv[1:], (
    "model.safetensors", "adapter_model.safetensors", "model.safetensors")))
cfg = json.load(open(f"{sys.argv[2]}/adapter_config.json"))
s = cfg["lora_alpha"] / cfg["r"]
def floats(e, b):
    if e["dtype"] == "F32":
        return struct.unpack(f"<{len(b) // 4}f", b)
    assert e["dtype"] == "BF16", e["dtype"]
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{len(b) // 2}H", b)]
assert set(merged) == set(base), set(merged) ^ set(base)
adapted = changed = 0
for name, (e, wb) in base.items():
    me, mb = merged[name]
    assert me["dtype"] == e["dtype"] == "F32" and me["shape"] == e["shape"], name
    stem = "base_model.model." + name[:-len(".weight")]
    if stem + ".lora_A.weight" not in adapter:
        assert mb == wb, f"{name}: not adapted, yet changed"
        continue
    adapted += 1
    (ae, ab), (be, bb) = adapter[stem + ".lora_A.weight"], adapter[stem + ".lora_B.weight"]
    A, B, W = floats(ae, ab), floats(be, bb), floats(e, wb)
    r, (o_n, i_n) = ae["shape"][0], e["shape"]
    want = []
    for o in range(o_n):
        for i in range(i_n):
            acc = 0.0
            for k in range(r):
                acc += B[o * r + k] * A[k * i_n + i]
            d = s * acc
            want.append(W[o * i_n + i] if d == 0 else W[o * i_n + i] + d)
    got = struct.pack(f"<{len(want)}f", *want)
    assert mb == got, f"{name}: merged weights differ from W + s*B*A"
    changed += mb != wb
assert adapted == 21, adapted
print(f"{adapted} adapted, {changed} changed")
PY

python3 "$T/make_adapter.py" "$T/m" "$T/lora" 0
python3 "$T/make_adapter.py" "$T/m" "$T/lora0" 1
"$BIN" export --from "$T/m" --merge-lora "$T/lora" --out "$T/merged" --dtype f32 > "$T/export.log"
grep -q "with the LoRA adapter $T/lora merged" "$T/export.log" || { cat "$T/export.log"; exit 1; }
out=$(python3 "$T/check_merge.py" "$T/m" "$T/lora" "$T/merged")
[ "$out" = "21 adapted, 21 changed" ] || { echo "$out"; exit 1; }
cmp "$T/m/tokenizer.json" "$T/merged/tokenizer.json"

# --dtype bf16 applies to the merged weights: each the f32 merge rounded to nearest even.
"$BIN" export --from "$T/m" --merge-lora "$T/lora" --out "$T/merged_bf16" --dtype bf16 >/dev/null
python3 - "$T" <<'PY'
import os, struct, sys
sys.path.insert(0, sys.argv[1])
import tensors
f32, bf = (tensors.read(f"{sys.argv[1]}/{d}/model.safetensors") for d in ("merged", "merged_bf16"))
assert set(f32) == set(bf)
for name, (e, b) in f32.items():
    assert bf[name][0]["dtype"] == "BF16", name
    want = []
    for u in struct.unpack(f"<{len(b) // 4}I", b):
        want.append((u + 0x7FFF + ((u >> 16) & 1)) >> 16)  # finite values: round to nearest even
    assert bf[name][1] == struct.pack(f"<{len(want)}H", *want), name
PY

# B = 0: the base's weights, bit for bit.
"$BIN" export --from "$T/m" --merge-lora "$T/lora0" --out "$T/merged0" --dtype f32 >/dev/null
out=$(python3 "$T/check_merge.py" "$T/m" "$T/lora0" "$T/merged0")
[ "$out" = "21 adapted, 0 changed" ] || { echo "$out"; exit 1; }

# score reads the exports: the adapter changes the logprobs, B = 0 does not.
python3 - "$T" <<'PY'
import json, sys
with open(f"{sys.argv[1]}/in.jsonl", "w") as f:
    for ids in ([5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43], [100, 7, 7, 200, 13, 14, 15, 16, 17]):
        f.write(json.dumps({"prompt_ids": ids[:2], "response_ids": ids[2:]}) + "\n")
PY
for m in m merged merged0; do
  "$BIN" score --model "$T/$m" --input "$T/in.jsonl" --output "$T/score_$m.jsonl" --threads 1 > "$T/score.log" 2>&1 || { cat "$T/score.log"; exit 1; }
done
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
lp = {m: [json.loads(l)["logprobs"] for l in open(f"{t}/score_{m}.jsonl")] for m in ("m", "merged", "merged0")}
assert lp["merged0"] == lp["m"], "B = 0 changed the logprobs"
assert all(a != b for x, y in zip(lp["merged"], lp["m"]) for a, b in zip(x, y)), "the adapter left a logprob unchanged"
PY

# Refused: rsLoRA (another scale), a wrong shape; nothing is written then.
python3 - "$T/lora" "$T/rslora" <<'PY'
import json, os, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
c = json.load(open(f"{sys.argv[2]}/adapter_config.json"))
c["use_rslora"] = True
json.dump(c, open(f"{sys.argv[2]}/adapter_config.json", "w"))
PY
rc=0
"$BIN" export --from "$T/m" --merge-lora "$T/rslora" --out "$T/bad" --dtype f32 > /dev/null 2> "$T/err.txt" || rc=$?
[ "$rc" != 0 ] && grep -q "rslora/adapter_config.json: key \"use_rslora\" is true" "$T/err.txt" || { cat "$T/err.txt"; exit 1; }
[ ! -e "$T/bad" ]
python3 - "$T/lora" "$T/rank4" <<'PY'
import json, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
c = json.load(open(f"{sys.argv[2]}/adapter_config.json"))
c["r"] = 4
json.dump(c, open(f"{sys.argv[2]}/adapter_config.json", "w"))
PY
rc=0
"$BIN" export --from "$T/m" --merge-lora "$T/rank4" --out "$T/bad" --dtype f32 > /dev/null 2> "$T/err.txt" || rc=$?
[ "$rc" != 0 ] && grep -q "rank4/adapter_model.safetensors: tensor '.*lora_A.weight' has shape \[3, 32\], expected \[4, 32\]" "$T/err.txt" || { cat "$T/err.txt"; exit 1; }
[ ! -e "$T/bad" ]
echo ok
