// The critic of PPO with GAE (rl/gae.h): the transformer body with a scalar
// value head on the final hidden state (after the final norm), and its own
// optimizer. The value of response token t is the head applied to the hidden
// state of position t - 1, the state the token was sampled from (verl's
// critic). The body's gradient reaches it through the head input
// (model::backward_from_head_input); the lm_head is not used.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/train/trainer.h"

namespace lockstep::train {

// The [critic] section's trainer settings (docs/configuration.md).
struct CriticConfig {
  OptimizerConfig optim;  // lr, schedule, weight_decay, grad_clip: the critic's own
  int64_t micro_batch_tokens = 4096;
  int kv_block_size = 16;
  bool recompute_activations = false;
  double cliprange_value = 0.5;  // verl's critic.cliprange_value
};

// Per-sequence value loss: given the response tokens' predicted values
// vpred (n), writes dloss/dvpred and returns the sequence's loss.
using ValueLossFn = std::function<double(size_t seq, const float* vpred, int64_t n, float* dvpred)>;

// What value_loss adds up over a batch's tokens.
struct ValueLossStats {
  double loss = 0;       // sum of token_weight * the token's term
  int64_t clipped = 0;   // tokens whose clipped term was the larger (verl's vf_clipfrac)
  double vpred_sum = 0;  // sum of the predicted values
};

// verl's clipped value loss of one sequence of n tokens, each weighted by
// token_weight (1 / the batch's tokens: token-mean):
//   vclip_t = old_t + clamp(vpred_t - old_t, -cliprange, cliprange)
//   term_t  = 0.5 * max((vpred_t - R_t)^2, (vclip_t - R_t)^2)
// Writes dloss/dvpred (0 where the clipped term wins: it is flat in vpred
// there) and returns sum_t token_weight * term_t. mask (n, may be null)
// leaves its 0 tokens out. Stats are added to *stats.
double value_loss(const float* vpred, const float* old_values, const double* returns, const uint8_t* mask,
                  int64_t n, double cliprange, double token_weight, float* dvpred, ValueLossStats* stats);

struct CriticBuffers;  // critic.cpp

class Critic {
 public:
  // params: the body's f32 parameters (ParamLayout(config)). The value head,
  // weight (D) and bias, starts at zero: every value is 0 until it trains.
  Critic(const Context& ctx, const ModelConfig& config, Buffer params, CriticConfig cfg);

  // The value of every response token (tokens[prompt_len..]) of each sequence.
  std::vector<std::vector<float>> values(const std::vector<TrainSequence>& seqs);
  // Forward + backward over micro-batches; gradients accumulate. Returns the
  // summed loss; the predicted values are written to *vpred if given.
  double accumulate(const std::vector<TrainSequence>& seqs, const ValueLossFn& loss,
                    std::vector<std::vector<float>>* vpred = nullptr);
  // One AdamW step of body and head together: the gradient norm and clipping
  // over both, the head at the body's learning rate. Zeroes the gradients.
  OptimizerStats step();
  void zero_grad();

  const CriticConfig& config() const { return cfg_; }
  Trainer& body() { return *body_; }
  // (D + 1): the value head's weight, then its bias; head_grads() alike.
  float* head() { return head_.data(); }
  float* head_grads() { return head_grad_.data(); }

  // A Hugging Face directory: config.json and the body's safetensors, the
  // head in value_head.safetensors ("score.weight" (1, D), "score.bias"
  // (1), as a token-classification model with one label names it), the
  // body's optimizer.bin and the head's moments in
  // value_head_optimizer.safetensors.
  void save(const std::string& dir);
  // Reads what save wrote (the model must match: Error naming the directory).
  void load(const std::string& dir);
  // Only the head from `dir`'s value_head.safetensors, when there is one
  // (a critic's starting point: [critic] path).
  void load_head_if_present(const std::string& dir);

 private:
  double run(const std::vector<TrainSequence>& seqs, const ValueLossFn* loss,
             std::vector<std::vector<float>>* vpred);

  Context ctx_;
  Context host_;  // ctx_ without its backend: the value head's buffers are host memory
  CriticConfig cfg_;
  std::unique_ptr<Trainer> body_;
  std::vector<float> head_, head_grad_, head_m_, head_v_;  // (D + 1) each
  std::shared_ptr<CriticBuffers> buffers_;
};

}  // namespace lockstep::train
