// Expert parallelism without MPI: the ranks of an EP group are threads of
// this process exchanging rows through shared memory (ThreadGroupComm), so
// the routes, dispatch and return are checked in the fast suite; the MPI
// transport is checked by tests/parallel/expert_parallel_mpi.cpp.
// - a group of one is the plain trainer, bit for bit (scores, gradients, step);
// - in a group of 2 or 4, each rank's logprobs are the plain trainer's bits
//   for the same sequences, its non-expert gradients too, and the experts'
//   gradients summed over ranks match within 1e-6 relative L2;
// - shards that do not divide the experts are refused with a clear error.
#include "lockstep/model/expert_parallel.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "../common/test_util.h"
#include "../common/v4_config.h"
#include "lockstep/base/error.h"
#include "lockstep/comm/exact_sum.h"
#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

// A path in the test temp folder of this test and process alone: ctest runs
// the dense and DeepSeek-V4 variants at once, and they used to share a file.
std::string unique_temp(const std::string& stem) {
  return ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" + stem;
}

// P threads' shared exchange area.
struct ThreadGroup {
  explicit ThreadGroup(int p)
      : P(p), sync(p), send(size_t(p)), send_bytes(size_t(p)), values(size_t(p)) {}
  int P;
  std::barrier<> sync;
  std::vector<const char*> send;
  std::vector<std::vector<size_t>> send_bytes;
  std::vector<int64_t> values;
};

class ThreadGroupComm final : public model::ExpertComm {
 public:
  ThreadGroupComm(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int size() const override { return g_.P; }
  int rank() const override { return rank_; }
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes) override {
    g_.send[size_t(rank_)] = static_cast<const char*>(send);
    g_.send_bytes[size_t(rank_)] = send_bytes;
    g_.sync.arrive_and_wait();
    size_t at = 0;
    for (int q = 0; q < g_.P; ++q) {
      const auto& qb = g_.send_bytes[size_t(q)];
      size_t off = 0;
      for (int r = 0; r < rank_; ++r) off += qb[size_t(r)];
      EXPECT_EQ(qb[size_t(rank_)], recv_bytes[size_t(q)]) << "rank " << q << " sends what rank " << rank_
                                                          << " does not expect";
      if (recv_bytes[size_t(q)] > 0) std::memcpy(static_cast<char*>(recv) + at, g_.send[size_t(q)] + off,
                                                 recv_bytes[size_t(q)]);
      at += recv_bytes[size_t(q)];
    }
    g_.sync.arrive_and_wait();  // senders keep their buffers until every copy is done
  }
  int64_t max(int64_t x) override {
    g_.values[size_t(rank_)] = x;
    g_.sync.arrive_and_wait();
    int64_t m = x;
    for (int64_t v : g_.values) m = std::max(m, v);
    g_.sync.arrive_and_wait();
    return m;
  }
  double sum(double x) override {
    std::vector<double> all(size_t(g_.P));
    all_gather(&x, sizeof(double), all.data());
    double s = 0;
    for (double v : all) s += v;
    return s;
  }
  void all_gather(const void* in, size_t bytes, void* out) override {
    std::vector<size_t> send(size_t(g_.P), bytes);
    std::vector<char> rep;
    for (int q = 0; q < g_.P; ++q) rep.insert(rep.end(), static_cast<const char*>(in), static_cast<const char*>(in) + bytes);
    all_to_all_v(rep.data(), send, out, send);
  }
  void gather(const void* in, size_t bytes, void* out, int root) override {
    std::vector<char> all(bytes * size_t(g_.P));
    all_gather(in, bytes, all.data());
    if (rank_ == root) std::memcpy(out, all.data(), all.size());
  }
  // Sums floats over the group in rank order, in double (dist's all-reduce).
  void all_reduce_sum(float* x, size_t n) {
    std::vector<float> all(n * size_t(g_.P));
    all_gather(x, n * 4, all.data());
    for (size_t i = 0; i < n; ++i) {
      double s = 0;
      for (int q = 0; q < g_.P; ++q) s += all[size_t(q) * n + i];
      x[i] = float(s);
    }
  }

 private:
  ThreadGroup& g_;
  int rank_;
};

ModelConfig moe_config(int64_t experts, bool shared) {
  ModelConfig c;
  c.architecture = shared ? Architecture::Qwen2Moe : Architecture::Qwen3Moe;
  c.vocab_size = 61;
  c.hidden_size = 24;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 6;
  c.qk_norm = !shared;
  c.qkv_bias = shared;
  c.intermediate_size = 20;
  c.num_experts = experts;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = !shared;
  if (shared) {
    c.n_shared_experts = 1;
    c.shared_expert_gate = true;
    c.shared_expert_intermediate_size = 16;
  }
  c.mlp_only_layers = {1};
  c.max_position_embeddings = 64;
  return c;
}

std::vector<TrainSequence> sequences(const ModelConfig& c, int n, int salt) {
  std::vector<TrainSequence> out;
  for (int s = 0; s < n; ++s) {
    TrainSequence t;
    const int len = 3 + (s * 7 + salt) % 17;
    for (int i = 0; i < len; ++i) t.tokens.push_back(int32_t((i * 31 + s * 7 + salt * 3 + 1) % c.vocab_size));
    t.prompt_len = 1 + s % 2;
    out.push_back(std::move(t));
  }
  return out;
}

std::unique_ptr<Trainer> make_trainer(const ModelConfig& c, int64_t budget, bool recompute = false) {
  ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 21, 0.2f);
  TrainerConfig tc;
  tc.micro_batch_tokens = budget;
  tc.recompute_activations = recompute;
  return std::make_unique<Trainer>(Context{}, c, std::move(p), tc);
}

const LossFn kLoss = [](size_t i, const float* logp, const float* ent, int64_t n, float* dlogp, float* dent) {
  double l = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float w = 0.1f * float(int64_t(i % 5) + t % 3 + 1);
    l -= double(w) * double(logp[t]) + 0.01 * double(ent[t]);
    dlogp[t] = -w;
    dent[t] = -0.01f;
  }
  return l;
};

std::vector<bool> expert_mask(const ParamLayout& full) {
  std::vector<bool> m(size_t(full.numel()), false);
  for (const ParamInfo& p : full.params())
    if (p.routed_expert()) std::fill(m.begin() + p.offset, m.begin() + p.offset + p.numel, true);
  return m;
}

ScoreOptions score_options() {
  ScoreOptions so;
  so.entropy = true;
  so.temperature = 0.8f;
  return so;
}

TEST(ExpertParallel, GroupOfOneIsThePlainTrainer) {
  for (bool recompute : {false, true}) {
    const ModelConfig c = moe_config(4, false);
    auto a = make_trainer(c, 30, recompute), b = make_trainer(c, 30);
    ThreadGroup g(1);
    ThreadGroupComm comm(g, 0);
    a->set_expert_comm(&comm);
    const auto seqs = sequences(c, 7, 1);
    std::vector<TokenScores> sa, sb;
    EXPECT_EQ(a->accumulate(seqs, kLoss, score_options(), &sa), b->accumulate(seqs, kLoss, score_options(), &sb));
    test::expect_bits_equal(a->grads(), b->grads(), a->layout().numel(), "gradients");
    for (size_t i = 0; i < sa.size(); ++i)
      test::expect_bits_equal(sa[i].logp.data(), sb[i].logp.data(), int64_t(sa[i].logp.size()), "logp");
    a->step();
    b->step();
    test::expect_bits_equal(a->params(), b->params(), a->layout().numel(), "params after a step");
  }
}

// P threads, each a trainer with 1/P of the experts, each scoring and
// training its own shard of the batch (the last shard may be empty), against
// one plain trainer doing every shard in turn.
void check_group(int P, const ModelConfig& c, bool recompute, bool empty_last) {
  const auto batch = sequences(c, 4 * P + 1, P);
  std::vector<std::pair<size_t, size_t>> shards;
  const int parts = empty_last ? P - 1 : P;
  for (int r = 0; r < parts; ++r) shards.emplace_back(batch.size() * size_t(r) / size_t(parts),
                                                      batch.size() * size_t(r + 1) / size_t(parts));
  if (empty_last) shards.emplace_back(batch.size(), batch.size());
  auto shard_of = [&](int r) {
    return std::vector<TrainSequence>(batch.begin() + long(shards[size_t(r)].first),
                                      batch.begin() + long(shards[size_t(r)].second));
  };
  // EP ranks: different micro-batch budgets, so different micro-batch counts.
  ThreadGroup g(P);
  std::vector<std::unique_ptr<Trainer>> ranks;
  std::vector<std::unique_ptr<ThreadGroupComm>> comms;
  for (int r = 0; r < P; ++r) {
    ranks.push_back(make_trainer(c, 16 + 11 * r, recompute));
    comms.push_back(std::make_unique<ThreadGroupComm>(g, r));
    ranks.back()->set_expert_comm(comms.back().get());
  }
  std::vector<std::vector<TokenScores>> scored(static_cast<size_t>(P)), trained(static_cast<size_t>(P));
  std::vector<std::string> errors(static_cast<size_t>(P));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        const auto mine = shard_of(r);
        scored[size_t(r)] = ranks[size_t(r)]->score(mine, score_options());
        ranks[size_t(r)]->accumulate(mine, kLoss, score_options(), &trained[size_t(r)]);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;

  // Gradients: each rank holds its own experts' only.
  const ParamLayout& full = ranks[0]->model_layout();
  const size_t n = size_t(full.numel());
  const int64_t per = c.num_experts / P;
  std::vector<double> plain_sum(n, 0.0), ep_sum(n, 0.0);
  for (int r = 0; r < P; ++r) {
    const ParamLayout& g = ranks[size_t(r)]->layout();
    EXPECT_EQ(g.expert_first(), per * r);
    EXPECT_EQ(g.expert_count(), per);
    for (const ParamInfo& p : full.params()) {
      const ParamInfo* q = g.find(p.name);
      if (p.routed_expert()) {
        EXPECT_EQ(q != nullptr, p.expert / per == r) << "rank " << r << " " << p.name;
      }
      if (q == nullptr) continue;
      for (int64_t i = 0; i < p.numel; ++i) ep_sum[size_t(p.offset + i)] += ranks[size_t(r)]->grads()[q->offset + i];
    }
  }
  for (int r = 0; r < P; ++r) {
    auto plain = make_trainer(c, 16 + 11 * r);  // rank r's micro-batch cut
    const auto mine = shard_of(r);
    const auto ref = plain->score(mine, score_options());
    std::vector<TokenScores> ref_trained;
    plain->accumulate(mine, kLoss, score_options(), &ref_trained);
    for (size_t i = 0; i < mine.size(); ++i) {
      test::expect_bits_equal(scored[size_t(r)][i].logp.data(), ref[i].logp.data(), int64_t(ref[i].logp.size()),
                              "logp (score)");
      test::expect_bits_equal(scored[size_t(r)][i].entropy.data(), ref[i].entropy.data(),
                              int64_t(ref[i].entropy.size()), "entropy");
      test::expect_bits_equal(trained[size_t(r)][i].logp.data(), ref[i].logp.data(), int64_t(ref[i].logp.size()),
                              "logp (accumulate)");
    }
    for (size_t i = 0; i < n; ++i) plain_sum[i] += plain->grads()[i];
  }
  const std::vector<bool> is_expert = expert_mask(full);
  size_t other_differ = 0;
  double d2 = 0, r2 = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!is_expert[i]) {
      // The same per-rank terms: the same double sum.
      other_differ += float(ep_sum[i]) != float(plain_sum[i]);
      continue;
    }
    d2 += (ep_sum[i] - plain_sum[i]) * (ep_sum[i] - plain_sum[i]);
    r2 += plain_sum[i] * plain_sum[i];
  }
  EXPECT_EQ(other_differ, 0u) << "non-expert gradients differ";
  EXPECT_GT(r2, 0.0);
  EXPECT_LE(std::sqrt(d2 / r2), 1e-6) << "expert gradients";
}

TEST(ExpertParallel, TwoRanksKeepLogprobBits) { check_group(2, moe_config(4, false), false, false); }
TEST(ExpertParallel, FourRanksWithSharedExpertAndAnIdleRank) { check_group(4, moe_config(8, true), false, true); }
TEST(ExpertParallel, TwoRanksWithRecompute) { check_group(2, moe_config(6, false), true, true); }
// DeepSeek-V4: hash-routed layer 0, the routing weight before the down
// projection, the MTP-free toy model of tests/common/v4_config.h.
TEST(ExpertParallel, DeepSeekV4TwoRanksKeepLogprobBits) {
  check_group(2, test::tiny_v4(), false, false);
}
TEST(ExpertParallel, DeepSeekV4FourRanksWithAnIdleRank) {
  check_group(4, test::tiny_v4(), false, true);
}

// Two optimizer steps of a 2-rank group (gradient all-reduce of the
// non-expert tensors, global norm and clipping, AdamW on own experts,
// all-gather of the experts) against the plain trainer stepping on the same
// summed gradients; then the group's checkpointed optimizer state.
void check_steps(double grad_clip) {
  constexpr int P = 2;
  const ModelConfig c = moe_config(4, true);
  auto make = [&] {
    auto t = make_trainer(c, 40);
    t->optimizer().set_config([&] {
      OptimizerConfig o;
      o.lr = 1e-2;
      o.weight_decay = 0.1;
      o.grad_clip = grad_clip;
      return o;
    }());
    return t;
  };
  ThreadGroup g(P);
  std::vector<std::unique_ptr<Trainer>> ranks;
  std::vector<std::unique_ptr<ThreadGroupComm>> comms;
  for (int r = 0; r < P; ++r) {
    ranks.push_back(make());
    comms.push_back(std::make_unique<ThreadGroupComm>(g, r));
    ranks.back()->set_expert_comm(comms.back().get());
    // One EP group: the non-expert gradients are summed over it, the
    // experts' are whole on their owner already.
    ThreadGroupComm* comm = comms.back().get();
    const ParamLayout* gl = &ranks.back()->layout();
    ranks.back()->trainer_config().grad_reduce = [comm, gl](float* grads, size_t) {
      for (const ParamInfo& p : gl->params())
        if (p.name.find(".mlp.experts.") == std::string::npos) comm->all_reduce_sum(grads + p.offset, size_t(p.numel));
    };
  }
  auto plain = make();
  const size_t n = size_t(plain->layout().numel());
  std::vector<OptimizerStats> stats(P);
  for (int step = 0; step < 2; ++step) {
    const auto batch = sequences(c, 6, 10 + step);
    auto shard_of = [&](int r) {
      return std::vector<TrainSequence>(batch.begin() + long(batch.size() * size_t(r) / P),
                                        batch.begin() + long(batch.size() * size_t(r + 1) / P));
    };
    std::vector<std::thread> threads;
    std::vector<std::vector<float>> whole_model(P, std::vector<float>(n));
    for (int r = 0; r < P; ++r)
      threads.emplace_back([&, r] {
        ranks[size_t(r)]->accumulate(shard_of(r), kLoss, score_options());
        stats[size_t(r)] = ranks[size_t(r)]->step();
        // Each rank holds its own experts only: the group assembles the model.
        ranks[size_t(r)]->gather_model(whole_model[size_t(r)].data(), true);
      });
    for (auto& t : threads) t.join();
    EXPECT_LT(ranks[0]->layout().numel(), int64_t(n)) << "rank 0 holds every expert's parameters";
    // The plain trainer on the ranks' summed gradients (rank order, double).
    std::vector<double> sum(n, 0.0);
    for (int r = 0; r < P; ++r) {
      plain->accumulate(shard_of(r), kLoss, score_options());
      for (size_t i = 0; i < n; ++i) sum[i] += plain->grads()[i];
      std::fill(plain->grads(), plain->grads() + n, 0.0f);
    }
    for (size_t i = 0; i < n; ++i) plain->grads()[i] = float(sum[i]);
    const OptimizerStats ps = plain->step();
    if (grad_clip > 0) {
      EXPECT_GT(ps.grad_norm, grad_clip) << "the clipping variant must clip";
    }
    EXPECT_EQ(stats[0].grad_norm, stats[1].grad_norm) << "step " << step;
    EXPECT_NEAR(stats[0].grad_norm, ps.grad_norm, 1e-6 * ps.grad_norm) << "step " << step;
    test::expect_bits_equal(whole_model[0].data(), whole_model[1].data(), int64_t(n), "ranks' assembled models");
    double dmax = 0;
    size_t loose = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = std::fabs(double(whole_model[0][i]) - plain->params()[i]);
      dmax = std::max(dmax, d);
      loose += d > 1e-6;
    }
    // AdamW moves a weight by about lr whatever its gradient's size, so an
    // element whose gradient is ~0 may move the other way (docs/distributed.md).
    std::printf("[ep threads, clip %g] step %d: grad norm %.9g vs %.9g, max |param_ep - param_plain| %.3e, %zu of %zu "
                "above 1e-6\n", grad_clip, step + 1, stats[0].grad_norm, ps.grad_norm, dmax, loose, n);
    EXPECT_LE(dmax, 2 * 1e-2 * (step + 1)) << "step " << step;
    EXPECT_LE(double(loose), 2e-3 * double(n)) << loose << " of " << n << " weights differ by more than 1e-6";
  }
  // Checkpoint: the group's rank 0 gathers every expert's moments.
  const std::string path = unique_temp("ep_optimizer_" + std::to_string(int(grad_clip * 100)) + ".bin");
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] { ranks[size_t(r)]->prepare_checkpoint(r == 0, path + ".gathered"); });
  for (auto& t : threads) t.join();
  ranks[0]->save_optimizer(path);
  // A plain trainer reads the whole model's state; each rank's own part has
  // the rank's bits, shared tensors the (identical) ranks' bits.
  auto whole = make();
  whole->optimizer().load(path);
  EXPECT_EQ(whole->optimizer().steps_done(), 2);
  for (int r = 0; r < P; ++r) {
    const ParamLayout& gl = ranks[size_t(r)]->layout();
    for (const ParamInfo& p : gl.params()) {
      const int64_t at = plain->layout().at(p.name).offset;
      test::expect_bits_equal(whole->optimizer().m() + at, ranks[size_t(r)]->optimizer().m() + p.offset, p.numel,
                              "first moment");
      test::expect_bits_equal(whole->optimizer().v() + at, ranks[size_t(r)]->optimizer().v() + p.offset, p.numel,
                              "second moment");
    }
    // And an expert-parallel trainer picks its own part out of the file.
    auto back = make();
    back->set_expert_comm(comms[size_t(r)].get());
    back->optimizer().load(path);
    test::expect_bits_equal(back->optimizer().m(), ranks[size_t(r)]->optimizer().m(), gl.numel(), "reloaded m");
    test::expect_bits_equal(back->optimizer().v(), ranks[size_t(r)]->optimizer().v(), gl.numel(), "reloaded v");
  }
  std::remove(path.c_str());
}

TEST(ExpertParallel, StepsAndCheckpointWithoutClipping) { check_steps(0.0); }
TEST(ExpertParallel, StepsAndCheckpointWithClipping) { check_steps(0.05); }

// [dist] world_invariant with expert parallelism: P ranks of one EP group,
// each training a run of whole micro-batches of the batch's own cut (one rank
// none at all), with exact fixed-point sums (non-expert tensors summed over
// the group, each expert's folded per source on its owner) end two clipped
// AdamW steps with the one-rank trainer's bits: the gradient norm, every
// weight and both moments.
void all_reduce_fixed(ThreadGroupComm& comm, comm::Fixed* x, size_t n) {
  const size_t P = size_t(comm.size());
  std::vector<comm::Fixed> all(n * P);
  comm.all_gather(x, n * sizeof(comm::Fixed), all.data());
  for (size_t i = 0; i < n; ++i) {
    comm::Fixed s = 0;
    for (size_t q = 0; q < P; ++q) s = comm::fixed_add(s, all[q * n + i]);
    x[i] = s;
  }
}

void check_invariant_steps(int P, const ModelConfig& c) {
  constexpr int64_t kBudget = 24;
  auto make = [&] {
    auto t = make_trainer(c, kBudget);
    OptimizerConfig o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    o.grad_clip = 0.05;
    t->optimizer().set_config(o);
    t->trainer_config().world_invariant = true;
    return t;
  };
  ThreadGroup g(P);
  std::vector<std::unique_ptr<Trainer>> ranks;
  std::vector<std::unique_ptr<ThreadGroupComm>> comms;
  for (int r = 0; r < P; ++r) {
    ranks.push_back(make());
    comms.push_back(std::make_unique<ThreadGroupComm>(g, r));
    ranks.back()->set_expert_comm(comms.back().get());
    ThreadGroupComm* comm = comms.back().get();
    const ParamLayout* gl = &ranks.back()->layout();
    ranks.back()->trainer_config().exact_reduce = [comm, gl](comm::Fixed* sums, size_t n) {
      for (const ParamInfo& p : gl->params())
        if (!p.routed_expert()) all_reduce_fixed(*comm, sums + p.offset, size_t(p.numel));
      all_reduce_fixed(*comm, sums + (n - 2), 2);  // the fold and refusal counts
    };
  }
  auto plain = make();
  const size_t n = size_t(plain->layout().numel());
  for (int step = 0; step < 2; ++step) {
    const auto batch = sequences(c, 9, 20 + step);
    const auto mbs = micro_batches(batch, kBudget);
    ASSERT_GE(mbs.size(), size_t(P)) << "too few micro-batches to share out";
    // Micro-batch cut points: step 0, one each and the rest to the last
    // rank; step 1, two to rank 0, the rest to rank P-2, none to the last.
    const size_t M = mbs.size();
    std::vector<size_t> cut(size_t(P) + 1, M);
    cut[0] = 0;
    for (int r = 1; r < P; ++r) cut[size_t(r)] = step == 0 ? size_t(r) : (r == P - 1 ? M : size_t(r) + 1);
    auto at = [&](size_t m) { return m < M ? mbs[m].first : batch.size(); };
    auto shard_of = [&](int r) {
      return std::vector<TrainSequence>(batch.begin() + long(at(cut[size_t(r)])),
                                        batch.begin() + long(at(cut[size_t(r) + 1])));
    };
    // Every sequence trained once.
    size_t covered = 0;
    for (int r = 0; r < P; ++r) covered += shard_of(r).size();
    ASSERT_EQ(covered, batch.size());
    std::vector<OptimizerStats> stats(static_cast<size_t>(P));
    std::vector<std::vector<float>> whole_model(static_cast<size_t>(P), std::vector<float>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
      threads.emplace_back([&, r] {
        // kLoss weighs sequence i by its index: the shard's indices are global.
        const size_t first = at(cut[size_t(r)]);
        const LossFn loss = [first](size_t i, const float* lp, const float* en, int64_t k, float* dlp,
                                    float* den) { return kLoss(first + i, lp, en, k, dlp, den); };
        ranks[size_t(r)]->accumulate(shard_of(r), loss, score_options());
        stats[size_t(r)] = ranks[size_t(r)]->step();
        ranks[size_t(r)]->gather_model(whole_model[size_t(r)].data(), true);
      });
    for (auto& t : threads) t.join();
    plain->accumulate(batch, kLoss, score_options());
    const OptimizerStats ps = plain->step();
    EXPECT_GT(ps.grad_norm, 0.05) << "the steps must clip";
    for (int r = 0; r < P; ++r) {
      EXPECT_EQ(stats[size_t(r)].grad_norm, ps.grad_norm) << "rank " << r << " step " << step;
      test::expect_bits_equal(whole_model[size_t(r)].data(), plain->params(), int64_t(n), "weights");
    }
  }
  const std::string path = unique_temp("ep_invariant_" + std::to_string(P) + ".bin");
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] { ranks[size_t(r)]->prepare_checkpoint(r == 0, path + ".gathered"); });
  for (auto& t : threads) t.join();
  ranks[0]->save_optimizer(path);
  auto whole = make();
  whole->optimizer().load(path);
  test::expect_bits_equal(whole->optimizer().m(), plain->optimizer().m(), int64_t(n), "first moment");
  test::expect_bits_equal(whole->optimizer().v(), plain->optimizer().v(), int64_t(n), "second moment");
  std::remove(path.c_str());
}

TEST(ExpertParallel, WorldInvariantTwoRanksEqualOneBitForBit) {
  check_invariant_steps(2, moe_config(4, true));
}
TEST(ExpertParallel, WorldInvariantFourRanksEqualOneBitForBit) {
  check_invariant_steps(4, moe_config(8, false));
}
TEST(ExpertParallel, DeepSeekV4WorldInvariantTwoRanksEqualOneBitForBit) {
  check_invariant_steps(2, test::tiny_v4());
}
TEST(ExpertParallel, DeepSeekV4WorldInvariantFourRanksEqualOneBitForBit) {
  check_invariant_steps(4, test::tiny_v4());
}

TEST(ExpertParallel, ShardLayoutLoadsItsExpertsFromAWholeCheckpoint) {
  const ModelConfig c = moe_config(4, false);
  const ParamLayout whole(c), mine(c, 2, 2);
  Buffer p = alloc_params(whole);
  init_params(whole, p.as<float>(), 5, 0.2f);
  const std::string dir = unique_temp("ep_whole_model");
  save_pretrained(dir, c, whole, p.as<float>(), DType::F32);
  Buffer q = alloc_params(mine);
  load_params(dir, mine, q.as<float>());  // the other experts' tensors are not "unexpected"
  EXPECT_LT(mine.numel(), whole.numel());
  for (const ParamInfo& t : mine.params())
    test::expect_bits_equal(q.as<float>() + t.offset, p.as<float>() + whole.at(t.name).offset, t.numel, "tensor");
  EXPECT_EQ(mine.find("model.layers.0.mlp.experts.1.up_proj.weight"), nullptr);
  EXPECT_NE(mine.find("model.layers.0.mlp.experts.3.up_proj.weight"), nullptr);
  std::filesystem::remove_all(dir);
}

TEST(ExpertParallel, ShardsMustDivideTheExperts) {
  const model::ExpertShard s = model::ExpertShard::of_rank(8, 4, 2);
  EXPECT_EQ(s.first, 4);
  EXPECT_EQ(s.count, 2);
  EXPECT_TRUE(s.contains(5));
  EXPECT_FALSE(s.contains(6));
  try {
    model::ExpertShard::of_rank(6, 4, 0);
    FAIL() << "6 experts over 4 ranks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks do not divide the model's 6 experts"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::train
