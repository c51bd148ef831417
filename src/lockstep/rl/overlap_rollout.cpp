// The one-process rollout that generates ahead of training.
#include "lockstep/rl/overlap_rollout.h"

#include <map>

#include "lockstep/base/error.h"
#include "lockstep/model/packed_checksum.h"
#include "lockstep/rl/mpi_rollout.h"
#include "lockstep/rollout/localise.h"

namespace lockstep::rl {

OverlapRollout::OverlapRollout(train::Trainer& trainer, const rollout::RolloutSection& cfg, uint64_t seed,
                               int64_t threads)
    : pool_(make_pool(threads > 0 ? threads : trainer.context().threads())),
      ctx_(trainer.context()),
      seed_(seed),
      sync_bytes_(trainer.model_layout().nbytes()) {
  if (trainer.expert_comm() != nullptr)
    LS_THROW << "[dist] max_weight_staleness = 1 in one process does not cover expert parallelism "
             << "(use rollout ranks: [dist] rollout_ranks > 0)";
  if (ctx_.gpu != nullptr)
    LS_THROW << "[dist] max_weight_staleness = 1 in one process runs the rollout on the CPU only "
             << "(the trainer's context is on a GPU device)";
  ctx_.pool = pool_.get();
  const DType storage = rollout::precision_dtype(cfg.precision);
  aligned_ = storage == trainer.trainer_config().precision;
  source_ = trainer.params();
  weights_ = std::make_unique<model::ModelWeights>(
      ctx_, trainer.model_layout(), model::ModelWeights::SnapshotOf{source_, trainer.version()}, storage,
      storage == DType::FP8E4M3 ? cfg.fp8_block : 0);
  rollout::EngineConfig ec = cfg.engine;
  ec.seed = seed;
  engine_ = std::make_unique<rollout::Engine>(ctx_, weights_.get(), ec);
}

RolloutBackend::Memory OverlapRollout::memory() const {
  return {weights_->snapshot_bytes(), model::packed_bytes(*weights_), engine_->kv_bytes()};
}

OverlapRollout::~OverlapRollout() {
  if (in_flight_ && in_flight_->valid()) in_flight_->wait();  // never leave the engine's thread running
}

OverlapRollout::Batch OverlapRollout::run(std::vector<rollout::Request> requests) {
  const int64_t before = engine_->stats().generated_tokens;
  std::vector<uint64_t> ids;
  for (auto& r : requests) ids.push_back(engine_->submit(std::move(r)));
  std::map<uint64_t, rollout::RequestResult> done;
  for (auto& r : engine_->run_until_done(0)) done[r.id] = std::move(r);
  Batch b;
  for (uint64_t id : ids) {
    auto it = done.find(id);
    LS_CHECK(it != done.end()) << "rollout: request " << id << " did not finish";
    b.results.push_back(std::move(it->second));
  }
  b.tokens = engine_->stats().generated_tokens - before;
  return b;
}

void OverlapRollout::submit(std::vector<rollout::Request> requests) {
  LS_CHECK(!in_flight_) << "OverlapRollout::submit while a batch is in flight (collect it first)";
  fill_missing_seeds(requests, seed_, calls_++);
  in_flight_ = std::async(std::launch::async, [this, r = std::move(requests)]() mutable { return run(std::move(r)); });
}

std::vector<rollout::RequestResult> OverlapRollout::collect(const RolloutProgress& progress,
                                                          int64_t* generated_tokens) {
  LS_CHECK(in_flight_) << "OverlapRollout::collect with nothing submitted";
  std::future<Batch> f = std::move(*in_flight_);
  in_flight_.reset();
  Batch b = f.get();  // rethrows the engine thread's error here
  if (progress) {
    int64_t samples = 0;
    for (const auto& r : b.results) samples += int64_t(r.samples.size());
    progress(samples, b.tokens);
  }
  if (generated_tokens) *generated_tokens = b.tokens;
  return std::move(b.results);
}

std::vector<rollout::RequestResult> OverlapRollout::generate(std::vector<rollout::Request> requests,
                                                           const RolloutProgress& progress,
                                                           int64_t* generated_tokens) {
  submit(std::move(requests));
  return collect(progress, generated_tokens);
}

void OverlapRollout::sync(train::Trainer& trainer) {
  LS_CHECK(!in_flight_) << "OverlapRollout::sync while a batch is in flight (collect it first)";
  LS_CHECK(trainer.params() == source_) << "OverlapRollout::sync: the trainer's master moved";
  weights_->refresh(ctx_, trainer.version());  // the trainer is idle: nobody writes its master now
  engine_->update_weights(weights_.get());  // drops KV state built on the old weights
}

// The trainer's thread runs the replay (the engine's pool may be busy with a
// batch in flight): both read weights nobody writes until the next sync.
std::optional<std::string> OverlapRollout::localise(train::Trainer& trainer, const train::TrainSequence& seq,
                                                  const rollout::SamplingParams& params) {
  return rollout::localise_sample(trainer.context(), *weights_, trainer.weights(), engine_->config(), seq.tokens,
                                  seq.prompt_len, params);
}

}  // namespace lockstep::rl
