#!/usr/bin/env bash
# lockstep reward --type python: a verl-style file scored over a JSONL file
# with two workers (per-line verdicts in order, extra keys summarised, an
# exception and a bad return as failures, print() harmless), and start-up
# errors that stop the run with file:line and exit code 2.
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=()
[ -x /usr/bin/python3 ] && PY=(--python /usr/bin/python3)  # Debian's: fast start-up

cat > "$T/my_reward.py" <<'PY'
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    print("scoring", solution_str)  # goes to stderr, not into the protocol
    if solution_str == "boom":
        raise ValueError("boom in the reward")
    if solution_str == "text":
        return "not a number"
    n = int(solution_str)
    return {"score": n * 2 + (10 if data_source == "src" else 0), "acc": n == int(ground_truth), "n": n}
PY
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
with open(f"{t}/in.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"response": str(i), "label": str(i % 4), "metadata": {"data_source": "src" if i % 2 else "x"}}) + "\n")
    f.write(json.dumps({"response": "boom", "label": "1"}) + "\n")
    f.write(json.dumps({"response": "text", "label": "1"}) + "\n")
PY
cd "$T"
"$BIN" reward --type python --path my_reward.py --workers 2 "${PY[@]}" --input in.jsonl --output out.jsonl \
  > sum.txt 2> err.txt || { cat sum.txt err.txt; exit 1; }
grep -q "^n: *42" sum.txt
grep -q "failures: *2 (bad_return: 1, python: 1)" sum.txt || { cat sum.txt; exit 1; }
grep -q "reward/extra/n: 19.5000 (mean over 40)" sum.txt || { cat sum.txt; exit 1; }
grep -q "ValueError: boom in the reward" err.txt  # the traceback is logged
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("out.jsonl")]
assert len(rows) == 42
for i, r in enumerate(rows[:40]):  # each verdict belongs to its line
    assert r["reward"] == i * 2 + (10 if i % 2 else 0), (i, r)
    assert r["correct"] == (i == i % 4), (i, r)
assert rows[40]["reward"] is None and rows[40]["failure"] == "python: ValueError: boom in the reward", rows[40]
assert rows[41]["failure"].startswith("bad_return: compute_score (my_reward.py:1) returned str"), rows[41]
PY

# Start-up errors: exit code 2, nothing written, file:line in the message.
printf 'import os\ndef compute_score(data_source, solution_str\n' > broken.py
rc=0
"$BIN" reward --type python --path broken.py "${PY[@]}" --input in.jsonl --output bad.jsonl 2> err.txt || rc=$?
[ "$rc" = 2 ] || { cat err.txt; echo "syntax error: exit code $rc, expected 2"; exit 1; }
grep -q "broken.py:2: SyntaxError" err.txt || { cat err.txt; exit 1; }
[ ! -e bad.jsonl ]
rc=0
"$BIN" reward --type python --path my_reward.py --function score "${PY[@]}" --input in.jsonl --output bad.jsonl \
  2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "my_reward.py: no function 'score'" err.txt || { cat err.txt; exit 1; }
rc=0
"$BIN" reward --type python --path my_reward.py --python no-such-python3 --input in.jsonl --output bad.jsonl \
  2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "python interpreter 'no-such-python3' not found" err.txt || { cat err.txt; exit 1; }
echo OK
