#!/usr/bin/env bash
# DeepSeek-V4 end to end on checkpoints lockstep did not write: the
# independent float64 numpy reference (tests/v4ref) writes official-layout
# directories (BF16, and FP8 + E8M0 scales with MXFP4 experts; sharded), and
#  1. `lockstep score` agrees with the reference's float64 forward to < 1e-3 in
#     every token logprob (300 tokens: both compressors and the indexer in play),
#     and `score --mtp` with the MTP block's logprobs;
#  2. `generate --precision P` then `score --precision P` give bitwise-equal
#     logprobs for P = f32, bf16, fp8 (aligned at every precision);
#  3. `check-alignment` reports a gap of exactly 0 aligned, and above 0 in fast
#     mode (rollout fp8, trainer f32), with 0 router and indexer disagreement under
#     --replay;
#  4. lockstep's own official-layout writer (`init --dtype fp8`, MXFP4 experts),
#     read back by the reference: the two still agree.
set -euo pipefail
BIN=$1
SRC=$2
PY=/usr/bin/python3  # Debian's python3, with python3-numpy
REF=$SRC/tests/v4ref/v4_reference.py
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

for preset in tiny small; do
  for fmt in bf16 fp8; do
    d=$T/${preset}_$fmt
    $PY "$REF" write "$d" --preset $preset --fmt $fmt --seed 4 >/dev/null
    $PY - "$d" "$T/in_${preset}_$fmt.jsonl" <<'PY'
import json, random, sys
d, out = sys.argv[1:]
V = json.load(open(d + "/config.json"))["vocab_size"]
rnd = random.Random(6)
t = [rnd.randrange(V) for _ in range(300)]
open(out, "w").write(json.dumps({"prompt_ids": t[:1], "response_ids": t[1:]}) + "\n")
open(out + ".tokens", "w").write(",".join(map(str, t)))
PY
    "$BIN" score --model "$d" --input "$T/in_${preset}_$fmt.jsonl" --output "$T/out.jsonl" --mtp 2>/dev/null
    $PY "$REF" logprobs "$d" --tokens "$(cat "$T/in_${preset}_$fmt.jsonl.tokens")" --mtp >"$T/ref.json"
    $PY - "$T/ref.json" "$T/out.jsonl" "${preset}_$fmt" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))
got = json.loads(open(sys.argv[2]).readline())
for key, n in (("logprobs", 299), ("mtp_logprobs", 298)):
    assert len(ref[key]) == len(got[key]) == n, (key, len(ref[key]), len(got[key]))
    worst = max(abs(a - b) for a, b in zip(ref[key], got[key]))
    print(f"{sys.argv[3]} {key}: max |lockstep - float64 reference| = {worst:.3g}")
    assert worst < 1e-3, worst
PY
  done
done

# 2. Rollout then trainer at every precision, on the FP8/MXFP4 checkpoint.
M=$T/small_fp8
printf '{"prompt_ids":[3,4,5,6,7]}\n{"prompt_ids":[9,8,7]}\n' >"$T/p.jsonl"
for prec in f32 bf16 fp8; do
  "$BIN" generate --model "$M" --input "$T/p.jsonl" --output "$T/g.jsonl" --n 3 --max-new-tokens 140 \
    --precision $prec 2>/dev/null
  "$BIN" score --model "$M" --input "$T/g.jsonl" --output "$T/s.jsonl" --precision $prec 2>/dev/null
  $PY - "$T/g.jsonl" "$T/s.jsonl" $prec <<'PY'
import json, sys
n = 0
for g, s in zip(open(sys.argv[1]), open(sys.argv[2])):
    a, b = json.loads(g)["logprobs"], json.loads(s)["logprobs"]
    assert a == b, "generate and score logprobs differ"
    n += len(a)
assert n > 200, n
print(f"{sys.argv[3]}: {n} logprobs bitwise equal")
PY
done

# 3. The gap: 0 aligned; above 0 in fast mode; replay removes router disagreement.
"$BIN" check-alignment --model "$M" --data "$T/p.jsonl" --precision fp8 --n 2 --max-new-tokens 140 \
  --json "$T/a.json" >/dev/null
"$BIN" check-alignment --model "$M" --data "$T/p.jsonl" --precision fp8 --trainer-precision f32 --n 2 \
  --max-new-tokens 140 --json "$T/f.json" >/dev/null
"$BIN" check-alignment --model "$M" --data "$T/p.jsonl" --precision fp8 --trainer-precision f32 --n 2 \
  --max-new-tokens 140 --replay --json "$T/r.json" >/dev/null
$PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
a, f, r = (json.load(open(f"{t}/{n}.json")) for n in "afr")
gap = "train/train_rollout_logprob_abs_diff"
assert a[gap] == 0 and a["train/train_rollout_logprob_bitwise_equal_frac"] == 1, a
assert f[gap] > 0, f
routers = [v for k, v in r.items() if "router" in k and "disagreement" in k and isinstance(v, (int, float))]
assert routers and all(v == 0 for v in routers), r
assert f["train/indexer_topk_disagreement"] > 0 and r["train/indexer_topk_disagreement"] == 0, (f, r)
print(f"gap aligned 0, fast {f[gap]:.3g}, replayed {r[gap]:.3g}")
PY

# 4. lockstep writes the official FP8/MXFP4 layout; the reference reads it.
"$BIN" init --config "$SRC/configs/bench/v4-tiny.toml" --out "$T/own" --dtype fp8 --no-tokenizer \
  --set 'model.expert_dtype="fp4"' --set model.vocab_size=512 --set model.init_std=0.05 >/dev/null
$PY - "$T/own" "$T/in_own.jsonl" <<'PY'
import json, random, struct, sys
d, out = sys.argv[1:]
f = open(d + "/model.safetensors", "rb")
header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
dtypes = {header[k]["dtype"] for k in header if k != "__metadata__"}
assert {"F8_E4M3", "F8_E8M0", "I8", "I64", "F32", "BF16"} <= dtypes, dtypes
assert header["layers.0.ffn.gate.tid2eid"]["dtype"] == "I64"
rnd = random.Random(8)
t = [rnd.randrange(512) for _ in range(200)]
open(out, "w").write(json.dumps({"prompt_ids": t[:1], "response_ids": t[1:]}) + "\n")
open(out + ".tokens", "w").write(",".join(map(str, t)))
PY
"$BIN" score --model "$T/own" --input "$T/in_own.jsonl" --output "$T/out.jsonl" --mtp 2>/dev/null
$PY "$REF" logprobs "$T/own" --tokens "$(cat "$T/in_own.jsonl.tokens")" --mtp >"$T/ref.json"
$PY - "$T/ref.json" "$T/out.jsonl" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))
got = json.loads(open(sys.argv[2]).readline())
for key in ("logprobs", "mtp_logprobs"):
    worst = max(abs(a - b) for a, b in zip(ref[key], got[key]))
    print(f"lockstep-written fp8 {key}: max |lockstep - float64 reference| = {worst:.3g}")
    assert len(ref[key]) == len(got[key]) > 190 and worst < 1e-3, worst
PY
