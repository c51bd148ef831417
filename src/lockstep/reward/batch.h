// Batch scoring: many samples scored in parallel on worker threads, each
// with a time limit. A sample that runs past the limit is reported as a
// failure ("timeout") and its worker is replaced; the late result is
// discarded. Failures are counted (rollout/reward_failures), never scored as
// wrong answers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/reward/reward.h"

namespace lockstep::reward {

struct BatchOptions {
  int threads = 0;          // worker threads; 0: default_thread_count()
  double timeout_s = 10.0;  // per sample, counted from when a worker starts it
  // How long the destructor waits for workers still busy with timed-out
  // samples before detaching them (they own all they touch, see batch.cpp).
  double exit_grace_s = 1.0;
};

// Options for scoring with `options`' reward: its thread count and time
// limit (plus a little slack for remote rewards, whose own time budget is
// timeout_s, so that they report their precise failure first).
BatchOptions batch_options_for(const RewardOptions& options);

struct BatchStats {
  int64_t n = 0;
  int64_t correct = 0;
  int64_t failures = 0;  // samples with a failure, timeouts included
  int64_t timeouts = 0;
  double reward_sum = 0.0;  // over samples that did not fail
  double seconds = 0.0;     // wall time of score()
  std::map<std::string, int64_t> failure_reasons;  // "timeout", "bad_label", "http 500", ...
  // RewardResult::extra over the samples that did not fail and reported the key.
  std::map<std::string, double> extra_sum;
  std::map<std::string, int64_t> extra_n;

  void add(const RewardResult& r);
  void merge(const BatchStats& other);
  double accuracy() const { return n ? static_cast<double>(correct) / static_cast<double>(n) : 0.0; }
  double reward_mean() const;  // over samples that did not fail
  // rollout/reward_failures, rollout/reward_timeouts, rollout/reward_accuracy, rollout/reward_mean,
  // and reward/extra/<key>: the mean of each extra key over the samples that reported it.
  std::map<std::string, double> metrics() const;
};

class BatchScorer {
 public:
  BatchScorer(std::shared_ptr<const Reward> reward, BatchOptions options);
  ~BatchScorer();
  BatchScorer(const BatchScorer&) = delete;
  BatchScorer& operator=(const BatchScorer&) = delete;

  // Scores every request; results[i] belongs to requests[i]. Returns when
  // each sample has a result or has timed out. Adds to *stats if given.
  std::vector<RewardResult> score(const std::vector<RewardRequest>& requests, BatchStats* stats = nullptr);

  int threads() const;

 private:
  struct Core;
  std::shared_ptr<Core> core_;
  BatchOptions options_;
};

}  // namespace lockstep::reward
