#!/usr/bin/env python3
"""lockstep against PyTorch eager: training and scoring at one model shape, same threads.

  scripts/pytorch/compare.py [--lockstep build/release/lockstep]
      [--config configs/bench/qwen3-0.6b.toml] [--seq-lens 512,1024,2048,4096]
      [--threads 2] [--mem-limit-gb 20] [--modes train,score] [--out DIR]
      [--python /usr/bin/python3]

For each sequence length T and mode, runs lockstep and then the PyTorch eager
baseline (qwen3_eager.py, an HF-style Qwen3 in PyTorch) on one sequence of T
random tokens, one after the other in this run, and prints a markdown table:
tokens/s of each, their ratio, and each one's peak RSS.
- train: `lockstep bench train --seq-len T --seqs 1 --steps 1` (and, where
  that does not fit, with --recompute) against forward + backward + AdamW in
  PyTorch. tokens/s over wall time, and over CPU time (x threads), which a
  machine shared with other work disturbs less.
- score: `lockstep score` on a model `lockstep init` wrote (its "scored ... in
  X s", the load excluded) against a no-grad forward with log-softmax.
Before any timing, both score one 64-token sequence on the weights `lockstep
init` wrote (the baseline loads them): their logprobs must agree to 1e-3.
A run whose resident memory passes --mem-limit-gb is stopped and reported as
"out of memory" (a watchdog reads /proc every 0.1 s), so a baseline that
would need more than the machine has does not take the machine down.
Ratios are only meaningful within one run (docs/benchmarks.md).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_watched(cmd, limit_bytes):
    """Runs cmd; returns (rc, output, peak_rss_bytes, killed_for_memory). The peak is
    the kernel's (wait4's ru_maxrss); /proc is polled only to stop a run over the limit."""
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        killed = False
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid != 0:
                break
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    rss = next((int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:")), 0)
            except (FileNotFoundError, ProcessLookupError):
                rss = 0
            if rss > limit_bytes and not killed:
                p.kill()
                killed = True
            time.sleep(0.1)
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        return p.returncode, log.read(), usage.ru_maxrss * 1024, killed


def lockstep_train(a, T, recompute):
    cmd = [a.lockstep, "bench", "train", "--config", a.config, "--seq-len", str(T), "--seqs", "1", "--steps", "1",
           "--threads", str(a.threads)] + (["--recompute"] if recompute else [])
    rc, out, peak, killed = run_watched(cmd, a.limit)
    if killed or rc != 0:
        return {"oom": killed, "error": None if killed else out[-400:], "peak": peak}
    # The speed table's row: model threads seq tokens/step tokens/s ... CPU use ...
    header = next(l for l in out.splitlines() if "tokens/s" in l and "CPU use" in l).split("  ")
    cols = [c.strip() for c in header if c.strip()]
    row = next(l for l in out.splitlines() if re.match(r"^\s*\S+\s+\d+\s+%d\s" % T, l)).split()
    tok_s = float(row[cols.index("tokens/s")])
    cpu_use = float(row[cols.index("CPU use")].rstrip("%")) / 100.0
    return {"oom": False, "tok_s": tok_s, "tok_per_cpu_s": tok_s / max(cpu_use, 1e-9), "peak": peak,
            "recompute": recompute}


def torch_run(a, mode, T):
    cmd = [a.python, str(HERE / "qwen3_eager.py"), mode, "--config", a.config, "--seq-len", str(T),
           "--threads", str(a.threads)]
    rc, out, peak, killed = run_watched(cmd, a.limit)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    r = json.loads(lines[-1]) if lines else {}
    if killed or r.get("oom"):
        return {"oom": True, "peak": peak}
    if rc != 0:
        return {"oom": False, "error": out[-400:], "peak": peak}
    return {"oom": False, "tok_s": r["tok_s"], "tok_per_cpu_s": r["tok_per_cpu_s"], "peak": peak}


def lockstep_score(a, model_dir, T, work):
    import random
    rng = random.Random(T)
    vocab = json.load(open(model_dir / "config.json"))["vocab_size"]
    inp = work / f"score_{T}.jsonl"
    with open(inp, "w") as f:
        f.write(json.dumps({"prompt_ids": [rng.randrange(vocab)],
                            "response_ids": [rng.randrange(vocab) for _ in range(T - 1)]}) + "\n")
    cmd = [a.lockstep, "score", "--model", str(model_dir), "--input", str(inp), "--output",
           str(work / f"scored_{T}.jsonl"), "--threads", str(a.threads)]
    rc, out, peak, killed = run_watched(cmd, a.limit)
    m = re.search(r"scored \d+ sequences \((\d+) tokens\) in ([0-9.e+-]+) s", out)
    if killed or rc != 0 or not m:
        return {"oom": killed, "error": None if killed else out[-400:], "peak": peak}
    return {"oom": False, "tok_s": int(m.group(1)) / float(m.group(2)), "peak": peak}


def same_model_check(a, model_dir, work):
    """The baseline must be the same model: both score a 64-token sequence on the
    weights lockstep init wrote, and their logprobs agree to 1e-3."""
    lockstep_score(a, model_dir, 64, work)
    out = subprocess.run([a.python, str(HERE / "qwen3_eager.py"), "check", "--model", str(model_dir), "--input",
                          str(work / "scored_64.jsonl"), "--threads", str(a.threads)],
                         check=True, capture_output=True, text=True).stdout
    diff = json.loads(out.strip().splitlines()[-1])["max_abs_diff"]
    print(f"same model: max |logprob(lockstep) - logprob(PyTorch)| = {diff:.3g} over 63 tokens")
    if not diff < 1e-3:
        sys.exit("the PyTorch baseline is not the model lockstep runs (difference over 1e-3): nothing timed")


def cell(r, key="tok_s"):
    if r.get("oom"):
        return "out of memory"
    if r.get("error"):
        return "failed"
    return f"{r[key]:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lockstep", default="build/release/lockstep")
    ap.add_argument("--config", default="configs/bench/qwen3-0.6b.toml")
    ap.add_argument("--seq-lens", default="512,1024,2048,4096")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mem-limit-gb", type=float, default=20.0)
    ap.add_argument("--modes", default="train,score")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the interpreter with torch (Debian's python3-torch lives in /usr/bin/python3's path)")
    ap.add_argument("--out", default=None, help="folder for the raw results (results.jsonl)")
    a = ap.parse_args()
    a.limit = int(a.mem_limit_gb * 1e9)
    modes = a.modes.split(",")
    if not set(modes) <= {"train", "score"}:
        sys.exit(f"--modes: train and/or score, got {a.modes}")
    lens = [int(x) for x in a.seq_lens.split(",")]
    out_dir = Path(a.out or tempfile.mkdtemp(prefix="lockstep-vs-torch-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        subprocess.run([a.lockstep, "init", "--config", a.config, "--out", str(model_dir), "--threads",
                        str(a.threads)], check=True, stdout=subprocess.DEVNULL)
        same_model_check(a, model_dir, work)
        for T in lens:
            if "train" in modes:
                ls = lockstep_train(a, T, False)
                if ls.get("oom") or ls.get("error"):
                    ls = lockstep_train(a, T, True)
                results.append({"mode": "train", "T": T, "lockstep": ls, "torch": torch_run(a, "train", T)})
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
            if "score" in modes:
                results.append({"mode": "score", "T": T, "lockstep": lockstep_score(a, model_dir, T, work),
                                "torch": torch_run(a, "score", T)})
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    with open(out_dir / "results.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(f"{Path(a.config).stem}, {a.threads} threads, memory limit {a.mem_limit_gb:g} GB\n")
    print("| mode | T | lockstep tok/s | PyTorch tok/s | ratio | lockstep tok/CPU-s | PyTorch tok/CPU-s "
          "| ratio per CPU-s | lockstep peak GB | PyTorch peak GB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ls, pt = r["lockstep"], r["torch"]
        ok = "tok_s" in ls and "tok_s" in pt
        ratio = f"{ls['tok_s'] / pt['tok_s']:.2f}x" if ok else "-"
        cpu_ok = ok and "tok_per_cpu_s" in ls and "tok_per_cpu_s" in pt
        cratio = f"{ls['tok_per_cpu_s'] / pt['tok_per_cpu_s']:.2f}x" if cpu_ok else "-"
        name = "lockstep" + (" (--recompute)" if ls.get("recompute") else "")
        print(f"| {r['mode']} | {r['T']} | {cell(ls)} | {cell(pt)} | {ratio} | "
              f"{cell(ls, 'tok_per_cpu_s') if 'tok_per_cpu_s' in ls else '-'} | "
              f"{cell(pt, 'tok_per_cpu_s') if 'tok_per_cpu_s' in pt else '-'} | {cratio} | "
              f"{ls['peak'] / 1e9:.2f} | {pt['peak'] / 1e9:.2f} |" + ("" if name == "lockstep" else f" {name}"))
    print(f"\nraw results: {out_dir / 'results.jsonl'}")


if __name__ == "__main__":
    main()
