// Reward failures step after step: a run whose verifier fails (a bad label,
// a reward file returning a string, a dead reward server) must not train on
// in silence. The watch warns once, naming the first failure, and stops the
// run when every reward of a step failed or the failure rate stayed above
// [reward] max_failure_rate for kPatience steps in a row.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::rl {

// One step's reward verdicts (samples the environment scored aside).
struct RewardTally {
  int64_t scored = 0;         // samples sent to the reward
  int64_t failed = 0;         // of them, the failed ones
  std::string first_failure;  // the first failed sample's reason
  double rate() const { return scored ? double(failed) / double(scored) : 0.0; }
};

class RewardWatch {
 public:
  static constexpr int kPatience = 3;  // steps in a row above the rate before the run stops

  explicit RewardWatch(double max_failure_rate) : max_rate_(max_failure_rate) {}
  // Records the step; logs the warning on the run's first failure. Returns
  // why the run must stop ("" to go on).
  std::string observe(int64_t step, const RewardTally& t);

 private:
  double max_rate_;
  int over_ = 0;  // steps in a row above max_rate_
  bool warned_ = false;
};

}  // namespace lockstep::rl
