// Where the RL loop's samples come from. The loop only needs two things of a
// rollout backend: generate a batch of requests (results in request order),
// and take the trainer's new weights. LocalRollout is the colocated engine in
// this process; a distributed backend (rollout ranks over MPI) implements the
// same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lockstep/rollout/engine.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

// (finished samples, generated tokens) so far in the current generate call.
using RolloutProgress = std::function<void(int64_t, int64_t)>;

class RolloutBackend {
 public:
  virtual ~RolloutBackend() = default;
  // Runs every request to completion; results[i] belongs to requests[i].
  // *generated_tokens (if given) receives the tokens generated.
  virtual std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests,
                                                       const RolloutProgress& progress,
                                                       int64_t* generated_tokens) = 0;
  // Publishes the trainer's current weights (trainer.version()).
  virtual void sync(train::Trainer& trainer) = 0;
  // True when the rollout's logprobs are computed exactly as the trainer's
  // (same process or same bits, f32): the on-policy shortcut may apply.
  virtual bool aligned() const = 0;
  // Bytes the last sync() sent over the network (0: none, e.g. colocated);
  // the loop reports bytes / perf/weight_sync_s as perf/weight_sync_gb_per_s.
  virtual size_t last_sync_bytes() const { return 0; }
};

// The rollout engine in this process, reading the trainer's weights: in
// aligned mode (f32) the trainer's packed weights themselves, without a copy;
// in fast mode (bf16, fp8) its own packed copy, re-cast from the trainer's f32
// master parameters at every sync.
class LocalRollout : public RolloutBackend {
 public:
  LocalRollout(train::Trainer& trainer, const rollout::RolloutSection& cfg, uint64_t seed);
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests, const RolloutProgress& progress,
                                               int64_t* generated_tokens) override;
  void sync(train::Trainer& trainer) override;
  bool aligned() const override { return aligned_; }
  rollout::Engine& engine() { return *engine_; }

 private:
  const model::ModelWeights* weights(train::Trainer& trainer) const;
  Context ctx_;
  bool aligned_ = true;
  std::unique_ptr<model::ModelWeights> fast_weights_;
  std::unique_ptr<rollout::Engine> engine_;
};

}  // namespace lockstep::rl
