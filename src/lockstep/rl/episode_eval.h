// Held-out evaluation of a multi-turn task ([eval] with [rollout] env): every
// problem runs `n` episodes of the environment with the eval's sampling
// (temperature, max_new_tokens per turn, seed), turn by turn as in training.
// An episode is scored as a training sample is: by the rewards its
// environment gave (correct when their sum is > 0), or, when it gave none,
// by the eval's verifier on the episode's last model turn. An environment
// failure is a scoring failure (reported, never counted correct). pass@k,
// truncation (the token budget or the context) and the mean number of model
// turns follow (docs/eval.md, docs/agents.md).
#pragma once

#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/eval/evaluator.h"
#include "lockstep/rl/multi_turn.h"

namespace lockstep::rl {

// `episodes` was built with the eval's sampling (eval_sampling()). `score`
// scores the episodes without an environment reward (the evaluator's batch
// scorer, or the RL loop's split over trainer ranks).
eval::EvalSummary evaluate_episodes(MultiTurnRollout& episodes, const eval::EvalConfig& config,
                                    const eval::Evaluator::ScoreBatchFn& score, const tokenizer::Tokenizer& tok,
                                    const std::vector<data::PromptExample>& problems,
                                    std::vector<eval::EvalProblemResult>* per_problem, MultiTurnStats* stats);

// The sampling of an eval's episodes: config.sampling with n = config.n.
rollout::SamplingParams eval_sampling(const eval::EvalConfig& config);

}  // namespace lockstep::rl
