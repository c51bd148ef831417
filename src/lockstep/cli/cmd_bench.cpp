// `lockstep bench train|rollout`: the training and rollout throughput
// benchmarks as a command, printing the same tables as bench/train_bench.cpp
// and bench/rollout_bench.cpp (the workloads live in src/lockstep/bench/).
#include <iostream>
#include <sstream>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/bench/ratios.h"
#include "lockstep/bench/rl.h"
#include "lockstep/bench/rollout.h"
#include "lockstep/bench/train.h"
#include "lockstep/cli/command.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/device.h"

namespace lockstep::cli {
namespace {

// "1,16,64" -> {1, 16, 64}, each at least `min`.
std::vector<int64_t> parse_list(const std::string& flag, const std::string& s, int64_t min = 1) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int64_t v = std::stoll(item, &used);
      if (used != item.size() || v < min) throw std::invalid_argument("bad");
      out.push_back(v);
    } catch (const std::exception&) {
      LS_THROW << "flag --" << flag << ": expected integers >= " << min << " separated by commas, got '" << s
               << "'";
    }
  }
  if (out.empty()) LS_THROW << "flag --" << flag << " is empty";
  return out;
}

int64_t positive(const Args& args, const std::string& key, int64_t fallback) {
  const int64_t v = args.get_int(key, fallback);
  if (v < 1) LS_THROW << "flag --" << key << " must be >= 1, got " << v;
  return v;
}

// The configs to run: every --config given as a comma list, or both bench models.
std::vector<std::string> configs(const Args& args) {
  std::vector<std::string> out;
  if (auto c = args.maybe("config")) {
    std::stringstream ss(*c);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(item);
  } else {
    out = {perf::bench_config_path("moe-tiny"), perf::bench_config_path("moe-small")};
  }
  return out;
}

void print_machine(const perf::Peak& peak) {
  std::cout << "machine: " << std::thread::hardware_concurrency() << " hardware threads, " << peak.threads
            << " used, simd " << kernels::simd_target_name()
            << (peak.vector_width == 16 ? " (f32 GEMM and FMA peak on AVX-512)" : "") << "; fp32 FMA peak at "
            << peak.threads << " threads: " << perf::fmt("%.1f", peak.wall_gflops) << " GFLOP/s (wall), "
            << perf::fmt("%.1f", peak.cpu_gflops) << " GFLOP/s (per CPU-s x threads)\n\n";
}

// --precision f32|bf16|fp8.
DType precision_flag(const std::string& p) {
  if (p == "f32") return DType::F32;
  if (p == "bf16") return DType::BF16;
  if (p == "fp8") return DType::FP8E4M3;
  LS_THROW << "flag --precision: expected f32, bf16 or fp8, got '" << p << "'";
}

// --device: the backend the benchmark's kernels run on (null: the CPU).
const kernels::GpuBackend* device_flag(const Args& args) {
  const kernels::GpuBackend* b =
      kernels::device_backend(kernels::parse_device(args.get("device", "cpu"), "--device"), "--device");
  if (b)
    std::cout << "device: " << b->name << " (the GPU kernel sources; entries it lacks run on the CPU: "
              << b->missing().size() << ")\n";
  return b;
}

const std::vector<std::string> train_flags = {
    "config",    "threads",         "seq-len",   "seqs",   "micro-batch-tokens", "steps",
    "recompute", "world-invariant", "precision", "device", "packed-copy",        "lora-rank"};
const std::vector<std::string> rollout_flags = {
    "config",          "threads",     "batches",      "new-tokens",   "prompt-len",
    "prefill-prompts", "prefill-len", "grpo-prompts", "grpo-samples", "grpo-prompt-len",
    "precision",       "bf16-kv",     "device"};

const std::vector<std::string> rl_flags = {"config",
                                           "threads",
                                           "prompts",
                                           "samples",
                                           "prompt-len",
                                           "new-tokens",
                                           "micro-batch-tokens",
                                           "steps",
                                           "precision",
                                           "trainer-precision",
                                           "staleness",
                                           "rollout-threads",
                                           "kl-coef",
                                           "lora-rank",
                                           "recompute"};

// --steps of train and rl: the measured steps after the warm-up; 0 runs the
// warm-up step alone, for its memory.
int64_t memory_only_steps(const Args& args, int64_t fallback) {
  const int64_t steps = args.get_int("steps", fallback);
  if (steps < 0) LS_THROW << "flag --steps must be >= 0 (0: the warm-up step alone, for memory), got " << steps;
  return steps;
}

perf::TrainBenchOptions train_options(const Args& args) {
  perf::TrainBenchOptions o;
  o.threads = int(positive(args, "threads", 2));
  o.seq_len = positive(args, "seq-len", o.seq_len);
  o.seqs_per_step = positive(args, "seqs", o.seqs_per_step);
  o.micro_batch_tokens = positive(args, "micro-batch-tokens", o.micro_batch_tokens);
  o.recompute = args.flag("recompute");
  o.world_invariant = args.flag("world-invariant");
  o.in_place = !args.flag("packed-copy");
  o.lora_rank = args.get_int("lora-rank", 0);
  if (o.lora_rank < 0) LS_THROW << "--lora-rank must be >= 0, got " << o.lora_rank;
  o.steps = memory_only_steps(args, o.steps);
  if (auto p = args.maybe("precision")) o.precision = precision_flag(*p);
  return o;
}

perf::RolloutBenchOptions rollout_options(const Args& args) {
  perf::RolloutBenchOptions o;
  o.threads = int(positive(args, "threads", 2));
  if (auto b = args.maybe("batches")) o.decode_batches = parse_list("batches", *b);
  o.new_tokens = positive(args, "new-tokens", o.new_tokens);
  o.decode_prompt_len = positive(args, "prompt-len", o.decode_prompt_len);
  o.prefill_prompts = positive(args, "prefill-prompts", o.prefill_prompts);
  o.prefill_len = positive(args, "prefill-len", o.prefill_len);
  o.grpo_prompts = positive(args, "grpo-prompts", o.grpo_prompts);
  o.grpo_samples = positive(args, "grpo-samples", o.grpo_samples);
  o.grpo_prompt_len = positive(args, "grpo-prompt-len", o.grpo_prompt_len);
  if (auto p = args.maybe("precision")) o.precision = precision_flag(*p);
  o.bf16_kv = args.flag("bf16-kv");
  return o;
}

perf::RlBenchOptions rl_options(const Args& args) {
  perf::RlBenchOptions o;
  o.threads = int(positive(args, "threads", 2));
  o.prompts = positive(args, "prompts", o.prompts);
  o.samples = positive(args, "samples", o.samples);
  o.prompt_len = positive(args, "prompt-len", o.prompt_len);
  o.new_tokens = positive(args, "new-tokens", o.new_tokens);
  o.micro_batch_tokens = positive(args, "micro-batch-tokens", o.micro_batch_tokens);
  o.steps = memory_only_steps(args, o.steps);
  o.recompute = args.flag("recompute");
  if (auto p = args.maybe("precision")) o.precision = o.trainer_precision = precision_flag(*p);
  if (auto p = args.maybe("trainer-precision")) o.trainer_precision = precision_flag(*p);
  o.staleness = args.get_int("staleness", 0);
  if (o.staleness != 0 && o.staleness != 1)
    LS_THROW << "flag --staleness: expected 0 or 1, got " << o.staleness;
  o.rollout_threads = args.get_int("rollout-threads", 0);
  if (o.rollout_threads < 0) LS_THROW << "flag --rollout-threads must be >= 0, got " << o.rollout_threads;
  o.kl_coef = args.get_double("kl-coef", 0.0);
  if (!(o.kl_coef >= 0)) LS_THROW << "flag --kl-coef must be >= 0, got " << o.kl_coef;
  return o;
}

// bench rl --lora-rank: a list, each rank run on every config (0: full fine-tuning).
std::vector<int64_t> rl_lora_ranks(const Args& args) {
  const auto list = args.maybe("lora-rank");
  return list ? parse_list("lora-rank", *list, 0) : std::vector<int64_t>{0};
}

// The training benchmark over every config: its two tables, and the results.
std::vector<perf::TrainBenchResult> train_benches(perf::TrainBenchOptions o, const Args& args,
                                                  const perf::Peak& peak) {
  std::vector<perf::TrainBenchResult> rs;
  perf::Table t = perf::train_table(), mem = perf::train_memory_table();
  for (const auto& path : configs(args)) {
    o.config_path = path;
    rs.push_back(perf::run_train_bench(o, peak));
    add_row(t, rs.back());
    add_memory_row(mem, rs.back());
  }
  std::cout
      << t.str()
      << "\nFLOP/token = 6 x active matmul params (attention projections, router, K experts, lm_head)\n"
         "           + 3 x 4*T*Dh*H*L attention (T = sequence length); see docs/benchmarks.md.\n\n"
      << mem.str()
      << "\nPeak resident memory of the run above the process before the trainer existed, in bytes per\n"
         "parameter: master f32 weights, their packed copy, bf16/fp8's widened weights (backward), "
         "gradients,\n"
         "AdamW moments, world_invariant's exact sums; the rest is activations and workspace.\n";
  return rs;
}

// The rollout benchmark over every config: its tables, and the results.
std::vector<perf::RolloutBenchResult> rollout_benches(perf::RolloutBenchOptions o, const Args& args,
                                                      const perf::Peak& peak) {
  std::vector<perf::RolloutBenchResult> rs;
  for (const auto& path : configs(args)) {
    o.config_path = path;
    rs.push_back(perf::run_rollout_bench(o, peak));
  }
  std::cout << perf::rollout_tables(rs);
  return rs;
}

// The RL-step benchmark over every config: its two tables.
void rl_benches(perf::RlBenchOptions o, const Args& args) {
  perf::Table t = perf::rl_table(), mem = perf::rl_memory_table();
  for (const auto& path : configs(args))
    for (const int64_t rank : rl_lora_ranks(args)) {
      o.config_path = path;
      o.lora_rank = rank;
      const perf::RlBenchResult r = perf::run_rl_bench(o);
      add_row(t, r);
      add_memory_row(mem, r);
    }
  std::cout
      << t.str()
      << "\nOne RL step of `lockstep rl` in this process (GRPO, random prompts, a synthetic 0/1 reward,\n"
         "every response --new-tokens long); seconds are per step, step tok/s = trained tokens / step s,\n"
         "rollout tok/s = generated tokens / rollout s, train tok/s = trained tokens / train s.\n\n"
      << mem.str()
      << "\nPeak resident memory of the RL run above the process before the trainer existed, in bytes per\n"
         "parameter of the model (the base, with --lora-rank): the trainer's master (with LoRA also\n"
         "the adapters), packed copy, widened weights, gradients and moments (LoRA: the adapters'); the KL\n"
         "reference's weights; the rollout's own packed copy (fast mode or staleness 1: the aligned\n"
         "rollout in step reads the trainer's) and, staleness 1, its copy of the tensors read unpacked\n"
         "(rollout master: embedding, norms, biases); its KV cache as allocated (pages it never wrote\n"
         "take no memory); the rest is activations, logits and workspace.\n";
}

int run_train(const Args& args) {
  args.check_known(train_flags);
  perf::TrainBenchOptions o = train_options(args);
  o.gpu = device_flag(args);
  const perf::Peak peak = perf::measure_fma_peak(o.threads);
  print_machine(peak);
  train_benches(o, args, peak);
  return 0;
}

int run_rollout(const Args& args) {
  args.check_known(rollout_flags);
  perf::RolloutBenchOptions o = rollout_options(args);
  o.gpu = device_flag(args);
  const perf::Peak peak = perf::measure_fma_peak(o.threads);
  print_machine(peak);
  rollout_benches(o, args, peak);
  return 0;
}

int run_rl(const Args& args) {
  args.check_known(rl_flags);
  const perf::RlBenchOptions o = rl_options(args);
  print_machine(perf::measure_fma_peak(o.threads));
  rl_benches(o, args);
  return 0;
}

// Every benchmark (rollout at batches 1, 16 and 64 unless --batches says
// otherwise), then every ratio they measured in one table.
int run_all(const Args& args) {
  std::vector<std::string> known = train_flags;
  known.insert(known.end(), rollout_flags.begin(), rollout_flags.end());
  known.insert(known.end(), rl_flags.begin(), rl_flags.end());
  args.check_known(known);
  perf::TrainBenchOptions to = train_options(args);
  perf::RolloutBenchOptions ro = rollout_options(args);
  const perf::RlBenchOptions lo = rl_options(args);
  if (to.steps == 0) LS_THROW << "bench all: --steps 0 (memory only) is for bench train and bench rl; all reports ratios";
  if (!args.maybe("batches")) ro.decode_batches = {1, 16, 64};
  to.gpu = ro.gpu = device_flag(args);
  const perf::Peak peak = perf::measure_fma_peak(to.threads);
  print_machine(peak);
  const auto train = train_benches(to, args, peak);
  std::cout << "\n";
  const auto rollout = rollout_benches(ro, args, peak);
  std::cout << "\n";
  rl_benches(lo, args);
  std::cout << "\nEvery ratio above, each against the baseline measured in this run:\n"
            << perf::ratio_table(train, rollout).str();
  return 0;
}

int run_bench(const Args& args) {
  const auto& pos = args.positional();
  if (pos.empty() || pos[0] == "all") return run_all(args);
  if (pos[0] == "train") return run_train(args);
  if (pos[0] == "rollout") return run_rollout(args);
  if (pos[0] == "rl") return run_rl(args);
  LS_THROW << "bench: unknown benchmark '" << pos[0] << "' (train, rollout, rl, all)";
}

LS_REGISTER_COMMAND(Command{
    "bench",
    "training, rollout and RL-step throughput and memory benchmarks",
    "usage: lockstep bench [all]   [any flag of train, rollout and rl]\n"
    "       lockstep bench train   [--config FILE[,FILE]] [--threads N] [--seq-len N] [--seqs N]\n"
    "                              [--micro-batch-tokens N] [--steps N] [--recompute]\n"
    "                              [--world-invariant] [--precision f32|bf16|fp8] [--packed-copy]\n"
    "                              [--lora-rank N] [--device cpu|interpret]\n"
    "       lockstep bench rollout [--config FILE[,FILE]] [--threads N] [--batches 1,16,64,256]\n"
    "                              [--new-tokens N] [--prompt-len N] [--prefill-prompts N]\n"
    "                              [--prefill-len N] [--grpo-prompts N] [--grpo-samples N]\n"
    "                              [--grpo-prompt-len N] [--precision f32|bf16|fp8] [--bf16-kv]\n"
    "                              [--device cpu|interpret]\n"
    "       lockstep bench rl      [--config FILE[,FILE]] [--threads N] [--prompts N] [--samples N]\n"
    "                              [--prompt-len N] [--new-tokens N] [--micro-batch-tokens N]\n"
    "                              [--steps N] [--recompute] [--precision f32|bf16|fp8]\n"
    "                              [--trainer-precision f32|bf16|fp8] [--staleness 0|1]\n"
    "                              [--rollout-threads N] [--kl-coef X] [--lora-rank N[,N]]\n\n"
    "Runs on randomly initialised weights of the [model] in each config (default: both\n"
    "configs/bench/moe-tiny.toml and moe-small.toml) with 2 threads unless --threads says\n"
    "otherwise, and prints a table.\n\n"
    "all (also with no name): train, rollout at --batches 1,16,64 and rl, then one table of\n"
    "  every ratio they measured (training and prefill FLOP/s over the FMA peak, decode\n"
    "  tokens/s over its roofline at each batch, GRPO with prefix sharing over without),\n"
    "  each against the baseline measured in the same run.\n"
    "train: tokens/s of full training steps (forward + backward + clip/AdamW/repack) on\n"
    "  --seqs sequences of --seq-len tokens per step (defaults 32 x 256, in micro-batches of\n"
    "  --micro-batch-tokens 4096), the model FLOPs per\n"
    "  token and the fraction of the machine's fp32 FMA peak, measured in the same run.\n"
    "  --recompute: activation recompute (keep only layer inputs; backward recomputes).\n"
    "  --steps 0: the warm-up step alone, for its memory (the speed table shows no times).\n"
    "  --world-invariant: [dist] world_invariant's exact gradient sum (a fold per micro-batch).\n"
    "  --precision: the forward's weights in bf16 or fp8 (master weights and AdamW stay f32).\n"
    "  --packed-copy: keep the packed copy of f32 weights (aligned RL's rollout reads it); by\n"
    "  default the f32 forward reads the master in place, as SFT does.\n"
    "  --lora-rank N: train LoRA adapters of rank N on every projection ([lora] all-linear)\n"
    "  over the frozen base instead of every weight.\n"
    "rollout: decode tokens/s at each --batches size (prompts of --prompt-len tokens,\n"
    "  --new-tokens generated each) next to its roofline: the larger of the step's FLOPs at\n"
    "  the FMA peak and its weight and KV bytes at the measured read bandwidth (and the\n"
    "  step's matrix products timed alone, GEMM-only);\n"
    "  prefill tokens/s; a GRPO-shaped workload (--grpo-prompts x --grpo-samples)\n"
    "  with and without prefix sharing. --precision: the weights in f32 (default), bf16 or fp8\n"
    "  (power-of-two 128 x 128 block scales), as in aligned mode at that precision (f32 KV\n"
    "  cache); --bf16-kv keeps the KV cache in bf16 as fast mode does.\n"
    "rl: RL steps of `lockstep rl` in this process (GRPO; --prompts x --samples responses of\n"
    "  --new-tokens each to random prompts of --prompt-len tokens, a synthetic 0/1 reward,\n"
    "  defaults 8 x 8, 64 and 64), one warm-up then --steps timed: seconds per phase, and the\n"
    "  step's peak memory in bytes per parameter (trainer state, KL reference, the rollout's\n"
    "  own copies, KV cache, activations). --precision sets both engines (aligned);\n"
    "  --trainer-precision f32 with a bf16/fp8 --precision is fast mode; --staleness 1 generates\n"
    "  one step ahead on --rollout-threads of its own; --kl-coef > 0 adds the frozen reference.\n"
    "  --recompute: the trainer's activation recompute, as bench train. --steps 0 runs the\n"
    "  warm-up step alone and reports its memory only (a long --prompt-len then measures memory\n"
    "  against sequence length without the decode of as many tokens).\n"
    "  --lora-rank N[,N]: LoRA adapters of each rank on every projection ([lora] all-linear,\n"
    "  alpha 2 x N) over the frozen base, one run per rank (0: full fine-tuning), e.g. 0,16.\n"
    "--device interpret runs the model's kernels through the GPU kernel sources on the CPU\n"
    "(the emulator of docs/gpu.md): its speed, not a GPU's.\n"
    "See docs/benchmarks.md for what each number means.\n",
    {"recompute", "world-invariant", "packed-copy", "bf16-kv"},
    run_bench});

}  // namespace
}  // namespace lockstep::cli
