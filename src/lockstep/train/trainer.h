// The trainer: owns the f32 master parameters, their gradients and the
// optimizer; scores sequences (per-token logprobs under the current weights)
// and accumulates gradients of any per-token loss over micro-batches cut by a
// token budget. It calls the same model::forward as the rollout engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/train/optimizer.h"

namespace lockstep::train {

// A sequence to score or train on: the loss covers tokens[prompt_len..].
struct TrainSequence {
  std::vector<int32_t> tokens;
  int32_t prompt_len = 1;  // >= 1: the first token is never predicted
  // Optional routing replay (R3): (len, L_moe, K) experts for every token.
  std::vector<int32_t> routed_experts;
  int64_t num_targets() const { return int64_t(tokens.size()) - prompt_len; }
};

// Per response token of one sequence.
struct TokenScores {
  std::vector<float> logp;
  std::vector<float> entropy;  // empty unless asked for
};

// Per-sequence loss: given the response tokens' logp (and entropy, or null),
// writes dloss/dlogp (and dloss/dentropy when entropy is non-null) and
// returns the sequence's loss contribution.
using LossFn = std::function<double(size_t seq, const float* logp, const float* entropy, int64_t n, float* dlogp,
                                    float* dentropy)>;

struct TrainerConfig {
  OptimizerConfig optim;
  int64_t micro_batch_tokens = 4096;  // token budget of one forward/backward
  // Keep only each layer's input during the forward and recompute the rest in
  // backward, one layer at a time: activation memory of one layer instead of
  // all, for about one more forward's work. Gradients have the same bits.
  bool recompute_activations = false;
  int kv_block_size = 16;
  // Data parallelism (dist/data_parallel.h): when set, step() first replaces
  // the accumulated gradients grads[0, n) by their sum over all ranks. The
  // LossFn must then normalise by global counts (tokens of the global batch).
  std::function<void(float* grads, size_t n)> grad_reduce;
};

struct ScoreOptions {
  float temperature = 1.0f;
  bool entropy = false;
  bool replay = false;  // use TrainSequence::routed_experts
};

struct RunBuffers;  // trainer.cpp

class Trainer {
 public:
  Trainer(const Context& ctx, const ModelConfig& config, Buffer params, TrainerConfig cfg);

  // Forward only.
  std::vector<TokenScores> score(const std::vector<TrainSequence>& seqs, const ScoreOptions& opt);
  // Forward + backward over micro-batches, gradients accumulate. Returns the
  // summed loss; the scores of the forward are written to *scores if given.
  double accumulate(const std::vector<TrainSequence>& seqs, const LossFn& loss, const ScoreOptions& opt,
                    std::vector<TokenScores>* scores = nullptr);
  // grad_reduce (if set), clip, AdamW, zero the gradients, repack the weights, version += 1.
  OptimizerStats step();

  const Context& context() const { return ctx_; }
  const ModelConfig& config() const { return layout_.config(); }
  const ParamLayout& layout() const { return layout_; }
  const model::ModelWeights& weights() const { return *weights_; }
  float* params() { return params_.as<float>(); }
  float* grads() { return grads_.as<float>(); }
  uint64_t version() const { return weights_->version(); }
  AdamW& optimizer() { return optimizer_; }
  TrainerConfig& trainer_config() { return cfg_; }
  // Expert parallelism (model/expert_parallel.h): from now on this trainer
  // packs and runs only its shard of every MoE layer's experts (shard
  // comm->rank() of comm->size()) and exchanges expert rows with the group's
  // ranks; null: all experts again. The parameters, gradients and optimizer
  // stay whole on every rank; backward writes gradients only for this rank's
  // experts (the group's tokens), so grad_reduce must sum over every trainer
  // rank. Every rank of the group must make the same sequence of score() and
  // accumulate() calls (each call runs as many micro-batches as the group's
  // largest, empty ones included). `comm` must outlive the trainer's use of it.
  void set_expert_comm(model::ExpertComm* comm);
  model::ExpertComm* expert_comm() const { return experts_; }
  // After params() were overwritten (checkpoint load): repack, set version.
  void params_changed(uint64_t version);
  // Token-budget micro-batches: [begin, end) index ranges into seqs.
  std::vector<std::pair<size_t, size_t>> micro_batches(const std::vector<TrainSequence>& seqs) const;

 private:
  double run(const std::vector<TrainSequence>& seqs, const LossFn* loss, const ScoreOptions& opt,
             std::vector<TokenScores>* scores);

  Context ctx_;
  ParamLayout layout_;
  Buffer params_, grads_;
  ModelParams grad_views_;
  TrainerConfig cfg_;
  AdamW optimizer_;
  std::unique_ptr<model::ModelWeights> weights_;
  model::ExpertComm* experts_ = nullptr;
  // run()'s KV cache, saved activations and logits (trainer.cpp), kept from
  // call to call: re-allocating them made every step fault in fresh pages.
  std::shared_ptr<RunBuffers> buffers_;
};

}  // namespace lockstep::train
