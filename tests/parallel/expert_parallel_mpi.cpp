// Expert parallelism under mpirun (np 2, 4), on random MoE models of every
// MoE architecture lockstep runs (Qwen2-MoE with its gated shared expert,
// Qwen3-MoE, dots.llm1 / DeepSeek-V3 routing with sigmoid scores, bias,
// shared experts, dense first layers and group-limited routing):
// - a rank's logprobs and entropies with its experts spread over the group
//   are the bits of the same sequences scored with every expert at hand
//   (EP = 1), whatever the other ranks score at the same time, with ranks
//   running different numbers of micro-batches and some ranks none at all,
//   with routing replay and with activation recompute;
// - the summed gradient equals data parallelism without experts spread:
//   bit for bit on every non-expert parameter, within the tolerance
//   docs/distributed.md states on the experts (their rows are summed in one
//   chain on the owner instead of per rank);
// - SFT steps keep every rank's weights identical and close to the DP run;
// - a DP x EP grid (np 4: 2 groups of 2) gives the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "parallel/mpi_test_main.h"
#include "lockstep/base/error.h"
#include "lockstep/comm/checksum.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/expert_comm.h"
#include "lockstep/model/forward.h"
#include "lockstep/train/sft.h"
#include "parity/parity_util.h"

namespace lockstep::parallel {
namespace {

// A random MoE config (parity_util's generator) whose experts `P` divides.
ModelConfig moe_config(uint64_t seed, int P) {
  std::mt19937_64 g(seed);
  for (;;) {
    ModelConfig c = parity::random_config(g);
    if (c.num_experts > 0 && c.num_experts % P == 0 && c.num_moe_layers() > 0) return c;
  }
}

std::vector<train::TrainSequence> random_batch(const ModelConfig& c, int n, uint64_t seed, bool replay) {
  std::mt19937_64 g(seed);
  const int64_t n_moe = c.num_moe_layers(), K = c.num_experts_per_tok, E = c.num_experts;
  std::vector<train::TrainSequence> out(static_cast<size_t>(n));
  for (auto& s : out) {
    const int len = 2 + int(g() % 23);
    for (int i = 0; i < len; ++i) s.tokens.push_back(int32_t(g() % uint64_t(c.vocab_size)));
    s.prompt_len = 1 + int32_t(g() % uint64_t(std::min(len - 1, 4)));
    if (!replay) continue;
    // K distinct experts per token and MoE layer.
    for (int i = 0; i < len * n_moe; ++i) {
      std::vector<int32_t> ex(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) ex[size_t(e)] = int32_t(e);
      std::shuffle(ex.begin(), ex.end(), g);
      s.routed_experts.insert(s.routed_experts.end(), ex.begin(), ex.begin() + K);
    }
  }
  return out;
}

std::unique_ptr<train::Trainer> make_trainer(const Context& ctx, const ModelConfig& c, uint64_t seed,
                                             int64_t micro_batch_tokens, bool recompute = false) {
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), seed, 0.2f);
  train::TrainerConfig tc;
  tc.optim.lr = 1e-3;
  tc.optim.weight_decay = 0.01;
  tc.micro_batch_tokens = micro_batch_tokens;
  tc.recompute_activations = recompute;
  return std::make_unique<train::Trainer>(ctx, c, std::move(params), tc);
}

TEST(ExpertParallel, LogprobsKeepTheirBits) {
  comm::Communicator world = comm::Communicator::world(120);
  const int P = world.size(), rank = world.rank();
  auto ep = make_expert_comm(world);
  const Context ctx;
  int64_t compared = 0;
  for (uint64_t cs = 0; cs < 16; ++cs) {
    const ModelConfig c = moe_config(100 + cs, P);
    const bool replay = cs % 3 == 1;
    const int n = 3 * P - 1 + int(cs % 3);
    const auto batch = random_batch(c, n, 7 * cs + 1, replay);
    // Some cases leave the last rank nothing to score.
    std::vector<Range> shards = split_even(size_t(n), P);
    if (cs % 4 == 2) {
      shards = split_even(size_t(n), P - 1);
      shards.push_back({size_t(n), size_t(n)});
    }
    const Range mine = shards[size_t(rank)];
    const std::vector<train::TrainSequence> part(batch.begin() + long(mine.begin), batch.begin() + long(mine.end));
    // Different micro-batch budgets per rank: ranks run different counts.
    const int64_t budget = 8 + int64_t((cs * 7 + uint64_t(rank) * 13) % 40);
    auto spread = make_trainer(ctx, c, 5 + cs, budget);
    auto whole = make_trainer(ctx, c, 5 + cs, budget);
    spread->set_expert_comm(ep.get());
    train::ScoreOptions so;
    so.entropy = true;
    so.replay = replay;
    so.temperature = cs % 2 ? 0.7f : 1.0f;
    const auto a = spread->score(part, so);
    const auto b = whole->score(part, so);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].logp.size(), b[i].logp.size());
      ASSERT_EQ(std::memcmp(a[i].logp.data(), b[i].logp.data(), a[i].logp.size() * 4), 0)
          << "case " << cs << " (" << architecture_name(c.architecture) << ", E=" << c.num_experts << ") rank " << rank
          << " sequence " << mine.begin + i << ": logprobs differ with experts spread over " << P << " ranks";
      ASSERT_EQ(std::memcmp(a[i].entropy.data(), b[i].entropy.data(), a[i].entropy.size() * 4), 0)
          << "case " << cs << " sequence " << mine.begin + i << ": entropies differ";
      compared += int64_t(a[i].logp.size());
    }
  }
  const double total = world.sum(double(compared));
  if (rank == 0) std::printf("[ep P=%d] %.0f token logprobs bitwise equal to EP = 1 over 16 models\n", P, total);
  EXPECT_GT(total, 500);
}

// Gradient of one global SFT batch: EP over `ep_comm` (and DP over world)
// against the single-process emulation of the same world shards.
void check_gradients(comm::Communicator& world, comm::Communicator& ep_comm, comm::Communicator* replicas, bool recompute,
                     const char* label) {
  const int P = world.size();
  auto ep = make_expert_comm(ep_comm);
  const Context ctx;
  for (uint64_t cs = 0; cs < 4; ++cs) {
    const ModelConfig c = moe_config(300 + cs, ep_comm.size());
    const auto batch = random_batch(c, 4 * P + 1, 50 + cs, false);
    const auto shards = split_by_tokens(batch, P);
    int64_t n_targets = 0;
    for (const auto& s : batch) n_targets += s.num_targets();
    const train::LossFn loss = sft_loss(n_targets);
    // One micro-batch budget everywhere: the cut decides how gradients are
    // summed, and the emulation runs every shard with this rank's trainer.
    auto spread = make_trainer(ctx, c, 9 + cs, 20, recompute);
    auto emu = make_trainer(ctx, c, 9 + cs, 20);
    spread->set_expert_comm(ep.get());
    make_data_parallel(*spread, world, replicas);
    const size_t n = size_t(spread->layout().numel());
    std::vector<float> reduced;
    auto reduce = spread->trainer_config().grad_reduce;
    spread->trainer_config().grad_reduce = [&](float* g, size_t m) {
      reduce(g, m);
      reduced.assign(g, g + m);
    };
    const double l_ep = dp_accumulate(*spread, world, batch, shards, loss, {});
    spread->step();
    const double l_emu = emulate_dp_accumulate(*emu, batch, shards, loss, {});
    EXPECT_EQ(l_ep, l_emu) << label << " case " << cs;
    ASSERT_EQ(reduced.size(), n);
    // This rank's gradients (its own experts only) against the same tensors
    // of the emulation's whole-model gradients.
    const float* ref = emu->grads();
    double d2 = 0, r2 = 0, dmax = 0;
    size_t other_differ = 0;
    for (const ParamInfo& p : spread->layout().params()) {
      const float* a = reduced.data() + p.offset;
      const float* b = ref + emu->layout().at(p.name).offset;
      if (p.name.find(".mlp.experts.") == std::string::npos) {
        other_differ += std::memcmp(a, b, size_t(p.numel) * 4) != 0;
        continue;
      }
      for (int64_t i = 0; i < p.numel; ++i) {
        const double d = double(a[i]) - b[i];
        d2 += d * d;
        r2 += double(b[i]) * b[i];
        dmax = std::max(dmax, std::fabs(d));
      }
    }
    EXPECT_EQ(other_differ, 0u) << label << " case " << cs << ": non-expert gradients differ from data parallelism";
    const double rel = std::sqrt(d2 / std::max(r2, 1e-300));
    if (world.rank() == 0)
      std::printf("[%s] case %llu (%s, E=%lld): expert gradients vs DP: rel L2 %.3e, max |d| %.3e\n", label,
                  (unsigned long long)cs, architecture_name(c.architecture), (long long)c.num_experts, rel, dmax);
    EXPECT_LE(rel, 1e-6) << label << " case " << cs;
    EXPECT_GT(r2, 0) << "no expert gradient at all";
  }
}

TEST(ExpertParallel, GradientsMatchDataParallel) {
  comm::Communicator world = comm::Communicator::world(120);
  check_gradients(world, world, nullptr, false, "ep=all");
}

TEST(ExpertParallel, RecomputeGivesTheSameGradients) {
  comm::Communicator world = comm::Communicator::world(120);
  check_gradients(world, world, nullptr, true, "ep=all, recompute");
}

TEST(ExpertParallel, DataParallelTimesExpertParallelGrid) {
  comm::Communicator world = comm::Communicator::world(120);
  if (world.size() % 2 != 0 || world.size() < 4) GTEST_SKIP() << "needs an even world of at least 4 ranks";
  // Expert-parallel neighbours are consecutive ranks (parallel/dist_config.h).
  comm::Communicator ep = world.split(world.rank() / 2, world.rank() % 2, "ep");
  comm::Communicator replicas = world.split(world.rank() % 2, world.rank() / 2, "dp");
  ASSERT_EQ(ep.size(), 2);
  check_gradients(world, ep, &replicas, false, "dp=2 x ep=2");
}

TEST(ExpertParallel, SftStepsKeepRanksIdentical) {
  comm::Communicator world = comm::Communicator::world(120);
  const int P = world.size();
  auto ep = make_expert_comm(world);
  const Context ctx;
  const ModelConfig c = moe_config(77, P);
  auto spread = make_trainer(ctx, c, 3, 24), plain = make_trainer(ctx, c, 3, 24);
  spread->set_expert_comm(ep.get());
  make_data_parallel(*spread, world);
  const size_t n = size_t(spread->model_layout().numel());
  ASSERT_LT(spread->layout().numel(), int64_t(n)) << "each rank holds its own experts only";
  std::vector<float> whole(n);
  for (int step = 1; step <= 3; ++step) {
    const auto batch = random_batch(c, 2 * P + 2, 900 + uint64_t(step), false);
    const train::SftStepStats a = dp_sft_step(*spread, world, batch);
    const train::SftStepStats b = train::sft_step(*plain, batch);
    ASSERT_FALSE(a.skipped);
    EXPECT_NEAR(a.loss, b.loss, (step == 1 ? 1e-12 : 1e-5) * std::fabs(b.loss)) << "step " << step;
    spread->gather_model(whole.data(), true);
    const std::vector<uint64_t> sums = world.all_gather(comm::checksum64(whole.data(), n * 4));
    for (int q = 0; q < P; ++q) ASSERT_EQ(sums[size_t(q)], sums[0]) << "rank " << q << " diverged at step " << step;
    double d = 0;
    for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(double(whole[i]) - plain->params()[i]));
    if (world.rank() == 0) std::printf("[ep P=%d] step %d: max |param_ep - param_single| = %.3e\n", P, step, d);
    EXPECT_LE(d, 2.0 * 1e-3 * step);
  }
}

TEST(ExpertParallel, WrongShardIsRefused) {
  comm::Communicator world = comm::Communicator::world(120);
  auto ep = make_expert_comm(world);
  const Context ctx;
  const ModelConfig c = moe_config(5, world.size());
  auto whole = make_trainer(ctx, c, 1, 64);
  // Weights holding every expert, run with expert parallelism: refused
  // before any exchange, on every rank alike.
  model::KvCache kv(c, 4, 16);
  model::Workspace ws;
  model::RaggedBatch b;
  b.tokens = {1, 2};
  b.n_ctx = {0};
  b.n_new = {2};
  b.block_table = {0};
  b.max_blocks = 1;
  b.logit_rows = {1};
  model::ForwardOptions fo;
  fo.experts = ep.get();
  model::ForwardResult fr;
  try {
    model::forward(ctx, whole->weights(), kv, ws, b, fo, &fr);
    FAIL() << "forward with the wrong expert shard accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert-parallel shard"), std::string::npos) << e.what();
  }
  world.barrier();
}

}  // namespace
}  // namespace lockstep::parallel

LOCKSTEP_MPI_TEST_MAIN
