// The processors that reshape the sampling distribution of a request:
// logit_bias, min_new_tokens, repetition, frequency and presence penalties.
// They act on a copy of a row of logits before the token choice; the
// reported logprobs come from the unprocessed row (sampler.h), so their
// meaning (tempered, untruncated, what the trainer computes) never changes.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/rollout/sampler.h"

namespace lockstep::rollout {

// What a processor needs to know about the sample being drawn.
struct ProcessorInput {
  const std::vector<int32_t>* tokens = nullptr;  // prompt + output so far
  int64_t prompt_len = 0;
  const std::vector<int64_t>* eos_ids = nullptr;  // the model's; masked by min_new_tokens unless ignore_eos
};

// logits (V) f32, processed in place, in the order vLLM and SGLang apply
// them: logit_bias (added), min_new_tokens (EOS and stop_token_ids set to
// -inf while the output is shorter), repetition_penalty (a logit of a token
// in prompt + output divided by it when positive, multiplied when not), then
// frequency_penalty * count + presence_penalty for every token of the output.
// Token ids of logit_bias outside [0, V) are an Error (the server checks them first).
void process_logits(float* logits, int64_t V, const SamplingParams& p, const ProcessorInput& in);

}  // namespace lockstep::rollout
