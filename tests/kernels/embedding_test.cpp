// Tests for the embedding lookup and its scatter-add backward: exact copies,
// token-order accumulation for repeated ids, thread invariance, bad ids, shapes.
#include "lockstep/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<int32_t> random_ids(int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  std::vector<int32_t> ids(sz(T));
  for (auto& i : ids) i = d(g);
  return ids;
}

TEST(Embedding, ForwardCopiesRowsExactly) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t V : {1, 5, 300}) {
    for (int64_t D : {1, 3, 64, 257}) {
      for (int64_t T : {0, 1, 7, 100}) {
        const int64_t ld_tab = D + 3, ld_out = D + 1;
        auto table = test::randn(V * ld_tab, seed++);
        auto ids = random_ids(T, V, seed++);
        Guarded out(T * ld_out, 5.0f);
        Tensor tt(table.data(), DType::F32, {V, D});
        tt.stride[0] = ld_tab;
        Tensor ot(out.data(), DType::F32, {T, D});
        ot.stride[0] = ld_out;
        embedding_forward(ctx, ot, tt, Tensor(ids.data(), DType::I32, {T}));
        out.check("out");
        for (int64_t t = 0; t < T; ++t) {
          expect_bits_equal(out.data() + t * ld_out, table.data() + ids[sz(t)] * ld_tab, D, "row");
          for (int64_t i = D; i < ld_out; ++i) ASSERT_EQ(out[t * ld_out + i], 5.0f) << "padding written";
        }
      }
    }
  }
}

// Double reference of the scatter-add, and the exact token-order contract.
TEST(Embedding, BackwardAccumulatesInTokenOrder) {
  uint32_t seed = 50;
  for (int64_t V : {1, 4, 97}) {
    for (int64_t D : {1, 33, 600}) {
      const int64_t T = 80;  // many repeats of each id when V is small
      auto ids = random_ids(T, V, seed++);
      auto dout = test::randn(T * D, seed++);
      auto init = test::randn(V * D, seed++);
      std::vector<double> want(init.begin(), init.end());
      std::vector<float> exact = init;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D; ++i) {
          want[sz(ids[sz(t)] * D + i)] += dout[sz(t * D + i)];
          float& e = exact[sz(ids[sz(t)] * D + i)];
          e = e + dout[sz(t * D + i)];
        }
      std::vector<std::vector<float>> got;
      ThreadPool p1(1), p2(2);
      for (ThreadPool* p : {&p1, &p2}) {
        Context ctx{p};
        Guarded dt(V * D);
        for (int64_t i = 0; i < V * D; ++i) dt[i] = init[sz(i)];
        embedding_backward(ctx, dt.tensor({V, D}), Tensor(dout.data(), DType::F32, {T, D}),
                           Tensor(ids.data(), DType::I32, {T}));
        dt.check("dtable");
        got.push_back(dt.values());
      }
      expect_close(got[0], want, 1e-5, "dtable vs double");
      expect_bits_equal(got[0].data(), exact.data(), V * D, "dtable vs token-order f32 sum");
      expect_bits_equal(got[1].data(), exact.data(), V * D, "dtable with 2 threads");
    }
  }
}

// embedding(ids) is linear in the table: a directional finite difference of
// L = sum dout * out equals <dtable, direction> (exact up to rounding).
TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Context ctx;
  const int64_t V = 11, D = 9, T = 23;
  auto table = test::randn(V * D, 3), dout = test::randn(T * D, 4), dir = test::randn(V * D, 5);
  auto ids = random_ids(T, V, 6);
  auto loss = [&](double h) {
    double l = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D; ++i) {
        const size_t k = sz(ids[sz(t)] * D + i);
        l += double(dout[sz(t * D + i)]) * (double(table[k]) + h * dir[k]);
      }
    return l;
  };
  const double h = 1e-3, fd = (loss(h) - loss(-h)) / (2 * h);
  std::vector<float> dt(sz(V * D), 0.0f);
  embedding_backward(ctx, Tensor(dt.data(), DType::F32, {V, D}), Tensor(dout.data(), DType::F32, {T, D}),
                     Tensor(ids.data(), DType::I32, {T}));
  double an = 0;
  for (size_t k = 0; k < dt.size(); ++k) an += double(dt[k]) * dir[k];
  EXPECT_NEAR(an, fd, 1e-4 * (1 + std::fabs(fd)));
}

TEST(Embedding, BatchInvariance) {
  const int64_t V = 50, D = 300, N = 64;
  auto table = test::randn(V * D, 7);
  auto ids = random_ids(N, V, 8);
  ThreadPool p1(1), p2(2);
  for (ThreadPool* p : {&p1, &p2}) {
    Context ctx{p};
    for (int64_t b = 1; b <= N; ++b) {
      std::vector<float> out(sz(b * D));
      const int64_t r0 = N - b;
      embedding_forward(ctx, Tensor(out.data(), DType::F32, {b, D}), Tensor(table.data(), DType::F32, {V, D}),
                        Tensor(ids.data() + r0, DType::I32, {b}));
      for (int64_t i = 0; i < b; ++i)
        expect_bits_equal(out.data() + i * D, table.data() + ids[sz(r0 + i)] * D, D, "row");
    }
  }
}

TEST(Embedding, OutOfRangeIdNamesIdAndPositionAndWritesNothing) {
  Context ctx;
  const int64_t V = 10, D = 4, T = 3;
  std::vector<float> table(sz(V * D), 1.0f), out(sz(T * D), 9.0f), dt(sz(V * D), 0.0f), dout(sz(T * D), 1.0f);
  for (int32_t bad : {10, -1}) {
    std::vector<int32_t> ids = {2, bad, 3};
    std::string msg = error_of([&] {
      embedding_forward(ctx, Tensor(out.data(), DType::F32, {T, D}), Tensor(table.data(), DType::F32, {V, D}),
                        Tensor(ids.data(), DType::I32, {T}));
    });
    EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
    for (float v : out) ASSERT_EQ(v, 9.0f);
    msg = error_of([&] {
      embedding_backward(ctx, Tensor(dt.data(), DType::F32, {V, D}), Tensor(dout.data(), DType::F32, {T, D}),
                         Tensor(ids.data(), DType::I32, {T}));
    });
    EXPECT_NE(msg.find("position 1"), std::string::npos) << msg;
    for (float v : dt) ASSERT_EQ(v, 0.0f);
  }
}

TEST(Embedding, ShapeMismatchNamesTheShapes) {
  Context ctx;
  std::vector<float> buf(1000);
  std::vector<int32_t> ids(8, 0);
  Tensor table(buf.data(), DType::F32, {10, 8}), out_bad(buf.data(), DType::F32, {4, 7});
  Tensor out(buf.data(), DType::F32, {4, 8});
  std::string msg =
      error_of([&] { embedding_forward(ctx, out_bad, table, Tensor(ids.data(), DType::I32, {4})); });
  EXPECT_NE(msg.find("(4, 7)"), std::string::npos) << msg;
  msg = error_of([&] { embedding_forward(ctx, out, table, Tensor(ids.data(), DType::I32, {5})); });
  EXPECT_NE(msg.find("(5,)"), std::string::npos) << msg;
  msg = error_of([&] { embedding_forward(ctx, out, table, Tensor(buf.data(), DType::F32, {4})); });
  EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
  msg = error_of([&] { embedding_backward(ctx, table, out_bad, Tensor(ids.data(), DType::I32, {4})); });
  EXPECT_NE(msg.find("(4, 7)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lockstep::kernels
