// The RL loop's trainer group: OneRank is the whole batch and leaves the
// step's sums as they are (bit for bit), and StepSums::reduce adds every
// named field over the ranks (checked here with two simulated ranks).
#include "lockstep/rl/trainer_group.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace lockstep::rl {
namespace {

StepSums sample_sums(double k) {
  StepSums s;
  s.loss.pg_loss = 0.1 * k;
  s.loss.kl = 0.03 * k;
  s.loss.entropy = 1.7 * k;
  s.loss.clipped = int64_t(3 * k);
  s.loss.ratio_sum = 11.3 * k;
  s.loss.approx_kl = -0.02 * k;
  s.has_mismatch = true;
  s.mismatch.abs_diff_mean = 0.1 / 3 * k;
  s.mismatch.abs_diff_max = 0.25 * k;
  s.mismatch.kl_k3 = 1e-3 / 7 * k;
  s.mismatch.bitwise_equal_frac = 0.9 / k;
  s.mismatch.samples = int64_t(5 * k);
  s.mismatch.tokens = int64_t(37 * k);
  return s;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(RlTrainerGroup, OneRankIsTheWholeBatchAndKeepsTheSumsBits) {
  OneRank g;
  EXPECT_EQ(g.ranks(), 1);
  EXPECT_TRUE(g.writer());
  EXPECT_FALSE(OneRank(false).writer());
  EXPECT_EQ(g.shard(7), (std::pair<size_t, size_t>(0, 7)));
  EXPECT_EQ(g.max(2.5), 2.5);
  StepSums s = sample_sums(1.0);
  const StepSums before = s;
  s.reduce(g);
  EXPECT_TRUE(same_bits(s.loss.pg_loss, before.loss.pg_loss));
  EXPECT_EQ(s.loss.clipped, before.loss.clipped);
  // A mean recomputed as (mean * count) / count would round: one rank keeps it.
  EXPECT_TRUE(same_bits(s.mismatch.abs_diff_mean, before.mismatch.abs_diff_mean));
  EXPECT_TRUE(same_bits(s.mismatch.kl_k3, before.mismatch.kl_k3));
  EXPECT_TRUE(same_bits(s.mismatch.bitwise_equal_frac, before.mismatch.bitwise_equal_frac));
}

// Rank 0 of two: the peer's values are those rank 1 sent (recorded first).
class TwoRanks final : public TrainerGroup {
 public:
  int ranks() const override { return 2; }
  int rank() const override { return 0; }
  bool writer() const override { return true; }
  std::pair<size_t, size_t> shard(size_t n) const override { return {0, n / 2}; }
  void sum(double* v, size_t n) override {
    if (peer.empty()) {  // recording rank 1's values
      sent.assign(v, v + n);
      return;
    }
    ASSERT_EQ(peer.size(), n);
    for (size_t i = 0; i < n; ++i) v[i] = v[i] + peer[i];  // rank order: 0, then 1
  }
  double max(double x) override { return peer.empty() ? x : std::max(x, peer_max); }
  std::vector<std::string> gather_strings(const std::string& mine) override { return {mine, mine}; }
  std::vector<double> sent, peer;
  double peer_max = 0;
};

TEST(RlTrainerGroup, StepSumsReduceAddsEveryField) {
  const StepSums a0 = sample_sums(1.0), b0 = sample_sums(3.0);
  TwoRanks rank1;
  StepSums b = b0;
  b.reduce(rank1);
  TwoRanks rank0;
  rank0.peer = rank1.sent;
  rank0.peer_max = b0.mismatch.abs_diff_max;
  StepSums a = a0;
  a.reduce(rank0);
  EXPECT_TRUE(same_bits(a.loss.pg_loss, a0.loss.pg_loss + b0.loss.pg_loss));
  EXPECT_TRUE(same_bits(a.loss.kl, a0.loss.kl + b0.loss.kl));
  EXPECT_TRUE(same_bits(a.loss.entropy, a0.loss.entropy + b0.loss.entropy));
  EXPECT_EQ(a.loss.clipped, a0.loss.clipped + b0.loss.clipped);
  EXPECT_TRUE(same_bits(a.loss.ratio_sum, a0.loss.ratio_sum + b0.loss.ratio_sum));
  EXPECT_TRUE(same_bits(a.loss.approx_kl, a0.loss.approx_kl + b0.loss.approx_kl));
  const train::MismatchStats &x = a0.mismatch, &y = b0.mismatch;
  EXPECT_EQ(a.mismatch.samples, x.samples + y.samples);
  EXPECT_EQ(a.mismatch.tokens, x.tokens + y.tokens);
  const double n = double(x.samples) + double(y.samples), t = double(x.tokens) + double(y.tokens);
  EXPECT_TRUE(same_bits(a.mismatch.abs_diff_mean,
                        (x.abs_diff_mean * double(x.samples) + y.abs_diff_mean * double(y.samples)) / n));
  EXPECT_TRUE(same_bits(a.mismatch.kl_k3, (x.kl_k3 * double(x.tokens) + y.kl_k3 * double(y.tokens)) / t));
  EXPECT_TRUE(same_bits(a.mismatch.bitwise_equal_frac,
                        (x.bitwise_equal_frac * double(x.tokens) + y.bitwise_equal_frac * double(y.tokens)) / t));
  EXPECT_EQ(a.mismatch.abs_diff_max, y.abs_diff_max);

  // Without a mismatch (recomputed old logprobs) the loss sums still add and
  // the mismatch is left alone.
  StepSums c = sample_sums(1.0), d = sample_sums(3.0);
  c.has_mismatch = d.has_mismatch = false;
  TwoRanks r1;
  d.reduce(r1);
  TwoRanks r0;
  r0.peer = r1.sent;
  c.reduce(r0);
  EXPECT_EQ(c.loss.clipped, a0.loss.clipped + b0.loss.clipped);
  EXPECT_TRUE(same_bits(c.mismatch.abs_diff_mean, a0.mismatch.abs_diff_mean));
}

}  // namespace
}  // namespace lockstep::rl
