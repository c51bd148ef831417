#!/usr/bin/env bash
# DeepSeek-V4 with --device interpret (the GPU kernel sources run on the CPU
# by the emulator) against the CPU kernels, on the micro V4 model of
# tests/common/v4_micro_model.toml written by `lockstep init --dtype fp8` with
# MXFP4 routed experts, the policy in fp8 (the experts multiplied as MXFP4):
#  1. `score --device interpret` gives the CPU's logprob, entropy and MTP
#     logprob bits;
#  2. `generate --device interpret` gives the CPU run's tokens and logprobs,
#     and `score` on the CPU gives every logprob back;
#  3. `sft` with the indexer and MTP losses and `--set model.device=interpret`
#     writes the CPU run's metrics and checkpoint bytes (its indexer and MTP
#     tensors differ from those of the same run without these losses);
#  4. a 2-step `rl` (GRPO) on the interpret device: the CPU run's metrics and
#     checkpoint bytes, every rollout logprob equal to the trainer's (gap 0);
#     then --resume for a third step: the CPU's checkpoint bytes again;
#  5. the same model at f32 and at bf16: `score` and a 2-step `rl` give the
#     CPU's output and checkpoint bytes, with gap 0.
# Every command runs strict (the host cannot touch device memory).
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LOCKSTEP_THREADS=2
fail() { echo "FAIL: $*"; exit 1; }

cp "$SRC/tests/common/v4_micro_model.toml" "$T/model.toml"
"$BIN" init --config "$T/model.toml" --out "$T/model" --dtype fp8 --set 'model.expert_dtype="fp4"' \
  > "$T/init.log" 2>&1 || { cat "$T/init.log"; fail "init --dtype fp8 with MXFP4 experts"; }

python3 - "$T" <<'PY'
import json, random, sys
t = sys.argv[1]
random.seed(5)
with open(f"{t}/score_in.jsonl", "w") as f:
    for i in range(4):
        p = [random.randrange(1, 272) for _ in range(3 + 7 * i)]
        r = [random.randrange(1, 272) for _ in range(2 + 4 * i)]
        f.write(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n")
with open(f"{t}/p.jsonl", "w") as f:
    for p in ([5, 6, 7, 8], list(range(1, 24)), [40]):
        f.write(json.dumps({"prompt_ids": p}) + "\n")
with open(f"{t}/sft.jsonl", "w") as f:
    for a in range(16):
        f.write(json.dumps({"prompt": f"{a}+{(a * 7) % 10}=", "response": f"{a + (a * 7) % 10}"}) + "\n")
with open(f"{t}/train.jsonl", "w") as f:
    for a in range(1, 9):
        f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
PY

# 1. score.
for dev in cpu interpret; do
  "$BIN" score --model "$T/model" --input "$T/score_in.jsonl" --output "$T/score_$dev.jsonl" --entropy --mtp \
    --precision fp8 --device $dev > "$T/score_$dev.log" 2>&1 || { cat "$T/score_$dev.log"; fail "score --device $dev"; }
done
# 2. generate, then score on the CPU.
for dev in cpu interpret; do
  "$BIN" generate --model "$T/model" --input "$T/p.jsonl" --output "$T/gen_$dev.jsonl" --n 2 --max-new-tokens 8 \
    --temperature 0.9 --precision fp8 --max-prefill-chunk 5 --device $dev > "$T/gen_$dev.log" 2>&1 ||
    { cat "$T/gen_$dev.log"; fail "generate --device $dev"; }
done
"$BIN" score --model "$T/model" --input "$T/gen_interpret.jsonl" --output "$T/gen_scored.jsonl" --temperature 0.9 \
  --precision fp8 > "$T/gen_score.log" 2>&1 || { cat "$T/gen_score.log"; fail "score of the generated samples"; }
python3 - "$T" <<'PY'
import json, struct, sys
t = sys.argv[1]
load = lambda p: [json.loads(l) for l in open(f"{t}/{p}")]
bits = lambda xs: [struct.unpack("<I", struct.pack("<f", x))[0] for x in xs]
cpu, dev = load("score_cpu.jsonl"), load("score_interpret.jsonl")
assert len(cpu) == len(dev) == 4
for a, b in zip(cpu, dev):
    assert bits(a["logprobs"]) == bits(b["logprobs"]), "score --device interpret differs from the CPU"
    assert bits(a["entropy"]) == bits(b["entropy"]), "score --device interpret: entropy differs"
    assert len(a["mtp_logprobs"]) == len(a["logprobs"]) - 1 > 0, "score --mtp: no MTP logprobs"
    assert bits(a["mtp_logprobs"]) == bits(b["mtp_logprobs"]), "score --mtp --device interpret differs"
g_cpu, g_dev, s = load("gen_cpu.jsonl"), load("gen_interpret.jsonl"), load("gen_scored.jsonl")
assert len(g_cpu) == len(g_dev) == len(s) == 6
n = 0
for a, b, c in zip(g_cpu, g_dev, s):
    assert a["response_ids"] == b["response_ids"], "generate --device interpret: other tokens than the CPU"
    assert len(b["logprobs"]) == len(b["response_ids"]) > 0
    assert bits(a["logprobs"]) == bits(b["logprobs"]), "generate --device interpret: logprobs differ from the CPU"
    assert bits(b["logprobs"]) == bits(c["logprobs"]), "generate --device interpret vs score on the CPU differ"
    n += len(b["logprobs"])
print(f"v4 interpret vs CPU: {sum(len(a['logprobs']) for a in cpu)} scored and {n} generated logprobs bitwise equal")
PY

# 3. SFT with the indexer loss.
cat > "$T/sft.toml" <<TOML
[model]
path = "$T/model"
precision = "fp8"

[data]
train_file = "$T/sft.jsonl"
apply_chat_template = false

[train]
steps = 2
batch_size = 4
lr = 3e-3
micro_batch_tokens = 64
seed = 1
save_interval = 2
indexer_loss_coef = 0.5
mtp_loss_coef = 0.3
TOML
# 4. RL, 2 GRPO steps.
cat > "$T/rl.toml" <<TOML
[model]
path = "$T/model"
precision = "fp8"

[data]
train_file = "$T/train.jsonl"
apply_chat_template = false

[rollout]
batch_size = 2
n = 2
temperature = 1.0
max_new_tokens = 5

[train]
steps = 2
lr = 1e-3
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
TOML
for cmd in sft rl; do
  for dev in cpu interpret; do
    "$BIN" $cmd --config "$T/$cmd.toml" --out "$T/${cmd}_$dev" --set model.device=$dev > "$T/${cmd}_$dev.log" 2>&1 ||
      { cat "$T/${cmd}_$dev.log"; fail "$cmd with model.device=$dev"; }
  done
  cmp "$T/${cmd}_cpu/checkpoints/step_2/model.safetensors" "$T/${cmd}_interpret/checkpoints/step_2/model.safetensors" ||
    fail "$cmd: the interpret device's checkpoint differs from the CPU's"
done
"$BIN" sft --config "$T/sft.toml" --out "$T/sft_noidx" --set model.device=interpret \
  --set train.indexer_loss_coef=0 --set train.mtp_loss_coef=0 > "$T/sft_noidx.log" 2>&1 || { cat "$T/sft_noidx.log"; fail "sft without the indexer loss"; }
python3 - "$T" <<'PY'
import glob, json, struct, sys
t = sys.argv[1]
def load(path):
    out = []
    for line in open(path):
        m = json.loads(line)
        out.append({k: v for k, v in m.items()
                    if not k.startswith("perf/") and "time" not in k and not k.endswith("per_s")})
    return out
for cmd in ("sft", "rl"):
    a, b = load(f"{t}/{cmd}_cpu/metrics.jsonl"), load(f"{t}/{cmd}_interpret/metrics.jsonl")
    assert len(a) == 2 and a == b, f"{cmd}: --device interpret metrics differ from the CPU's"
rl = load(f"{t}/rl_interpret/metrics.jsonl")
for m in rl:
    assert m["train/train_rollout_logprob_abs_diff"] == 0, m
    assert m["train/train_rollout_logprob_bitwise_equal_frac"] == 1, m
# The indexer loss reached the indexer: its tensors end elsewhere than in
# the same run without it.
def tensors(d):
    out = {}
    for f in sorted(glob.glob(d + "/*.safetensors")):
        b = open(f, "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        h.pop("__metadata__", None)
        for k, v in h.items():
            s, e = v["data_offsets"]
            out[k] = b[8 + n + s:8 + n + e]
    return out
with_loss = tensors(f"{t}/sft_interpret/checkpoints/step_2")
without = tensors(f"{t}/sft_noidx/checkpoints/step_2")
names = [k for k in with_loss if "attn.indexer." in k]
assert names and all(with_loss[k] != without[k] for k in names), "the indexer loss left the indexer unchanged"
# The MTP loss reached the MTP block (without it the block is not run).
mtp = [k for k in with_loss if k.startswith("mtp.")]
assert mtp and any(with_loss[k] != without[k] for k in mtp), "the MTP loss left the MTP block unchanged"
print("v4 sft and rl on the interpret device: the CPU's metrics and checkpoint bytes, rollout gap 0")
PY
# --resume of the 2-step GRPO run for a third step, on each device.
for dev in cpu interpret; do
  "$BIN" rl --config "$T/rl.toml" --out "$T/rl_$dev" --set model.device=$dev --resume --set train.steps=3 \
    > "$T/rl_resume_$dev.log" 2>&1 || { cat "$T/rl_resume_$dev.log"; fail "rl --resume with model.device=$dev"; }
  grep -q "resumed from" "$T/rl_resume_$dev.log" || { cat "$T/rl_resume_$dev.log"; fail "rl on $dev did not resume"; }
done
[ "$(cat "$T/rl_interpret/checkpoints/latest")" = step_3 ] || fail "the resumed run did not end at step_3"
cmp "$T/rl_cpu/checkpoints/step_3/model.safetensors" "$T/rl_interpret/checkpoints/step_3/model.safetensors" ||
  fail "rl --resume: the interpret device's checkpoint differs from the CPU's"

# 5. The same model at f32 and bf16: score, and 2 GRPO steps, on both devices.
for prec in f32 bf16; do
  for dev in cpu interpret; do
    "$BIN" score --model "$T/model" --input "$T/score_in.jsonl" --output "$T/score_${prec}_$dev.jsonl" --entropy \
      --precision $prec --device $dev > "$T/score_${prec}_$dev.log" 2>&1 ||
      { cat "$T/score_${prec}_$dev.log"; fail "score --precision $prec --device $dev"; }
    "$BIN" rl --config "$T/rl.toml" --out "$T/rl_${prec}_$dev" --set model.device=$dev \
      --set "model.precision=\"$prec\"" > "$T/rl_${prec}_$dev.log" 2>&1 ||
      { cat "$T/rl_${prec}_$dev.log"; fail "rl at $prec with model.device=$dev"; }
  done
  cmp "$T/score_${prec}_cpu.jsonl" "$T/score_${prec}_interpret.jsonl" || fail "score at $prec: interpret differs"
  cmp "$T/rl_${prec}_cpu/checkpoints/step_2/model.safetensors" \
    "$T/rl_${prec}_interpret/checkpoints/step_2/model.safetensors" || fail "rl at $prec: interpret differs"
done
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
for prec in ("f32", "bf16"):
    rows = [json.loads(l) for l in open(f"{t}/rl_{prec}_interpret/metrics.jsonl")]
    assert len(rows) == 2, (prec, len(rows))
    for m in rows:
        assert m["train/train_rollout_logprob_abs_diff"] == 0, (prec, m)
# The precision reached the model: fp8 quantizes the activations, so its
# scores differ from f32's (the fp8 weights themselves are exact in bf16).
f32 = [json.loads(l)["logprobs"] for l in open(f"{t}/score_f32_cpu.jsonl")]
fp8 = [json.loads(l)["logprobs"] for l in open(f"{t}/score_cpu.jsonl")]
assert f32 != fp8, "f32 and fp8 scores are the same: the precision did not reach the model"
PY

echo "gpu interpret v4 CLI checks passed"
