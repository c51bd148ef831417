// SFT: cross-entropy loss, data order, the step loop with checkpoints.
#include "lockstep/train/sft.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/step_clock.h"
#include "lockstep/base/timer.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/checkpoint_integrity.h"
#include "lockstep/train/data_order.h"

namespace lockstep::train {

std::vector<size_t> sft_batch_indices(size_t n, int64_t batch_size, int64_t step, uint64_t seed, bool shuffle) {
  LS_CHECK(n > 0 && batch_size > 0) << "empty dataset or batch";
  std::vector<size_t> out;
  const uint64_t first = uint64_t(step - 1) * uint64_t(batch_size);
  std::vector<size_t> perm;
  int64_t perm_epoch = -1;
  for (uint64_t g = first; g < first + uint64_t(batch_size); ++g) {
    const int64_t epoch = int64_t(g / n);
    if (epoch != perm_epoch) {
      perm = epoch_permutation(n, seed, epoch, shuffle);
      perm_epoch = epoch;
    }
    out.push_back(perm[g % n]);
  }
  return out;
}

SftStepStats sft_step(Trainer& trainer, const std::vector<TrainSequence>& batch) {
  Timer timer;
  SftStepStats st;
  int64_t n_targets = 0;
  for (const auto& s : batch) {
    n_targets += s.num_targets();
    st.tokens += int64_t(s.tokens.size());
  }
  LS_CHECK(n_targets > 0) << "SFT batch has no response tokens";
  const double inv = 1.0 / double(n_targets);
  std::vector<double> per_seq(batch.size(), 0.0);
  LossFn loss = [&](size_t s, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) {
      l -= double(logp[i]) * inv;
      dlogp[i] = float(-inv);
    }
    per_seq[s] = l;
    return l;
  };
  st.loss = trainer.accumulate(batch, loss, ScoreOptions{});
  // world_invariant: the per-sequence losses in batch order, as a
  // data-parallel group adds them (parallel::dp_sft_step).
  if (trainer.trainer_config().world_invariant) {
    st.loss = 0;
    for (double l : per_seq) st.loss += l;
  }
  if (!std::isfinite(st.loss)) {
    trainer.zero_grad();
    st.skipped = true;
  } else {
    OptimizerStats os = trainer.step();
    st.grad_norm = os.grad_norm;
    st.lr = os.lr;
    st.skipped = os.skipped;
  }
  st.tokens_per_s = double(st.tokens) / std::max(timer.seconds(), 1e-9);
  return st;
}

void run_sft(Trainer& trainer, const std::vector<TrainSequence>& data, const std::string& run_dir,
             const SftConfig& cfg, bool resume, const std::string& tokenizer_dir,
             const std::function<void(const SftStepStats&)>& on_step, const SftRanks& ranks,
             const std::string& resume_from) {
  if (data.empty()) LS_THROW << "SFT dataset is empty";
  const bool writer = ranks.writer;
  if (writer && !resume) refuse_existing_run(run_dir);  // a fresh run never appends to another's metrics
  int64_t start = 0;
  if (resume) {
    if (auto info = find_resume_checkpoint(run_dir, resume_from, writer)) {
      load_checkpoint(*info, trainer);
      start = info->step;
    } else {
      LS_LOG(Warn) << "--resume: no checkpoint in " << run_dir << ", starting from step 0";
    }
  }
  std::unique_ptr<metrics::MetricsLogger> log;
  if (writer)
    log = std::make_unique<metrics::MetricsLogger>(run_dir + "/metrics.jsonl",
                                                   resume ? start : metrics::MetricsLogger::kAppend, cfg.log);
  const StepClock clock(start + 1, cfg.steps);
  for (int64_t step = start + 1; step <= cfg.steps; ++step) {
    std::vector<TrainSequence> batch;
    for (size_t i : sft_batch_indices(data.size(), cfg.batch_size, step, cfg.seed, cfg.shuffle)) batch.push_back(data[i]);
    SftStepStats st = ranks.step ? ranks.step(trainer, batch) : sft_step(trainer, batch);
    st.step = step;
    const bool save = step == cfg.steps || (cfg.save_interval > 0 && step % cfg.save_interval == 0);
    // Expert parallelism: the writer's group gathers the optimizer state (a collective).
    if (save) trainer.prepare_checkpoint(writer, run_dir + "/checkpoints/optimizer.gathered");
    if (writer) {
      log->log(step, {{"train/loss", st.loss},
                     {"train/grad_norm", st.grad_norm},
                     {"train/lr", st.lr},
                     {"train/skipped", st.skipped},
                     {"perf/train_tokens_per_s", st.tokens_per_s},
                     {"train/tokens", st.tokens}});
      if (cfg.log_interval > 0 && (step % cfg.log_interval == 0 || step == cfg.steps)) {
        std::cout << metrics::format_console_line(clock.head(step), {{"loss", st.loss},
                                                                     {"grad_norm", st.grad_norm},
                                                                     {"lr", st.lr},
                                                                     {"tok/s", st.tokens_per_s}})
                  << (st.skipped ? " | SKIPPED (non-finite)" : "") << " | " << clock.timing(step)
                  << std::endl;
      }
    }
    if (on_step) on_step(st);
    if (writer && save) {
      nlohmann::json state = {{"data_seed", cfg.seed}, {"data_position", step * cfg.batch_size}};
      save_checkpoint(run_dir, step, trainer, state, tokenizer_dir, cfg.keep_last);
    }
  }
}

}  // namespace lockstep::train
