#!/usr/bin/env bash
# Resuming past a corrupt checkpoint, from the command line, on a tiny model:
#  1. one flipped bit in the latest checkpoint's weights: `rl --resume` says
#     which checkpoint is broken and why, falls back to the one before
#     (keep_last = 2, save_interval = 1), and ends with the bits of the run
#     that was never damaged;
#  2. `rl --resume-from step_N` resumes from exactly that checkpoint (the same
#     bits again); a corrupt one named so is an error, not a fallback;
#  3. `sft --resume-from N` likewise, and a flipped bit in optimizer.bin of the
#     latest checkpoint makes `sft --resume` fall back.
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

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
"$BIN" init --config "$T/model.toml" --out "$T/model" --threads 1 > "$T/init.log" 2>&1 || { cat "$T/init.log"; exit 1; }
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/train.jsonl", "w") as f:
    for a in range(1, 9):
        f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
with open(f"{t}/sft.jsonl", "w") as f:
    for a in range(16):
        f.write(json.dumps({"prompt": f"{a}+{(a * 7) % 10}=", "response": f"{a + (a * 7) % 10}"}) + "\n")
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
max_new_tokens = 8
[train]
steps = 4
lr = 1e-3
micro_batch_tokens = 64
seed = 3
save_interval = 1
keep_last = 2
[reward]
type = "math"
extractors = ["last_number"]
[log]
progress = false
TOML
cat > "$T/sft.toml" <<TOML
[model]
path = "$T/model"
[data]
train_file = "$T/sft.jsonl"
apply_chat_template = false
[train]
steps = 3
batch_size = 4
lr = 1e-3
micro_batch_tokens = 32
save_interval = 1
keep_last = 2
TOML

# Flips one bit in the middle of a tensor's data (or, with no tensor, of a file).
flip() {
  python3 - "$@" <<'PY'
import json, struct, sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
if len(sys.argv) > 2:
    n = struct.unpack("<Q", b[:8])[0]
    s, e = json.loads(b[8:8 + n])[sys.argv[2]]["data_offsets"]
    at = 8 + n + (s + e) // 2
else:
    at = len(b) // 2
b[at] ^= 0x08
open(path, "wb").write(bytes(b))
PY
}
same_end() {  # same bits as the undamaged run's final checkpoint
  for f in model.safetensors optimizer.bin trainer_state.json checksums.json; do
    cmp -s "$1/checkpoints/step_$3/$f" "$2/checkpoints/step_$3/$f" || { echo "$1: step_$3/$f differs from $2's"; exit 1; }
  done
}
tensor=model.layers.1.mlp.experts.2.up_proj.weight

# 1. rl: the latest checkpoint's weights corrupt -> back to step_3.
"$BIN" rl --config "$T/rl.toml" --out "$T/full" > "$T/full.log" 2>&1 || { cat "$T/full.log"; exit 1; }
"$BIN" rl --config "$T/rl.toml" --out "$T/rl" > "$T/rl1.log" 2>&1 || { cat "$T/rl1.log"; exit 1; }
ls "$T/rl/checkpoints" | tr '\n' ' ' | grep -q "^latest step_3 step_4 $" || { ls "$T/rl/checkpoints"; exit 1; }
flip "$T/rl/checkpoints/step_4/model.safetensors" "$tensor"
"$BIN" rl --config "$T/rl.toml" --out "$T/rl" --resume > "$T/rl2.log" 2>&1 || { cat "$T/rl2.log"; exit 1; }
for want in "checkpoint step_4 is corrupt or incomplete" "model.safetensors: tensor '$tensor' fails its checksum (file corrupt)" \
            "falling back to step_3" "resumed from $T/rl/checkpoints/step_3 (step 3)"; do
  grep -qF "$want" "$T/rl2.log" || { cat "$T/rl2.log"; echo "rl --resume did not say: $want"; exit 1; }
done
same_end "$T/rl" "$T/full" 4
python3 - "$T/rl" <<'PY'
import json, sys
steps = [json.loads(line)["step"] for line in open(f"{sys.argv[1]}/metrics.jsonl")]
assert steps == [1, 2, 3, 4], steps
PY

# 2. rl --resume-from: exactly the checkpoint named.
"$BIN" rl --config "$T/rl.toml" --out "$T/rl" --resume-from step_3 > "$T/rl3.log" 2>&1 || { cat "$T/rl3.log"; exit 1; }
grep -qF "resumed from $T/rl/checkpoints/step_3 (step 3)" "$T/rl3.log" || { cat "$T/rl3.log"; exit 1; }
same_end "$T/rl" "$T/full" 4
flip "$T/rl/checkpoints/step_3/optimizer.bin"
if "$BIN" rl --config "$T/rl.toml" --out "$T/rl" --resume-from step_3 > "$T/rl4.log" 2>&1; then
  cat "$T/rl4.log"; echo "rl resumed from a corrupt checkpoint named by --resume-from"; exit 1
fi
grep -qF "optimizer.bin: fails its checksum (file corrupt)" "$T/rl4.log" || { cat "$T/rl4.log"; exit 1; }
grep -qF -- "--resume-from step_3" "$T/rl4.log" || { cat "$T/rl4.log"; exit 1; }
flip "$T/rl/checkpoints/step_4/model.safetensors" "$tensor"
if "$BIN" rl --config "$T/rl.toml" --out "$T/rl" --resume > "$T/rl5.log" 2>&1; then
  cat "$T/rl5.log"; echo "rl resumed with no intact checkpoint"; exit 1
fi
for want in "no intact checkpoint" "step_4: " "step_3: "; do
  grep -qF "$want" "$T/rl5.log" || { cat "$T/rl5.log"; echo "missing: $want"; exit 1; }
done

# 3. sft: --resume-from N, and a fallback past a corrupt optimizer.bin.
"$BIN" sft --config "$T/sft.toml" --out "$T/sfull" > "$T/sfull.log" 2>&1 || { cat "$T/sfull.log"; exit 1; }
"$BIN" sft --config "$T/sft.toml" --out "$T/sft" > "$T/sft1.log" 2>&1 || { cat "$T/sft1.log"; exit 1; }
"$BIN" sft --config "$T/sft.toml" --out "$T/sft" --resume-from 2 > "$T/sft2.log" 2>&1 || { cat "$T/sft2.log"; exit 1; }
grep -qF "resumed from $T/sft/checkpoints/step_2 (step 2)" "$T/sft2.log" || { cat "$T/sft2.log"; exit 1; }
same_end "$T/sft" "$T/sfull" 3
flip "$T/sft/checkpoints/step_3/optimizer.bin"
"$BIN" sft --config "$T/sft.toml" --out "$T/sft" --resume > "$T/sft3.log" 2>&1 || { cat "$T/sft3.log"; exit 1; }
grep -qF "falling back to step_2" "$T/sft3.log" || { cat "$T/sft3.log"; exit 1; }
grep -qF "optimizer.bin: fails its checksum" "$T/sft3.log" || { cat "$T/sft3.log"; exit 1; }
same_end "$T/sft" "$T/sfull" 3
echo ok
