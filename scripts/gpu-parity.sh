#!/usr/bin/env bash
# The end-to-end parity checks of a device against the CPU, through the
# lockstep binary (the device steps of scripts/gpu-check.sh; any device that
# --device takes, so `interpret` runs them here without a GPU):
#
#   scripts/gpu-parity.sh BIN DEVICE WORKDIR rl      the demo model: SFT warm-up
#       and 3 GRPO steps on the CPU and on DEVICE write the same metrics and
#       the same checkpoint bytes (WORKDIR/cpu, WORKDIR/DEVICE)
#   scripts/gpu-parity.sh BIN DEVICE WORKDIR score   on the CPU run's model:
#       `score --device DEVICE` gives the CPU's logprob and entropy bits;
#       `generate --device DEVICE` then `score` on the CPU: every logprob equal
#   scripts/gpu-parity.sh BIN DEVICE WORKDIR align   `check-alignment --device
#       DEVICE` (rollout on DEVICE, trainer on the CPU): every logprob equal
#
# `score` and `align` use the model the `rl` part trained (run it first).
# THREADS (default 4) sets --threads.
set -euo pipefail
BIN=$1 DEV=$2 W=$3 PART=$4
THREADS=${THREADS:-4}
mkdir -p "$W"

rl_part() {
  local short=(--sft-steps 4 --rl-steps 3 --threads "$THREADS" --set eval.interval=3 --set rollout.batch_size=4
    --set eval.n=1 --force)
  "$BIN" demo --out "$W/cpu" "${short[@]}" --device cpu >"$W/cpu.log" 2>&1 || { tail -50 "$W/cpu.log"; exit 1; }
  "$BIN" demo --out "$W/$DEV" "${short[@]}" --device "$DEV" >"$W/$DEV.log" 2>&1 || { tail -50 "$W/$DEV.log"; exit 1; }
  python3 - "$W/cpu" "$W/$DEV" <<'PY'
import json, sys
def load(path):
    return [{k: v for k, v in json.loads(l).items()
             if not k.startswith("perf/") and "time" not in k and not k.endswith("per_s")} for l in open(path)]
for f in ("metrics.jsonl", "sft/metrics.jsonl"):
    a, b = load(f"{sys.argv[1]}/{f}"), load(f"{sys.argv[2]}/{f}")
    assert len(a) > 0 and a == b, f"demo {f}: the device run's metrics differ from the CPU's"
print("demo metrics equal")
PY
  local n=0 f
  while IFS= read -r f; do
    cmp "$W/cpu/$f" "$W/$DEV/$f" || { echo "checkpoint $f differs on $DEV"; exit 1; }
    n=$((n + 1))
  done < <(cd "$W/cpu" && find . -name '*.safetensors' | sort)
  grep -q . < <(cd "$W/cpu" && find checkpoints -name '*.safetensors') || { echo "no RL checkpoint written"; exit 1; }
  echo "rl: $n checkpoint files bitwise equal on cpu and $DEV"
}

score_part() {
  local m=$W/cpu/model
  [ -d "$m" ] || { echo "no $m: run the rl part first"; exit 1; }
  python3 - "$W/score_in.jsonl" <<'PY'
import json, random, sys
random.seed(3)
with open(sys.argv[1], "w") as f:
    for i in range(6):
        p = [random.randrange(3, 60) for _ in range(3 + 7 * i)]
        r = [random.randrange(3, 60) for _ in range(2 + 5 * i)]
        f.write(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n")
PY
  printf '{"prompt_ids":[5,6,7,8]}\n{"prompt_ids":[9,10,11,12,13,14,15,16,17,18,19,20,21]}\n{"prompt_ids":[40]}\n' \
    >"$W/p.jsonl"
  "$BIN" score --model "$m" --input "$W/score_in.jsonl" --output "$W/s_cpu.jsonl" --entropy --threads "$THREADS"
  "$BIN" score --model "$m" --input "$W/score_in.jsonl" --output "$W/s_dev.jsonl" --entropy --threads "$THREADS" \
    --device "$DEV"
  "$BIN" generate --model "$m" --input "$W/p.jsonl" --output "$W/g.jsonl" --n 4 --max-new-tokens 24 \
    --temperature 0.9 --threads "$THREADS" --device "$DEV"
  "$BIN" score --model "$m" --input "$W/g.jsonl" --output "$W/gs.jsonl" --temperature 0.9 --threads "$THREADS"
  python3 - "$W" <<'PY'
import json, struct, sys
w = sys.argv[1]
load = lambda p: [json.loads(l) for l in open(f"{w}/{p}")]
bits = lambda xs: [struct.unpack("<I", struct.pack("<f", x))[0] for x in xs]
cpu, dev = load("s_cpu.jsonl"), load("s_dev.jsonl")
assert len(cpu) == len(dev) == 6
for a, b in zip(cpu, dev):
    assert bits(a["logprobs"]) == bits(b["logprobs"]), "score on the device differs from the CPU"
    assert bits(a["entropy"]) == bits(b["entropy"]), "entropy on the device differs from the CPU"
g, s = load("g.jsonl"), load("gs.jsonl")
assert len(g) == len(s) == 12
n = 0
for a, b in zip(g, s):
    assert len(a["logprobs"]) == len(a["response_ids"]) > 0
    assert bits(a["logprobs"]) == bits(b["logprobs"]), "generate on the device vs score on the CPU differ"
    n += len(a["logprobs"])
print(f"score: {sum(len(a['logprobs']) for a in cpu)} scored and {n} generated logprobs bitwise equal")
PY
}

align_part() {
  local m=$W/cpu/model
  [ -d "$m" ] || { echo "no $m: run the rl part first"; exit 1; }
  [ -f "$W/p.jsonl" ] || printf '{"prompt_ids":[5,6,7,8]}\n{"prompt_ids":[40,41]}\n' >"$W/p.jsonl"
  "$BIN" check-alignment --model "$m" --data "$W/p.jsonl" --n 4 --max-new-tokens 24 --threads "$THREADS" \
    --device "$DEV" --json "$W/align.json"
  python3 - "$W/align.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["train/train_rollout_logprob_abs_diff"] == 0, j
assert j["train/train_rollout_logprob_bitwise_equal_frac"] == 1, j
print("align: rollout on the device vs trainer on the CPU, every logprob equal")
PY
}

case $PART in
  rl) rl_part ;;
  score) score_part ;;
  align) align_part ;;
  *) echo "gpu-parity: unknown part '$PART' (rl, score or align)" >&2; exit 2 ;;
esac
