// RewardWatch: the warning and the stop rule of reward failures.
#include "lockstep/rl/reward_watch.h"

#include <sstream>

#include "lockstep/base/log.h"

namespace lockstep::rl {

std::string RewardWatch::observe(int64_t step, const RewardTally& t) {
  if (t.failed > 0 && !warned_) {
    warned_ = true;
    LS_LOG(Warn) << "rl step " << step << ": " << t.failed << " of " << t.scored
                 << " rewards failed (failed samples do not train; samples/*.jsonl gives each one's "
                 << "reward_failure); the first: " << t.first_failure;
  }
  over_ = t.scored > 0 && t.rate() > max_rate_ ? over_ + 1 : 0;
  std::ostringstream why;
  if (t.scored > 0 && t.failed == t.scored) {
    why << "rl step " << step << ": every reward failed (" << t.failed << " of " << t.scored << ")";
  } else if (over_ >= kPatience) {
    why << "rl step " << step << ": reward failures above [reward] max_failure_rate = " << max_rate_
        << " for " << over_ << " steps in a row (" << t.failed << " of " << t.scored << " this step)";
  } else {
    return "";
  }
  why << "; the first failure: " << t.first_failure
      << ". The run stops; its metrics and checkpoints so far are kept (fix the reward or the data, then "
         "--resume)";
  return why.str();
}

}  // namespace lockstep::rl
