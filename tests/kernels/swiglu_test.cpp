// Tests for SwiGLU forward/backward: double references, the forward's silu
// bits, finite differences, aliasing, batch/thread invariance, shapes.
#include "lockstep/kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/kernels/cpu/simd.h"

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

double sig(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

Tensor strided(float* p, int64_t T, int64_t F, int64_t ld) {
  Tensor t(p, DType::F32, {T, F});
  t.stride[0] = ld;
  return t;
}

TEST(SwiGlu, ForwardAndBackwardMatchDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t T : {1, 4, 19}) {
    for (int64_t F : {1, 15, 256, 700}) {
      // gate and up are the two halves of a fused (T, 2F) projection; outputs padded.
      const int64_t ldg = 2 * F, ldo = F + 3;
      auto gu = test::randn(T * ldg, seed++, 3.0f), dout = test::randn(T * F, seed++);
      Tensor gate = strided(gu.data(), T, F, ldg), up = strided(gu.data() + F, T, F, ldg);
      Guarded out(T * ldo), dg(T * ldo), du(T * F);
      swiglu_forward(ctx, strided(out.data(), T, F, ldo), gate, up);
      swiglu_backward(ctx, strided(dg.data(), T, F, ldo), du.tensor({T, F}),
                      Tensor(dout.data(), DType::F32, {T, F}), gate, up);
      out.check("out");
      dg.check("dgate");
      du.check("dup");
      std::vector<double> yo(sz(T * F)), gd(sz(T * F)), ud(sz(T * F));
      std::vector<float> got_o(sz(T * F)), got_g(sz(T * F));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < F; ++j) {
          const double g = gu[sz(t * ldg + j)], u = gu[sz(t * ldg + F + j)], d = dout[sz(t * F + j)];
          const size_t k = sz(t * F + j);
          yo[k] = g * sig(g) * u;
          gd[k] = d * u * sig(g) * (1 + g * (1 - sig(g)));
          ud[k] = d * g * sig(g);
          got_o[k] = out[t * ldo + j];
          got_g[k] = dg[t * ldo + j];
          ASSERT_EQ(out[t * ldo + j], silu1(float(g)) * float(u))
              << "forward uses the silu bits";  // |g| < 100 here
        }
      const std::string what = "T=" + std::to_string(T) + " F=" + std::to_string(F);
      expect_close(got_o, yo, 2e-6, ("out " + what).c_str());
      expect_close(got_g, gd, 4e-6, ("dgate " + what).c_str());
      expect_close(du.values(), ud, 2e-6, ("dup " + what).c_str());
    }
  }
}

// Central differences of L = sum dout * silu(gate) * up on the double reference.
TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  Context ctx;
  const int64_t T = 3, F = 21;
  auto g = test::randn(T * F, 5, 4.0f), u = test::randn(T * F, 6), d = test::randn(T * F, 7);
  auto loss = [&](const std::vector<float>& gv, const std::vector<float>& uv, size_t k, double dg,
                  double du) {
    double l = 0;
    for (size_t i = 0; i < gv.size(); ++i) {
      const double gi = gv[i] + (i == k ? dg : 0.0), ui = uv[i] + (i == k ? du : 0.0);
      l += double(d[i]) * gi * sig(gi) * ui;
    }
    return l;
  };
  const double h = 1e-5;
  std::vector<double> fg(sz(T * F)), fu(sz(T * F));
  for (size_t k = 0; k < fg.size(); ++k) {
    fg[k] = (loss(g, u, k, h, 0) - loss(g, u, k, -h, 0)) / (2 * h);
    fu[k] = (loss(g, u, k, 0, h) - loss(g, u, k, 0, -h)) / (2 * h);
  }
  Guarded dg(T * F), du(T * F);
  swiglu_backward(ctx, dg.tensor({T, F}), du.tensor({T, F}), Tensor(d.data(), DType::F32, {T, F}),
                  Tensor(g.data(), DType::F32, {T, F}), Tensor(u.data(), DType::F32, {T, F}));
  dg.check("dgate");
  du.check("dup");
  expect_close(dg.values(), fg, 1e-5, "dgate vs finite differences", 1e-7);
  expect_close(du.values(), fu, 1e-5, "dup vs finite differences", 1e-7);
}

TEST(SwiGlu, ExtremeGatesStayFinite) {
  Context ctx;
  // Beyond Highway exp's valid range (|x| > 104) the activation must still be right.
  std::vector<float> g = {-1e30f, -1e6f, -200.0f, -90.0f, -20.0f, 0.0f, 20.0f, 90.0f, 200.0f, 1e6f, 1e30f};
  const int64_t F = int64_t(g.size());
  std::vector<float> u(sz(F), 2.0f), d(sz(F), 1.0f), out(sz(F)), dg(sz(F)), du(sz(F));
  swiglu_forward(ctx, Tensor(out.data(), DType::F32, {1, F}), Tensor(g.data(), DType::F32, {1, F}),
                 Tensor(u.data(), DType::F32, {1, F}));
  swiglu_backward(ctx, Tensor(dg.data(), DType::F32, {1, F}), Tensor(du.data(), DType::F32, {1, F}),
                  Tensor(d.data(), DType::F32, {1, F}), Tensor(g.data(), DType::F32, {1, F}),
                  Tensor(u.data(), DType::F32, {1, F}));
  for (int64_t i = 0; i < F; ++i) {
    const double gi = g[sz(i)], want = 2.0 * gi * sig(gi), want_dg = 2.0 * sig(gi) * (1 + gi * (1 - sig(gi)));
    EXPECT_TRUE(std::isfinite(out[sz(i)]) && std::isfinite(dg[sz(i)]) && std::isfinite(du[sz(i)])) << gi;
    EXPECT_NEAR(out[sz(i)], want, 1e-6 * std::fabs(want) + 1e-30) << gi;
    EXPECT_NEAR(du[sz(i)], want / 2, 1e-6 * std::fabs(want) + 1e-30) << gi;
    EXPECT_NEAR(dg[sz(i)], want_dg, 1e-5 * (1 + std::fabs(want_dg))) << gi;
  }
}

TEST(SwiGlu, NanGatePropagates) {
  Context ctx;
  std::vector<float> g = {std::numeric_limits<float>::quiet_NaN(), 1.0f}, u = {1.0f, 1.0f}, out(2);
  swiglu_forward(ctx, Tensor(out.data(), DType::F32, {1, 2}), Tensor(g.data(), DType::F32, {1, 2}),
                 Tensor(u.data(), DType::F32, {1, 2}));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_FALSE(std::isnan(out[1]));
}

TEST(SwiGlu, OutputsMayAliasInputsElementForElement) {
  Context ctx;
  const int64_t T = 5, F = 300;
  auto g = test::randn(T * F, 8), u = test::randn(T * F, 9), d = test::randn(T * F, 10);
  std::vector<float> out(sz(T * F)), dg(sz(T * F)), du(sz(T * F));
  Tensor gt(g.data(), DType::F32, {T, F}), ut(u.data(), DType::F32, {T, F}), dt(d.data(), DType::F32, {T, F});
  swiglu_forward(ctx, Tensor(out.data(), DType::F32, {T, F}), gt, ut);
  swiglu_backward(ctx, Tensor(dg.data(), DType::F32, {T, F}), Tensor(du.data(), DType::F32, {T, F}), dt, gt,
                  ut);
  // In place: out over gate; dgate over gate and dup over up.
  std::vector<float> g2 = g, u2 = u;
  swiglu_forward(ctx, Tensor(g2.data(), DType::F32, {T, F}), Tensor(g2.data(), DType::F32, {T, F}), ut);
  expect_bits_equal(g2.data(), out.data(), T * F, "out in place of gate");
  g2 = g;
  swiglu_backward(ctx, Tensor(g2.data(), DType::F32, {T, F}), Tensor(u2.data(), DType::F32, {T, F}), dt,
                  Tensor(g2.data(), DType::F32, {T, F}), Tensor(u2.data(), DType::F32, {T, F}));
  expect_bits_equal(g2.data(), dg.data(), T * F, "dgate in place of gate");
  expect_bits_equal(u2.data(), du.data(), T * F, "dup in place of up");
}

TEST(SwiGlu, BatchAndThreadInvariance) {
  const int64_t N = 64, F = 1000;
  auto g = test::randn(N * F, 11, 2.0f), u = test::randn(N * F, 12), d = test::randn(N * F, 13);
  auto run = [&](ThreadPool* p, int64_t r0, int64_t b, std::vector<float>* o, std::vector<float>* dg,
                 std::vector<float>* du) {
    Context ctx{p};
    o->assign(sz(b * F), 0.0f);
    dg->assign(sz(b * F), 0.0f);
    du->assign(sz(b * F), 0.0f);
    Tensor gt = Tensor(g.data(), DType::F32, {N, F}).slice_rows(r0, r0 + b);
    Tensor ut = Tensor(u.data(), DType::F32, {N, F}).slice_rows(r0, r0 + b);
    Tensor dt = Tensor(d.data(), DType::F32, {N, F}).slice_rows(r0, r0 + b);
    swiglu_forward(ctx, Tensor(o->data(), DType::F32, {b, F}), gt, ut);
    swiglu_backward(ctx, Tensor(dg->data(), DType::F32, {b, F}), Tensor(du->data(), DType::F32, {b, F}), dt,
                    gt, ut);
  };
  std::vector<std::vector<float>> o1(sz(N)), g1(sz(N)), u1(sz(N));
  for (int64_t r = 0; r < N; ++r) run(nullptr, r, 1, &o1[sz(r)], &g1[sz(r)], &u1[sz(r)]);
  ThreadPool p1(1), p2(2);
  std::vector<float> o, dg, du;
  for (ThreadPool* p : {&p1, &p2}) {
    for (int64_t b = 1; b <= N; ++b) {
      const int64_t r0 = (b * 5) % (N - b + 1);
      run(p, r0, b, &o, &dg, &du);
      for (int64_t i = 0; i < b; ++i) {
        expect_bits_equal(o.data() + i * F, o1[sz(r0 + i)].data(), F, "out row");
        expect_bits_equal(dg.data() + i * F, g1[sz(r0 + i)].data(), F, "dgate row");
        expect_bits_equal(du.data() + i * F, u1[sz(r0 + i)].data(), F, "dup row");
      }
    }
  }
}

TEST(SwiGlu, ShapeMismatchNamesTheShapes) {
  Context ctx;
  std::vector<float> buf(1000);
  Tensor a(buf.data(), DType::F32, {4, 8}), bad(buf.data(), DType::F32, {4, 9});
  std::string msg = error_of([&] { swiglu_forward(ctx, a, a, bad); });
  EXPECT_NE(msg.find("up"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 8)"), std::string::npos) << msg;
  msg = error_of([&] { swiglu_backward(ctx, a, bad, a, a, a); });
  EXPECT_NE(msg.find("dup"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  Tensor overlap(buf.data(), DType::F32, {4, 8});
  overlap.stride[0] = 4;
  msg = error_of([&] { swiglu_forward(ctx, overlap, a, a); });
  EXPECT_NE(msg.find("stride"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lockstep::kernels
