// SamplingParams::validate: the checks on sampling parameters that come from
// configs and HTTP requests. Apart from sampler.cpp so that request parsing
// links without the sampling kernels.
#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/rollout/sampler.h"

namespace lockstep::rollout {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    LS_THROW << "sampling_params.temperature must be >= 0, got " << temperature;
  if (!(top_p > 0.0f && top_p <= 1.0f)) LS_THROW << "sampling_params.top_p must be in (0, 1], got " << top_p;
  if (!(min_p >= 0.0f && min_p <= 1.0f)) LS_THROW << "sampling_params.min_p must be in [0, 1], got " << min_p;
  if (max_new_tokens < 1) LS_THROW << "sampling_params.max_new_tokens must be >= 1, got " << max_new_tokens;
  if (n < 1 || n > 1024) LS_THROW << "sampling_params.n must be in [1, 1024], got " << n;
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs)
    LS_THROW << "sampling_params.top_logprobs must be in [0, " << kMaxTopLogprobs << "], got "
             << top_logprobs;
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    LS_THROW << "sampling_params.frequency_penalty must be in [-2, 2], got " << frequency_penalty;
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    LS_THROW << "sampling_params.presence_penalty must be in [-2, 2], got " << presence_penalty;
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    LS_THROW << "sampling_params.repetition_penalty must be > 0, got " << repetition_penalty;
  if (min_new_tokens < 0) LS_THROW << "sampling_params.min_new_tokens must be >= 0, got " << min_new_tokens;
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) LS_THROW << "sampling_params.logit_bias: token id " << id << " is negative";
    if (!(bias >= -100.0f && bias <= 100.0f))
      LS_THROW << "sampling_params.logit_bias[" << id << "] must be in [-100, 100], got " << bias;
  }
}

}  // namespace lockstep::rollout
