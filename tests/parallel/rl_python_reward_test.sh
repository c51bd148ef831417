#!/usr/bin/env bash
# `lockstep rl` with a verl-style Python reward ([reward] type = "python"),
# the file found next to the config whatever the working directory:
#  1. one process: every training and eval sample is scored exactly once (the
#     reward file appends a line per call), the dict's extra keys are logged
#     as reward/extra/<key>;
#  2. 2 colocated trainers and 2 trainers + 1 rollout rank: the same number
#     of calls as one process (each sample scored once, not once per trainer
#     rank) and the same rollout metrics;
#  3. a reward file with a syntax error stops the job at start-up with file:line.
# usage: rl_python_reward_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"
source "$(dirname "$0")/rl_mpi_setup.sh"

# Each call appends one line (O_APPEND: lines from concurrent workers do not mix).
cat > "$T/count_reward.py" <<'PY'
import os

CALLS = os.environ["LS_TEST_CALLS"]

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(CALLS, "a") as f:
        f.write(f"{os.getpid()} {len(solution_str)}\n")
    digits = [c for c in solution_str if c.isdigit()]
    labels = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    ok = bool(digits) and digits[-1] in labels
    return {"score": 1.0 if ok else 0.0, "acc": ok, "has_digit": bool(digits)}
PY
sed -e 's/^type = "math"/type = "python"\npath = "count_reward.py"\nworkers = 1/' \
    -e '/^extractors = /d' -e '/^format_reward = /d' "$T/rl.toml" > "$T/py.toml"
grep -q 'type = "python"' "$T/py.toml" || fail "the [reward] section was not rewritten"
python_exe=python3
[ -x /usr/bin/python3 ] && python_exe=/usr/bin/python3  # fast start-up
sed -i "s|^workers = 1|workers = 1\npython = \"$python_exe\"|" "$T/py.toml"

run() {  # run NAME NP --set ...  (from / so that the reward path is resolved from the config's directory)
  local name=$1 np=$2
  shift 2
  : > "$T/$name.calls"
  if [ "$np" = 1 ]; then
    (cd / && LS_TEST_CALLS="$T/$name.calls" timeout -k 5 100 "$BIN" rl --config "$T/py.toml" --out "$T/$name" "$@") \
      > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name: the run failed"; }
  else
    (cd / && timeout -k 5 100 "${MPI[@]}" -x LS_TEST_CALLS="$T/$name.calls" -np "$np" "$BIN" rl \
      --config "$T/py.toml" --out "$T/$name" "$@") > "$T/$name.log" 2>&1 \
      || { cat "$T/$name.log"; fail "$name: the job failed"; }
  fi
}
run single 1
run d20 2 --set dist.trainer_ranks=2
run d21 3 --set dist.rollout_ranks=1

python3 - "$T" <<'PY'
import json, sys
import run_files
t = sys.argv[1]

def calls(run):
    with open(f"{t}/{run}.calls") as f:
        return [line.split() for line in f]

single = run_files.metrics(f"{t}/single")
# Samples scored by one process: training rollouts plus eval samples.
train = sum(m.get("rollout/num_samples", 0) for m in single)
evals = 0
for m in single:
    evals += m.get("eval/test/num_samples", 0)
n = len(calls("single"))
assert train > 0 and evals > 0, (train, evals)
assert n == train + evals, f"one process: {n} reward calls for {train} training + {evals} eval samples"
assert all("reward/extra/has_digit" in m and "reward/extra/acc" in m for m in single[1:]), single[1]
for run in ("d20", "d21"):
    c = calls(run)
    assert len(c) == n, f"{run}: {len(c)} reward calls, one process made {n} (each sample once)"
    ms = run_files.metrics(f"{t}/{run}")
    for a, b in zip(single[1:], ms[1:]):
        for k in ("rollout/reward_mean", "rollout/accuracy", "rollout/num_samples", "reward/extra/has_digit"):
            assert a[k] == b[k], (run, a["step"], k, a[k], b[k])
# Two trainer ranks each scored their share: calls came from two worker processes.
assert len({p for p, _ in calls("d20")}) == 2, "d20: the calls did not come from both trainer ranks"
print(f"reward calls: {n} ({train} training + {evals} eval samples), the same with 2 trainer ranks")
PY

printf 'def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return (\n' \
  > "$T/count_reward.py"
if (cd / && "$BIN" rl --config "$T/py.toml" --out "$T/bad" > "$T/bad.log" 2>&1); then
  fail "a reward file with a syntax error was accepted"
fi
grep -q "count_reward.py:2: SyntaxError" "$T/bad.log" || { cat "$T/bad.log"; fail "no file:line for the syntax error"; }
echo "OK"
