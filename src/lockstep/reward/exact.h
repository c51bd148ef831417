// Exact-match reward: the response (or the answer an extractor finds in it)
// equals the label, optionally ignoring surrounding whitespace and case.
#pragma once

#include <vector>

#include "lockstep/reward/math_text.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {

class ExactMatchReward final : public Reward {
 public:
  explicit ExactMatchReward(const RewardOptions& options);
  RewardResult evaluate(const RewardRequest& request) const override;
  std::string type() const override { return "exact"; }

 private:
  std::string normalize(std::string_view s) const;

  std::vector<Extractor> extractors_;  // empty: compare the whole response
  bool strip_, casefold_;
  double correct_reward_, incorrect_reward_, format_reward_;
};

}  // namespace lockstep::reward
