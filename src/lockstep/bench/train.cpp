// The training-throughput benchmark of train.h: full training steps of a
// Trainer on random tokens, timed per phase, and its table row.
#include "lockstep/bench/train.h"

#include <algorithm>
#include <random>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/base/timer.h"
#include "lockstep/comm/exact_sum.h"
#include "lockstep/model/packed_checksum.h"
#include "lockstep/train/trainer.h"

namespace lockstep::perf {

namespace {
// What the trainer holds by design, from its configuration and layout.
void record_memory(TrainBenchResult& r, train::Trainer& trainer, const ParamLayout& layout) {
  const size_t n = size_t(layout.numel()), f32 = n * sizeof(float);
  r.params = int64_t(n);
  r.master = r.grads = f32;
  r.moments = 2 * f32;  // AdamW's m and v
  r.packed = model::packed_bytes(trainer.weights());
  r.effective = trainer.trainer_config().precision != DType::F32 ? f32 : 0;
  r.exact_sum = trainer.trainer_config().world_invariant ? (n + 2) * sizeof(comm::Fixed) : 0;
  if (const train::LoraState* lora = trainer.lora()) {  // gradients and moments of the adapters only
    const size_t a = size_t(lora->numel()) * sizeof(float);
    r.master = f32 + a;
    r.grads = a;
    r.moments = 2 * a;
  }
}
}  // namespace

size_t TrainBenchResult::rest() const {
  const size_t known = master + packed + effective + grads + moments + exact_sum;
  return peak_rss > known ? peak_rss - known : 0;
}

TrainBenchResult run_train_bench(const TrainBenchOptions& opt, Peak peak) {
  TrainBenchResult r;
  r.model =
      model_name(opt.config_path) + (opt.lora_rank > 0 ? " lora r" + std::to_string(opt.lora_rank) : "");
  r.opt = opt;
  const ModelConfig c = model_config_from_toml_file(opt.config_path);
  ThreadPool pool(opt.threads);
  Context ctx{&pool, 0};
  ctx.gpu = opt.gpu;
  r.peak = peak.wall_gflops > 0 ? peak : measure_fma_peak(opt.threads);

  ParamLayout layout(c);
  reset_peak_rss();
  const size_t baseline = rss_bytes();
  train::TrainerConfig tc;
  tc.micro_batch_tokens = opt.micro_batch_tokens;
  tc.recompute_activations = opt.recompute;
  tc.world_invariant = opt.world_invariant;
  tc.precision = opt.precision;
  tc.in_place_weights = opt.in_place;
  tc.optim.lr = 1e-4;  // small enough that the weights stay sane over a few steps
  if (opt.lora_rank > 0) {
    tc.lora.rank = opt.lora_rank;
    tc.lora.alpha = 2.0 * double(opt.lora_rank);
    tc.lora.target_modules = {"all-linear"};
  }
  train::Trainer trainer(ctx, c, bench_params(layout, ctx), tc);

  // Uniformly random tokens: every token a target (prompt_len 1).
  std::mt19937 gen(7);
  std::vector<train::TrainSequence> seqs(static_cast<size_t>(opt.seqs_per_step));
  for (auto& s : seqs) {
    s.tokens.resize(static_cast<size_t>(opt.seq_len));
    for (auto& t : s.tokens) t = int32_t(gen() % uint32_t(c.vocab_size));
    s.prompt_len = 1;
  }
  int64_t targets = 0;
  for (const auto& s : seqs) targets += s.num_targets();
  const double inv = 1.0 / double(std::max<int64_t>(targets, 1));
  // Mean token cross-entropy, as in SFT.
  train::LossFn loss = [&](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) {
      l -= double(logp[i]) * inv;
      dlogp[i] = float(-inv);
    }
    return l;
  };

  for (int64_t step = 0; step <= opt.steps; ++step) {  // step 0 warms caches and allocator
    Timer t;
    const double c0 = process_cpu_seconds();
    const double l = trainer.accumulate(seqs, loss, train::ScoreOptions{});
    const double t_acc = t.seconds();
    trainer.step();
    const double t_all = t.seconds();
    const double c_all = process_cpu_seconds() - c0;
    if (step == 0) continue;
    r.cpu_s += c_all;
    r.fwd_bwd_s += t_acc;
    r.optim_s += t_all - t_acc;
    r.loss = l;
  }
  const size_t high = peak_rss_bytes();
  r.peak_rss = high > baseline ? high - baseline : 0;
  record_memory(r, trainer, layout);
  const double steps = double(std::max<int64_t>(opt.steps, 1));
  r.fwd_bwd_s /= steps;
  r.optim_s /= steps;
  r.cpu_s /= steps;
  const double tokens = double(opt.seqs_per_step * opt.seq_len);
  r.tokens_per_s = opt.steps > 0 ? tokens / (r.fwd_bwd_s + r.optim_s) : 0.0;  // 0 steps: nothing timed
  r.flops_per_token = train_flops_per_token(c, opt.seq_len);
  r.gflops = r.tokens_per_s * r.flops_per_token * 1e-9;
  return r;
}

Table train_table() {
  return Table({"model", "threads", "seq", "tokens/step", "tokens/s", "MFLOP/token", "GFLOP/s",
                "peak GFLOP/s", "% of peak", "% of peak per CPU-s", "CPU use", "fwd+bwd s/step",
                "optim s/step", "loss"});
}

Table train_memory_table() {
  return Table({"model", "params (M)", "peak MB", "B/param", "master", "packed", "effective", "grads",
                "moments", "exact sum", "activations+rest"});
}

void add_memory_row(Table& t, const TrainBenchResult& r) {
  const double n = double(std::max<int64_t>(r.params, 1));
  auto per = [&](size_t b) { return fmt("%.2f", double(b) / n); };
  t.add({r.model, fmt("%.2f", double(r.params) * 1e-6), fmt("%.0f", double(r.peak_rss) / 1048576.0), per(r.peak_rss),
         per(r.master), per(r.packed), per(r.effective), per(r.grads), per(r.moments), per(r.exact_sum),
         per(r.rest())});
}

void add_row(Table& t, const TrainBenchResult& r) {
  const double wall = r.fwd_bwd_s + r.optim_s, tokens = double(r.opt.seq_len * r.opt.seqs_per_step);
  const double cpu_gflops = tokens * r.flops_per_token / (r.cpu_s / r.opt.threads) * 1e-9;
  const double peak = r.peak.gflops();
  const long long step_tokens = static_cast<long long>(r.opt.seq_len) * r.opt.seqs_per_step;
  if (r.opt.steps == 0) {  // --steps 0: the warm-up step alone, for its memory; nothing timed
    std::vector<std::string> row = {r.model, fmt("%d", r.opt.threads), fmt("%lld", (long long)r.opt.seq_len),
                                    fmt("%lld", step_tokens)};
    row.resize(train_table().columns(), "-");
    t.add(row);
    return;
  }
  t.add({r.model, fmt("%d", r.opt.threads), fmt("%lld", (long long)r.opt.seq_len), fmt("%lld", step_tokens),
         fmt("%.0f", r.tokens_per_s), fmt("%.1f", r.flops_per_token * 1e-6), fmt("%.1f", r.gflops),
         fmt("%.1f", peak), fmt("%.1f%%", 100.0 * r.gflops / peak), fmt("%.1f%%", 100.0 * cpu_gflops / peak),
         fmt("%.0f%%", 100.0 * r.cpu_s / (wall * r.opt.threads)), fmt("%.3f", r.fwd_bwd_s),
         fmt("%.3f", r.optim_s), fmt("%.3f", r.loss)});
}

}  // namespace lockstep::perf
