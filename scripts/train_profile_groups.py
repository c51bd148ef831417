"""Groups `perf script -F ip,sym` samples (with call chains) of a training run
into kernel families: each sample goes to the first family that a frame names,
walking from the sampled function towards main (so a GEMM micro-kernel counts
for the product that called it). Used by scripts/train-profile.sh."""
import collections
import re
import sys

# (family, pattern on a frame's function name); the first frame that matches
# any family decides, in the order the frames come (innermost first).
FAMILIES = [
    ("FMA peak measurement (not the step)", r"measure_fma_peak|fma_chains"),
    ("init (random weights)", r"init_params|Philox|__cos_fma|__ieee754_log_fma"),
    ("GEMM x.Wt (forward)", r"gemm_xwt|project_packed|xwt_"),
    ("GEMM dY.W (activation grads)", r"gemm_dyw"),
    ("GEMM dYt.X (weight grads)", r"gemm_dytx|project_dw"),
    ("attention backward", r"attention_backward|fused_item|accumulate_key_tile|dq_pass|dkv_pass"),
    ("attention forward", r"attention_forward|kv_cache_write"),
    ("log-probs and loss", r"token_logprob|logprob|log_softmax|cross_entropy"),
    ("MoE route, dispatch, combine", r"moe_|expert_dispatch|expert_return|select_topk"),
    ("norms", r"rmsnorm"),
    ("SwiGLU and gates", r"swiglu|vsilu|vsigmoid|backward_row"),
    ("RoPE", r"rope_|rotate_token"),
    ("optimizer (AdamW, grad norm, zeroing)", r"adamw|grad_norm|chunk_sums|Trainer::step|clip_"),
    ("embedding", r"embedding_"),
    ("residual adds, copies, zeroing", r"add_into|scatter_rows|join_qkv|split_qkv|zero|mem(set|move|cpy)"),
    ("thread pool (spinning, waking)", r"^lockstep::ThreadPool::|futex|sched_yield"),
]
# Tried only when no frame names a family: a pool thread's job has no caller
# above worker_loop, so its products are told apart by the micro-kernel alone
# (profile with --threads 1 to split them all).
FALLBACK = [
    ("GEMM dYt.X (weight grads)", r"micro_tile<.*ALayout\)1"),
    ("GEMM on a pool thread (x.Wt or dY.W)", r"micro_tile|pack_plain_panels|stage_row_panels|gemm_detail|run_range"),
]
COMPILED = [(name, re.compile(pat)) for name, pat in FAMILIES]
COMPILED_FALLBACK = [(name, re.compile(pat)) for name, pat in FALLBACK]
EXCLUDED = {"FMA peak measurement (not the step)", "init (random weights)"}


def family_of(frames):
    # The pool's own frames count only where the sample is in them (spinning):
    # below a job they are just the way into it.
    for rules in (COMPILED, COMPILED_FALLBACK):
        for i, f in enumerate(frames):
            for name, pat in rules:
                if pat.search(f) and (not name.startswith("thread pool") or i == 0):
                    return name
    return "other: " + (frames[0][:60] if frames else "?")


def main():
    counts = collections.Counter()
    frames = []
    for line in sys.stdin:
        line = line.strip()
        if not line:
            if frames:
                counts[family_of(frames)] += 1
            frames = []
            continue
        parts = line.split(None, 1)
        frames.append(parts[1] if len(parts) > 1 else parts[0])
    if frames:
        counts[family_of(frames)] += 1
    step = sum(n for k, n in counts.items() if k not in EXCLUDED)
    print()
    print("%-44s %8s %7s" % ("share of the training run (perf samples)", "samples", "%"))
    shown = 0.0
    for name, n in counts.most_common():
        if name in EXCLUDED:
            continue
        pct = 100.0 * n / max(step, 1)
        if name.startswith("other: ") and pct < 0.5:
            continue
        shown += pct
        print("%-44s %8d %6.1f%%" % (name, n, pct))
    print("%-44s %8s %6.1f%%" % ("other (each under 0.5%)", "", 100.0 - shown))
    print("excluded: %d samples of the peak measurement and the weights' init" %
          sum(counts[k] for k in EXCLUDED))


if __name__ == "__main__":
    main()
