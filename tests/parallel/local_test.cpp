// The single-process parts of comm/ and parallel/: comm::checksum64 (XXH64 test vectors, every
// single-bit flip detected), comm::sum_in_rank_order, the data-parallel shard
// splits, and the emulation of a P-rank data-parallel step.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <utility>

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

// Xxh64 fed in pieces of every size gives the one-shot value, which is the
// reference's (libxxhash's XXH64) for inputs past one 32-byte stripe too.
TEST(Checksum, StreamingEqualsOneShot) {
  const std::string s = "Nobody inspects the spammish repetition";
  EXPECT_EQ(comm::checksum64(s.data(), s.size()), 0xFBCEA83C8A378BF1ull);
  std::vector<unsigned char> buf(301);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 37 + 11);
  const uint64_t whole = comm::checksum64(buf.data(), buf.size());
  EXPECT_EQ(whole, 0x51A95C085D01840Aull);
  for (size_t piece = 1; piece <= 70; ++piece) {
    comm::Xxh64 x;
    for (size_t i = 0; i < buf.size(); i += piece) x.update(buf.data() + i, std::min(piece, buf.size() - i));
    ASSERT_EQ(x.digest(), whole) << "pieces of " << piece;
  }
  uint64_t back = 0;
  EXPECT_EQ(comm::checksum_hex(whole), "51a95c085d01840a");
  ASSERT_TRUE(comm::parse_checksum_hex("51a95c085d01840a", &back));
  EXPECT_EQ(back, whole);
  EXPECT_FALSE(comm::parse_checksum_hex("51A95C085D01840A", &back));
  EXPECT_FALSE(comm::parse_checksum_hex("51a95c085d01840", &back));
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

TEST(Sharding, WorldInvariantShardsAreRunsOfTheGlobalMicroBatches) {
  const auto batch = test::dp_batch(23, 9);
  const int64_t budget = 24;
  const auto global = train::micro_batches(batch, budget);
  ASSERT_GE(global.size(), 6u) << "too few micro-batches to share out";
  for (int P = 1; P <= 8; ++P) {
    const std::vector<Range> shards = split_micro_batches(batch, budget, P);
    ASSERT_EQ(shards.size(), size_t(P));
    // The shards' own cuts, concatenated, are the global cut.
    std::vector<std::pair<size_t, size_t>> joined;
    size_t next = 0;
    for (const Range& r : shards) {
      ASSERT_EQ(r.begin, next) << "P = " << P;
      next = r.end;
      const std::vector<train::TrainSequence> shard(batch.begin() + ptrdiff_t(r.begin), batch.begin() + ptrdiff_t(r.end));
      for (auto [b0, b1] : train::micro_batches(shard, budget)) joined.emplace_back(r.begin + b0, r.begin + b1);
    }
    ASSERT_EQ(next, batch.size());
    ASSERT_EQ(joined, global) << "P = " << P;
  }
  // More ranks than micro-batches: some shards are empty, none is cut.
  const auto many = split_micro_batches(batch, budget, int(global.size()) + 3);
  size_t empty = 0;
  for (const Range& r : many) empty += r.size() == 0 ? 1 : 0;
  EXPECT_GE(empty, 3u);
}

// The world-invariant trainer: any sharing out of the micro-batches over
// accumulate() calls, in any order, gives the same step bit for bit; the
// plain trainer does not (the negative control).
TEST(WorldInvariant, TheStepDoesNotDependOnHowMicroBatchesAreShared) {
  const Context ctx;
  const auto batch = test::dp_batch(13, 21);
  int64_t targets = 0;
  for (const auto& s : batch) targets += s.num_targets();
  const train::LossFn loss = sft_loss(targets);
  auto train_in_shards = [&](bool invariant, int P, bool reverse) {
    auto t = test::dp_trainer(ctx, invariant);
    std::vector<Range> shards = split_micro_batches(batch, t->trainer_config().micro_batch_tokens, P);
    if (reverse) std::reverse(shards.begin(), shards.end());
    for (const Range& r : shards) {
      if (r.size() == 0) continue;
      const std::vector<train::TrainSequence> shard(batch.begin() + ptrdiff_t(r.begin), batch.begin() + ptrdiff_t(r.end));
      const train::LossFn shifted = [&, off = r.begin](size_t i, const float* lp, const float* en, int64_t m,
                                                       float* dl, float* de) { return loss(i + off, lp, en, m, dl, de); };
      t->accumulate(shard, shifted, {});
    }
    const train::OptimizerStats os = t->step();
    EXPECT_FALSE(os.skipped);
    const size_t n = size_t(t->layout().numel());
    // The gradient norm (a double sum of squares) shows a one-ulp change of
    // any gradient element; AdamW's first step may hide it in the weights.
    return std::make_pair(os.grad_norm, std::vector<float>(t->params(), t->params() + n));
  };
  const auto [norm1, one] = train_in_shards(true, 1, false);
  for (int P : {2, 3, 4})
    for (bool reverse : {false, true}) {
      const auto [norm, params] = train_in_shards(true, P, reverse);
      ASSERT_EQ(norm, norm1) << "P = " << P << (reverse ? ", shards backwards" : "");
      ASSERT_EQ(std::memcmp(params.data(), one.data(), one.size() * 4), 0)
          << "P = " << P << (reverse ? ", shards backwards" : "");
    }
  EXPECT_NE(train_in_shards(false, 3, true).first, train_in_shards(false, 1, false).first)
      << "plain f32 accumulation did not depend on the order: the test shows nothing";
  // train::sft_step on one trainer takes the same step.
  auto whole = test::dp_trainer(ctx, true);
  EXPECT_EQ(train::sft_step(*whole, batch).grad_norm, norm1);
  EXPECT_EQ(std::memcmp(whole->params(), one.data(), one.size() * 4), 0);
}

TEST(WorldInvariant, ANonFiniteGradientSkipsTheStepAndDropsTheSums) {
  const Context ctx;
  auto t = test::dp_trainer(ctx, true);
  const size_t n = size_t(t->layout().numel());
  const std::vector<float> before(t->params(), t->params() + n);
  const auto batch = test::dp_batch(3, 2);
  const train::LossFn nan_loss = [](size_t, const float*, const float*, int64_t m, float* dl, float*) {
    for (int64_t i = 0; i < m; ++i) dl[i] = std::numeric_limits<float>::quiet_NaN();
    return 0.0;
  };
  t->accumulate(batch, nan_loss, {});
  EXPECT_TRUE(t->step().skipped);
  EXPECT_EQ(std::memcmp(t->params(), before.data(), n * 4), 0);
  // Nothing of the refused step is left in the sums: the next one equals a fresh trainer's.
  auto fresh = test::dp_trainer(ctx, true);
  train::sft_step(*t, batch);
  train::sft_step(*fresh, batch);
  EXPECT_EQ(std::memcmp(t->params(), fresh->params(), n * 4), 0);
  // A step with nothing folded since the last one (a rank without
  // micro-batches) sees a zero gradient, not stale sums; so does one after
  // zero_grad() dropped what was folded.
  EXPECT_EQ(t->step().grad_norm, 0.0);
  int64_t targets = 0;
  for (const auto& s : batch) targets += s.num_targets();
  t->accumulate(batch, sft_loss(targets), {});
  t->zero_grad();
  EXPECT_EQ(t->step().grad_norm, 0.0);
}

}  // namespace
}  // namespace lockstep::parallel
