// make_reward: the factory over every reward type. Apart from reward.cpp so
// that code reading reward options links without the rewards themselves.
#include "lockstep/reward/countdown.h"
#include "lockstep/reward/exact.h"
#include "lockstep/reward/math_verifier.h"
#include "lockstep/reward/python_reward.h"
#include "lockstep/reward/remote.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {

std::unique_ptr<Reward> make_reward(const RewardOptions& options) {
  options.validate();
  if (options.type == "math") return std::make_unique<MathVerifier>(options);
  if (options.type == "countdown") return std::make_unique<CountdownReward>(options);
  if (options.type == "exact") return std::make_unique<ExactMatchReward>(options);
  if (options.type == "python") return std::make_unique<PythonReward>(options);
  return std::make_unique<RemoteReward>(options);
}

}  // namespace lockstep::reward
