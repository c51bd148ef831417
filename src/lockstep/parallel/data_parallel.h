// Data-parallel training: every rank of a dp comm::Communicator holds the same
// weights and optimizer state, trains on its shard of the global batch, and
// Trainer::step() sums the gradients over ranks (TrainerConfig::grad_reduce)
// before clipping and AdamW, so all ranks take the same step.
//
// Equivalence (docs/distributed.md, tests/parallel/data_parallel_mpi.cpp):
// - P ranks == emulate_dp_accumulate with the same P shards in one process,
//   bit for bit (same per-shard gradients, same comm::sum_in_rank_order);
// - P ranks vs the plain single-rank accumulate: equal up to floating-point
//   reassociation of the gradient sum (per-shard partials are added instead
//   of one running sum), a relative gradient difference of ~1e-7;
// - with TrainerConfig::world_invariant, P ranks == 1 rank bit for bit: the
//   batch is cut into micro-batches without looking at P, ranks take runs of
//   whole micro-batches (split_micro_batches), and the gradients are summed
//   exactly (comm/exact_sum.h).
#pragma once

#include <cstddef>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/train/sft.h"
#include "lockstep/train/trainer.h"

namespace lockstep::parallel {

struct Range {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// Contiguous shards of n items, equal counts: shard r = [n*r/P, n*(r+1)/P).
std::vector<Range> split_even(size_t n, int P);
// Contiguous shards with about equal token counts: shard r ends at the first
// sequence where the cumulative token count reaches total*(r+1)/P. Pure
// function of the lengths, so every rank computes the same split.
std::vector<Range> split_by_tokens(const std::vector<train::TrainSequence>& seqs, int P);
// The world-invariant shards: the batch cut into micro-batches by the
// trainer's token budget (train::micro_batches, which never looks at P), and
// those micro-batches shared out as P contiguous runs of about equal token
// counts (split_by_tokens' rule over the micro-batches). Shard r covers whole
// micro-batches, so the trainer's own cut of it repeats the global cut: every
// micro-batch holds the same sequences for any P. Shards may be empty.
std::vector<Range> split_micro_batches(const std::vector<train::TrainSequence>& seqs, int64_t micro_batch_tokens,
                                       int P);
// The shards a data-parallel step uses on `trainer`: split_micro_batches with
// world_invariant, split_by_tokens otherwise.
std::vector<Range> step_shards(const train::Trainer& trainer, const std::vector<train::TrainSequence>& seqs, int P);

// Sum of v in index order, in double: the one order world-invariant losses
// and statistics are added in, on any number of ranks.
double ordered_sum(const std::vector<double>& v);

// Sets trainer's grad_reduce to dp.all_reduce_sum (world_invariant: its
// exact_reduce to the exact fixed-point all_reduce_sum). `dp` must outlive every
// later trainer.step(). A dp of size 1 leaves step() as it was.
// Expert parallelism (call after Trainer::set_expert_comm): the gradients of
// the trainer's own routed experts are summed over `expert_replicas` instead
// (the trainer ranks holding the same experts, one per expert-parallel group;
// null or size 1: not summed), everything else over `dp` (every trainer).
void make_data_parallel(train::Trainer& trainer, comm::Communicator& dp, comm::Communicator* expert_replicas = nullptr);

// Rank dp.rank() accumulates the gradient of shards[dp.rank()] of the global
// batch. `loss` gets indices into global_batch and must normalise by global
// counts. Returns the global loss (sum over ranks in rank order; the same on
// every rank). The gradients are summed over ranks by the next step().
double dp_accumulate(train::Trainer& trainer, comm::Communicator& dp, const std::vector<train::TrainSequence>& global_batch,
                     const std::vector<Range>& shards, const train::LossFn& loss, const train::ScoreOptions& opt);

// The same in one process, for any number of shards: accumulates each shard
// from zero gradients, then leaves comm::sum_in_rank_order of the per-shard
// gradients in trainer.grads(). Needs zero gradients on entry (as after
// step()) and no grad_reduce on the trainer. Returns the loss like dp_accumulate.
double emulate_dp_accumulate(train::Trainer& trainer, const std::vector<train::TrainSequence>& global_batch,
                             const std::vector<Range>& shards, const train::LossFn& loss,
                             const train::ScoreOptions& opt);

// Mean token cross-entropy over the response tokens of a batch holding
// n_targets of them, as train::sft_step uses: dloss/dlogp = -1/n_targets.
train::LossFn sft_loss(int64_t n_targets);

// train::sft_step for a data-parallel group: every rank passes the same
// global batch, trains on its shard (step_shards) and the loss is the
// global mean. A non-finite global loss skips the step on every rank.
// world_invariant: the loss is the per-sequence losses gathered and added
// in batch order (ordered_sum), as train::sft_step adds them on one rank.
train::SftStepStats dp_sft_step(train::Trainer& trainer, comm::Communicator& dp,
                                const std::vector<train::TrainSequence>& global_batch);
// dp_sft_step of a P-rank group, emulated in one process (bit-identical).
train::SftStepStats emulated_dp_sft_step(train::Trainer& trainer, int P,
                                         const std::vector<train::TrainSequence>& global_batch);

}  // namespace lockstep::parallel
