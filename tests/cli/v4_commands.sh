#!/usr/bin/env bash
# DeepSeek-V4 through every user command, one by one, on a micro V4 model
# (mHC streams, a hash-routed layer, a CSA layer with its indexer, an MTP
# block; tests/common/v4_micro_model.toml) made with `lockstep init`:
#  1. `lockstep sft` with the MTP loss: the loss falls, checkpoints load; with
#     [train] indexer_loss_coef the indexer's tensors train, without it they
#     keep the initial model's bytes;
#  2. `lockstep rl` (GRPO) from the SFT checkpoint: a gap of exactly 0 at every
#     step, the on-policy shortcut on;
#  3. `lockstep eval` on the RL checkpoint writes pass@k;
#  4. `lockstep generate` then `lockstep score` on it: bitwise-equal logprobs;
#  5. `lockstep serve` on it, real HTTP requests (/generate with return_logprob,
#     /v1/completions with logprobs): the server's logprobs equal `score`'s bits,
#     and /update_weights_from_disk loads the SFT checkpoint back;
#  6. `lockstep sft --resume` after a stop at step 2 ends with the weights of
#     the uninterrupted run;
#  7. `lockstep init --dtype fp8` with MXFP4 experts, then `check-alignment
#     --precision fp8`: aligned (experts multiplied as MXFP4 in both engines)
#     every logprob bitwise equal; against an f32 trainer a gap above 0.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
SERVER=""
trap '[ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$T"' EXIT
export LOCKSTEP_THREADS=2
fail() { echo "FAIL: $*"; exit 1; }

cp "$SRC/tests/common/v4_micro_model.toml" "$T/model.toml"
"$BIN" init --config "$T/model.toml" --out "$T/model" > "$T/init.log" 2>&1 || { cat "$T/init.log"; fail init; }

python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/sft.jsonl", "w") as f:
    for a in range(48):
        b = (a * 7) % 10
        f.write(json.dumps({"prompt": f"{a}+{b}=", "response": f"{a + b}"}) + "\n")
with open(f"{t}/train.jsonl", "w") as f:
    for a in range(1, 9):
        f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
with open(f"{t}/test.jsonl", "w") as f:
    for a in range(1, 4):
        f.write(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n")
PY
cat > "$T/sft.toml" <<TOML
[model]
path = "$T/model"

[data]
train_file = "$T/sft.jsonl"
apply_chat_template = false

[train]
steps = 6
batch_size = 8
lr = 3e-3
micro_batch_tokens = 64
seed = 1
save_interval = 2
mtp_loss_coef = 0.3
TOML

# 1. SFT with the MTP loss.
"$BIN" sft --config "$T/sft.toml" --out "$T/sft" > "$T/sft.log" 2>&1 || { cat "$T/sft.log"; fail "sft"; }
python3 - "$T" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1] + "/sft/metrics.jsonl")]
assert [m["step"] for m in ms] == [1, 2, 3, 4, 5, 6], [m["step"] for m in ms]
loss = [m["train/loss"] for m in ms]
assert loss[-1] < loss[0], loss
print("v4 sft loss", [round(x, 3) for x in loss])
PY

# 1b. The indexer loss ([train] indexer_loss_coef) trains the lightning
# indexer: its tensors move from the initial model's, which they keep without it.
"$BIN" sft --config "$T/sft.toml" --out "$T/sft-idx" --set train.steps=2 --set train.indexer_loss_coef=0.5 \
  > "$T/sft-idx.log" 2>&1 || { cat "$T/sft-idx.log"; fail "sft with the indexer loss"; }
python3 - "$T" <<'PY'
import glob, json, struct, sys
t = sys.argv[1]

def tensors(d):
    out = {}
    for f in sorted(glob.glob(d + "/*.safetensors")):
        b = open(f, "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        for k, v in h.items():
            if k != "__metadata__":
                s, e = v["data_offsets"]
                out[k] = b[8 + n + s:8 + n + e]
    return out

init = tensors(t + "/model")
plain, idx = tensors(t + "/sft/checkpoints/step_6"), tensors(t + "/sft-idx/checkpoints/step_2")
assert plain and idx, "no checkpoint read"
names = [k for k in init if "attn.indexer." in k]
assert names, "the micro V4 has no indexer tensors"
assert all(plain[k] == init[k] for k in names), "without the indexer loss the indexer moved"
moved = [k for k in names if idx[k] != init[k]]
assert len(moved) == len(names), ("indexer tensors the loss left alone", sorted(set(names) - set(moved)))
print(f"indexer loss: {len(moved)} indexer tensors trained; frozen without it")
PY

# 6. A run stopped after step 2 and resumed ends with the same weights.
"$BIN" sft --config "$T/sft.toml" --out "$T/sft-part" --set train.steps=2 > "$T/part.log" 2>&1 \
  || { cat "$T/part.log"; fail "sft part"; }
"$BIN" sft --config "$T/sft.toml" --out "$T/sft-part" --resume > "$T/resume.log" 2>&1 \
  || { cat "$T/resume.log"; fail "sft resume"; }
cmp -s "$T/sft/checkpoints/step_6/model.safetensors" "$T/sft-part/checkpoints/step_6/model.safetensors" \
  || fail "sft resumed after step 2 differs from the uninterrupted run"

# 2. RL from the SFT checkpoint: aligned, a gap of exactly 0.
cat > "$T/rl.toml" <<TOML
[model]
path = "$T/sft/checkpoints/step_6"

[data]
train_file = "$T/train.jsonl"
eval_file = "$T/test.jsonl"
apply_chat_template = false

[rollout]
batch_size = 4
n = 4
temperature = 1.0
max_new_tokens = 6

[train]
steps = 3
lr = 1e-3
micro_batch_tokens = 64
save_interval = 3

[algo]
advantage = "grpo"

[reward]
type = "math"

[eval]
interval = 3
n = 2
max_new_tokens = 6
TOML
"$BIN" rl --config "$T/rl.toml" --out "$T/rl" > "$T/rl.log" 2>&1 || { cat "$T/rl.log"; fail "rl"; }
python3 - "$T" <<'PY'
import json, sys
ms = [json.loads(l) for l in open(sys.argv[1] + "/rl/metrics.jsonl")]
steps = [m for m in ms if "train/train_rollout_logprob_abs_diff_max" in m]
assert len(steps) == 3, [m["step"] for m in ms]
for m in steps:
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, m
    assert m["train/on_policy_shortcut"] == 1, m
print("v4 rl: gap 0 at", len(steps), "steps")
PY
CKPT=$T/rl/checkpoints/step_3

# 3. eval.
"$BIN" eval --model "$CKPT" --data "$T/test.jsonl" --n 2 --max-new-tokens 6 --no-chat-template \
  --output "$T/eval.jsonl" > "$T/eval.log" 2>&1 || { cat "$T/eval.log"; fail "eval"; }
grep -q "pass@1" "$T/eval.log" || { cat "$T/eval.log"; fail "eval: no pass@1"; }

# 4. generate, then score the generated tokens.
printf '{"text":"3+4="}\n{"text":"12+5="}\n' > "$T/prompts.jsonl"
"$BIN" generate --model "$CKPT" --input "$T/prompts.jsonl" --output "$T/gen.jsonl" --n 2 --max-new-tokens 6 \
  > "$T/gen.log" 2>&1 || { cat "$T/gen.log"; fail "generate"; }
"$BIN" score --model "$CKPT" --input "$T/gen.jsonl" --output "$T/score.jsonl" > "$T/score.log" 2>&1 \
  || { cat "$T/score.log"; fail "score"; }
python3 - "$T" <<'PY'
import json, struct, sys
t = sys.argv[1]
bits = lambda xs: [struct.pack("<f", x) for x in xs]
gen = [json.loads(line) for line in open(f"{t}/gen.jsonl")]
sc = [json.loads(line) for line in open(f"{t}/score.jsonl")]
assert len(gen) == len(sc) == 4, (len(gen), len(sc))
for g, s in zip(gen, sc):
    assert bits(g["logprobs"]) == bits(s["logprobs"]), (g["logprobs"], s["logprobs"])
print("v4 generate == score bit for bit:", sum(len(g["logprobs"]) for g in gen), "tokens")
PY

# 5. serve, with real HTTP requests.
"$BIN" serve --model "$CKPT" --port 0 --threads 2 > "$T/serve.out" 2> "$T/serve.err" &
SERVER=$!
for _ in $(seq 1 100); do
  grep -q "listening on http://" "$T/serve.out" && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$T/serve.err"; fail "serve exited"; }
  sleep 0.1
done
URL=$(grep -o "http://[0-9.]*:[0-9]*" "$T/serve.out" | head -1)
[ -n "$URL" ] || { cat "$T/serve.err"; fail "no listening line"; }
python3 - "$URL" "$T" "$BIN" "$CKPT" "$T/sft/checkpoints/step_6" <<'PY'
import json, struct, subprocess, sys, urllib.request
url, t, binary, ckpt, sft = sys.argv[1:]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())
bits = lambda xs: [struct.pack("<f", x) for x in xs]
def score(prompt_ids, output_ids):
    with open(f"{t}/srv_in.jsonl", "w") as f:
        f.write(json.dumps({"prompt_ids": prompt_ids, "response_ids": output_ids}) + "\n")
    subprocess.run([binary, "score", "--model", ckpt, "--input", f"{t}/srv_in.jsonl", "--output",
                    f"{t}/srv_out.jsonl"], check=True, capture_output=True)
    return json.loads(open(f"{t}/srv_out.jsonl").readline())["logprobs"]
g = post("/generate", {"input_ids": [51, 43, 52, 61], "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "seed": 3}})
lp = [x[0] for x in g["meta_info"]["output_token_logprobs"]]
ids = [x[1] for x in g["meta_info"]["output_token_logprobs"]]
assert bits(lp) == bits(score([51, 43, 52, 61], ids)), "/generate logprobs differ from score"
c = post("/v1/completions", {"model": "default", "prompt": [51, 43, 52, 61], "max_tokens": 5,
                             "temperature": 0, "logprobs": 2})
assert len(c["choices"][0]["logprobs"]["token_logprobs"]) >= 1, c
u = post("/update_weights_from_disk", {"model_path": sft})
assert u.get("success", False), u
g2 = post("/generate", {"input_ids": [51, 43, 52, 61], "return_logprob": True,
                        "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
assert len(g2["meta_info"]["output_token_logprobs"]) >= 1, g2
print("v4 serve: /generate logprobs == score's bits; completions, weight update ok")
PY
kill "$SERVER"
wait "$SERVER" 2>/dev/null || true
SERVER=""

# 7. The official release's storage: fp8 blocks and MXFP4 experts.
"$BIN" init --config "$T/model.toml" --out "$T/fp4" --dtype fp8 --set 'model.expert_dtype="fp4"' \
  > "$T/init4.log" 2>&1 || { cat "$T/init4.log"; fail "init --dtype fp8 with MXFP4 experts"; }
echo '{"prompt_ids": [51, 43, 52, 61]}' > "$T/align.jsonl"
for trainer in fp8 f32; do
  "$BIN" check-alignment --model "$T/fp4" --data "$T/align.jsonl" --precision fp8 --trainer-precision $trainer \
    --n 4 --max-new-tokens 24 --json "$T/align_$trainer.json" > "$T/align_$trainer.log" 2>&1 \
    || { cat "$T/align_$trainer.log"; fail "check-alignment --precision fp8 --trainer-precision $trainer"; }
done
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
aligned = json.load(open(f"{t}/align_fp8.json"))
fast = json.load(open(f"{t}/align_f32.json"))
gap = "train/train_rollout_logprob_abs_diff"
assert aligned[gap] == 0 and aligned["train/train_rollout_logprob_bitwise_equal_frac"] == 1, aligned
assert fast[gap] > 0, fast
print(f"v4 MXFP4 experts: aligned gap 0, fast-mode gap {fast[gap]:.4g}")
PY
echo PASS
