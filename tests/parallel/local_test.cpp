// The single-process parts of comm/ and parallel/: comm::checksum64 (XXH64 test vectors, every
// single-bit flip detected), comm::sum_in_rank_order, the data-parallel shard
// splits, and the emulation of a P-rank data-parallel step.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "parallel/dp_test_util.h"
#include "lockstep/comm/checksum.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/comm/reduce_order.h"
#include "lockstep/train/sft.h"

namespace lockstep::parallel {
namespace {

TEST(Checksum, Xxh64Vectors) {
  // Reference values of XXH64 with seed 0 (xxHash's own test suite / xxhsum).
  EXPECT_EQ(comm::checksum64("", 0), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(comm::checksum64("a", 1), 0xD24EC4F1A98C6E5Bull);
  EXPECT_EQ(comm::checksum64("abc", 3), 0x44BC2CF5AD770999ull);
}

TEST(Checksum, EverySingleBitFlipIsDetected) {
  std::vector<unsigned char> buf(301);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 37 + 11);
  const uint64_t h = comm::checksum64(buf.data(), buf.size());
  for (size_t i = 0; i < buf.size(); ++i) {
    for (int b = 0; b < 8; ++b) {
      buf[i] ^= static_cast<unsigned char>(1 << b);
      ASSERT_NE(comm::checksum64(buf.data(), buf.size()), h) << "byte " << i << " bit " << b;
      buf[i] ^= static_cast<unsigned char>(1 << b);
    }
  }
  EXPECT_NE(comm::checksum64(buf.data(), buf.size() - 1), h);  // length matters
}

TEST(ReduceOrder, RankOrderInDoubleRoundedOnce) {
  // 1 + 2^-24 + 2^-24: f32 left to right gives 1 (each add rounds back to 1);
  // the double accumulator keeps both halves and rounds once to 1 + 2^-23.
  const float a = 1.0f, b = 0x1p-24f, c = 0x1p-24f;
  const float* parts[] = {&a, &b, &c};
  float out = 0;
  comm::sum_in_rank_order(parts, 3, 1, &out);
  EXPECT_EQ(out, 1.0f + 0x1p-23f);
  // Order is rank order: (1e16 + -1e16) + 1 = 1 in double; other orders give 0.
  const double x = 1e16, y = -1e16, z = 1.0;
  const double* dparts[] = {&x, &y, &z};
  double dout = 0;
  comm::sum_in_rank_order(dparts, 3, 1, &dout);
  EXPECT_EQ(dout, 1.0);
}

TEST(Sharding, SplitsTileTheBatchInOrder) {
  for (int P = 1; P <= 5; ++P) {
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(64)}) {
      const auto s = split_even(n, P);
      ASSERT_EQ(s.size(), size_t(P));
      size_t next = 0;
      for (const auto& r : s) {
        EXPECT_EQ(r.begin, next);
        EXPECT_LE(r.size(), (n + size_t(P) - 1) / size_t(P));
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  // By tokens: one long sequence and many short ones.
  std::vector<train::TrainSequence> seqs(9);
  seqs[0].tokens.assign(80, 1);
  for (size_t i = 1; i < seqs.size(); ++i) seqs[i].tokens.assign(10, 1);
  const auto t = split_by_tokens(seqs, 2);  // 160 tokens: the long one alone is half
  EXPECT_EQ(t[0].begin, 0u);
  EXPECT_EQ(t[0].end, 1u);
  EXPECT_EQ(t[1].begin, 1u);
  EXPECT_EQ(t[1].end, 9u);
  const auto t4 = split_by_tokens(seqs, 4);  // targets 40, 80, 120
  EXPECT_EQ(t4[0].end, 1u);
  EXPECT_EQ(t4[1].end, 1u);  // already past 80 tokens: empty shard
  EXPECT_EQ(t4[2].end, 5u);
  EXPECT_EQ(t4[3].end, 9u);
}

TEST(Emulation, OneShardIsThePlainSftStepBitForBit) {
  const Context ctx;
  auto a = test::dp_trainer(ctx), b = test::dp_trainer(ctx);
  const size_t n = size_t(a->layout().numel());
  for (int step = 1; step <= 2; ++step) {
    const auto batch = test::dp_batch(7, 5 + uint32_t(step));
    const train::SftStepStats sa = emulated_dp_sft_step(*a, 1, batch);
    const train::SftStepStats sb = train::sft_step(*b, batch);
    EXPECT_EQ(sa.loss, sb.loss);
    EXPECT_EQ(sa.grad_norm, sb.grad_norm);
    ASSERT_EQ(std::memcmp(a->params(), b->params(), n * 4), 0) << "step " << step;
  }
}

TEST(Emulation, GradientIsTheRankOrderSumOfShardGradients) {
  const Context ctx;
  auto emu = test::dp_trainer(ctx), ref = test::dp_trainer(ctx);
  const size_t n = size_t(emu->layout().numel());
  const auto batch = test::dp_batch(9, 3);
  int64_t targets = 0;
  for (const auto& s : batch) targets += s.num_targets();
  const train::LossFn loss = sft_loss(targets);
  const auto shards = split_by_tokens(batch, 3);
  emulate_dp_accumulate(*emu, batch, shards, loss, {});
  // By hand: each shard from zero gradients, partials summed in shard order.
  std::vector<std::vector<float>> partial;
  for (const auto& r : shards) {
    std::vector<train::TrainSequence> shard(batch.begin() + ptrdiff_t(r.begin), batch.begin() + ptrdiff_t(r.end));
    train::LossFn shifted = [&, off = r.begin](size_t i, const float* lp, const float* en, int64_t m, float* dl,
                                               float* de) { return loss(i + off, lp, en, m, dl, de); };
    if (!shard.empty()) ref->accumulate(shard, shifted, {});
    partial.emplace_back(ref->grads(), ref->grads() + n);
    std::memset(ref->grads(), 0, n * 4);
  }
  for (size_t i = 0; i < n; ++i) {
    const float expect = float((double(partial[0][i]) + double(partial[1][i])) + double(partial[2][i]));
    ASSERT_EQ(emu->grads()[i], expect) << i;
  }
}

}  // namespace
}  // namespace lockstep::parallel
