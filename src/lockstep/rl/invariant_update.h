// The RL update with [dist] world_invariant (docs/distributed.md): each
// mini-batch is cut into micro-batches without looking at the number of
// trainer ranks, ranks train runs of whole micro-batches, and every statistic
// is gathered per sequence and added in sequence order, so the update's
// metrics have the same bits on 1, 2, 3 or 4 ranks (the gradients are summed
// exactly by the trainer, comm/exact_sum.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "lockstep/rl/algo.h"
#include "lockstep/rl/trainer_group.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

// This rank's [begin, end) of the mini-batch `seqs`: whole micro-batches of
// the cut by micro_batch_tokens (parallel::split_micro_batches).
std::pair<size_t, size_t> invariant_shard(const TrainerGroup& group,
                                          const std::vector<train::TrainSequence>& seqs,
                                          int64_t micro_batch_tokens);

// Each sequence's loss and SeqLossStats of one mini-batch, written by the
// rank that trains it.
class SeqStatsTable {
 public:
  explicit SeqStatsTable(size_t n) : v_(n * kFields, 0.0) {}
  void set(size_t i, double loss, const SeqLossStats& st);
  // Collective: gathers every rank's entries (a rank-order sum in which one
  // rank holds each entry: x + 0 == x), then adds them into `ls` in sequence
  // order exactly as the loop does on one rank (pg_loss, kl and entropy
  // divided by n_mb). Returns the mini-batch's loss, summed in sequence order.
  double add_in_order(TrainerGroup& group, int64_t n_mb, SeqLossStats& ls);

 private:
  static constexpr size_t kFields = 7;  // loss, pg_loss, kl, entropy, clipped, ratio_sum, approx_kl
  std::vector<double> v_;               // (n, kFields)
};

// Collective: every rank's `mine` (the logprobs of its shard, in order)
// concatenated in rank order, cut into `lengths` (every sequence's count, in
// mini-batch order).
std::vector<std::vector<float>> gather_logprobs(TrainerGroup& group,
                                                const std::vector<std::vector<float>>& mine,
                                                const std::vector<size_t>& lengths);

}  // namespace lockstep::rl
