// Rollout one step ahead of training in one process ([dist]
// max_weight_staleness = 1 with rollout_ranks = 0 and a single trainer): the
// rollout engine runs on a thread of its own with a thread pool of its own,
// on a snapshot of the weights (its own packed projections and a copy of the
// few tensors read unpacked, model::ModelWeights::SnapshotOf), so it
// generates step k+1's first round while the trainer trains step k and
// updates its master in place. The
// semantics are those of MpiRollout's submit/collect: a batch is generated
// on the weights of the last sync, requests without a seed get the one
// fill_missing_seeds gives them (the same call count), and the engine's
// seed is the run's; so a run equals the same run with one MPI rollout rank
// bit for bit.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/rl/rollout_backend.h"

namespace lockstep::rl {

class OverlapRollout : public RolloutBackend {
 public:
  // threads: the engine's pool (<= 0: as many as the trainer's). The weights
  // are packed from the trainer's master now and at every sync. Error for an
  // expert-parallel trainer or a GPU context (not covered).
  OverlapRollout(train::Trainer& trainer, const rollout::RolloutSection& cfg, uint64_t seed, int64_t threads);
  ~OverlapRollout() override;

  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests, const RolloutProgress& progress,
                                               int64_t* generated_tokens) override;
  // Repacks this engine's weights from the trainer's f32 master (and copies
  // its unpacked tensors); only between a collect and the next submit.
  void sync(train::Trainer& trainer) override;
  bool aligned() const override { return aligned_; }
  size_t last_sync_bytes() const override { return sync_bytes_; }
  Memory memory() const override;
  bool can_overlap() const override { return true; }
  // Starts generating on the engine's thread and returns at once.
  void submit(std::vector<rollout::Request> requests) override;
  // Waits for the batch submitted last; progress is reported once, at the end.
  std::vector<rollout::RequestResult> collect(const RolloutProgress& progress, int64_t* generated_tokens) override;
  std::optional<std::string> localise(train::Trainer& trainer, const train::TrainSequence& seq,
                                      const rollout::SamplingParams& params) override;
  int threads() const { return pool_->size(); }

 private:
  struct Batch {
    std::vector<rollout::RequestResult> results;
    int64_t tokens = 0;
  };
  Batch run(std::vector<rollout::Request> requests);

  std::unique_ptr<ThreadPool> pool_;
  Context ctx_;
  bool aligned_ = true;
  uint64_t seed_;
  uint64_t calls_ = 0;
  size_t sync_bytes_;              // the f32 master a sync reads
  const float* source_ = nullptr;  // the trainer's master
  std::unique_ptr<model::ModelWeights> weights_;
  std::unique_ptr<rollout::Engine> engine_;
  std::optional<std::future<Batch>> in_flight_;
};

}  // namespace lockstep::rl
