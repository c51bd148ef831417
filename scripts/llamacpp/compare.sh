#!/usr/bin/env bash
# Side-by-side decode throughput of lockstep's rollout engine and llama.cpp on
# the two benchmark models (configs/bench/moe-tiny.toml, moe-small.toml), on the
# CPU, same weights, same shapes, same thread count. See README.md here.
#
#   scripts/llamacpp/compare.sh
#
# Steps:
#   1. setup.sh: llama.cpp (node-llama-cpp@3.21.1's bundled source, CPU-only build).
#   2. Per model: `lockstep init --seed 1` (exactly the weights `lockstep bench`
#      builds in-process: both call init_params(layout, seed 1, std 0.02)), then
#      hf_to_gguf.py to f32 and half-precision (LLAMACPP_HALF) GGUFs, then check_logprobs.py:
#      the f32 GGUF must give every token the logprob `lockstep score` gives it
#      (max |dlogp| <= CHECK_TOL, else the script stops), and so must the same
#      shape initialised at init_std CHECK_STD (logits far from uniform); the half
#      GGUFs' gaps are reported only (their weights are rounded differently).
#   3. REPS rounds; in each, per model: lockstep f32, llama.cpp f32 (every
#      LLAMACPP_CONFIGS entry), lockstep bf16, llama.cpp half (every entry); the
#      order of the four alternates round by round. The machine is shared and
#      noisy: every figure is the median of its REPS runs.
#   4. summarize.py prints the table (and which llama.cpp config won each cell).
#
# What the two decode figures count (both exclude prompt processing):
#   lockstep `bench rollout` "decode tok/s" (src/lockstep/bench/rollout.cpp,
#     run_decode + drive): B requests of PROMPT_LEN random tokens, NEW_TOKENS
#     each, temperature 1, EOS ignored. The engine's first step prefills every
#     prompt and samples each sequence's first token; that step is excluded.
#     The figure is tokens / seconds over the "pure decode" steps only (every fed
#     token produced a token): NEW_TOKENS-1 steps of B tokens, at positions
#     PROMPT_LEN .. PROMPT_LEN+NEW_TOKENS-2, each step = forward of B tokens +
#     logits + sampling (softmax over V and a draw per sequence) + bookkeeping.
#   llama-batched-bench "S_TG t/s" (tools/batched-bench): pl sequences of -npp
#     random tokens are prefilled (T_PP, excluded), then -ntg steps, each one
#     llama_decode of pl tokens (one per sequence, random ids, logits for all pl
#     rows copied out) + llama_synchronize; S_TG = pl * ntg / T_TG. No sampling.
#   So -npp PROMPT_LEN -ntg NEW_TOKENS-1 feeds llama.cpp the same positions and
#   context lengths as lockstep's pure decode steps (16..46 for 16 + 32), B = pl.
#   lockstep's figure carries the sampling and scheduler cost on top; llama.cpp's
#   carries copying the logits out. Neither counts the prompt.
#   Precision: "f32" = lockstep aligned mode (f32 weights, f32 KV) vs llama.cpp
#   on f32 weights with an f32 KV cache; "bf16" = lockstep fast mode
#   (--precision bf16 --bf16-kv: bf16 projections, bf16 KV, f32 router/norms/
#   embedding) vs llama.cpp on f16 and on bf16 weights (LLAMACPP_HALF; a table
#   column each) with an f16 KV cache (f32 router and norms). bf16 is the
#   closer match, and on CPUs with AVX512-BF16 llama.cpp's faster half type.
#
# Settings (environment):
#   REPS (3), MODELS ("moe-tiny moe-small"), BATCHES (1,16,64), PROMPT_LEN (16),
#   NEW_TOKENS (32), THREADS (2), LOCKSTEP (build/release/lockstep),
#   LLAMACPP_CACHE (~/.cache/lockstep-llamacpp), WORK ($LLAMACPP_CACHE/compare:
#   models, GGUFs and the logs of every run, under runs/DATE-TIME),
#   LLAMACPP_HALF ("f16 bf16": the half-precision GGUFs tried, one or both),
#   LLAMACPP_F32_KV (f32), LLAMACPP_HALF_KV (f16): llama.cpp's KV cache types,
#   LLAMACPP_CONFIGS: the llama-batched-bench settings tried per cell, ';'-separated
#     (default "-fa off;-fa on;-fa off -kvu;-fa on -kvu"; -ub/-b only split the
#     prompt batch, so they matter to S_TG only when pl > -ub: add e.g.
#     "-fa on -ub 64 -b 64" to try them), the best median per cell is llama.cpp's figure,
#   CHECK_TOL (1e-3), CHECK_STD (0.1: init_std of the second, sharper check model),
#   SKIP_CHECK (0), SKIP_SETUP (0), RUN_TIMEOUT (1200 s per run),
#   PYTHON (a python3 with numpy).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export LLAMACPP_CACHE=${LLAMACPP_CACHE:-$HOME/.cache/lockstep-llamacpp}
REPS=${REPS:-3}
MODELS=${MODELS:-"moe-tiny moe-small"}
BATCHES=${BATCHES:-1,16,64}
PROMPT_LEN=${PROMPT_LEN:-16}
NEW_TOKENS=${NEW_TOKENS:-32}
THREADS=${THREADS:-2}
LOCKSTEP=${LOCKSTEP:-$ROOT/build/release/lockstep}
WORK=${WORK:-$LLAMACPP_CACHE/compare}
HALF=${LLAMACPP_HALF:-f16 bf16}
F32_KV=${LLAMACPP_F32_KV:-f32}
HALF_KV=${LLAMACPP_HALF_KV:-f16}
CONFIGS=${LLAMACPP_CONFIGS:-"-fa off;-fa on;-fa off -kvu;-fa on -kvu"}
CHECK_TOL=${CHECK_TOL:-1e-3}
CHECK_STD=${CHECK_STD:-0.1}
RUN_TIMEOUT=${RUN_TIMEOUT:-1200}
SEED=1  # bench_params' seed: the init'ed model is the benchmark's model

if [[ -z ${PYTHON:-} ]]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import numpy' 2>/dev/null; then PYTHON=$p; break; fi
  done
fi
[[ -n ${PYTHON:-} ]] || { echo "compare.sh: no python3 with numpy (apt-get install python3-numpy)" >&2; exit 2; }
[[ -x $LOCKSTEP ]] || { echo "compare.sh: $LOCKSTEP is missing (make build)" >&2; exit 2; }
for h in $HALF; do
  [[ $h == f16 || $h == bf16 ]] || { echo "compare.sh: LLAMACPP_HALF: f16 and/or bf16, not $h" >&2; exit 2; }
done

[[ ${SKIP_SETUP:-0} == 1 ]] || "$HERE/setup.sh"
BENCH=$LLAMACPP_CACHE/build/bin/llama-batched-bench
LOGPROBS=$LLAMACPP_CACHE/bin/logprobs
export PYTHONPATH=$LLAMACPP_CACHE/llama.cpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}

RUN=$WORK/runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN"
echo "== logs: $RUN"
{
  echo "llama.cpp: $(cat "$LLAMACPP_CACHE/VERSION" 2>/dev/null || echo '?')"
  echo "lockstep: $("$LOCKSTEP" info 2>/dev/null | grep -E '^lockstep|simd target' | tr -s ' ' | paste -sd';'); git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; threads $THREADS"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "reps $REPS, batches $BATCHES, prompt $PROMPT_LEN, new tokens $NEW_TOKENS, half $HALF, kv f32=$F32_KV half=$HALF_KV"
} | tee "$RUN/info.txt"

# 2. Models, GGUFs, correctness.
for m in $MODELS; do
  cfg=$ROOT/configs/bench/$m.toml
  d=$WORK/models/$m
  mkdir -p "$d"
  if [[ ! -f $d/hf/model.safetensors || $cfg -nt $d/hf/model.safetensors ]]; then
    rm -rf "$d/hf"
    "$LOCKSTEP" init --config "$cfg" --out "$d/hf" --seed "$SEED" --threads "$THREADS"
  fi
  for dt in f32 $HALF; do
    if [[ ! -f $d/$dt.gguf || $d/hf/model.safetensors -nt $d/$dt.gguf || $HERE/hf_to_gguf.py -nt $d/$dt.gguf ]]; then
      "$PYTHON" "$HERE/hf_to_gguf.py" "$d/hf" "$d/$dt.gguf.tmp" --dtype "$dt"
      mv "$d/$dt.gguf.tmp" "$d/$dt.gguf"
    fi
  done
  if [[ ${SKIP_CHECK:-0} != 1 ]]; then
    "$PYTHON" "$HERE/check_logprobs.py" --lockstep "$LOCKSTEP" --logprobs "$LOGPROBS" --model "$d/hf" \
      --gguf "$d/f32.gguf" --tol "$CHECK_TOL" --threads "$THREADS" --label "$m f32.gguf" | tee -a "$RUN/check.txt"
    # The benchmark's weights (std 0.02) give nearly uniform next-token distributions
    # (logprobs near -log V), a weaker test; the same shape at init_std CHECK_STD has
    # logprobs far from uniform. (A GGUF with q/k permuted the LLaMA way fails both:
    # max |dlogp| 0.32 on moe-tiny's benchmark weights, 5.7 at init_std 0.1; 8.7 on moe-small.)
    sharp=$d/sharp-std$CHECK_STD
    if [[ ! -f $sharp.gguf || $HERE/hf_to_gguf.py -nt $sharp.gguf || $cfg -nt $sharp.gguf ]]; then
      rm -rf "$sharp"
      "$LOCKSTEP" init --config "$cfg" --out "$sharp" --seed "$SEED" --threads "$THREADS" \
        --set "model.init_std=$CHECK_STD" >/dev/null
      "$PYTHON" "$HERE/hf_to_gguf.py" "$sharp" "$sharp.gguf" >/dev/null
    fi
    "$PYTHON" "$HERE/check_logprobs.py" --lockstep "$LOCKSTEP" --logprobs "$LOGPROBS" --model "$sharp" \
      --gguf "$sharp.gguf" --tol "$CHECK_TOL" --threads "$THREADS" \
      --label "$m f32.gguf at init_std $CHECK_STD" | tee -a "$RUN/check.txt"
    for h in $HALF; do
      "$PYTHON" "$HERE/check_logprobs.py" --lockstep "$LOCKSTEP" --logprobs "$LOGPROBS" --model "$d/hf" \
        --gguf "$d/$h.gguf" --kv "$HALF_KV" --tol 0 --threads "$THREADS" --label "$m $h.gguf" | tee -a "$RUN/check.txt"
    done
  fi
done

# 3. The runs.
lockstep_run() {  # model precision rep
  local extra=()
  [[ $2 == bf16 ]] && extra=(--precision bf16 --bf16-kv)
  [[ $2 == f32 ]] && extra=(--precision f32)
  # The prefill and GRPO workloads of `bench rollout` are cut to their minimum (1 x 16 tokens).
  timeout "$RUN_TIMEOUT" "$LOCKSTEP" bench rollout --config "$ROOT/configs/bench/$1.toml" --threads "$THREADS" \
    --batches "$BATCHES" --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" \
    --prefill-prompts 1 --prefill-len 16 --grpo-prompts 1 --grpo-samples 1 --grpo-prompt-len 16 \
    "${extra[@]}" >"$RUN/lockstep.$1.$2.r$3.txt" 2>&1 \
    || echo "   lockstep $1 $2 failed: $RUN/lockstep.$1.$2.r$3.txt"
}
llama_run() {  # model dtype rep
  local kv=$F32_KV c i=0 maxpl ctx
  [[ $2 != f32 ]] && kv=$HALF_KV
  maxpl=$(tr ',' '\n' <<<"$BATCHES" | sort -n | tail -1)
  ctx=$((maxpl * (PROMPT_LEN + NEW_TOKENS)))
  IFS=';' read -ra cs <<<"$CONFIGS"
  for c in "${cs[@]}"; do
    i=$((i + 1))
    local out=$RUN/llama.$1.$2.c$i.r$3.jsonl
    echo "$c" >"$RUN/llama.config.c$i"
    # shellcheck disable=SC2086
    timeout "$RUN_TIMEOUT" "$BENCH" -m "$WORK/models/$1/$2.gguf" -t "$THREADS" -tb "$THREADS" \
      -c "$ctx" -npp "$PROMPT_LEN" -ntg $((NEW_TOKENS - 1)) -npl "$BATCHES" \
      -ctk "$kv" -ctv "$kv" $c --output-format jsonl >"$out" 2>"$out.log" \
      || echo "   llama.cpp $1 $2 [$c] failed: $out.log"
  done
}
for ((r = 1; r <= REPS; r++)); do
  for m in $MODELS; do
    echo "== round $r/$REPS: $m ($(cut -d' ' -f1 /proc/loadavg) load)"
    if ((r % 2)); then
      lockstep_run "$m" f32 "$r"; llama_run "$m" f32 "$r"; lockstep_run "$m" bf16 "$r"
      for h in $HALF; do llama_run "$m" "$h" "$r"; done
    else
      for h in $HALF; do llama_run "$m" "$h" "$r"; done
      lockstep_run "$m" bf16 "$r"; llama_run "$m" f32 "$r"; lockstep_run "$m" f32 "$r"
    fi
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RUN/info.txt"

# 4. The table.
"$PYTHON" "$HERE/summarize.py" "$RUN" --models "$MODELS" --batches "$BATCHES" --half "$HALF" | tee "$RUN/table.md"
