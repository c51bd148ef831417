// The math verifier: extracts the final answer from a response and decides
// whether it equals the label (numbers, fractions, expressions, tuples,
// sets, intervals, equations, percentages, multiple-choice letters).
#pragma once

#include <string_view>
#include <vector>

#include "lockstep/reward/math_text.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {

// Compares an extracted answer with a label's answer (both as text, before
// parsing). Every input terminates quickly; see docs/rewards.md for the rules.
bool math_answers_equivalent(std::string_view gold, std::string_view pred, double rel_tol = 1e-6);

// Convenience for tests and tools: extracts from `response` with the default
// extractors and compares with `label` (label_to_answer applied).
bool math_response_correct(std::string_view response, std::string_view label, double rel_tol = 1e-6);

class MathVerifier final : public Reward {
 public:
  explicit MathVerifier(const RewardOptions& options);
  RewardResult evaluate(const RewardRequest& request) const override;
  std::string type() const override { return "math"; }

 private:
  std::vector<Extractor> extractors_;
  double tolerance_;
  double correct_reward_, incorrect_reward_, format_reward_;
};

}  // namespace lockstep::reward
