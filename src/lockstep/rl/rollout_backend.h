// Where the RL loop's samples come from. The loop only needs two things of a
// rollout backend: generate a batch of requests (results in request order),
// and take the trainer's new weights. LocalRollout is the colocated engine in
// this process; a distributed backend (rollout ranks over MPI) implements the
// same interface, and also the asynchronous submit/collect pair that lets the
// rollout generate the next batch while the trainer trains
// ([dist] max_weight_staleness > 0).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
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
  // What this backend holds in this process beyond the trainer's own
  // buffers (zeros for a rollout on other ranks): its f32 copy of the
  // master, its packed weights, and its KV cache (allocated bytes).
  struct Memory {
    size_t master = 0, packed = 0, kv_cache = 0;
  };
  virtual Memory memory() const { return {}; }

  // Overlap. A backend that can_overlap() starts a batch with submit() and
  // returns at once; collect() waits for that batch and returns its results
  // as generate() would. The batch is generated with the weights of the last
  // sync() before submit(), whatever the trainer does meanwhile. At most one
  // batch is in flight, and while it is neither generate() nor sync() may be
  // called: collect() first. Only a rollout that runs outside the trainer's
  // process (rollout ranks) can overlap; the others keep these defaults, and
  // submit/collect on them are errors.
  virtual bool can_overlap() const { return false; }
  virtual void submit(std::vector<rollout::Request> requests);
  virtual std::vector<rollout::RequestResult> collect(const RolloutProgress& progress, int64_t* generated_tokens);

  // Streaming (multi-turn episodes that do not wait for each other). A
  // backend that can_stream() serves, between begin_stream() and
  // end_stream(), requests from any thread: stream() returns at once and the
  // future completes when that request has finished, while the engine keeps
  // batching whatever else is running. Results are those generate() would
  // give (seeded, batch-invariant). No generate(), sync() or submit() in between.
  virtual bool can_stream() const { return false; }
  // Names the first intermediate at which this backend's decode of one
  // recorded sample differs from the trainer's forward over it
  // (rollout::localise_sample); nullopt where it cannot (the rollout on other
  // ranks, an expert-parallel trainer).
  virtual std::optional<std::string> localise(train::Trainer& trainer, const train::TrainSequence& seq,
                                              const rollout::SamplingParams& params);
  virtual void begin_stream();
  virtual std::future<rollout::RequestResult> stream(rollout::Request request);
  virtual void end_stream();
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
  bool can_stream() const override { return true; }
  Memory memory() const override;
  std::optional<std::string> localise(train::Trainer& trainer, const train::TrainSequence& seq,
                                      const rollout::SamplingParams& params) override;
  void begin_stream() override;
  std::future<rollout::RequestResult> stream(rollout::Request request) override;
  void end_stream() override;
  rollout::Engine& engine() { return *engine_; }

 private:
  const model::ModelWeights* weights(train::Trainer& trainer) const;
  void check_packed_bits(train::Trainer& trainer) const;
  // The trainer's adapters into engine_adapters_.
  void copy_adapters(const train::Trainer& trainer);
  Context ctx_;
  bool aligned_ = true;
  bool own_weights_ = false;   // fast mode, an expert-parallel trainer, or another device
  bool cross_device_ = false;  // [rollout] device differs from the trainer's
  Buffer model_;              // expert parallelism: the whole model's f32 parameters
  std::unique_ptr<model::ModelWeights> fast_weights_;  // own_weights_: this engine's packed copy
  // LoRA with the engine on another device: a copy of the trainer's adapters
  // in the engine's memory, refreshed at every sync, and the views over it.
  Buffer engine_adapters_;
  std::unique_ptr<model::LoraWeights> engine_lora_;
  std::unique_ptr<rollout::Engine> engine_;
};

}  // namespace lockstep::rl
