// Tests for the canonical reductions and elementwise math: double-precision
// references, width/length independence of the bits, edge inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lockstep/kernels/cpu/simd.h"

namespace lockstep::kernels {
namespace {

std::vector<float> randn(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// The contract written out in scalar code: 16 lanes in index order, fixed tree.
float reference_canonical_sum(const float* x, int64_t n) {
  float lanes[16] = {0};
  for (int64_t i = 0; i < n; ++i) lanes[i % 16] = lanes[i % 16] + x[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lanes[j] = lanes[j] + lanes[j + w];
  return lanes[0];
}
float reference_canonical_dot(const float* a, const float* b, int64_t n) {
  float lanes[16] = {0};
  for (int64_t i = 0; i < n; ++i) lanes[i % 16] = std::fma(a[i], b[i], lanes[i % 16]);
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lanes[j] = lanes[j] + lanes[j + w];
  return lanes[0];
}

}  // namespace

TEST(Simd, ReductionsFollowTheWrittenContractBitForBit) {
  for (int64_t n : {1, 3, 15, 16, 17, 31, 64, 100, 1000, 4099}) {
    auto a = randn(n, 1), b = randn(n, 2);
    EXPECT_EQ(canonical_sum(a.data(), n), reference_canonical_sum(a.data(), n)) << n;
    EXPECT_EQ(canonical_dot(a.data(), b.data(), n), reference_canonical_dot(a.data(), b.data(), n)) << n;
    EXPECT_EQ(canonical_sum_sq(a.data(), n), reference_canonical_dot(a.data(), a.data(), n)) << n;
    double s = 0, d = 0;
    for (int64_t i = 0; i < n; ++i) {
      s += a[i];
      d += double(a[i]) * b[i];
    }
    EXPECT_NEAR(canonical_sum(a.data(), n), s, 1e-5 * std::sqrt(double(n)) * 4);
    EXPECT_NEAR(canonical_dot(a.data(), b.data(), n), d, 1e-5 * std::sqrt(double(n)) * 4);
  }
}

TEST(Simd, ElementwiseMatchesDoubleReference) {
  auto x = randn(1001, 3);
  for (auto& v : x) v *= 8.0f;
  std::vector<float> y(x.size());
  vexp(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], std::exp(double(x[i])), 4e-7 * std::exp(double(x[i]))) << x[i];
  vsilu(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    double r = x[i] / (1.0 + std::exp(-double(x[i])));
    ASSERT_NEAR(y[i], r, 1e-6 * (1 + std::fabs(r))) << x[i];
  }
  vsigmoid(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], 1.0 / (1.0 + std::exp(-double(x[i]))), 1e-6) << x[i];
  for (auto& v : x) v = std::fabs(v) + 1e-3f;
  vlog(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], std::log(double(x[i])), 1e-6 * (1 + std::fabs(std::log(x[i])))) << x[i];
}

TEST(Simd, ScalarFormsGiveTheSameBitsAsArrayForms) {
  auto x = randn(37, 4);
  std::vector<float> y(x.size());
  vexp(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(exp1(x[i]), y[i]);
  vsilu(x.data(), y.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(silu1(x[i]), y[i]);
}

TEST(Simd, NanPropagatesThroughEveryFunction) {
  const float nan = std::nanf("");
  EXPECT_TRUE(std::isnan(exp1(nan)));
  EXPECT_TRUE(std::isnan(log1(nan)));
  EXPECT_TRUE(std::isnan(sigmoid1(nan)));
  EXPECT_TRUE(std::isnan(silu1(nan)));
}

TEST(Simd, ExpEdgeInputs) {
  EXPECT_EQ(exp1(0.0f), 1.0f);
  EXPECT_EQ(exp1(-200.0f), 0.0f);
  EXPECT_LT(exp1(-87.0f), 1e-37f);
  EXPECT_TRUE(std::isfinite(exp1(88.0f)));
  EXPECT_EQ(exp1(89.0f), INFINITY);
  EXPECT_EQ(exp1(200.0f), INFINITY);
  EXPECT_EQ(exp1(1e30f), INFINITY);
  EXPECT_EQ(sigmoid1(-200.0f), 0.0f);
  EXPECT_EQ(sigmoid1(200.0f), 1.0f);
  EXPECT_EQ(silu1(-200.0f), 0.0f);
  EXPECT_EQ(silu1(200.0f), 200.0f);
}

}  // namespace lockstep::kernels

namespace lockstep::kernels {
#if defined(__AVX2__) && defined(__FMA__)
// Guards the build flags: without AES/PCLMUL Highway 1.0 silently picks SSSE3.
TEST(Simd, HighwayUsesTheAvx2TargetWhenTheCompilerTargetsIt) { EXPECT_STREQ(simd_target_name(), "AVX2"); }
#endif
}  // namespace lockstep::kernels
