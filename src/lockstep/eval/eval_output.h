// How an evaluation is reported: the flat metric map the RL loop logs
// (eval/<name>/...), summary.json, the per-problem JSONL lines and the
// console table of `lockstep eval`.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/eval/evaluator.h"

namespace lockstep::eval {

// eval/<name>/pass@1, eval/<name>/pass@<k> for every reported k,
// eval/<name>/truncated_ratio, response_len_mean, reward_mean,
// reward_failures, num_problems, num_samples, tokens_per_s, time_s.
std::map<std::string, double> eval_metrics(const EvalSummary& s);
// summary.json: the metrics above under "metrics", plus every summary field
// under its own name ("pass@k" maps k to the value).
nlohmann::json summary_to_json(const EvalSummary& s);
// One line of the per-problem JSONL: prompt, label, n, correct, pass@k and
// every sample with its reward, verdict and finish reason.
nlohmann::json problem_to_json(const EvalProblemResult& p);
// The console table of `lockstep eval`.
std::string format_summary_table(const EvalSummary& s);

}  // namespace lockstep::eval
