// Token sampling from one row of logits: greedy, temperature, top-k, top-p,
// min-p. A sample's random number is Philox(seed) at (stream = sample key,
// counter = position), so its tokens never depend on what else shares the
// batch. The reported logprob is that of the tempered, untruncated
// distribution, computed by kernels::token_logprob_forward — the function
// the trainer uses — so it matches the trainer's bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/sampling_rules.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::rollout {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (logprobs then reported at temperature 1)
  int64_t top_k = 0;         // 0 or < 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  int64_t max_new_tokens = 256;
  std::vector<int32_t> stop_token_ids;  // in addition to the model's eos ids
  std::vector<std::string> stop;        // stop strings (need a tokenizer)
  bool ignore_eos = false;
  int64_t n = 1;                  // samples per prompt (sharing the prompt's KV blocks)
  int64_t seed = -1;              // -1: the engine's seed mixed with the request id
  bool return_logprobs = true;
  // Top alternatives reported per position (0: none, at most kMaxTopLogprobs),
  // from the same distribution as the logprobs.
  int64_t top_logprobs = 0;
  // Processors of the sampling distribution only (logit_processors.h): the
  // reported logprobs stay those of the unprocessed, tempered distribution.
  float frequency_penalty = 0.0f;   // [-2, 2], times a token's count in the output
  float presence_penalty = 0.0f;    // [-2, 2], once for a token present in the output
  float repetition_penalty = 1.0f;  // > 0, over prompt + output (1: off)
  int64_t min_new_tokens = 0;       // EOS and stop tokens masked, stop strings ignored, before this many
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, [-100, 100] added to its logit)

  // Throws Error naming the first invalid field.
  void validate() const;
  // The temperature used for logprobs (1 for greedy).
  float logprob_temperature() const { return temperature > 0.0f ? temperature : 1.0f; }
  // Whether any processor changes the sampling distribution.
  bool processes_logits() const {
    return frequency_penalty != 0.0f || presence_penalty != 0.0f || repetition_penalty != 1.0f ||
           min_new_tokens > 0 || !logit_bias.empty();
  }
};

// The most alternatives a request may ask for (OpenAI's limit).
constexpr int64_t kMaxTopLogprobs = 20;

// One position's alternatives: (token id, logprob), highest logprob first,
// ties by lower id.
using TopLogprobs = std::vector<std::pair<int32_t, float>>;

// Per-sample random stream key.
uint64_t sample_stream(uint64_t request_seed, int64_t sample_index);

// The draw of sample `sample_index` of a request at token position
// `position` on logits row `logit_row`: its random number is
// Philox(request_seed) at (sample_stream(request_seed, sample_index), position).
kernels::SampleSpec sample_spec(const SamplingParams& p, uint64_t request_seed, int64_t sample_index,
                                int64_t position, int64_t logit_row);

// Samples one token from logits (V) f32 with the draw `u` in [0, 1) given: the
// one-row form of kernels::sample_rows (kernels/cpu/sampling.h defines the
// choice). Without truncation (top-k, top-p, min-p off) the inverse CDF runs
// over token ids in order; with truncation over the candidates sorted by
// logit, ties ordered by lower id. Greedy picks the lowest id among the
// maxima. Thread-safe.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, double u);

// Logprob of `token` under softmax(logits / T) for each row: the same kernel
// call the trainer makes. logits (R, V); tokens (R); out (R).
void token_logprobs(const Context& ctx, const Tensor& logits, const std::vector<int32_t>& tokens, float temperature,
                    std::vector<float>* out);

// The k most likely tokens of each row under softmax(logits / T), ranked by
// kernels::log_softmax_forward (token_logprob_forward's documented twin);
// each value is token_logprob_forward's for that token on that row, bit for
// bit. logits (R, V); out (R).
void top_logprobs(const Context& ctx, const Tensor& logits, int64_t k, float temperature,
                  std::vector<TopLogprobs>* out);

}  // namespace lockstep::rollout
