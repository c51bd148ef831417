// Partial rollouts' gap at each token's own version (rl/partial_gap.h): the
// kept copies of the trainer's parameters score every older token with the
// bits of a scorer on that version's parameters; a wrong version mapping is
// found by the gap check; copies are kept only for held versions and
// released when no longer held.
#include "lockstep/rl/partial_gap.h"

#include <gtest/gtest.h>

#include <cstring>

#include "../common/small_models.h"
#include "../model/model_test_util.h"
#include "lockstep/model/params.h"
#include "lockstep/rl/gap_check.h"

namespace lockstep::rl {
namespace {

struct Versions {
  Versions() : cfg(test::small_moe()), layout(cfg), init(alloc_params(layout)) {
    init_params(layout, init.as<float>(), 7, 0.3f);
  }
  // Version v's parameters: the initial ones, each scaled by a factor of its own.
  Buffer params(uint64_t v) const {
    Buffer p = alloc_params(layout);
    const float* a = init.as<float>();
    float* out = p.as<float>();
    for (size_t i = 0; i < size_t(layout.numel()); ++i)
      out[i] = a[i] * (1.0f + 0.04f * float(v) * float(int64_t(i * 2654435761u % 5) - 2));
    return p;
  }
  std::unique_ptr<train::Trainer> trainer(uint64_t v) const {
    train::TrainerConfig tc;
    tc.micro_batch_tokens = 24;  // several micro-batches: the cut sequences batch differently
    auto t = std::make_unique<train::Trainer>(Context{}, cfg, params(v), tc);
    t->params_changed(v);
    return t;
  }
  // Version v's logprobs of seqs, as a scorer with the trainer's settings gives them.
  std::vector<std::vector<float>> scores(uint64_t v, const std::vector<train::TrainSequence>& seqs) const {
    train::TrainerConfig tc;
    tc.micro_batch_tokens = 24;
    train::Scorer s(Context{}, cfg, params(v), tc.micro_batch_tokens, tc.kv_block_size, tc.precision,
                    tc.fp8_block, tc.logits_chunk);
    std::vector<std::vector<float>> out;
    for (auto& sc : s.score(seqs, train::ScoreOptions{})) out.push_back(std::move(sc.logp));
    return out;
  }
  ModelConfig cfg;
  ParamLayout layout;
  Buffer init;
};

// Four samples: tokens of versions 0, 1 (older) and 2 (the trainer's), one
// of the trainer's version only, one without versions (all the trainer's).
std::vector<train::TrainSequence> sequences() {
  std::vector<train::TrainSequence> seqs;
  for (int64_t i = 0; i < 4; ++i) {
    train::TrainSequence s;
    for (int64_t t = 0; t < 4 + i + 7; ++t) s.tokens.push_back(int32_t((i * 17 + t * 5) % 60 + 1));
    s.prompt_len = int32_t(4 + i);
    seqs.push_back(std::move(s));
  }
  return seqs;
}
const std::vector<std::vector<uint64_t>> kVersions = {
    {0, 0, 1, 1, 1, 2, 2}, {1, 1, 1, 1, 2, 2, 2}, {2, 2, 2, 2, 2, 2, 2}, {}};

std::vector<std::vector<float>> trainer_scores(train::Trainer& t,
                                               const std::vector<train::TrainSequence>& seqs) {
  std::vector<std::vector<float>> out;
  for (auto& sc : t.score(seqs, train::ScoreOptions{})) out.push_back(std::move(sc.logp));
  return out;
}

TEST(VersionScorers, EveryTokenGetsItsOwnVersionsBits) {
  Versions m;
  const auto seqs = sequences();
  // The rollout's logprobs: each token's, under its own version's weights.
  std::vector<std::vector<std::vector<float>>> by_version;
  for (uint64_t v = 0; v < 3; ++v) by_version.push_back(m.scores(v, seqs));
  std::vector<std::vector<float>> rollout = by_version[2];
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t t = 0; t < kVersions[i].size(); ++t) rollout[i][t] = by_version[kVersions[i][t]][i][t];

  auto trainer = m.trainer(2);
  VersionScorers vs(*trainer);
  vs.add(0, m.params(0));
  vs.add(1, m.params(1));
  const VersionRescore r =
      vs.rescore(seqs, kVersions, trainer_scores(*trainer, seqs), 2, train::ScoreOptions{});
  EXPECT_EQ(r.rescored, 9);  // 5 + 4 tokens of versions 0 and 1
  EXPECT_FALSE(first_gap(rollout, r.logprobs).has_value());
  // Without the rescoring the older tokens differ: the test can tell.
  EXPECT_TRUE(first_gap(rollout, trainer_scores(*trainer, seqs)).has_value());
  EXPECT_EQ(older_tokens(r.logprobs, kVersions, 2).at(0).size(), 5u);
  EXPECT_TRUE(older_tokens(r.logprobs, kVersions, 2).at(3).empty());
}

// A planted fault: versions 0 and 1 kept under each other's number. The gap
// check names the first older token, whose bits now differ.
TEST(VersionScorers, AWrongVersionMappingFailsTheGapCheck) {
  Versions m;
  const auto seqs = sequences();
  std::vector<std::vector<std::vector<float>>> by_version;
  for (uint64_t v = 0; v < 3; ++v) by_version.push_back(m.scores(v, seqs));
  std::vector<std::vector<float>> rollout = by_version[2];
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t t = 0; t < kVersions[i].size(); ++t) rollout[i][t] = by_version[kVersions[i][t]][i][t];
  auto trainer = m.trainer(2);
  VersionScorers vs(*trainer);
  vs.add(0, m.params(1));
  vs.add(1, m.params(0));
  const VersionRescore r =
      vs.rescore(seqs, kVersions, trainer_scores(*trainer, seqs), 2, train::ScoreOptions{});
  const auto g = first_gap(rollout, r.logprobs);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->sample, 0u);
  EXPECT_EQ(g->token, 0);
  EXPECT_NE(describe_gap(*g, seqs[0].prompt_len).find("sample 0"), std::string::npos);
}

TEST(VersionScorers, AVersionNotKeptIsAnError) {
  Versions m;
  const auto seqs = sequences();
  auto trainer = m.trainer(2);
  VersionScorers vs(*trainer);
  vs.add(1, m.params(1));
  test::expect_error(
      [&] { vs.rescore(seqs, kVersions, trainer_scores(*trainer, seqs), 2, train::ScoreOptions{}); },
      {"sequence 0", "version 0", "not kept"});
}

// keep(): a copy only of a version some token in flight holds, taken before
// the weights change; versions no longer held are released.
TEST(VersionScorers, KeepsHeldVersionsOnlyAndReleasesTheRest) {
  Versions m;
  const auto seqs = sequences();
  auto trainer = m.trainer(0);
  VersionScorers vs(*trainer);
  vs.keep(*trainer, {});
  EXPECT_TRUE(vs.versions().empty());
  vs.keep(*trainer, {0});
  vs.keep(*trainer, {0});  // kept once
  EXPECT_EQ(vs.versions(), (std::vector<uint64_t>{0}));
  // The trainer moves on to version 1's weights; the copy keeps version 0's.
  const Buffer v1 = m.params(1);
  std::memcpy(trainer->params(), v1.as<float>(), m.layout.nbytes());
  trainer->params_changed(1);
  vs.keep(*trainer, {0});  // version 1 is not held: no copy
  EXPECT_EQ(vs.versions(), (std::vector<uint64_t>{0}));
  const std::vector<std::vector<uint64_t>> all_zero(seqs.size(), std::vector<uint64_t>(7, 0));
  const VersionRescore r =
      vs.rescore(seqs, all_zero, trainer_scores(*trainer, seqs), 1, train::ScoreOptions{});
  EXPECT_EQ(r.rescored, 28);
  EXPECT_FALSE(first_gap(m.scores(0, seqs), r.logprobs).has_value());
  vs.keep(*trainer, {1});
  EXPECT_EQ(vs.versions(), (std::vector<uint64_t>{1}));
  vs.add(3, m.params(3));
  vs.release_stale(/*version=*/4, /*max_staleness=*/2);  // version 1 lags 3 > 2: its groups go
  EXPECT_EQ(vs.versions(), (std::vector<uint64_t>{3}));
  vs.release_unheld({});
  EXPECT_TRUE(vs.versions().empty());
}

}  // namespace
}  // namespace lockstep::rl
