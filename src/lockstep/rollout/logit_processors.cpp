// Logit processors: each a pass over the row or over the sample's tokens.
#include "lockstep/rollout/logit_processors.h"

#include <cmath>
#include <limits>

#include "lockstep/base/error.h"

namespace lockstep::rollout {

namespace {

void mask_stop_tokens(float* logits, int64_t V, const SamplingParams& p, const ProcessorInput& in) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (!p.ignore_eos && in.eos_ids)
    for (int64_t e : *in.eos_ids)
      if (e >= 0 && e < V) logits[e] = ninf;
  for (int32_t e : p.stop_token_ids)
    if (e >= 0 && e < V) logits[e] = ninf;
}

void repetition(float* logits, int64_t V, float penalty, const std::vector<int32_t>& tokens) {
  std::vector<char> seen(static_cast<size_t>(V), 0);
  for (int32_t t : tokens)
    if (t >= 0 && t < V) seen[size_t(t)] = 1;
  for (int64_t i = 0; i < V; ++i)
    if (seen[size_t(i)]) logits[i] = logits[i] > 0.0f ? logits[i] / penalty : logits[i] * penalty;
}

void frequency_presence(float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& tokens,
                        int64_t prompt_len) {
  std::vector<int32_t> count(static_cast<size_t>(V), 0);  // (V) occurrences in the output
  for (size_t i = size_t(prompt_len); i < tokens.size(); ++i)
    if (tokens[i] >= 0 && tokens[i] < V) ++count[size_t(tokens[i])];
  for (int64_t i = 0; i < V; ++i) {
    const int32_t c = count[size_t(i)];
    if (c > 0) logits[i] -= p.frequency_penalty * float(c) + p.presence_penalty;
  }
}

}  // namespace

void process_logits(float* logits, int64_t V, const SamplingParams& p, const ProcessorInput& in) {
  LS_CHECK(in.tokens != nullptr) << "process_logits without the sample's tokens";
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= V) LS_THROW << "logit_bias: token id " << id << " is outside [0, " << V << ")";
    logits[id] += bias;
  }
  const int64_t out_len = int64_t(in.tokens->size()) - in.prompt_len;
  if (out_len < p.min_new_tokens) mask_stop_tokens(logits, V, p, in);
  if (p.repetition_penalty != 1.0f) repetition(logits, V, p.repetition_penalty, *in.tokens);
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    frequency_presence(logits, V, p, *in.tokens, in.prompt_len);
}

}  // namespace lockstep::rollout
