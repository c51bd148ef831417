// Tests for score_across_ranks and the verdicts' wire form: one rank of two
// scores only its shard (counted by a reward that records every call), the
// gathered verdicts are every rank's in rank order, and encode/decode keep
// rewards bit for bit (NaN of a failure, extra keys, extracted text).
#include "lockstep/rl/group_scoring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>

namespace lockstep::rl {
namespace {

// Reward = the response's number / 7 (not exact in binary), extra "len".
class CountingReward final : public reward::Reward {
 public:
  reward::RewardResult evaluate(const reward::RewardRequest& r) const override {
    ++calls;
    if (r.response == "fail") return reward::RewardResult::failure_result("python: ValueError: no");
    reward::RewardResult out;
    out.reward = std::stod(r.response) / 7.0;
    out.correct = out.reward > 1;
    out.extracted = r.response;
    out.extra["len"] = double(r.response.size());
    return out;
  }
  std::string type() const override { return "counting"; }
  mutable std::atomic<int> calls{0};
};

// Rank 1 of two: its shard is the second half; rank 0's verdicts are given.
class SecondOfTwo final : public TrainerGroup {
 public:
  int ranks() const override { return 2; }
  int rank() const override { return 1; }
  bool writer() const override { return false; }
  std::pair<size_t, size_t> shard(size_t n) const override { return {n / 2, n}; }
  void sum(double*, size_t) override {}
  double max(double x) override { return x; }
  std::vector<std::string> gather_strings(const std::string& mine) override { return {rank0, mine}; }
  std::string rank0;
};

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(RlGroupScoring, EachRankScoresItsShardAndAllGetEveryVerdict) {
  auto counting = std::make_shared<CountingReward>();
  reward::BatchScorer scorer(counting, reward::BatchOptions{2, 10.0, 1.0});
  std::vector<reward::RewardRequest> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back({"", i == 7 ? "fail" : std::to_string(i * 3), "x", nullptr});
  // What rank 0 would have sent: its own shard's verdicts.
  std::vector<reward::RewardRequest> first(reqs.begin(), reqs.begin() + 5);
  SecondOfTwo group;
  group.rank0 = encode_results(scorer.score(first));
  counting->calls = 0;
  auto all = score_across_ranks(scorer, group, reqs);
  EXPECT_EQ(counting->calls.load(), 5);  // only rank 1's half was scored here
  ASSERT_EQ(all.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    if (i == 7) {
      EXPECT_EQ(all[7].failure, "python: ValueError: no");
      EXPECT_TRUE(std::isnan(all[7].reward));
      continue;
    }
    EXPECT_TRUE(same_bits(all[size_t(i)].reward, (i * 3) / 7.0)) << i;
    EXPECT_EQ(all[size_t(i)].extracted, std::to_string(i * 3));
    EXPECT_EQ(all[size_t(i)].extra.at("len"), double(std::to_string(i * 3).size()));
    EXPECT_EQ(all[size_t(i)].correct, (i * 3) / 7.0 > 1);
  }
}

TEST(RlGroupScoring, OneRankScoresEverything) {
  auto counting = std::make_shared<CountingReward>();
  reward::BatchScorer scorer(counting, reward::BatchOptions{1, 10.0, 1.0});
  OneRank one;
  auto all = score_across_ranks(scorer, one, {{"", "1", "x", nullptr}, {"", "2", "x", nullptr}});
  EXPECT_EQ(counting->calls.load(), 2);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(same_bits(all[1].reward, 2 / 7.0));
}

TEST(RlGroupScoring, WireFormKeepsEveryField) {
  reward::RewardResult a;
  a.reward = 0.1 + 0.2;
  a.correct = true;
  a.extracted = "\\frac{1}{3} \xff";  // invalid UTF-8 is replaced, not fatal
  a.extra = {{"acc", 1.0}, {"tiny", 1e-300}};
  auto b = reward::RewardResult::failure_result("timeout: ran past 1 s");
  auto back = decode_results(encode_results({a, b}));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(same_bits(back[0].reward, a.reward));
  EXPECT_TRUE(back[0].correct);
  EXPECT_EQ(back[0].extra, a.extra);
  EXPECT_EQ(back[0].extracted.rfind("\\frac{1}{3} ", 0), 0u);
  EXPECT_TRUE(std::isnan(back[1].reward));
  EXPECT_EQ(back[1].failure, b.failure);
}

}  // namespace
}  // namespace lockstep::rl
