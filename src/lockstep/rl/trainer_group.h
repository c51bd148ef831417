// The trainer ranks the RL loop runs on, as the loop sees them: every rank
// runs the loop on the same samples, trains on its shard of each mini-batch
// and joins the sums of the step's statistics. OneRank is a single process;
// rl/dist_group.h holds the MPI group. StepSums is what update() sums.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/rl/algo.h"
#include "lockstep/train/mismatch.h"

namespace lockstep::rl {

class TrainerGroup {
 public:
  virtual ~TrainerGroup() = default;
  virtual int ranks() const = 0;
  virtual int rank() const = 0;  // this rank's index in [0, ranks())
  // Only the writer writes metrics, samples, eval files, checkpoints, reports.
  virtual bool writer() const = 0;
  // This rank's share [begin, end) of a mini-batch of n sequences.
  virtual std::pair<size_t, size_t> shard(size_t n) const = 0;
  // Sums v[0, n) element-wise over the ranks, in rank order, in place.
  virtual void sum(double* v, size_t n) = 0;
  // The largest of x over the ranks.
  virtual double max(double x) = 0;
  // Every rank's `mine`, in rank order (the RL loop gathers reward verdicts).
  virtual std::vector<std::string> gather_strings(const std::string& mine) = 0;
};

// One trainer: the whole mini-batch, sums and maxima of one value.
class OneRank final : public TrainerGroup {
 public:
  explicit OneRank(bool writer = true) : writer_(writer) {}
  int ranks() const override { return 1; }
  int rank() const override { return 0; }
  bool writer() const override { return writer_; }
  std::pair<size_t, size_t> shard(size_t n) const override { return {0, n}; }
  void sum(double*, size_t) override {}
  double max(double x) override { return x; }
  std::vector<std::string> gather_strings(const std::string& mine) override { return {mine}; }

 private:
  bool writer_;
};

// The statistics of one update that every rank adds its share to.
struct StepSums {
  SeqLossStats loss;  // over this rank's sequences of every mini-batch
  // The first mini-batch's train/rollout mismatch over this rank's shard (the
  // on-policy shortcut measures it there); reduced only when set.
  bool has_mismatch = false;
  train::MismatchStats mismatch;

  // Replaces every field by its sum over the group (means by the mean over
  // the union of the shards, abs_diff_max by the maximum). Collective; one
  // rank keeps its values as they are (bit for bit).
  void reduce(TrainerGroup& group);
};

}  // namespace lockstep::rl
