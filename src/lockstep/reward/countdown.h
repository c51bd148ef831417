// Countdown reward: the response's equation uses each given number exactly
// once with + - * / and parentheses and reaches the target (exact rational
// arithmetic). A well-formed but wrong equation earns the format reward.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lockstep/reward/bigint.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {

struct CountdownCheck {
  bool well_formed = false;   // only numbers, + - * / ( ) and spaces, and it parses
  bool numbers_ok = false;    // uses each given number exactly once
  std::optional<Rational> value;  // nullopt on division by zero
  bool reaches_target = false;
};

// Checks an equation such as "(93 - 43) + 1" (an "= 51" suffix is allowed).
CountdownCheck check_countdown(std::string_view equation, int64_t target, const std::vector<int64_t>& numbers);

// The equation in a response: the last <answer>...</answer>, else the last
// \boxed{}, else the last non-empty line.
std::string countdown_equation(std::string_view response);

class CountdownReward final : public Reward {
 public:
  explicit CountdownReward(const RewardOptions& options);
  RewardResult evaluate(const RewardRequest& request) const override;
  std::string type() const override { return "countdown"; }

 private:
  double correct_reward_, incorrect_reward_, format_reward_;
};

}  // namespace lockstep::reward
