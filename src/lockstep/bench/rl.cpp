// The RL-step benchmark of rl.h: rl::run_rl on a bench model, with the
// rollout backend the loop would pick made here so its memory can be read.
#include "lockstep/bench/rl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/bench/rollout.h"
#include "lockstep/model/packed_checksum.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/overlap_rollout.h"
#include "lockstep/tokenizer/byte_level.h"

namespace lockstep::perf {

namespace {

// Rewards 1 or 0 by a hash of the response, so that the samples of a group
// disagree and every group carries a gradient, as a real verifier's do.
class SyntheticReward : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest& request) const override {
    reward::RewardResult r;
    r.correct = std::hash<std::string>{}(request.response) % 2 == 0;
    r.reward = r.correct ? 1.0 : 0.0;
    return r;
  }
  std::string type() const override { return "synthetic"; }
};

// A directory of its own under the system's temporary directory, removed
// with this object.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("lockstep-bench-rl-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Random byte prompts, enough that no step reuses another's.
std::vector<data::PromptExample> random_prompts(const RlBenchOptions& opt, const tokenizer::Tokenizer& tok) {
  std::mt19937 gen(11);
  std::vector<data::PromptExample> out(size_t(opt.prompts * (opt.steps + 1)));
  for (size_t i = 0; i < out.size(); ++i) {
    auto& p = out[i];
    p.line = int64_t(i) + 1;
    p.prompt_ids.resize(size_t(opt.prompt_len));
    for (auto& t : p.prompt_ids) t = int32_t(gen() % 256);
    p.prompt_text = tok.decode(p.prompt_ids);
    p.label = "1";
  }
  return out;
}

rl::RlConfig rl_config(const RlBenchOptions& opt, const std::string& out_dir) {
  rl::RlConfig cfg;
  cfg.batch_size = opt.prompts;
  cfg.steps = opt.steps + 1;  // step 1 warms caches and the allocator
  cfg.shuffle = false;
  cfg.seed = 5;
  cfg.checkpoints = false;
  cfg.out_dir = out_dir;
  cfg.log_interval = 0;
  cfg.log.progress = false;
  cfg.log.samples_interval = 0;
  cfg.max_weight_staleness = opt.staleness;
  cfg.rollout_threads = opt.rollout_threads;
  cfg.algo.kl_coef = opt.kl_coef;
  cfg.rollout.sampling.n = opt.samples;
  cfg.rollout.sampling.max_new_tokens = opt.new_tokens;
  cfg.rollout.sampling.ignore_eos = true;
  // A KV cache that holds every sample at its full length, as a user sizes
  // `[rollout] kv_blocks` for the step: the default 1,024 blocks (16,384
  // tokens) would make long samples preempt each other and recompute.
  {
    const int64_t bs = cfg.rollout.engine.block_size, len = opt.prompt_len + opt.new_tokens;
    const int64_t need = opt.prompts * opt.samples * ((len + bs - 1) / bs + 1) + 16;
    cfg.rollout.engine.num_blocks = std::max(cfg.rollout.engine.num_blocks, need);
  }
  cfg.rollout.precision = precision_name(opt.precision);
  cfg.rollout.trainer_precision = precision_name(opt.trainer_precision);
  cfg.trainer.micro_batch_tokens = opt.micro_batch_tokens;
  cfg.trainer.precision = opt.trainer_precision;
  cfg.trainer.recompute_activations = opt.recompute;
  cfg.trainer.in_place_weights = opt.precision != opt.trainer_precision;  // as `lockstep rl` (fast mode)
  cfg.trainer.optim.lr = 1e-4;
  if (opt.lora_rank > 0) {  // as bench train --lora-rank
    cfg.trainer.lora.rank = opt.lora_rank;
    cfg.trainer.lora.alpha = 2.0 * double(opt.lora_rank);
    cfg.trainer.lora.target_modules = {"all-linear"};
  }
  return cfg;
}

// Sums the measured steps' phase seconds (steps after the first).
void add_step(RlBenchResult& r, int64_t step, const nlohmann::json& m) {
  if (step < 2) return;
  auto get = [&](const char* k) { return m.contains(k) && m[k].is_number() ? m[k].get<double>() : 0.0; };
  r.step_s += get("perf/step_time_s");
  r.rollout_s += get("perf/rollout_time_s");
  r.old_logprob_s += get("perf/old_logprob_time_s");
  r.ref_logprob_s += get("perf/ref_logprob_time_s");
  r.train_s += get("perf/train_time_s");
  r.sync_s += get("perf/weight_sync_s");
  r.wait_s += get("perf/rollout_wait_time_s");
  const double samples = double(r.opt.prompts * r.opt.samples);
  const double len = get("rollout/response_len_mean");
  r.generated_tokens += samples * len;
  r.trained_tokens += samples * (double(r.opt.prompt_len) + len);
}

void record_memory(RlBenchResult& r, train::Trainer& trainer, const rl::RolloutBackend& rollout,
                   const train::Scorer* reference) {
  const size_t n = size_t(trainer.model_layout().numel()), f32 = n * sizeof(float);
  r.params = int64_t(n);
  r.master = r.grads = f32;
  r.moments = 2 * f32;
  r.packed = model::packed_bytes(trainer.weights());
  r.effective = trainer.trainer_config().precision != DType::F32 ? f32 : 0;
  if (const train::LoraState* lora = trainer.lora()) {  // gradients and moments of the adapters only
    r.adapters = size_t(lora->numel()) * sizeof(float);
    r.master = f32 + r.adapters;
    r.grads = r.adapters;
    r.moments = 2 * r.adapters;
  }
  if (reference) r.reference = f32 + model::packed_bytes(reference->weights());
  const rl::RolloutBackend::Memory m = rollout.memory();
  r.rollout_master = m.master;
  r.rollout_packed = m.packed;
  r.kv_cache = m.kv_cache;
}

}  // namespace

size_t RlBenchResult::rest() const {
  const size_t known =
      master + packed + effective + grads + moments + reference + rollout_master + rollout_packed + kv_cache;
  return peak_rss > known ? peak_rss - known : 0;
}

RlBenchResult run_rl_bench(const RlBenchOptions& opt) {
  RlBenchResult r;
  r.model =
      model_name(opt.config_path) + (opt.lora_rank > 0 ? " lora r" + std::to_string(opt.lora_rank) : "");
  r.opt = opt;
  const ModelConfig c = model_config_from_toml_file(opt.config_path);
  if (c.vocab_size < 259)
    LS_THROW << opt.config_path << ": bench rl needs vocab_size >= 259 (a byte-level tokenizer), got "
             << c.vocab_size;
  if (opt.prompt_len + opt.new_tokens > c.max_position_embeddings)
    LS_THROW << "bench rl: --prompt-len " << opt.prompt_len << " + --new-tokens " << opt.new_tokens
             << " exceeds the model's max_position_embeddings " << c.max_position_embeddings;
  TempDir dir;
  tokenizer::write_byte_level_tokenizer(dir.path() / "tokenizer");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir.path() / "tokenizer");
  const rl::RlConfig cfg = rl_config(opt, (dir.path() / "run").string());

  ThreadPool pool(opt.threads);
  Context ctx{&pool, 0};
  const ParamLayout layout(c);
  reset_peak_rss();
  const size_t baseline = rss_bytes();
  Buffer params = bench_params(layout, ctx);
  std::shared_ptr<train::Scorer> reference;
  if (opt.kl_coef > 0) {
    Buffer ref = alloc_params(layout);
    std::copy(params.as<float>(), params.as<float>() + layout.numel(), ref.as<float>());
    reference = std::make_shared<train::Scorer>(ctx, c, std::move(ref), cfg.trainer.micro_batch_tokens,
                                                cfg.trainer.kv_block_size, cfg.trainer.precision,
                                                cfg.trainer.fp8_block, cfg.trainer.logits_chunk);
  }
  train::Trainer trainer(ctx, c, std::move(params), cfg.trainer);
  std::shared_ptr<rl::RolloutBackend> rollout;
  if (opt.staleness > 0)
    rollout = std::make_shared<rl::OverlapRollout>(trainer, cfg.rollout, cfg.seed, cfg.rollout_threads);
  else
    rollout = std::make_shared<rl::LocalRollout>(trainer, cfg.rollout, cfg.seed);

  rl::RlInputs in;
  in.tok = &tok;
  in.train = random_prompts(opt, tok);
  in.reference = reference;
  in.reward = std::make_shared<SyntheticReward>();
  in.rollout = rollout;
  in.on_step = [&](int64_t step, const nlohmann::json& m) { add_step(r, step, m); };
  rl::run_rl(trainer, in, cfg, false);

  const size_t high = peak_rss_bytes();
  r.peak_rss = high > baseline ? high - baseline : 0;
  record_memory(r, trainer, *rollout, reference.get());
  const double steps = double(std::max<int64_t>(opt.steps, 1));
  for (double* x : {&r.step_s, &r.rollout_s, &r.old_logprob_s, &r.ref_logprob_s, &r.train_s, &r.sync_s,
                    &r.wait_s, &r.generated_tokens, &r.trained_tokens})
    *x /= steps;
  return r;
}

Table rl_table() {
  return Table({"model", "precision", "staleness", "threads", "prompts x n", "generated/step", "trained/step",
                "step s", "rollout s", "old logprob s", "ref logprob s", "train s", "sync s",
                "rollout wait s", "step tok/s", "rollout tok/s", "train tok/s"});
}

void add_row(Table& t, const RlBenchResult& r) {
  const std::string prec =
      r.opt.precision == r.opt.trainer_precision
          ? precision_name(r.opt.precision)
          : precision_name(r.opt.precision) + "/" + precision_name(r.opt.trainer_precision);
  std::vector<std::string> row = {r.model, prec, fmt("%lld", (long long)r.opt.staleness),
                                  fmt("%d", r.opt.threads),
                                  fmt("%lld x %lld", (long long)r.opt.prompts, (long long)r.opt.samples)};
  if (r.opt.steps == 0) {  // --steps 0: the warm-up step alone, for its memory; nothing timed
    row.resize(rl_table().columns(), "-");
    t.add(row);
    return;
  }
  for (std::string cell : {fmt("%.0f", r.generated_tokens), fmt("%.0f", r.trained_tokens),
                           fmt("%.2f", r.step_s), fmt("%.2f", r.rollout_s), fmt("%.2f", r.old_logprob_s),
                           fmt("%.2f", r.ref_logprob_s), fmt("%.2f", r.train_s), fmt("%.3f", r.sync_s),
                           fmt("%.2f", r.wait_s), fmt("%.0f", r.trained_tokens / std::max(r.step_s, 1e-9)),
                           fmt("%.0f", r.generated_tokens / std::max(r.rollout_s, 1e-9)),
                           fmt("%.0f", r.trained_tokens / std::max(r.train_s, 1e-9))})
    row.push_back(std::move(cell));
  t.add(row);
}

Table rl_memory_table() {
  return Table({"model", "params (M)", "peak MB", "B/param", "master", "packed", "effective", "grads",
                "moments", "reference", "rollout master", "rollout packed", "KV cache", "activations+rest"});
}

void add_memory_row(Table& t, const RlBenchResult& r) {
  const double n = double(std::max<int64_t>(r.params, 1));
  auto per = [&](size_t b) { return fmt("%.2f", double(b) / n); };
  t.add({r.model, fmt("%.2f", double(r.params) * 1e-6), fmt("%.0f", double(r.peak_rss) / 1048576.0),
         per(r.peak_rss), per(r.master), per(r.packed), per(r.effective), per(r.grads), per(r.moments),
         per(r.reference), per(r.rollout_master), per(r.rollout_packed), per(r.kv_cache), per(r.rest())});
}

}  // namespace lockstep::perf
