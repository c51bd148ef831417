#!/usr/bin/env bash
# LoRA on DeepSeek-V4 from the command line (docs/lora.md, "DeepSeek-V4"), on
# the micro V4 model of tests/common/v4_micro_model.toml made with `lockstep init`:
#  1. `lockstep rl` with [lora] target_modules = ["all-linear"]: a gap of
#     exactly 0 at every step, the base unchanged, and checkpoints holding
#     adapter_config.json (V4's module names) and adapter_model.safetensors
#     (wq_a, wkv, wq_b, wo_b and every expert's w1, w3, w2 of the main layers;
#     no wo_a, router, compressor, indexer or MTP block);
#  2. `lockstep export --merge-lora` on that checkpoint writes W + s·B·A for
#     every adapted tensor, bit for bit as docs/lora.md orders it, and every
#     other tensor unchanged;
#  3. [lora] with the MTP loss is refused with the reason.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LOCKSTEP_THREADS=2
fail() { echo "FAIL: $*"; exit 1; }

cp "$SRC/tests/common/v4_micro_model.toml" "$T/model.toml"
"$BIN" init --config "$T/model.toml" --out "$T/model" > "$T/init.log" 2>&1 || { cat "$T/init.log"; fail init; }
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/train.jsonl", "w") as f:
    for a in range(1, 9):
        f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
PY
cat > "$T/rl.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/train.jsonl"
apply_chat_template = false

[rollout]
batch_size = 4
n = 4
temperature = 1.0
max_new_tokens = 6

[train]
steps = 2
lr = 1e-2
micro_batch_tokens = 64
save_interval = 2

[algo]
advantage = "grpo"

[reward]
type = "math"

[eval]
interval = 0

[log]
samples_interval = 0

[lora]
rank = 4
alpha = 8
target_modules = ["all-linear"]
init_seed = 3
TOML

# 1. RL with adapters: aligned, a gap of exactly 0.
"$BIN" rl --config "$T/rl.toml" --out "$T/rl" > "$T/rl.log" 2>&1 || { cat "$T/rl.log"; fail "rl with [lora]"; }
cat > "$T/tensors.py" <<'PY'
import glob, json, struct
def read(d):
    out = {}
    for f in sorted(glob.glob(d + "/*.safetensors")):
        raw = open(f, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        h = json.loads(raw[8:8 + n])
        h.pop("__metadata__", None)
        for k, v in h.items():
            s, e = v["data_offsets"]
            out[k] = (v, raw[8 + n + s:8 + n + e])
    return out
PY
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
sys.path.insert(0, t)
import tensors
ms = [json.loads(l) for l in open(f"{t}/rl/metrics.jsonl")]
steps = [m for m in ms if "train/train_rollout_logprob_abs_diff" in m]
assert len(steps) == 2, [m.get("step") for m in ms]
for m in steps:
    assert m["train/train_rollout_logprob_abs_diff"] == 0, m
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, m
ck = f"{t}/rl/checkpoints/step_2"
cfg = json.load(open(f"{ck}/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8, cfg
assert sorted(cfg["target_modules"]) == sorted(["wq_a", "wkv", "wq_b", "wo_b", "w1", "w3", "w2"]), cfg
a = tensors.read(ck)
a = {k: v for k, v in a.items() if ".lora_" in k}
mods = [k.split(".")[-3] for k in a]
# 2 main layers: 4 attention projections, 4 routed experts and the shared one x 3, A and B each.
assert len(a) == 2 * (4 + 5 * 3) * 2, (len(a), sorted(a)[:6])
assert set(mods) == {"wq_a", "wkv", "wq_b", "wo_b", "w1", "w3", "w2"}, set(mods)
for bad in ("mtp.", "compressor", "indexer", "wo_a", "gate.lora"):
    assert not any(bad in k for k in a), (bad, [k for k in a if bad in k])
for name in ("base_model.model.layers.0.attn.wq_a.lora_A.weight",
             "base_model.model.layers.1.ffn.experts.3.w2.lora_B.weight",
             "base_model.model.layers.0.ffn.shared_experts.w1.lora_A.weight"):
    assert name in a, (name, sorted(a)[:6])
b = a["base_model.model.layers.1.attn.wo_b.lora_B.weight"]
assert b[0]["shape"][1] == 4 and any(x != 0 for x in b[1]), "B is still zero after 2 steps"
w0, w2 = tensors.read(f"{t}/model"), tensors.read(ck)
base = {k: v[1] for k, v in w2.items() if ".lora_" not in k}
assert base == {k: v[1] for k, v in w0.items()}, "the base moved"
print("v4 lora rl: gap 0 at", len(steps), "steps,", len(a), "adapter tensors")
PY

# 2. Merge the trained adapters into the base.
CK=$T/rl/checkpoints/step_2
"$BIN" export --from "$T/model" --merge-lora "$CK" --out "$T/merged" --dtype f32 > "$T/export.log" 2>&1 \
  || { cat "$T/export.log"; fail "export --merge-lora"; }
python3 - "$T" "$CK" <<'PY'
import json, struct, sys
t, ck = sys.argv[1], sys.argv[2]
sys.path.insert(0, t)
import tensors
base, merged = tensors.read(f"{t}/model"), tensors.read(f"{t}/merged")
adapter = {k: v for k, v in tensors.read(ck).items() if ".lora_" in k}
cfg = json.load(open(f"{ck}/adapter_config.json"))
s = cfg["lora_alpha"] / cfg["r"]
f32 = lambda b: struct.unpack(f"<{len(b) // 4}f", b)
assert set(merged) == set(base), set(merged) ^ set(base)
adapted = changed = 0
for name, (e, wb) in base.items():
    me, mb = merged[name]
    stem = "base_model.model." + name[:-len(".weight")]
    if stem + ".lora_A.weight" not in adapter:
        assert mb == wb, f"{name}: not adapted, yet changed"
        continue
    assert e["dtype"] == me["dtype"] == "F32", (name, e["dtype"])
    adapted += 1
    (ae, ab), (be, bb) = adapter[stem + ".lora_A.weight"], adapter[stem + ".lora_B.weight"]
    A, B, W = f32(ab), f32(bb), f32(wb)
    r, (o_n, i_n) = ae["shape"][0], e["shape"]
    want = []
    for o in range(o_n):
        for i in range(i_n):
            acc = 0.0
            for k in range(r):
                acc += B[o * r + k] * A[k * i_n + i]
            d = s * acc
            want.append(W[o * i_n + i] if d == 0 else W[o * i_n + i] + d)
    assert mb == struct.pack(f"<{len(want)}f", *want), f"{name}: merged weights differ from W + s*B*A"
    changed += mb != wb
assert adapted == 2 * (4 + 5 * 3), adapted
assert changed == adapted, (changed, adapted)
print(f"v4 merge: {adapted} adapted, {changed} changed")
PY

# 3. The MTP loss trains the MTP block, which [lora] freezes: refused.
if "$BIN" rl --config "$T/rl.toml" --out "$T/mtp" --set train.mtp_loss_coef=0.3 > "$T/e1" 2>&1; then
  fail "[lora] with the MTP loss was accepted"
fi
grep -q "mtp_loss_coef" "$T/e1" || { cat "$T/e1"; fail "no reason given for the MTP loss"; }
echo "lora_v4_cli: OK"
