// [dist] parsing and the role layout (no MPI needed): defaults, ranges,
// unknown keys, every layout error names the key and the world size, the
// DP x EP grid.
#include <gtest/gtest.h>

#include <string>

#include "lockstep/base/error.h"
#include "lockstep/parallel/dist_config.h"

namespace lockstep::parallel {
namespace {

DistConfig parse(const std::string& text) {
  toml::table root = parse_toml_with_overrides(text, "run.toml", {});
  TomlSection s(root["dist"].as_table(), "run.toml", "dist");
  DistConfig c = dist_config_from_toml(s);
  s.finish();
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DistConfig, DefaultsAndKeys) {
  const DistConfig d = parse("");
  EXPECT_EQ(d.trainer_ranks, 0);
  EXPECT_EQ(d.rollout_ranks, 0);
  EXPECT_EQ(d.expert_parallel, 1);
  EXPECT_EQ(d.bucket_bytes(), size_t(16) << 20);
  EXPECT_EQ(d.max_weight_staleness, 0);
  EXPECT_EQ(d.timeout_s, 1800.0);
  EXPECT_FALSE(d.world_invariant);
  EXPECT_TRUE(parse("[dist]\nworld_invariant = true\n").world_invariant);
  const DistConfig c = parse(
      "[dist]\ntrainer_ranks = 6\nrollout_ranks = 2\nexpert_parallel = 3\nbucket_mb = 64\n"
      "max_weight_staleness = 0\ntimeout_s = 90.5\n");
  EXPECT_EQ(c.trainer_ranks, 6);
  EXPECT_EQ(c.rollout_ranks, 2);
  EXPECT_EQ(c.expert_parallel, 3);
  EXPECT_EQ(c.bucket_bytes(), size_t(64) << 20);
  EXPECT_EQ(c.max_weight_staleness, 0);
  EXPECT_EQ(c.timeout_s, 90.5);
}

TEST(DistConfig, BadValuesNameTheKey) {
  std::string e = error_of([] { parse("[dist]\nbucket_mb = 0\n"); });
  EXPECT_NE(e.find("bucket_mb"), std::string::npos) << e;
  e = error_of([] { parse("[dist]\nexpert_parallel = 0\n"); });
  EXPECT_NE(e.find("expert_parallel"), std::string::npos) << e;
  e = error_of([] { parse("[dist]\nrollout_ranks = -1\n"); });
  EXPECT_NE(e.find("rollout_ranks"), std::string::npos) << e;
  e = error_of([] { parse("[dist]\ntimeout_s = \"soon\"\n"); });
  EXPECT_NE(e.find("timeout_s"), std::string::npos) << e;
  e = error_of([] { parse("[dist]\nworld_invariant = 1\n"); });
  EXPECT_NE(e.find("world_invariant"), std::string::npos) << e;
  e = error_of([] { parse("[dist]\ndata_parallel = 2\n"); });
  EXPECT_NE(e.find("data_parallel"), std::string::npos) << e;
}

TEST(Roles, SingleProcessIsAColocatedTrainer) {
  const Roles r = compute_roles(DistConfig{}, 1, 0);
  EXPECT_TRUE(r.is_trainer);
  EXPECT_FALSE(r.is_rollout);
  EXPECT_TRUE(r.colocated);
  EXPECT_TRUE(r.is_trainer_root());
  EXPECT_EQ(r.dp_size, 1);
  EXPECT_EQ(r.ep_size, 1);
}

TEST(Roles, TrainersFirstThenRolloutRanks) {
  DistConfig c;
  c.rollout_ranks = 3;
  for (int rank = 0; rank < 8; ++rank) {
    const Roles r = compute_roles(c, 8, rank);
    EXPECT_EQ(r.trainer_ranks, 5);
    EXPECT_FALSE(r.colocated);
    EXPECT_EQ(r.is_trainer, rank < 5);
    EXPECT_EQ(r.is_rollout, rank >= 5);
    EXPECT_EQ(r.trainer_rank, rank < 5 ? rank : -1);
    EXPECT_EQ(r.rollout_rank, rank < 5 ? -1 : rank - 5);
    EXPECT_EQ(r.dp_rank, rank < 5 ? rank : -1);
    EXPECT_EQ(r.dp_size, 5);
  }
  c.trainer_ranks = 5;  // explicit and consistent
  EXPECT_EQ(compute_roles(c, 8, 0).trainer_ranks, 5);
  EXPECT_EQ(describe(compute_roles(c, 8, 6)), "rank 6/8: rollout 1/3");
  EXPECT_EQ(describe(compute_roles(c, 8, 2)), "rank 2/8: trainer 2 (dp 2/5, ep 0/1)");
}

TEST(Roles, DataParallelTimesExpertParallelGrid) {
  DistConfig c;
  c.trainer_ranks = 6;
  c.rollout_ranks = 2;
  c.expert_parallel = 3;
  for (int rank = 0; rank < 6; ++rank) {
    const Roles r = compute_roles(c, 8, rank);
    EXPECT_EQ(r.dp_size, 2);
    EXPECT_EQ(r.ep_size, 3);
    EXPECT_EQ(r.dp_rank, rank / 3);  // expert-parallel neighbours are consecutive ranks
    EXPECT_EQ(r.ep_rank, rank % 3);
    EXPECT_EQ(describe(r), "rank " + std::to_string(rank) + "/8: trainer " + std::to_string(rank) + " (dp " +
                               std::to_string(rank / 3) + "/2, ep " + std::to_string(rank % 3) + "/3)");
  }
}

TEST(Roles, LayoutErrorsAreClear) {
  DistConfig c;
  c.rollout_ranks = 4;
  std::string e = error_of([&] { compute_roles(c, 4, 0); });
  EXPECT_NE(e.find("rollout_ranks = 4 leaves no trainer rank in a job of 4 ranks"), std::string::npos) << e;
  c.rollout_ranks = 1;
  c.trainer_ranks = 2;
  e = error_of([&] { compute_roles(c, 4, 0); });
  EXPECT_NE(e.find("trainer_ranks (2) + rollout_ranks (1) = 3, but the job has 4 ranks"), std::string::npos) << e;
  c.trainer_ranks = 0;
  c.expert_parallel = 2;
  e = error_of([&] { compute_roles(c, 4, 0); });
  EXPECT_NE(e.find("expert_parallel = 2 does not divide the 3 trainer ranks"), std::string::npos) << e;
  c.rollout_ranks = 0;
  c.world_invariant = true;  // covers expert parallelism: a 2 x 2 grid
  const Roles r = compute_roles(c, 4, 3);
  EXPECT_EQ(r.ep_size, 2);
  EXPECT_EQ(r.trainer_ranks, 4);
}

}  // namespace
}  // namespace lockstep::parallel
