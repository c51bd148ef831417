// Tests for AdamW, the global gradient norm and clipping: a two-step double
// reference and a hand-worked scalar case, thread invariance (bitwise),
// clipping behaviour (no-op under the limit, NaN left alone), bad options.
#include "lockstep/kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
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

// Textbook AdamW (Loshchilov & Hutter, PyTorch form) in double.
void ref_adamw(std::vector<double>& p, const std::vector<float>& g, std::vector<double>& m,
               std::vector<double>& v, const AdamWParams& hp) {
  const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  const double bc1 = 1 - std::pow(b1, double(hp.step)), bc2 = 1 - std::pow(b2, double(hp.step));
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1 - lr * wd;
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * double(g[i]) * g[i];
    p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
  }
}

TEST(AdamW, TwoStepsMatchDoubleReference) {
  Context ctx;
  for (int64_t n : {1, 7, 1000}) {
    auto p0 = test::randn(n, 1), g1 = test::randn(n, 2, 0.1f), g2 = test::randn(n, 3, 0.1f);
    Guarded p(n), m(n), v(n);
    for (int64_t i = 0; i < n; ++i) p[i] = p0[sz(i)];
    std::vector<double> pr(p0.begin(), p0.end()), mr(sz(n), 0.0), vr(sz(n), 0.0);
    AdamWParams hp;
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    for (int64_t step = 1; step <= 2; ++step) {
      hp.step = step;
      const auto& g = step == 1 ? g1 : g2;
      adamw_step(ctx, p.data(), g.data(), m.data(), v.data(), n, hp);
      ref_adamw(pr, g, mr, vr, hp);
    }
    p.check("param");
    m.check("m");
    v.check("v");
    expect_close(p.values(), pr, 1e-6, "param");
    expect_close(m.values(), mr, 1e-6, "m");
    expect_close(v.values(), vr, 1e-6, "v");
  }
}

// One parameter, worked by hand: lr 0.01, wd 0.1, betas (0.9, 0.95), p0 = 1,
// g1 = 0.5, g2 = -0.25.
//  step 1: p = 1 * 0.999 = 0.999; m = 0.05; v = 0.0125; m^ = 0.5, v^ = 0.25;
//          p = 0.999 - 0.01 * 0.5 / (0.5 + 1e-8) = 0.98900000002
//  step 2: p = 0.98900000002 * 0.999 = 0.98801100002; m = 0.045 - 0.025 = 0.02;
//          v = 0.011875 + 0.003125 = 0.015; m^ = 0.02 / 0.19; v^ = 0.015 / 0.0975;
//          p -= 0.01 * 0.10526315789 / (0.39223227027 + 1e-8)  ->  0.98532731...
TEST(AdamW, HandWorkedScalar) {
  Context ctx;
  float p = 1.0f, m = 0.0f, v = 0.0f;
  AdamWParams hp;
  hp.lr = 0.01f;
  hp.weight_decay = 0.1f;
  hp.step = 1;
  float g = 0.5f;
  adamw_step(ctx, &p, &g, &m, &v, 1, hp);
  // f32 betas are not exactly 0.9 / 0.95 (1 - 0.9f = 0.100000024): relative 1e-6.
  EXPECT_NEAR(m, 0.05, 1e-6 * 0.05);
  EXPECT_NEAR(v, 0.0125, 1e-6 * 0.0125);
  EXPECT_NEAR(p, 0.98900000002, 2e-7);
  g = -0.25f;
  hp.step = 2;
  adamw_step(ctx, &p, &g, &m, &v, 1, hp);
  EXPECT_NEAR(m, 0.02, 1e-6 * 0.02);
  EXPECT_NEAR(v, 0.015, 1e-6 * 0.015);
  const double want = 0.98900000002 * 0.999 - 0.01 * (0.02 / 0.19) / (std::sqrt(0.015 / 0.0975) + 1e-8);
  EXPECT_NEAR(want, 0.985327, 1e-6);  // the hand value above
  EXPECT_NEAR(p, want, 2e-7);
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  Context ctx;
  std::vector<float> p = {2.0f, -3.0f}, g = {0.0f, 0.0f}, m = {0.0f, 0.0f}, v = {0.0f, 0.0f};
  AdamWParams hp;
  hp.lr = 0.1f;
  hp.weight_decay = 0.5f;
  adamw_step(ctx, p.data(), g.data(), m.data(), v.data(), 2, hp);
  const float decay = float(1.0 - double(0.1f) * double(0.5f));  // computed in double, rounded once
  EXPECT_FLOAT_EQ(p[0], 2.0f * decay);
  EXPECT_FLOAT_EQ(p[1], -3.0f * decay);
}

TEST(AdamW, StepIsThreadInvariant) {
  const int64_t n = 300001;
  auto p0 = test::randn(n, 4), g = test::randn(n, 5), m0 = test::randn(n, 6, 0.1f),
       v0 = test::uniform(n, 7, 0.0f, 0.1f);
  AdamWParams hp;
  hp.lr = 3e-4f;
  hp.weight_decay = 0.01f;
  hp.step = 17;
  std::vector<std::vector<float>> ps;
  ThreadPool p1(1), p2(2);
  for (ThreadPool* pool : {&p1, &p2}) {
    Context ctx{pool};
    std::vector<float> p = p0, m = m0, v = v0;
    adamw_step(ctx, p.data(), g.data(), m.data(), v.data(), n, hp);
    ps.push_back(p);
  }
  expect_bits_equal(ps[0].data(), ps[1].data(), n, "param 1 vs 2 threads");
}

TEST(AdamW, BadOptionsAreErrors) {
  Context ctx;
  float p = 0, g = 0, m = 0, v = 0;
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.step = 0;
  EXPECT_NE(error_of([&] { adamw_step(ctx, &p, &g, &m, &v, 1, hp); }).find("1-based"), std::string::npos);
  hp.step = 1;
  hp.beta2 = 1.0f;
  EXPECT_NE(error_of([&] { adamw_step(ctx, &p, &g, &m, &v, 1, hp); }).find("beta2=1"), std::string::npos);
  hp.beta2 = 0.95f;
  hp.eps = 0.0f;
  EXPECT_NE(error_of([&] { adamw_step(ctx, &p, &g, &m, &v, 1, hp); }).find("eps"), std::string::npos);
  hp.eps = 1e-8f;
  hp.lr = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of([&] { adamw_step(ctx, &p, &g, &m, &v, 1, hp); }).find("lr"), std::string::npos);
}

TEST(GradNorm, MatchesDoubleAndIsThreadInvariant) {
  ThreadPool p1(1), p2(2);
  for (int64_t n : {0, 1, 4095, 4096, 4097, 1000003}) {
    auto g = test::randn(n, uint32_t(n + 1));
    double want = 0;
    for (float x : g) want += double(x) * x;
    want = std::sqrt(want);
    Context c1{&p1}, c2{&p2};
    const double a = global_grad_norm(c1, g.data(), n), b = global_grad_norm(c2, g.data(), n);
    EXPECT_EQ(a, b) << n;  // bitwise: fixed chunks summed in order
    EXPECT_NEAR(a, want, 1e-12 * (want + 1)) << n;
  }
}

TEST(GradNorm, SegmentsAreThreadInvariantAndAgreeWithTheFlatNorm) {
  auto g = test::randn(50000, 8);
  std::vector<FloatSegment> segs = {
      {g.data(), 10}, {g.data() + 10, 0}, {g.data() + 10, 30000}, {g.data() + 30010, 19990}};
  ThreadPool p1(1), p2(2);
  Context c1{&p1}, c2{&p2};
  const double a = global_grad_norm(c1, segs), b = global_grad_norm(c2, segs);
  EXPECT_EQ(a, b);
  EXPECT_NEAR(a, global_grad_norm(c1, g.data(), 50000), 1e-12 * a);
}

TEST(ClipGradNorm, NoOpUnderTheLimit) {
  Context ctx;
  auto g = test::randn(1000, 9);
  auto before = g;
  const double norm = global_grad_norm(ctx, g.data(), 1000);
  EXPECT_EQ(clip_grad_norm(ctx, g.data(), 1000, norm * 1.5), norm);
  expect_bits_equal(g.data(), before.data(), 1000, "untouched");
  EXPECT_EQ(clip_grad_norm(ctx, g.data(), 1000, norm), norm);  // equal is not above
  expect_bits_equal(g.data(), before.data(), 1000, "untouched at the limit");
}

TEST(ClipGradNorm, ScalesAboveTheLimitThreadInvariantly) {
  const int64_t n = 200000;
  auto g0 = test::randn(n, 10);
  ThreadPool p1(1), p2(2);
  std::vector<std::vector<float>> out;
  for (ThreadPool* p : {&p1, &p2}) {
    Context ctx{p};
    std::vector<float> g = g0;
    const double pre = clip_grad_norm(ctx, g.data(), n, 1.0);
    EXPECT_NEAR(pre, std::sqrt(double(n)), 0.01 * std::sqrt(double(n)));
    EXPECT_NEAR(global_grad_norm(ctx, g.data(), n), 1.0, 1e-6);
    const float scale = float(1.0 / pre);
    for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(g[sz(i)], g0[sz(i)] * scale);
    out.push_back(g);
  }
  expect_bits_equal(out[0].data(), out[1].data(), n, "clipped 1 vs 2 threads");
  // Segments version, with guards after each segment.
  Guarded a(300), b(700);
  for (int i = 0; i < 300; ++i) a[i] = 1.0f;
  for (int i = 0; i < 700; ++i) b[i] = 1.0f;
  Context ctx;
  const double pre = clip_grad_norm(ctx, {{a.data(), 300}, {b.data(), 700}}, 1.0);
  EXPECT_NEAR(pre, std::sqrt(1000.0), 1e-9);
  a.check("segment a");
  b.check("segment b");
  EXPECT_FLOAT_EQ(a[0], float(1.0 / std::sqrt(1000.0)));
  EXPECT_FLOAT_EQ(b[699], float(1.0 / std::sqrt(1000.0)));
}

TEST(ClipGradNorm, NonFiniteNormIsReturnedAndNothingIsWritten) {
  Context ctx;
  std::vector<float> g = {1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
  EXPECT_TRUE(std::isnan(clip_grad_norm(ctx, g.data(), 3, 0.1)));
  EXPECT_EQ(g[0], 1.0f);
  EXPECT_EQ(g[2], 3.0f);
  g[1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(clip_grad_norm(ctx, g.data(), 3, 0.1)));
  EXPECT_EQ(g[0], 1.0f);
  EXPECT_NE(error_of([&] { clip_grad_norm(ctx, g.data(), 3, 0.0); }).find("max_norm"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::kernels
