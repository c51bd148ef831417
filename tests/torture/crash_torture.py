#!/usr/bin/env python3
"""Crash torture for `lockstep rl` and `lockstep sft`: SIGKILL at random moments, resume, compare bits.

For each configuration (rl in one process, rl under mpirun with expert
parallelism, sft in one process) on a tiny MoE model made with `lockstep init`:

1. an uninterrupted reference run, traced (LOCKSTEP_PAUSE_AT="*:0": every
   pause point it passes, see src/lockstep/base/pause_point.h), which gives
   how often each point is reached per step and how long a run takes;
2. rounds of: launch, SIGKILL the whole process tree, check the run
   directory, launch again with --resume, ... until the round's kill quota is
   spent or the run ends; then one last --resume to the end. A kill lands
   either at a random time, or at a pause point drawn at random (the N-th
   time the process reaches it: inside a checkpoint, a metrics line, a sample
   or eval file, the report), where the process waits for the kill. All
   draws come from one seeded random.Random, so a seed replays its plan
   (exactly, but for where the timed kills land and what follows from that).
3. after every kill: every JSON line parses (a torn last metrics line is
   allowed only right after a kill; resume must drop it), every safetensors
   header matches its file's size, every checkpoints/step_N is complete,
   `latest` names a complete one, every metrics step appears once and in
   order; at each round's end the final weights, optimizer state, trainer
   state, samples and eval files equal the reference run's bit for bit, and
   the metrics rows equal it but for timings.

Then the full-disk and read-only checks (unless --no-disk): a run directory on a tiny
tmpfs fills up mid-run (or, where nothing can be mounted, a file size limit
makes the writes fail), and a read-only run directory: the job must fail
with an error naming the file, and lose nothing already written (the last
checkpoint resumes to the reference's bits, every metrics row up to it stays).

usage: crash_torture.py --bin LOCKSTEP [--mpiexec MPIRUN] [--mode short|full] [--seed S]
                        [--configs rl,rl-ep,sft] [--kills N] [--no-disk] [--no-mount] [--keep DIR]
Exit status 0 when every check passed; prints a summary per configuration.
"""
import argparse
import collections
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid

# What a pause-point kill aims at: a kind of file (chosen first, by the
# weights below, so the rarely written ones are hit too), then one of the
# points reached while writing it. The detail of a hit (the file's path)
# names its kind.
KIND_WEIGHTS = {"checkpoint": 3, "metrics": 2, "samples": 1, "eval": 1, "report": 1, "config": 1}
FILE_KINDS = {
    "checkpoint": "/checkpoints/",  # shards, optimizer.bin, trainer_state.json, latest; step_N renames, pruning
    "metrics": "metrics.jsonl",  # a step's line (whole or half), the resume's rewrite
    "samples": "/samples/",
    "eval": "/eval/",
    "report": "report.html",
    "config": "config.toml",
}
# The points (base/pause_point.h): inside a temporary file being written; a
# whole temporary file not yet renamed over its target; a metrics line
# written, its step's checkpoint not yet; half a metrics line written;
# step_N in place with `latest` still naming the previous one; an old
# checkpoint moved aside and being removed.
POINTS = ("atomic.write", "atomic.rename", "metrics.line", "metrics.torn", "checkpoint.published",
          "checkpoint.discard")
TIMED_SHARE = 0.2  # of the kills land at a random time instead
STRIP_PREFIXES = ("perf/",)
STRIP_KEYS = ("time",)  # each line's wall-clock time
STRIP_SUBSTRINGS = ("time_s", "tokens_per_s")


class Failure(Exception):
    pass


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- set-up

MODEL_TOML = """[model]
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
"""


def rl_toml(work, steps):
    return f"""[model]
path = "{work}/model"

[data]
train_file = "{work}/train.jsonl"
eval_file = "{work}/test.jsonl"
apply_chat_template = false

[rollout]
batch_size = 4
n = 4
temperature = 1.0
max_new_tokens = 8

[train]
steps = {steps}
lr = 1e-3
micro_batch_tokens = 64
seed = 3
save_interval = 1
keep_last = 2

[algo]
advantage = "grpo"
loss_agg = "token-mean"
num_steps_per_rollout = 2

[reward]
type = "math"
extractors = ["last_number"]
format_reward = 0.5

[eval]
name = "test"
n = 2
max_new_tokens = 8
interval = 2

[log]
progress = false
samples_interval = 1
report_interval = 1

[dist]
timeout_s = 60
"""


def sft_toml(work, steps):
    return f"""[model]
path = "{work}/model"

[data]
train_file = "{work}/sft.jsonl"
apply_chat_template = false

[train]
steps = {steps}
batch_size = 8
lr = 1e-3
micro_batch_tokens = 32
seed = 1
save_interval = 1
keep_last = 2
"""


def setup(work, binary, steps):
    with open(f"{work}/model.toml", "w") as f:
        f.write(MODEL_TOML)
    run_checked([binary, "init", "--config", f"{work}/model.toml", "--out", f"{work}/model", "--threads", "1"],
                f"{work}/init.log")
    # Any single digit is a correct answer: a random model finds one now and
    # then, so the groups' rewards differ and the policy gradient is not zero.
    with open(f"{work}/train.jsonl", "w") as f:
        for a in range(1, 9):
            f.write(json.dumps({"prompt": f"{a}+{a % 3}=", "label": [str(d) for d in range(10)]}) + "\n")
    with open(f"{work}/test.jsonl", "w") as f:
        for a in range(1, 4):
            f.write(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n")
    with open(f"{work}/sft.jsonl", "w") as f:
        for a in range(40):
            b = (a * 7) % 10
            f.write(json.dumps({"prompt": f"{a}+{b}=", "response": f"{a + b}"}) + "\n")
    with open(f"{work}/rl.toml", "w") as f:
        f.write(rl_toml(work, steps["rl"]))
    with open(f"{work}/sft.toml", "w") as f:
        f.write(sft_toml(work, steps["sft"]))


def run_checked(argv, log_path):
    with open(log_path, "w") as out:
        rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise Failure(f"{' '.join(argv)} failed (rc {rc}):\n{open(log_path).read()[-3000:]}")


class Config:
    """One configuration: how to launch it, its steps, its first metrics step."""

    def __init__(self, name, command, toml, steps, first_step, np=1, sets=()):
        self.name, self.command, self.toml, self.steps = name, command, toml, steps
        self.first_step, self.np, self.sets = first_step, np, list(sets)

    def argv(self, args, run_dir, resume, extra_sets=()):
        argv = [args.bin, self.command, "--config", self.toml, "--out", run_dir]
        if resume:
            argv.append("--resume")
        for s in self.sets + list(extra_sets):
            argv += ["--set", s]
        if self.np > 1:
            argv = [args.mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", str(self.np),
                    "-x", "LOCKSTEP_THREADS", "-x", "LOCKSTEP_PAUSE_AT", "-x", "LOCKSTEP_PAUSE_NOTIFY",
                    "-x", "LOCKSTEP_TORTURE_TAG"] + argv
        return argv


# ---------------------------------------------------------------- processes

def processes_tagged(tag):
    """Pids of live processes whose environment holds LOCKSTEP_TORTURE_TAG=tag."""
    want = f"LOCKSTEP_TORTURE_TAG={tag}".encode()
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    with open(f"/proc/{p}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(p))
        except OSError:
            pass
    return out


def kill_tree(proc, tag):
    """SIGKILL the launched process, its process group and every process carrying
    its tag (MPI ranks included), and wait until none is left."""
    victims = set(processes_tagged(tag)) | {proc.pid}
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    deadline = time.time() + 20
    while processes_tagged(tag):
        if time.time() > deadline:
            raise Failure(f"processes survived SIGKILL: {processes_tagged(tag)}")
        for p in processes_tagged(tag):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    # Killed ranks are reparented and reaped by init: give it a moment, so the
    # next launch finds their pids gone (a zombie still holds its pid).
    deadline = time.time() + 5
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in victims):
        time.sleep(0.02)


class Launch:
    """One launch of a configuration, with an optional armed pause point."""

    def __init__(self, args, cfg, run_dir, resume, log_path, pause=None, extra_sets=(), preexec=None):
        self.tag = uuid.uuid4().hex
        self.notify = f"{log_path}.notify"
        if os.path.exists(self.notify):
            os.unlink(self.notify)
        # PMIX_MCA_gds=hash: PMIx (MPI start-up, also of one process) keeps its
        # data in memory rather than in shared-memory files, which the file
        # size limit of the full-disk fallback would break.
        env = dict(os.environ, LOCKSTEP_THREADS="1", LOCKSTEP_TORTURE_TAG=self.tag, PMIX_MCA_gds="hash",
                   LOCKSTEP_PAUSE_NOTIFY=self.notify, LOCKSTEP_PAUSE_AT=pause or "")
        self.log_path = log_path
        self.out = open(log_path, "w")
        self.start = time.time()
        self.proc = subprocess.Popen(cfg.argv(args, run_dir, resume, extra_sets), stdout=self.out,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=preexec)

    def notified(self):
        try:
            with open(self.notify) as f:
                return f.read()
        except OSError:
            return ""

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc, self.tag)
            raise Failure(f"{self.log_path}: no end within {timeout} s")
        self.out.close()
        return rc

    def log_tail(self):
        if not self.out.closed:
            self.out.flush()
        with open(self.log_path) as f:
            return f.read()[-3000:]


# ---------------------------------------------------------------- run directory checks

def parse_jsonl(path, allow_torn_tail):
    """The lines of a JSONL file, parsed; Failure for a line that does not parse,
    except (when allowed) a last line without its newline. Returns (rows, torn)."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    torn = False
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        if not allow_torn_tail:
            raise Failure(f"{path}: the last line has no newline (torn): {lines[-1][:80]!r}")
        lines.pop()
        torn = True
    rows = []
    for i, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            raise Failure(f"{path}:{i}: does not parse ({e}): {line[:80]!r}")
    return rows, torn


def check_safetensors(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise Failure(f"{path}: {size} bytes, no header length")
        n = struct.unpack("<Q", head)[0]
        if 8 + n > size:
            raise Failure(f"{path}: header of {n} bytes in a file of {size}")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise Failure(f"{path}: header does not parse: {e}")
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    end = 0
    for s, e in spans:
        if s != end or e < s:
            raise Failure(f"{path}: tensor data [{s}, {e}) does not follow {end}")
        end = e
    if 8 + n + end != size:
        raise Failure(f"{path}: header says {8 + n + end} bytes, the file has {size}")


def check_checkpoint(d):
    """A published checkpoint directory must be whole."""
    for f in ("config.json", "trainer_state.json", "optimizer.bin", "model.safetensors"):
        if not os.path.isfile(f"{d}/{f}"):
            raise Failure(f"{d}: incomplete checkpoint, no {f} (has {sorted(os.listdir(d))})")
    for f in ("config.json", "trainer_state.json"):
        try:
            with open(f"{d}/{f}") as fh:
                j = json.load(fh)
        except ValueError as e:
            raise Failure(f"{d}/{f}: does not parse: {e}")
    if j.get("step") != int(os.path.basename(d)[5:]):
        raise Failure(f"{d}/trainer_state.json: step {j.get('step')}")
    check_safetensors(f"{d}/model.safetensors")
    size = os.path.getsize(f"{d}/optimizer.bin")
    with open(f"{d}/optimizer.bin", "rb") as f:
        head = f.read(24)
    if len(head) < 24:
        raise Failure(f"{d}/optimizer.bin: {size} bytes, no header")
    n = struct.unpack("<q", head[16:24])[0]
    if size != 24 + 8 * n:
        raise Failure(f"{d}/optimizer.bin: {size} bytes for {n} parameters (want {24 + 8 * n})")


def check_run_dir(run, cfg, after_kill):
    """Everything a resume (or a reader) may find in the run directory.
    Returns (latest step or None, last metrics step, torn metrics tail, leftovers)."""
    leftovers = []
    ck = f"{run}/checkpoints"
    latest = None
    if os.path.isdir(ck):
        for name in sorted(os.listdir(ck)):
            p = f"{ck}/{name}"
            if name.startswith("step_") and name[5:].isdigit() and os.path.isdir(p):
                check_checkpoint(p)
            elif name != "latest":
                leftovers.append(f"checkpoints/{name}")
        if os.path.exists(f"{ck}/latest"):
            with open(f"{ck}/latest") as f:
                text = f.read()
            if not text.endswith("\n") or not text.strip().startswith("step_"):
                raise Failure(f"{ck}/latest: torn or wrong: {text!r}")
            target = f"{ck}/{text.strip()}"
            if not os.path.isdir(target):
                raise Failure(f"{ck}/latest names {text.strip()}, which does not exist")
            latest = int(text.strip()[5:])
    steps, torn = [], False
    if os.path.exists(f"{run}/metrics.jsonl"):
        rows, torn = parse_jsonl(f"{run}/metrics.jsonl", allow_torn_tail=after_kill)
        steps = [r["step"] for r in rows]
    want = list(range(cfg.first_step, cfg.first_step + len(steps)))
    if steps != want:
        raise Failure(f"{run}/metrics.jsonl: steps {steps}, want each step once in order {want}")
    if latest is not None and (not steps or steps[-1] < latest):
        raise Failure(f"{run}/metrics.jsonl: last step {steps[-1] if steps else None} before the checkpoint {latest}")
    for sub in ("samples", "eval"):
        if os.path.isdir(f"{run}/{sub}"):
            for name in sorted(os.listdir(f"{run}/{sub}")):
                if name.endswith(".jsonl"):
                    parse_jsonl(f"{run}/{sub}/{name}", allow_torn_tail=False)
                else:
                    leftovers.append(f"{sub}/{name}")
    if os.path.exists(f"{run}/report.html"):
        with open(f"{run}/report.html", "rb") as f:
            if not f.read().endswith(b"</html>\n"):
                raise Failure(f"{run}/report.html: torn (no closing </html>)")
    for name in os.listdir(run) if os.path.isdir(run) else []:
        if ".tmp" in name:
            leftovers.append(name)
    return latest, steps[-1] if steps else None, torn, leftovers


def stripped(rows):
    return [{k: v for k, v in r.items()
             if not k.startswith(STRIP_PREFIXES) and not any(s in k for s in STRIP_SUBSTRINGS)
             and k not in STRIP_KEYS} for r in rows]


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def compare_to_reference(run, ref, cfg):
    """The finished run against the uninterrupted one: bits of the final
    checkpoint, samples and eval files; metrics rows but for timings."""
    last = f"checkpoints/step_{cfg.steps}"
    for f in ("model.safetensors", "optimizer.bin", "trainer_state.json"):
        a, b = read_bytes(f"{run}/{last}/{f}"), read_bytes(f"{ref}/{last}/{f}")
        if a != b:
            raise Failure(f"{run}/{last}/{f} differs from the uninterrupted run's "
                          f"({hashlib.sha256(a).hexdigest()[:12]} vs {hashlib.sha256(b).hexdigest()[:12]})")
    for sub in ("samples", "eval"):
        names = sorted(os.listdir(f"{ref}/{sub}")) if os.path.isdir(f"{ref}/{sub}") else []
        got = sorted(n for n in os.listdir(f"{run}/{sub}") if n.endswith(".jsonl")) if names else []
        if names != got:
            raise Failure(f"{run}/{sub}: files {got}, the uninterrupted run has {names}")
        for n in names:
            if read_bytes(f"{run}/{sub}/{n}") != read_bytes(f"{ref}/{sub}/{n}"):
                raise Failure(f"{run}/{sub}/{n} differs from the uninterrupted run's")
    a = stripped(parse_jsonl(f"{run}/metrics.jsonl", False)[0])
    b = stripped(parse_jsonl(f"{ref}/metrics.jsonl", False)[0])
    if a != b:
        diff = next((x, y) for x, y in zip(a + [None] * len(b), b + [None] * len(a)) if x != y)
        raise Failure(f"{run}/metrics.jsonl differs from the uninterrupted run's (timings aside): {diff}")


# ---------------------------------------------------------------- torture

class Stats:
    def __init__(self):
        self.kills = 0
        self.phases = collections.Counter()
        self.resumes = 0
        self.rounds = 0
        self.identical = 0
        self.torn_tails = 0
        self.natural_ends = 0
        self.leftovers = 0


def kind_of(detail):
    for kind, text in FILE_KINDS.items():
        if text in detail:
            return kind
    return "other"


def reference_run(args, cfg, work):
    ref = f"{work}/{cfg.name}-ref"
    launch = Launch(args, cfg, ref, False, f"{ref}.log", pause="*:0")
    rc = launch.wait(args.timeout)
    if rc != 0:
        raise Failure(f"{cfg.name}: the reference run failed (rc {rc}):\n{launch.log_tail()}")
    seconds = time.time() - launch.start
    trace = [line.split(" ", 1) for line in launch.notified().splitlines()]
    hits = collections.Counter((p, kind_of(d)) for p, d in trace)
    # Reached only when armed (it splits the line): once per line.
    hits[("metrics.torn", "metrics")] = hits[("metrics.line", "metrics")]
    check_run_dir(ref, cfg, after_kill=False)
    return ref, seconds, hits


def plan_kill(rng, hits, steps_left, cfg, seconds):
    """A pause point where the kill lands ("POINT@FILE:N", N drawn within the
    next three steps' hits), or a time (seconds after the launch)."""
    kinds = sorted({k for (_, k), n in hits.items() if n > 0 and k in FILE_KINDS})
    if not kinds or rng.random() < TIMED_SHARE:  # no kinds: a binary without pause points
        # The start-up (loading, a resume's checks) is a good part of a tiny run.
        return None, rng.uniform(0.0, seconds * (0.3 + 0.7 * steps_left / cfg.steps))
    kind = rng.choices(kinds, [KIND_WEIGHTS[k] for k in kinds])[0]
    point = rng.choice([p for p in POINTS if hits.get((p, kind), 0) > 0])
    per_step = hits[(point, kind)] / cfg.steps
    n = rng.randint(1, max(1, round(per_step * min(steps_left, 3))))
    return f"{point}@{FILE_KINDS[kind]}:{n}", None


def one_launch(args, cfg, run, resume, rng, ref_info, stats, tag):
    """Launch (resuming if asked), kill as planned; returns True if the run ended by itself."""
    ref, seconds, hits = ref_info
    latest = check_run_dir(run, cfg, after_kill=True)[0] if os.path.isdir(run) else None
    steps_left = cfg.steps - (latest or 0)
    pause, at = plan_kill(rng, hits, steps_left, cfg, seconds)
    launch = Launch(args, cfg, run, resume, f"{run}.{tag}.log", pause=pause)
    if resume:
        stats.resumes += 1
    deadline = launch.start + args.timeout
    while True:
        rc = launch.proc.poll()
        if rc is not None:
            launch.out.close()
            if rc != 0:
                raise Failure(f"{cfg.name}: launch {tag} failed (rc {rc}):\n{launch.log_tail()}")
            stats.natural_ends += 1
            return True
        note = launch.notified() if pause else ""
        if note.endswith("\n"):
            point, detail = note.strip().split(" ", 1)
            stats.phases[f"{kind_of(detail)}/{point}"] += 1
            break
        if at is not None and time.time() - launch.start >= at:
            stats.phases["timed"] += 1
            break
        if time.time() > deadline:
            kill_tree(launch.proc, launch.tag)
            raise Failure(f"{cfg.name}: launch {tag} neither ended nor paused in {args.timeout} s")
        time.sleep(0.005)
    kill_tree(launch.proc, launch.tag)
    launch.out.close()
    stats.kills += 1
    _, _, torn, left = check_run_dir(run, cfg, after_kill=True)
    stats.torn_tails += int(torn)
    stats.leftovers = max(stats.leftovers, len(left))
    return False


def torture(args, cfg, work, rng):
    stats = Stats()
    ref_info = reference_run(args, cfg, work)
    per_run = ", ".join(f"{k}/{p} {n}" for (p, k), n in sorted(ref_info[2].items(), key=lambda x: (x[0][1], x[0][0])))
    log(f"[{cfg.name}] reference: {ref_info[1]:.1f} s; pause points reached per run: {per_run}")
    while stats.kills < args.kills:
        stats.rounds += 1
        run = f"{work}/{cfg.name}-r{stats.rounds}"
        quota = min(args.kills - stats.kills, args.kills_per_round)
        launches, ended = 0, False
        kills_before = stats.kills
        while stats.kills - kills_before < quota and not ended:
            ended = one_launch(args, cfg, run, launches > 0, rng, ref_info, stats, f"l{launches}")
            launches += 1
        if not ended:  # the quota is spent: resume once more, to the end
            launch = Launch(args, cfg, run, True, f"{run}.final.log")
            stats.resumes += 1
            rc = launch.wait(args.timeout)
            if rc != 0:
                raise Failure(f"{cfg.name}: the final resume failed (rc {rc}):\n{launch.log_tail()}")
        latest, last, _, left = check_run_dir(run, cfg, after_kill=False)
        if latest != cfg.steps or last != cfg.steps:
            raise Failure(f"{run}: ended with latest {latest}, last metrics step {last}; want {cfg.steps}")
        if left:
            raise Failure(f"{run}: a resumed run left what killed runs left behind: {left}")
        compare_to_reference(run, ref_info[0], cfg)
        stats.identical += 1
        log(f"[{cfg.name}] round {stats.rounds}: {stats.kills - kills_before} kills, {launches} launches, "
            f"bit-identical to the uninterrupted run")
        if not args.keep:
            shutil.rmtree(run)
    return stats, ref_info


# ---------------------------------------------------------------- full disk, read-only

def can_mount(work):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    d = f"{work}/mount-probe"
    os.makedirs(d, exist_ok=True)
    ok = subprocess.call(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    if ok:
        subprocess.call(["umount", d])
    return ok


def snapshot(run):
    out = {}
    for root, _, files in os.walk(run):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, run)] = hashlib.sha256(read_bytes(p)).hexdigest()
    return out


def expect_failure(launch, timeout, what, words):
    rc = launch.wait(timeout)
    text = open(launch.log_path).read()
    if rc == 0:
        raise Failure(f"{what}: the job succeeded:\n{text[-2000:]}")
    lines = [l for l in text.splitlines() if any(w in l for w in words)]
    if not lines:
        raise Failure(f"{what}: no error saying {words}:\n{text[-2000:]}")
    return lines[0].strip()


def named_file(line, run):
    """The error line names a file in the run directory."""
    return run in line or "/checkpoints/" in line or "metrics.jsonl" in line


def disk_checks(args, cfg, work, ref_info):
    """A run directory that fills up, and one that is read-only."""
    ref = ref_info[0]
    results = []
    mounted = not args.no_mount and can_mount(work)
    run = f"{work}/{cfg.name}-disk"
    os.makedirs(run, exist_ok=True)
    ck_bytes = sum(os.path.getsize(f"{ref}/checkpoints/step_{cfg.steps}/{f}")
                   for f in os.listdir(f"{ref}/checkpoints/step_{cfg.steps}"))
    try:
        if mounted:
            # Room for about 2.5 checkpoints: the third save runs out of space
            # (keep_last = 2 keeps two, the third is written before pruning).
            size = int(ck_bytes * 2.5) + 64 * 1024
            subprocess.check_call(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", run])
            launch = Launch(args, cfg, run, False, f"{run}.full.log")
            how = f"tmpfs of {size // 1024} KiB"
        else:
            # No mount: a file size limit (SIGXFSZ ignored, so write() fails
            # with EFBIG) below the model file's size.
            limit = os.path.getsize(f"{ref}/checkpoints/step_{cfg.steps}/model.safetensors") - 1

            def preexec():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            launch = Launch(args, cfg, run, False, f"{run}.full.log", preexec=preexec)
            how = f"file size limit of {limit} bytes"
        err = expect_failure(launch, args.timeout, f"{cfg.name} full disk",
                             ("No space left on device", "File too large"))
        if not named_file(err, run):
            raise Failure(f"{cfg.name} full disk: the error names no file: {err}")
        latest, last, torn, _ = check_run_dir(run, cfg, after_kill=True)
        # The rows a resume keeps: through the last checkpoint (none without one).
        kept_rows = [r for r in stripped(parse_jsonl(f"{run}/metrics.jsonl", True)[0]) if r["step"] <= (latest or -1)] \
            if os.path.exists(f"{run}/metrics.jsonl") else []
        results.append(f"full disk ({how}): {err[:160]}; latest step {latest}, metrics through {last}")
        if mounted:
            kept = snapshot(f"{run}/checkpoints/step_{latest}") if latest else {}
            # Read-only: the same directory, remounted.
            subprocess.check_call(["mount", "-o", "remount,ro", run])
            before = snapshot(run)
            launch = Launch(args, cfg, run, True, f"{run}.ro.log")
            err = expect_failure(launch, args.timeout, f"{cfg.name} read-only", ("Read-only file system",))
            if not named_file(err, run):
                raise Failure(f"{cfg.name} read-only: the error names no file: {err}")
            if snapshot(run) != before:
                raise Failure(f"{cfg.name} read-only: files changed")
            results.append(f"read-only: {err[:160]}; nothing changed")
            subprocess.check_call(["mount", "-o", "remount,rw,size=64m", run])
            if latest and snapshot(f"{run}/checkpoints/step_{latest}") != kept:
                raise Failure(f"{run}/checkpoints/step_{latest} changed")
        else:
            results.append("read-only: skipped (cannot mount here; root ignores file modes)")
        # Nothing lost: with room again the last checkpoint resumes to the reference's end.
        launch = Launch(args, cfg, run, True, f"{run}.resume.log")
        rc = launch.wait(args.timeout)
        if rc != 0:
            raise Failure(f"{cfg.name}: resume after the full disk failed (rc {rc}):\n{launch.log_tail()}")
        check_run_dir(run, cfg, after_kill=False)
        if stripped(parse_jsonl(f"{run}/metrics.jsonl", False)[0])[:len(kept_rows)] != kept_rows:
            raise Failure(f"{run}/metrics.jsonl: rows through step {latest} changed across the full disk")
        compare_to_reference(run, ref, cfg)
        results.append(f"resumed after the full disk: {len(kept_rows)} metrics rows kept, the end bit-identical "
                       "to the uninterrupted run")
    finally:
        if mounted:
            subprocess.call(["umount", "-l", run], stderr=subprocess.DEVNULL)
    return results


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the lockstep binary")
    ap.add_argument("--mpiexec", default=shutil.which("mpirun") or "", help="mpirun (for the rl-ep configuration)")
    ap.add_argument("--mode", choices=("short", "full"), default="short",
                    help="short: 5 kills per configuration; full: 30")
    ap.add_argument("--kills", type=int, help="kills per configuration (overrides --mode)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the kill plan")
    ap.add_argument("--configs", default="rl,rl-ep,sft", help="comma-separated: rl, rl-ep, sft")
    ap.add_argument("--no-disk", action="store_true", help="skip the full-disk and read-only checks")
    ap.add_argument("--no-mount", action="store_true",
                    help="full disk by a file size limit even where a tmpfs could be mounted")
    ap.add_argument("--timeout", type=float, default=240, help="seconds one launch may take")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary directory)")
    args = ap.parse_args()
    args.kills = args.kills or (5 if args.mode == "short" else 30)
    args.kills_per_round = 5 if args.mode == "short" else 10
    steps = {"rl": 4, "sft": 4} if args.mode == "short" else {"rl": 8, "sft": 8}
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="lockstep-torture-")
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)  # a fresh start: runs of an earlier call would be resumed
    os.makedirs(work, exist_ok=True)
    args.keep = bool(args.keep)
    rng = random.Random(args.seed)
    names = [c for c in args.configs.split(",") if c]
    configs = {
        "rl": Config("rl", "rl", f"{work}/rl.toml", steps["rl"], 0),
        "rl-ep": Config("rl-ep", "rl", f"{work}/rl.toml", steps["rl"], 0, np=2,
                        sets=["dist.trainer_ranks=2", "dist.expert_parallel=2"]),
        "sft": Config("sft", "sft", f"{work}/sft.toml", steps["sft"], 1),
    }
    if "rl-ep" in names and not args.mpiexec:
        log("rl-ep: no mpirun, skipped")
        names.remove("rl-ep")
    failed = False
    summary = []
    try:
        setup(work, args.bin, steps)
        for name in names:
            cfg = configs[name]
            t0 = time.time()
            try:
                stats, ref_info = torture(args, cfg, work, rng)
                disk = [] if args.no_disk else disk_checks(args, cfg, work, ref_info)
            except Failure as e:
                log(f"[{name}] FAIL: {e}")
                failed = True
                continue
            phases = ", ".join(f"{k} {v}" for k, v in sorted(stats.phases.items()))
            summary.append(f"{name}: {stats.kills} kills, {stats.resumes} resumes, {stats.rounds} rounds, "
                           f"{stats.identical}/{stats.rounds} bit-identical ends, {stats.natural_ends} launches "
                           f"ended before their kill, {stats.torn_tails} torn metrics tails (dropped on resume), "
                           f"up to {stats.leftovers} leftovers after a kill (temporaries, step_N.tmp/.old; none at the ends); "
                           f"{time.time() - t0:.0f} s")
            summary.append(f"  kills per phase: {phases}")
            summary += [f"  {d}" for d in disk]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    log(f"summary (seed {args.seed}, {args.kills} kills per configuration):")
    for line in summary:
        log(line)
    if failed:
        log("FAIL")
        return 1
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
