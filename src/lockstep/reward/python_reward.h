// PythonReward: a user's reward function in Python, called as verl calls it:
//   compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)
// on a pool of worker processes (reward/python_pool.h) that import the file
// once. A float/int/bool return is the reward; a dict gives it as "score"
// and its other numeric keys as RewardResult::extra. `async def` functions
// are awaited. Exceptions, bad returns, timeouts and crashed workers are
// failures (never a zero reward); see docs/rewards.md "Python rewards".
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "lockstep/reward/python_pool.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {

// The keyword arguments of one call: data_source = metadata["data_source"]
// (else None), solution_str = the response, ground_truth = the label,
// extra_info = metadata["extra_info"] when metadata holds that key, else
// the metadata itself (None when absent). A verl row's top-level
// data_source and extra_info are put into the metadata when the dataset is
// read (data/fields.h).
nlohmann::json verl_kwargs(const RewardRequest& request);

// min(4, hardware threads): the default of reward.workers.
int default_python_workers();

class PythonReward final : public Reward {
 public:
  // Starts the workers; throws Error naming the file (and line) when the
  // interpreter or file is missing, the file does not import, the function
  // is missing, not callable, or annotated to return something else.
  explicit PythonReward(const RewardOptions& options);
  RewardResult evaluate(const RewardRequest& request) const override;
  std::string type() const override { return "python"; }
  int max_parallelism() const override { return pool_->workers(); }
  PythonPool& pool() const { return *pool_; }

 private:
  RewardResult from_return(const nlohmann::json& v) const;
  RewardResult from_failure(const PythonCallResult& c) const;
  void log_traceback(const std::string& traceback) const;

  std::unique_ptr<PythonPool> pool_;
  std::string function_;
  std::string where_;  // "compute_score (my_reward.py:12)"
  double timeout_s_ = 10;
  mutable std::mutex log_mu_;
  mutable std::set<size_t> logged_;  // hashes of the tracebacks logged so far
  mutable bool log_capped_ = false;
};

}  // namespace lockstep::reward
