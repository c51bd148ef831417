// The `rl` console line of one step: where the run is, what the rewards came
// to (failures included) and why a step made no update, e.g.
//   step 3/10 | reward 0.42 (3/16 failed) | acc 0.5 | ... | s 1.2 | elapsed 4s, left 9s
//   step 4/10 | reward - (16/16 failed) | ... | skipped: all groups filtered | ...
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/rl/reward_watch.h"

namespace lockstep::rl {

// head: "step 3/10"; m: the step's metrics; skipped: why no update ran ("":
// it did); timing: "elapsed 4s, left 9s".
std::string format_step_line(const std::string& head, const nlohmann::json& m, const RewardTally& rewards,
                             const std::string& skipped, const std::string& timing);

}  // namespace lockstep::rl
