#!/usr/bin/env bash
# init -> generate -> score -> check-alignment on a model made by `lockstep init`:
# aligned mode gives identical logprobs from the engine and the trainer, and
# check-alignment reports a zero gap (exit 0), fast mode a positive one.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat > "$T/model.toml" <<'TOML'
[model]
vocab_size = 300
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 16
qk_norm = true
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 64
norm_topk_prob = true
max_position_embeddings = 512
init_std = 0.2
TOML
"$BIN" init --config "$T/model.toml" --out "$T/m" --seed 3 >/dev/null
printf '{"text":"2+2="}\n{"messages":[{"role":"user","content":"hello"}]}\n{"prompt_ids":[5,6,7,8]}\n' > "$T/p.jsonl"
"$BIN" generate --model "$T/m" --input "$T/p.jsonl" --output "$T/g.jsonl" --n 3 --max-new-tokens 12 --temperature 0.8 --threads 2 2>/dev/null
"$BIN" score --model "$T/m" --input "$T/g.jsonl" --output "$T/s.jsonl" --temperature 0.8 --threads 1 2>/dev/null
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
g = [json.loads(l) for l in open(f"{t}/g.jsonl")]
s = [json.loads(l) for l in open(f"{t}/s.jsonl")]
assert len(g) == 9 and len(s) == 9, (len(g), len(s))
for a, b in zip(g, s):
    assert a["logprobs"] == b["logprobs"], "rollout and trainer logprobs differ"
    assert len(a["logprobs"]) == len(a["response_ids"]) > 0
    assert a["finish_reason"] in ("stop", "length")
print("generate/score logprobs identical for", len(g), "samples")
PY
"$BIN" check-alignment --model "$T/m" --data "$T/p.jsonl" --n 4 --max-new-tokens 12 --json "$T/a.json" > "$T/a.txt"
grep -qx "OK: mean |dlogp| 0 <= 0" "$T/a.txt" || { cat "$T/a.txt"; exit 1; }  # numbers at their shortest
python3 -c "import json,sys; j=json.loads(open('$T/a.json').read()); assert j['train/train_rollout_logprob_abs_diff']==0 and j['train/train_rollout_logprob_bitwise_equal_frac']==1, j"
"$BIN" check-alignment --model "$T/m" --data "$T/p.jsonl" --precision bf16 --trainer-precision f32 --n 4 --max-new-tokens 12 --json "$T/b.json" > "$T/b.txt"
# Fast mode without --max-abs-diff: the gap is measured, no "<= inf".
grep -q "^OK: mean |dlogp| [0-9.e-]* (fast mode: measured, no limit" "$T/b.txt" || { cat "$T/b.txt"; exit 1; }
if grep -q "<= inf" "$T/b.txt"; then cat "$T/b.txt"; exit 1; fi
python3 -c "import json; j=json.loads(open('$T/b.json').read()); assert j['train/train_rollout_logprob_abs_diff']>0, j"
# Penalties change what is sampled, not the logprobs: still a zero gap, and a note says so.
out=$("$BIN" check-alignment --model "$T/m" --data "$T/p.jsonl" --n 2 --max-new-tokens 12 --repetition-penalty 1.5 \
  --frequency-penalty 0.5 --presence-penalty 0.5 --min-new-tokens 4 --json "$T/p.json")
echo "$out" | grep -q "change what is sampled, not the reported" || { echo "no penalty note: $out"; exit 1; }
python3 -c "import json; j=json.loads(open('$T/p.json').read()); assert j['train/train_rollout_logprob_bitwise_equal_frac']==1, j"
"$BIN" check-alignment --model "$T/m" --data "$T/p.jsonl" --n 2 --max-new-tokens 4 | grep -q "change what is sampled" &&
  { echo "penalty note without penalties"; exit 1; }
set +e
out=$("$BIN" check-alignment --model "$T/m" --data "$T/p.jsonl" --frequency-penalty 3 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && echo "$out" | grep -q "frequency_penalty" || { echo "bad penalty: rc $rc: $out"; exit 1; }
# A fast-mode gap above an explicit limit fails with exit code 1.
set +e
"$BIN" check-alignment --model "$T/m" --data "$T/p.jsonl" --precision fp8 --trainer-precision f32 --n 4 --max-new-tokens 12 --max-abs-diff 1e-9 >/dev/null
rc=$?
set -e
[ $rc -eq 1 ] || { echo "expected exit 1 from check-alignment over the limit, got $rc"; exit 1; }
# Bad input: a broken JSONL line names the file and line; exit code 2.
printf '{"prompt_ids":[1,2]}\n{"prompt_ids": [3\n' > "$T/bad.jsonl"
set +e
out=$("$BIN" generate --model "$T/m" --input "$T/bad.jsonl" --output "$T/x.jsonl" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || { echo "expected exit 2, got $rc: $out"; exit 1; }
echo "$out" | grep -q "bad.jsonl:2" || { echo "error does not name the line: $out"; exit 1; }
[ ! -e "$T/x.jsonl" ] || { echo "output written despite the error"; exit 1; }
echo "alignment CLI checks passed"
