// Data-parallel sharding, accumulation and the SFT step over a dp group.
#include "lockstep/parallel/data_parallel.h"

#include <cmath>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/base/timer.h"
#include "lockstep/comm/reduce_order.h"

namespace lockstep::parallel {

std::vector<Range> split_even(size_t n, int P) {
  LS_CHECK(P >= 1) << "P=" << P;
  std::vector<Range> out(static_cast<size_t>(P));
  for (size_t r = 0; r < size_t(P); ++r) out[r] = {n * r / size_t(P), n * (r + 1) / size_t(P)};
  return out;
}

namespace {
// Contiguous shards of items with these token counts: shard r ends at the
// first item where the cumulative count reaches total*(r+1)/P.
std::vector<Range> split_weights(const std::vector<uint64_t>& tokens, int P) {
  LS_CHECK(P >= 1) << "P=" << P;
  uint64_t total = 0;
  for (uint64_t t : tokens) total += t;
  std::vector<Range> out(static_cast<size_t>(P));
  size_t i = 0;
  uint64_t cum = 0;
  for (size_t r = 0; r < size_t(P); ++r) {
    out[r].begin = i;
    // Integer arithmetic: the split must not depend on floating-point rounding.
    const uint64_t target = total * (r + 1) / uint64_t(P);
    while (i < tokens.size() && (cum < target || r + 1 == size_t(P))) cum += tokens[i++];
    out[r].end = i;
  }
  return out;
}
}  // namespace

std::vector<Range> split_by_tokens(const std::vector<train::TrainSequence>& seqs, int P) {
  std::vector<uint64_t> tokens;
  for (const auto& s : seqs) tokens.push_back(s.tokens.size());
  return split_weights(tokens, P);
}

std::vector<Range> split_micro_batches(const std::vector<train::TrainSequence>& seqs, int64_t micro_batch_tokens,
                                       int P) {
  const auto mbs = train::micro_batches(seqs, micro_batch_tokens);
  std::vector<uint64_t> tokens;
  for (auto [b0, b1] : mbs) {
    uint64_t t = 0;
    for (size_t i = b0; i < b1; ++i) t += seqs[i].tokens.size();
    tokens.push_back(t);
  }
  std::vector<Range> out = split_weights(tokens, P);
  // Micro-batch indices to sequence indices; an empty run sits where the previous one ended.
  size_t at = 0;
  for (Range& r : out) {
    r = r.size() == 0 ? Range{at, at} : Range{mbs[r.begin].first, mbs[r.end - 1].second};
    at = r.end;
  }
  return out;
}

std::vector<Range> step_shards(const train::Trainer& trainer, const std::vector<train::TrainSequence>& seqs, int P) {
  const train::TrainerConfig& c = trainer.trainer_config();
  return c.world_invariant ? split_micro_batches(seqs, c.micro_batch_tokens, P) : split_by_tokens(seqs, P);
}

double ordered_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

void make_data_parallel(train::Trainer& trainer, comm::Communicator& dp, comm::Communicator* expert_replicas) {
  LS_CHECK(dp.valid()) << "make_data_parallel: this rank is not in the data-parallel group";
  comm::Communicator* c = &dp;
  const ParamLayout& g = trainer.layout();
  const bool invariant = trainer.trainer_config().world_invariant;
  if (g.all_experts()) {
    if (invariant)
      trainer.trainer_config().exact_reduce = [c](comm::Fixed* sums, size_t n) {
        c->all_reduce_sum(sums, n);
      };
    else
      trainer.trainer_config().grad_reduce = [c](float* grads, size_t n) { c->all_reduce_sum(grads, n); };
    return;
  }
  // Runs of adjacent tensors going to the same group: (offset, floats, experts?).
  struct Run {
    int64_t offset, n;
    bool experts;
  };
  std::vector<Run> runs;
  for (const ParamInfo& p : g.params()) {
    const bool e = p.routed_expert();
    if (!runs.empty() && runs.back().experts == e)
      runs.back().n += p.numel;
    else
      runs.push_back({p.offset, p.numel, e});
  }
  comm::Communicator* x = expert_replicas != nullptr && expert_replicas->size() > 1 ? expert_replicas : nullptr;
  if (invariant) {
    // The exact sums (layout order, then the fold and refusal counts, which
    // every trainer must agree on) go to the same groups as the gradients.
    const int64_t numel = g.numel();
    trainer.trainer_config().exact_reduce = [c, x, runs, numel](comm::Fixed* sums, size_t) {
      for (const Run& r : runs) {
        if (!r.experts)
          c->all_reduce_sum(sums + r.offset, size_t(r.n));
        else if (x != nullptr)
          x->all_reduce_sum(sums + r.offset, size_t(r.n));
      }
      c->all_reduce_sum(sums + numel, 2);
    };
    return;
  }
  trainer.trainer_config().grad_reduce = [c, x, runs](float* grads, size_t) {
    for (const Run& r : runs) {
      if (!r.experts)
        c->all_reduce_sum(grads + r.offset, size_t(r.n));
      else if (x != nullptr)
        x->all_reduce_sum(grads + r.offset, size_t(r.n));
    }
  };
}

namespace {
void check_shards(const std::vector<Range>& shards, size_t n, size_t P) {
  if (shards.size() != P) LS_THROW << shards.size() << " shards for a data-parallel group of " << P << " ranks";
  size_t next = 0;
  for (const Range& r : shards) {
    if (r.begin != next || r.end < r.begin) LS_THROW << "data-parallel shards must tile [0, " << n << ") in order";
    next = r.end;
  }
  if (next != n) LS_THROW << "data-parallel shards cover [0, " << next << "), the batch has " << n << " sequences";
}

// accumulate() of one shard with the loss seeing global indices.
double accumulate_shard(train::Trainer& trainer, const std::vector<train::TrainSequence>& global, Range r,
                        const train::LossFn& loss, const train::ScoreOptions& opt) {
  // An empty shard still runs under expert parallelism: the group's ranks
  // exchange expert rows in every micro-batch.
  if (r.size() == 0 && trainer.expert_comm() == nullptr) return 0;
  const std::vector<train::TrainSequence> shard(global.begin() + ptrdiff_t(r.begin), global.begin() + ptrdiff_t(r.end));
  const size_t off = r.begin;
  train::LossFn shifted = [&loss, off](size_t i, const float* logp, const float* ent, int64_t n, float* dlogp,
                                       float* dent) { return loss(i + off, logp, ent, n, dlogp, dent); };
  return trainer.accumulate(shard, shifted, opt);
}
}  // namespace

double dp_accumulate(train::Trainer& trainer, comm::Communicator& dp, const std::vector<train::TrainSequence>& global_batch,
                     const std::vector<Range>& shards, const train::LossFn& loss, const train::ScoreOptions& opt) {
  LS_CHECK(dp.valid()) << "dp_accumulate: this rank is not in the data-parallel group";
  check_shards(shards, global_batch.size(), size_t(dp.size()));
  const double local = accumulate_shard(trainer, global_batch, shards[size_t(dp.rank())], loss, opt);
  return dp.sum(local);
}

double emulate_dp_accumulate(train::Trainer& trainer, const std::vector<train::TrainSequence>& global_batch,
                             const std::vector<Range>& shards, const train::LossFn& loss,
                             const train::ScoreOptions& opt) {
  LS_CHECK(!trainer.trainer_config().grad_reduce) << "emulate_dp_accumulate on a trainer that already reduces";
  const size_t P = shards.size();
  check_shards(shards, global_batch.size(), P);
  const size_t n = size_t(trainer.layout().numel());
  float* g = trainer.grads();
  std::vector<std::vector<float>> partial(P);  // (P, numel)
  std::vector<const float*> parts(P);
  std::vector<double> losses(P);
  std::vector<const double*> loss_parts(P);
  for (size_t r = 0; r < P; ++r) {
    losses[r] = accumulate_shard(trainer, global_batch, shards[r], loss, opt);
    partial[r].assign(g, g + n);
    std::memset(g, 0, n * sizeof(float));
    parts[r] = partial[r].data();
    loss_parts[r] = &losses[r];
  }
  comm::sum_in_rank_order(parts.data(), int(P), n, g);
  double total = 0;
  comm::sum_in_rank_order(loss_parts.data(), int(P), 1, &total);
  return total;
}

train::LossFn sft_loss(int64_t n_targets) {
  LS_CHECK(n_targets > 0) << "SFT batch has no response tokens";
  const double inv = 1.0 / double(n_targets);
  return [inv](size_t, const float* logp, const float*, int64_t n, float* dlogp, float*) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) {
      l -= double(logp[i]) * inv;
      dlogp[i] = float(-inv);
    }
    return l;
  };
}

namespace {
template <typename Accumulate>
train::SftStepStats sft_step_with(train::Trainer& trainer, const std::vector<train::TrainSequence>& batch,
                                  const Accumulate& accumulate) {
  Timer timer;
  train::SftStepStats st;
  int64_t n_targets = 0;
  for (const auto& s : batch) {
    n_targets += s.num_targets();
    st.tokens += int64_t(s.tokens.size());
  }
  st.loss = accumulate(sft_loss(n_targets));
  if (!std::isfinite(st.loss)) {
    // The global loss is the same on every rank: all skip, none waits in step().
    trainer.zero_grad();
    st.skipped = true;
  } else {
    train::OptimizerStats os = trainer.step();
    st.grad_norm = os.grad_norm;
    st.lr = os.lr;
    st.skipped = os.skipped;
  }
  st.tokens_per_s = double(st.tokens) / std::max(timer.seconds(), 1e-9);
  return st;
}
}  // namespace

train::SftStepStats dp_sft_step(train::Trainer& trainer, comm::Communicator& dp,
                                const std::vector<train::TrainSequence>& global_batch) {
  const std::vector<Range> shards = step_shards(trainer, global_batch, dp.size());
  if (trainer.trainer_config().world_invariant) {
    LS_CHECK(dp.valid()) << "dp_sft_step: this rank is not in the data-parallel group";
    return sft_step_with(trainer, global_batch, [&](const train::LossFn& loss) {
      // Each sequence's loss is written by the one rank that trains it; the
      // others hold 0, so the rank-order sum is a gather (x + 0 == x).
      std::vector<double> per_seq(global_batch.size(), 0.0);
      const train::LossFn record = [&](size_t i, const float* logp, const float* ent, int64_t n, float* dlogp,
                                       float* dent) { return per_seq[i] = loss(i, logp, ent, n, dlogp, dent); };
      accumulate_shard(trainer, global_batch, shards[size_t(dp.rank())], record, train::ScoreOptions{});
      dp.all_reduce_sum(per_seq.data(), per_seq.size());
      return ordered_sum(per_seq);
    });
  }
  return sft_step_with(trainer, global_batch, [&](const train::LossFn& loss) {
    return dp_accumulate(trainer, dp, global_batch, shards, loss, train::ScoreOptions{});
  });
}

train::SftStepStats emulated_dp_sft_step(train::Trainer& trainer, int P,
                                         const std::vector<train::TrainSequence>& global_batch) {
  const std::vector<Range> shards = split_by_tokens(global_batch, P);
  return sft_step_with(trainer, global_batch, [&](const train::LossFn& loss) {
    return emulate_dp_accumulate(trainer, global_batch, shards, loss, train::ScoreOptions{});
  });
}

}  // namespace lockstep::parallel
