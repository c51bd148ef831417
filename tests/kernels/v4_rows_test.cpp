// DeepSeek-V4's per-element steps (kernels/cpu/v4_rows.h) against plain
// references: the product of two f32 values computed in double and rounded
// once is the correctly rounded f32 product, so scale_values must match it bit
// for bit (specials included); the row weights against the plan's token and
// slot arrays, their backward against finite differences of a linear loss.
// Also: batch and thread invariance, shape errors.
#include "lockstep/kernels/cpu/v4_rows.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/error.h"

namespace lockstep::kernels {
namespace {

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A plan for T tokens of top-k K over E experts (distinct experts per token).
MoeDispatch random_plan(int64_t T, int64_t K, int E, uint32_t seed) {
  std::vector<int32_t> idx(sz(T * K));
  const std::vector<float> u = test::uniform(T, seed, 0.0f, float(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < K; ++s) idx[sz(t * K + s)] = int32_t((int64_t(u[sz(t)]) + 3 * s) % E);
  return moe_plan(Tensor(idx.data(), DType::I32, {T, K}), E);
}

TEST(V4Rows, ScaleValuesMatchesTheDoubleReferenceWithSpecials) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float s : {0.125f, 0.17677669f, -3.5f, 1e-30f, 7e30f}) {
    std::vector<float> x = test::randn(1000, 7, 5.0f);
    const float specials[] = {-0.0f, 0.0f, inf, -inf, nan, 1e-40f, -3e-39f, FLT_MAX, -1e38f};
    for (size_t i = 0; i < std::size(specials); ++i) x[i * 97 + 3] = specials[i];
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = float(double(x[i]) * double(s));
    for (int threads : {1, 2}) {
      auto pool = make_pool(threads);
      Context ctx;
      ctx.pool = pool.get();
      std::vector<float> got = x;
      scale_values(ctx, Tensor(got.data(), DType::F32, {10, 100}), s);
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << i;
          continue;
        }
        ASSERT_EQ(bits(got[i]), bits(want[i])) << "s=" << s << " element " << i << ": " << x[i];
      }
    }
  }
}

TEST(V4Rows, ScaleValuesOfARowAloneEqualsTheRowInABatch) {
  const int64_t T = 9, N = 37;
  const std::vector<float> x = test::randn(T * N, 11, 2.0f);
  std::vector<float> batch = x;
  Context ctx;
  scale_values(ctx, Tensor(batch.data(), DType::F32, {T, N}), 0.3f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(x.begin() + t * N, x.begin() + (t + 1) * N);
    scale_values(ctx, Tensor(row.data(), DType::F32, {1, N}), 0.3f);
    for (int64_t j = 0; j < N; ++j) ASSERT_EQ(bits(row[sz(j)]), bits(batch[sz(t * N + j)])) << t << "," << j;
  }
}

TEST(V4Rows, RowWeightsFollowThePlan) {
  for (int64_t T : {1, 5, 33})
    for (int64_t K : {1, 2, 3}) {
      const MoeDispatch plan = random_plan(T, K, 5, uint32_t(T * 10 + K));
      std::vector<float> w = test::randn(T * K, uint32_t(T + K), 1.0f);
      std::vector<float> rows(sz(T * K), -7.0f);
      Context ctx;
      moe_row_weights(ctx, Tensor(rows.data(), DType::F32, {T * K, 1}), Tensor(w.data(), DType::F32, {T, K}),
                      plan);
      for (int64_t r = 0; r < T * K; ++r)
        ASSERT_EQ(bits(rows[sz(r)]), bits(w[sz(plan.token[sz(r)] * K + plan.slot[sz(r)])])) << "row " << r;
    }
}

// loss = sum_r c[r] * w_rows[r]: d loss / d topk_w by central differences
// against moe_row_weights_backward of dw_rows = c.
TEST(V4Rows, RowWeightsBackwardMatchesFiniteDifferences) {
  const int64_t T = 7, K = 2;
  const MoeDispatch plan = random_plan(T, K, 4, 3);
  const std::vector<float> w0 = test::randn(T * K, 4, 1.0f), c = test::randn(T * K, 5, 1.0f);
  Context ctx;
  auto loss = [&](const std::vector<float>& w) {
    std::vector<float> rows(sz(T * K));
    std::vector<float> wc = w;
    moe_row_weights(ctx, Tensor(rows.data(), DType::F32, {T * K, 1}), Tensor(wc.data(), DType::F32, {T, K}),
                    plan);
    double l = 0;
    for (int64_t r = 0; r < T * K; ++r) l += double(c[sz(r)]) * double(rows[sz(r)]);
    return l;
  };
  std::vector<float> dw(sz(T * K), -7.0f), dc = c;
  moe_row_weights_backward(ctx, Tensor(dw.data(), DType::F32, {T, K}),
                           Tensor(dc.data(), DType::F32, {T * K, 1}), plan);
  const float h = 1.0f / 64;  // exact in f32 around these values
  for (int64_t i = 0; i < T * K; ++i) {
    std::vector<float> up = w0, down = w0;
    up[sz(i)] += h;
    down[sz(i)] -= h;
    const double fd = (loss(up) - loss(down)) / (double(up[sz(i)]) - double(down[sz(i)]));
    EXPECT_NEAR(double(dw[sz(i)]), fd, 1e-6 * (1 + std::fabs(fd))) << "topk_w element " << i;
  }
}

TEST(V4Rows, ShapeErrorsNameTheArgument) {
  const MoeDispatch plan = random_plan(3, 2, 4, 1);
  std::vector<float> a(6), b(6);
  Context ctx;
  EXPECT_NE(error_of([&] {
              moe_row_weights(ctx, Tensor(a.data(), DType::F32, {5, 1}), Tensor(b.data(), DType::F32, {3, 2}),
                              plan);
            }).find("moe_row_weights: row weights (T*K, 1)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              moe_row_weights_backward(ctx, Tensor(a.data(), DType::F32, {2, 3}),
                                       Tensor(b.data(), DType::F32, {6, 1}), plan);
            }).find("moe_row_weights_backward: topk (T, K)"),
            std::string::npos);
  Tensor strided(a.data(), DType::F32, {2, 2});
  strided.stride[0] = 3;
  EXPECT_NE(error_of([&] { scale_values(ctx, strided, 2.0f); }).find("scale_values: x must be contiguous"),
            std::string::npos);
}

}  // namespace
}  // namespace lockstep::kernels
