#!/usr/bin/env bash
# lockstep demo and lockstep rl from the command line:
#  1. configs/demo/rl.toml is the demo's RL config (`demo --print-config`), and
#     every shipped recipe and example passes `rl --check-config`;
#  2. a short demo is deterministic: two runs write the same metrics (timings
#     aside), a summary.json and a report, with a zero gap at every step;
#  3. `lockstep rl` killed with SIGKILL mid-run, then --resume: every metrics
#     line parses, each step appears once, and the run finishes with a
#     loadable final checkpoint.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" demo --print-config | diff - "$SRC/configs/demo/rl.toml"
for f in "$SRC"/configs/demo/*.toml "$SRC"/configs/recipes/*.toml "$SRC"/configs/examples/*.toml; do
  "$BIN" rl --check-config "$f" | grep -q ": OK"
done
if "$BIN" rl --check-config "$SRC/configs/demo/rl.toml" --set algo.eps_clip_c=0.5 2> "$T/err"; then
  echo "a bad key value was accepted"; exit 1
fi
grep -q "eps_clip_c" "$T/err"

short=(--sft-steps 40 --rl-steps 4 --threads 2 --set eval.interval=2 --set rollout.batch_size=8 --set eval.n=4)
"$BIN" demo --out "$T/a" "${short[@]}" > "$T/a.log" 2>&1 || { cat "$T/a.log"; exit 1; }
"$BIN" demo --out "$T/b" "${short[@]}" --threads 1 > "$T/b.log" 2>&1 || { cat "$T/b.log"; exit 1; }
grep -q "pass@8" "$T/a.log"
test -s "$T/a/report.html"
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
def load(run):
    out = []
    for line in open(f"{t}/{run}/metrics.jsonl"):
        m = json.loads(line)
        out.append({k: v for k, v in m.items() if not k.startswith("perf/") and not k.endswith("time_s")
                    and k != "eval/test/tokens_per_s" and k != "time"})
    return out
a, b = load("a"), load("b")
assert [m["step"] for m in a] == [0, 1, 2, 3, 4], [m["step"] for m in a]
assert a == b, "two demo runs with the same seed differ (1 vs 2 threads)"
for m in a[1:]:
    assert m["train/train_rollout_logprob_abs_diff_max"] == 0, m
s = json.load(open(f"{t}/a/summary.json"))
for part in ("before", "after"):
    for k in ("pass@1", "pass@8", "truncated_ratio", "response_len_mean"):
        assert k in s[part], (part, k)
assert s["train_rollout_logprob_abs_diff_max"] == 0
PY

# Bad input: a malformed JSONL line is named by file and line, nothing is written.
printf '{"prompt":"1+1=","label":"2"}\n{"prompt": oops\n' > "$T/bad.jsonl"
if "$BIN" rl --config "$T/a/config.toml" --out "$T/bad" --set data.train_file="\"$T/bad.jsonl\"" 2> "$T/bad.err"; then
  echo "a malformed training file was accepted"; exit 1
fi
grep -q "bad.jsonl:2" "$T/bad.err" || { cat "$T/bad.err"; exit 1; }
test ! -e "$T/bad"

# kill -9 during training, then --resume.
run="$T/rl"
"$BIN" rl --config "$T/a/config.toml" --out "$run" --set train.steps=40 --set train.save_interval=2 \
  --set rollout.batch_size=8 --set eval.interval=0 --set log.samples_interval=1 > "$T/rl1.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  if [ -f "$run/checkpoints/latest" ] && [ "$(cat "$run/checkpoints/latest")" != "step_2" ]; then break; fi
  sleep 0.1
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
test -f "$run/checkpoints/latest" || { cat "$T/rl1.log"; echo "no checkpoint before the kill"; exit 1; }
killed_at=$(cat "$run/checkpoints/latest")
"$BIN" rl --config "$T/a/config.toml" --out "$run" --resume --set train.steps=40 --set train.save_interval=2 \
  --set rollout.batch_size=8 --set eval.interval=0 --set log.samples_interval=1 > "$T/rl2.log" 2>&1 || { cat "$T/rl2.log"; exit 1; }
grep -q "resumed from" "$T/rl2.log"
test "$(cat "$run/checkpoints/latest")" = "step_40"
test -s "$run/checkpoints/step_40/model.safetensors"
python3 - "$run" "$killed_at" <<'PY'
import json, sys
run, killed = sys.argv[1], sys.argv[2]
steps = [json.loads(line)["step"] for line in open(f"{run}/metrics.jsonl")]
assert steps == list(range(0, 41)), (steps, killed)
PY
# A fresh run (no --resume) into that directory is refused before it writes
# anything: config.toml and metrics.jsonl stay as they were.
cp "$run/config.toml" "$T/config.before"
cp "$run/metrics.jsonl" "$T/metrics.before"
if "$BIN" rl --config "$T/a/config.toml" --out "$run" --set train.steps=3 > "$T/rl3.log" 2>&1; then
  echo "a fresh rl into a run directory was accepted"; exit 1
fi
grep -q "already holds a run" "$T/rl3.log" || { cat "$T/rl3.log"; echo "no clear error"; exit 1; }
cmp -s "$run/config.toml" "$T/config.before" || { echo "the refused run replaced config.toml"; exit 1; }
cmp -s "$run/metrics.jsonl" "$T/metrics.before" || { echo "the refused run changed metrics.jsonl"; exit 1; }
echo "ok (killed after $killed_at)"
