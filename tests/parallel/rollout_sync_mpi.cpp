// MpiRollout's weight sync under mpirun, in aligned fp8: the rollout ranks'
// packing of the broadcast master is checked against the trainer root's
// packed bits at every sync, so the samples they return carry exactly the
// trainer's logprobs; a rollout rank that packs otherwise (here another fp8
// block size) stops the sync on every rank, naming the rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/model/params.h"
#include "lockstep/rl/mpi_rollout.h"
#include "parallel/dp_test_util.h"
#include "parallel/mpi_test_main.h"

namespace lockstep::rl {
namespace {

rollout::RolloutSection fp8_section(int64_t block) {
  rollout::RolloutSection s;
  s.precision = s.trainer_precision = "fp8";
  s.fp8_block = block;
  s.engine.num_blocks = 64;
  s.engine.block_size = 4;
  return s;
}

std::unique_ptr<train::Trainer> fp8_trainer() {
  const ModelConfig c = test::dp_tiny_moe();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 99, 0.5f);
  train::TrainerConfig tc;
  tc.precision = DType::FP8E4M3;
  tc.fp8_block = 128;
  return std::make_unique<train::Trainer>(Context{}, c, std::move(params), tc);
}

std::vector<rollout::Request> requests() {
  std::vector<rollout::Request> out(3);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].prompt_ids = {1, int32_t(2 + i), 5, 7};
    out[i].params.temperature = 1.0f;
    out[i].params.max_new_tokens = 6;
    out[i].params.seed = int64_t(10 + i);
  }
  return out;
}

// Rank 0 trains and publishes; ranks >= 1 serve with `rollout_block`.
// Returns the message of the Error the rank ended with ("" if none).
std::string run(comm::Communicator& world, int64_t rollout_block,
                std::vector<rollout::RequestResult>* results) {
  try {
    if (world.rank() == 0) {
      auto t = fp8_trainer();
      MpiRollout r(*t, &world, nullptr, fp8_section(128), 7);
      *results = r.generate(requests(), {}, nullptr);
      r.sync(*t);
      r.shutdown();
    } else {
      const ModelConfig c = test::dp_tiny_moe();
      Buffer params = alloc_params(ParamLayout(c));
      serve_rollout(world, Context{}, c, params.as<float>(), fp8_section(rollout_block), 7);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RolloutSync, AlignedFp8RolloutRanksReturnTheTrainersLogprobs) {
  comm::Communicator world = comm::Communicator::world(60);
  std::vector<rollout::RequestResult> results;
  ASSERT_EQ(run(world, 128, &results), "");
  if (world.rank() != 0) return;
  auto t = fp8_trainer();
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    train::TrainSequence s;
    s.tokens = r.prompt_ids;
    s.prompt_len = int32_t(r.prompt_ids.size());
    s.tokens.insert(s.tokens.end(), r.samples[0].output_ids.begin(), r.samples[0].output_ids.end());
    const auto scored = t->score({s}, train::ScoreOptions{});
    EXPECT_EQ(scored[0].logp, r.samples[0].logprobs);
  }
}

TEST(RolloutSync, ARolloutRankThatPacksOtherwiseStopsEveryRank) {
  comm::Communicator world = comm::Communicator::world(60);
  std::vector<rollout::RequestResult> results;
  const std::string what = run(world, 8, &results);
  EXPECT_NE(what.find("packed weights of rollout rank(s) 1"), std::string::npos) << what;
  if (world.rank() != 0) {
    EXPECT_NE(what.find("packed checksum"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lockstep::rl

LOCKSTEP_MPI_TEST_MAIN
