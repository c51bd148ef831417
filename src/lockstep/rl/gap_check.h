// Fail-closed alignment: in aligned mode (both engines in one precision) a
// token whose rollout and trainer logprobs differ in any bit is a bug, found
// here before the optimizer runs ([rl] on_gap, docs/alignment.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::rl {

// The first token, in sample then position order, whose two logprobs have
// different bits. `sample` counts from first_sample.
struct GapToken {
  size_t sample = 0;
  int64_t token = 0;  // index among the sample's response tokens
  float rollout = 0, trainer = 0;
};
std::optional<GapToken> first_gap(const std::vector<std::vector<float>>& rollout,
                                  const std::vector<std::vector<float>>& trainer, size_t first_sample = 0);

// "sample S of the step's batch, response token T (position P): rollout
// logprob X, trainer Y" with both values' bits.
std::string describe_gap(const GapToken& g, int64_t prompt_len);

}  // namespace lockstep::rl
