// The stream helpers of DeepSeek-V4's hyper-connections (kernels/cpu/streams.h)
// against double-precision references: one add of two f32 values done in
// double and rounded once is the correctly rounded f32 add, so add_to_streams
// and each step of sum_streams (stream order) must match bit for bit; the
// whole sum is also within its rounding bound of the exact double sum.
// Also: strided rows, sum_streams over its own input, batch and thread
// invariance, shape errors naming the argument.
#include "lockstep/kernels/cpu/streams.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/error.h"

namespace lockstep::kernels {
namespace {

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

Tensor rows(float* p, int64_t T, int64_t N, int64_t ld) {
  Tensor t(p, DType::F32, {T, N});
  t.stride[0] = ld;
  return t;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Case {
  int64_t n, D, T;
};
std::vector<Case> cases() {
  return {{1, 1, 1}, {4, 7, 5}, {4, 33, 9}, {2, 130, 3}, {3, 16, 64}};
}

TEST(Streams, AddToStreamsMatchesDoubleReferenceOnStridedRows) {
  ThreadPool pool(2);
  Context ctx{&pool};
  for (const Case& c : cases()) {
    const int64_t W = c.n * c.D, ld = W + 3, lde = c.D + 1;
    std::vector<float> x = test::randn(c.T * ld, uint32_t(c.T * 10 + c.D), 4.0f);
    const std::vector<float> e = test::randn(c.T * lde, uint32_t(c.D), 2.0f), x0 = x;
    add_to_streams(ctx, rows(x.data(), c.T, W, ld), rows(const_cast<float*>(e.data()), c.T, c.D, lde), c.n);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < ld; ++j) {
        const size_t i = sz(t * ld + j);
        const float want = j < W ? float(double(x0[i]) + double(e[sz(t * lde + j % c.D)])) : x0[i];
        ASSERT_EQ(x[i], want) << "n=" << c.n << " D=" << c.D << " t=" << t << " j=" << j;
      }
  }
}

TEST(Streams, RepeatStreamsCopiesEveryBit) {
  ThreadPool pool(2);
  Context ctx{&pool};
  for (const Case& c : cases()) {
    const int64_t W = c.n * c.D, ld = W + 2;
    std::vector<float> e = test::randn(c.T * c.D, uint32_t(c.T + 7 * c.D));
    e[0] = std::nanf("0x123");  // a NaN payload and a negative zero are copied as they are
    if (e.size() > 1) e[1] = -0.0f;
    std::vector<float> x(sz(c.T * ld), -7.0f);
    repeat_streams(ctx, rows(x.data(), c.T, W, ld), rows(e.data(), c.T, c.D, c.D), c.n);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < ld; ++j) {
        const float want = j < W ? e[sz(t * c.D + j % c.D)] : -7.0f;
        ASSERT_EQ(std::memcmp(&x[sz(t * ld + j)], &want, 4), 0) << "n=" << c.n << " D=" << c.D << " j=" << j;
      }
  }
}

TEST(Streams, SumStreamsAddsInStreamOrderAndIsWithinItsBoundOfTheExactSum) {
  ThreadPool pool(2);
  Context ctx{&pool};
  for (const Case& c : cases()) {
    const int64_t W = c.n * c.D, ld = W + 1;
    const std::vector<float> dx = test::randn(c.T * ld, uint32_t(3 * c.T + c.D), 3.0f);
    std::vector<float> de(sz(c.T * c.D), -7.0f);
    sum_streams(ctx, rows(de.data(), c.T, c.D, c.D), rows(const_cast<float*>(dx.data()), c.T, W, ld), c.n);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t d = 0; d < c.D; ++d) {
        double step = dx[sz(t * ld + d)], exact = step, mag = std::fabs(step);
        for (int64_t i = 1; i < c.n; ++i) {
          const double v = dx[sz(t * ld + i * c.D + d)];
          step = float(step + v);  // each add rounded once to f32, in stream order
          exact += v;
          mag += std::fabs(v);
        }
        const float got = de[sz(t * c.D + d)];
        ASSERT_EQ(got, float(step)) << "n=" << c.n << " D=" << c.D << " t=" << t << " d=" << d;
        EXPECT_LE(std::fabs(double(got) - exact), double(c.n) * FLT_EPSILON * mag + 1e-30);
      }
  }
}

TEST(Streams, SumStreamsMayWriteOverItsFirstStream) {
  Context ctx;
  const int64_t n = 4, D = 9, T = 3, W = n * D;
  std::vector<float> dx = test::randn(T * W, 11), want(sz(T * D));
  sum_streams(ctx, rows(want.data(), T, D, D), rows(dx.data(), T, W, W), n);
  sum_streams(ctx, rows(dx.data(), T, D, W), rows(dx.data(), T, W, W), n);
  for (int64_t t = 0; t < T; ++t)
    test::expect_bits_equal(dx.data() + t * W, want.data() + t * D, D, "in place");
}

// Every token's bits alone equal its bits in the batch, on 1 and 2 threads.
TEST(Streams, BatchAndThreadInvariant) {
  const int64_t n = 4, D = 37, T = 11, W = n * D;
  const std::vector<float> e = test::randn(T * D, 21), x0 = test::randn(T * W, 22);
  auto run = [&](int threads, int64_t t0, int64_t rows_n) {
    ThreadPool pool(threads);
    Context ctx{&pool};
    std::vector<float> x(x0.begin() + t0 * W, x0.begin() + (t0 + rows_n) * W);
    std::vector<float> es(e.begin() + t0 * D, e.begin() + (t0 + rows_n) * D), de(sz(rows_n * D));
    add_to_streams(ctx, rows(x.data(), rows_n, W, W), rows(es.data(), rows_n, D, D), n);
    sum_streams(ctx, rows(de.data(), rows_n, D, D), rows(x.data(), rows_n, W, W), n);
    repeat_streams(ctx, rows(x.data(), rows_n, W, W), rows(de.data(), rows_n, D, D), n);
    return x;
  };
  const std::vector<float> all = run(2, 0, T);
  test::expect_bits_equal(run(1, 0, T).data(), all.data(), T * W, "1 vs 2 threads");
  for (int64_t t = 0; t < T; ++t)
    test::expect_bits_equal(run(1, t, 1).data(), all.data() + t * W, W,
                            ("token " + std::to_string(t) + " alone").c_str());
}

TEST(Streams, BadShapesNameTheArgument) {
  Context ctx;
  std::vector<float> a(64), b(64);
  const Tensor x(a.data(), DType::F32, {2, 8}), e(b.data(), DType::F32, {2, 2}),
      e_bad(b.data(), DType::F32, {2, 3});
  EXPECT_NE(error_of([&] { add_to_streams(ctx, x, e_bad, 4); }).find("add_to_streams: x (T, n*D)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { repeat_streams(ctx, x, e, 0); }).find("repeat_streams: n (hc_mult) must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sum_streams(ctx, e, x, 3); }).find("sum_streams: dx (T, n*D)"), std::string::npos);
  EXPECT_NE(error_of([&] {
              sum_streams(ctx, Tensor(b.data(), DType::I32, {2, 2}), x, 4);
            }).find("sum_streams: de (T, D)"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { add_to_streams(ctx, x, e, 4); }), "");
}

}  // namespace
}  // namespace lockstep::kernels
