// Rewards scored once per job, not once per trainer rank: each rank scores
// its contiguous share of the samples (TrainerGroup::shard) and the verdicts
// are gathered in rank order, so every rank holds the same verdicts for all
// samples. A reward with side effects (a Python file, an HTTP judge) sees
// each sample once, and ranks never disagree about a timeout.
#pragma once

#include <string>
#include <vector>

#include "lockstep/reward/batch.h"
#include "lockstep/rl/trainer_group.h"

namespace lockstep::rl {

// Collective over the group when it has more than one rank.
std::vector<reward::RewardResult> score_across_ranks(reward::BatchScorer& scorer, TrainerGroup& group,
                                                     const std::vector<reward::RewardRequest>& requests);

// The wire form of verdicts (exact: doubles round-trip through JSON).
std::string encode_results(const std::vector<reward::RewardResult>& results);
std::vector<reward::RewardResult> decode_results(const std::string& text);

}  // namespace lockstep::rl
