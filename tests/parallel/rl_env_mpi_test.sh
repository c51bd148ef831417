#!/usr/bin/env bash
# Multi-turn `lockstep rl` ([rollout] env = "python", docs/agents.md) as an MPI
# job, against the same config run as one process:
#  1. one process: every episode calls reset once and step once per turn (the
#     environment appends a line per call); training and held-out episodes;
#  2. 2 colocated trainers and 2 trainers + 1 rollout rank: the same calls as
#     one process (each episode runs its environment once, not once per
#     trainer rank), the same rollout and eval metrics, a gap of exactly 0.
# usage: rl_env_mpi_test.sh MPIEXEC LOCKSTEP_BINARY
source "$(dirname "$0")/mpi_test_lib.sh"
source "$(dirname "$0")/rl_mpi_setup.sh"

# Two tool turns, then a reward from the last turn's length; every call
# appends "pid kind" (O_APPEND: lines from concurrent workers do not mix).
cat > "$T/count_env.py" <<'PY'
import os

CALLS = os.environ["LS_TEST_CALLS"]


def log(kind):
    with open(CALLS, "a") as f:
        f.write(f"{os.getpid()} {kind}\n")


class Env:
    def __init__(self):
        self.turn = 0

    def reset(self, sample):
        log("reset")
        return [{"role": "user", "content": sample["prompt"]}]

    def step(self, messages, completion):
        log("step")
        self.turn += 1
        if self.turn < 3:
            return {"observation": f"tool {self.turn}", "reward": None, "done": False}
        return {"observation": None, "reward": float(len(completion) % 3), "done": True}
PY
python_exe=python3
[ -x /usr/bin/python3 ] && python_exe=/usr/bin/python3  # fast start-up
sed -e "s|^\[rollout\]|[rollout]\nenv = \"python\"\nenv_path = \"count_env.py\"\nenv_workers = 1\nenv_python = \"$python_exe\"\nmax_turns = 4\nmax_total_tokens = 120|" \
    -e 's|^apply_chat_template = false|apply_chat_template = true|' "$T/rl.toml" > "$T/env.toml"
grep -q 'env = "python"' "$T/env.toml" || fail "the [rollout] section was not rewritten"

run() {  # run NAME NP --set ...
  local name=$1 np=$2
  shift 2
  : > "$T/$name.calls"
  if [ "$np" = 1 ]; then
    LS_TEST_CALLS="$T/$name.calls" timeout -k 5 100 "$BIN" rl --config "$T/env.toml" --out "$T/$name" "$@" \
      > "$T/$name.log" 2>&1 || { cat "$T/$name.log"; fail "$name: the run failed"; }
  else
    timeout -k 5 100 "${MPI[@]}" -x LS_TEST_CALLS="$T/$name.calls" -np "$np" "$BIN" rl \
      --config "$T/env.toml" --out "$T/$name" "$@" > "$T/$name.log" 2>&1 \
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
        return [line.split()[1] for line in f]

single = run_files.metrics(f"{t}/single")
episodes = sum(m.get("rollout/num_samples", 0) for m in single) + sum(m.get("eval/test/num_samples", 0) for m in single)
c = calls("single")
assert c.count("reset") == episodes, (c.count("reset"), episodes)
assert c.count("step") == 3 * episodes, (c.count("step"), episodes)
keys = ("rollout/reward_mean", "rollout/turns_mean", "rollout/num_samples", "rollout/env_failures",
        "rollout/response_len_mean", "eval/test/pass@1", "eval/test/turns_mean")
for m in single[1:]:
    assert m["rollout/turns_mean"] == 3.0 and m["rollout/env_failures"] == 0, m
    assert m["train/train_rollout_logprob_abs_diff"] == 0.0, m
for run in ("d20", "d21"):
    got = calls(run)
    assert sorted(got) == sorted(c), f"{run}: {len(got)} environment calls, one process made {len(c)}"
    ms = run_files.metrics(f"{t}/{run}")
    assert len(ms) == len(single), (run, len(ms), len(single))
    for a, b in zip(single, ms):
        for k in keys:
            assert a.get(k) == b.get(k), (run, a["step"], k, a.get(k), b.get(k))
        if a["step"] >= 1:
            assert b["train/train_rollout_logprob_abs_diff"] == 0.0, (run, b)
print(f"environment calls: {len(c)} for {episodes} episodes, the same with 2 trainer ranks and with a rollout rank")
PY
echo "OK"
