// Tests for the clamped SwiGLU (DeepSeek-V4's swiglu_limit): a double
// reference, the masks at and around the limits, the bits of swiglu_forward /
// swiglu_backward on pre-clamped inputs, finite differences away from the
// clamp boundaries, aliasing, batch/thread invariance, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/kernels/cpu/swiglu.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;

// DeepSeek-V4's swiglu_limit.
constexpr float kLimit = 10.0f;

inline size_t sz(int64_t n) { return static_cast<size_t>(n); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

Tensor mat(std::vector<float>& v, int64_t T, int64_t F) { return Tensor(v.data(), DType::F32, {T, F}); }

Tensor strided(float* p, int64_t T, int64_t F, int64_t ld) {
  Tensor t(p, DType::F32, {T, F});
  t.stride[0] = ld;
  return t;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

struct Grads {
  std::vector<float> dgate, dup;
};

Grads run_backward(const Context& ctx, std::vector<float> d, std::vector<float> g, std::vector<float> u, int64_t T,
                   int64_t F, float limit) {
  Guarded dg(T * F, 7.0f), du(T * F, 7.0f);
  swiglu_clamped_backward(ctx, dg.tensor({T, F}), du.tensor({T, F}), mat(d, T, F), mat(g, T, F), mat(u, T, F), limit);
  dg.check("dgate");
  du.check("dup");
  return {dg.values(), du.values()};
}

std::vector<float> run_forward(const Context& ctx, std::vector<float> g, std::vector<float> u, int64_t T, int64_t F,
                               float limit) {
  Guarded out(T * F, 7.0f);
  swiglu_clamped_forward(ctx, out.tensor({T, F}), mat(g, T, F), mat(u, T, F), limit);
  out.check("out");
  return out.values();
}

// Gate and up spread well past the limit on both sides.
TEST(SwiGluClamped, ForwardAndBackwardMatchDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t T : {1, 5, 17}) {
    for (int64_t F : {1, 31, 256, 600}) {
      // gate and up as the two halves of a fused (T, 2F) projection; out padded.
      const int64_t ldg = 2 * F, ldo = F + 5;
      auto gu = test::randn(T * ldg, seed++, 9.0f), dout = test::randn(T * F, seed++);
      Tensor gate = strided(gu.data(), T, F, ldg), up = strided(gu.data() + F, T, F, ldg);
      Guarded out(T * ldo), dg(T * ldo), du(T * F);
      swiglu_clamped_forward(ctx, strided(out.data(), T, F, ldo), gate, up, kLimit);
      swiglu_clamped_backward(ctx, strided(dg.data(), T, F, ldo), du.tensor({T, F}), mat(dout, T, F), gate, up,
                              kLimit);
      out.check("out");
      dg.check("dgate");
      du.check("dup");
      std::vector<double> want_o(sz(T * F)), want_g(sz(T * F)), want_u(sz(T * F));
      std::vector<float> got_o(sz(T * F)), got_g(sz(T * F));
      int64_t gate_clamped = 0, up_clamped = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < F; ++j) {
          const double g = gu[sz(t * ldg + j)], u = gu[sz(t * ldg + F + j)], d = dout[sz(t * F + j)];
          const double gc = std::min(g, double(kLimit)), uc = std::min(std::max(u, -double(kLimit)), double(kLimit));
          const size_t k = sz(t * F + j);
          want_o[k] = gc * sig(gc) * uc;
          want_g[k] = g > kLimit ? 0.0 : d * uc * sig(gc) * (1 + gc * (1 - sig(gc)));
          want_u[k] = std::fabs(u) > kLimit ? 0.0 : d * gc * sig(gc);
          got_o[k] = out[t * ldo + j];
          got_g[k] = dg[t * ldo + j];
          gate_clamped += g > kLimit;
          up_clamped += std::fabs(u) > kLimit;
        }
      const std::string what = "T=" + std::to_string(T) + " F=" + std::to_string(F);
      expect_close(got_o, want_o, 2e-6, ("out " + what).c_str());
      expect_close(got_g, want_g, 4e-6, ("dgate " + what).c_str());
      expect_close(du.values(), want_u, 2e-6, ("dup " + what).c_str());
      if (T * F >= 100) {
        EXPECT_GT(gate_clamped, 0) << what << ": the data should reach the gate clamp";
        EXPECT_GT(up_clamped, 0) << what << ": the data should reach the up clamp";
      }
    }
  }
}

// Values at, just inside and just outside each limit; the masks are strict.
TEST(SwiGluClamped, MasksAtTheBoundaries) {
  Context ctx;
  const float L = kLimit, above = std::nextafter(L, 2 * L), below = std::nextafter(L, 0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> gates = {L, above, below, 2 * L, 1e30f, inf, -L, -above, -1e30f, 0.5f};
  const std::vector<float> ups = {L, -L, above, -above, below, -below, 3 * L, -inf, 0.5f, -0.5f};
  const int64_t F = int64_t(gates.size());
  std::vector<float> g, u, d;
  for (float gv : gates)
    for (float uv : ups) {
      g.push_back(gv);
      u.push_back(uv);
      d.push_back(1.5f);
    }
  const int64_t T = int64_t(gates.size() * ups.size()) / F;
  const auto out = run_forward(ctx, g, u, T, F, L);
  const Grads gr = run_backward(ctx, d, g, u, T, F, L);
  // The same elements with the clamps applied by hand, through the plain kernels.
  std::vector<float> gc(g.size()), uc(u.size());
  for (size_t i = 0; i < g.size(); ++i) {
    gc[i] = std::min(g[i], L);
    uc[i] = std::min(std::max(u[i], -L), L);
  }
  std::vector<float> plain_dg(g.size()), plain_du(g.size());
  swiglu_backward(ctx, mat(plain_dg, T, F), mat(plain_du, T, F), mat(d, T, F), mat(gc, T, F), mat(uc, T, F));
  for (size_t i = 0; i < g.size(); ++i) {
    SCOPED_TRACE("gate " + std::to_string(g[i]) + " up " + std::to_string(u[i]));
    ASSERT_TRUE(std::isfinite(out[i]));
    if (g[i] > L) {
      EXPECT_EQ(bits(gr.dgate[i]), 0u) << "masked dgate is +0";
    } else {
      EXPECT_EQ(bits(gr.dgate[i]), bits(plain_dg[i])) << "dgate passes where gate <= L";
    }
    if (std::fabs(u[i]) > L) {
      EXPECT_EQ(bits(gr.dup[i]), 0u) << "masked dup is +0";
    } else {
      EXPECT_EQ(bits(gr.dup[i]), bits(plain_du[i])) << "dup passes where |up| <= L";
    }
  }
  // Exactly at the limit the gradients are the unclamped ones, and nonzero here.
  const size_t at = 0;  // gate == L, up == L
  EXPECT_EQ(g[at], L);
  EXPECT_EQ(u[at], L);
  EXPECT_NE(gr.dgate[at], 0.0f);
  EXPECT_NE(gr.dup[at], 0.0f);
  // Past the limit the forward is flat: every gate >= L gives the bits of gate == L.
  for (size_t row = 0; row < gates.size(); ++row) {
    if (!(gates[row] >= L)) continue;
    expect_bits_equal(out.data() + row * F, out.data(), F, "out for gate >= L");
  }
}

// The clamped kernels are the plain ones on pre-clamped inputs, bit for bit
// (forward fully, backward where no mask fires); L = +inf is the plain kernel.
TEST(SwiGluClamped, BitsEqualThePlainKernelOnClampedInputs) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t T = 7, F = 513;
  for (float limit : {kLimit, 0.75f, 7.0f}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    auto g = test::randn(T * F, 21, 8.0f), u = test::randn(T * F, 22, 8.0f), d = test::randn(T * F, 23);
    std::vector<float> gc(g.size()), uc(u.size());
    for (size_t i = 0; i < g.size(); ++i) {
      gc[i] = std::min(g[i], limit);
      uc[i] = std::min(std::max(u[i], -limit), limit);
    }
    std::vector<float> plain(g.size()), plain_dg(g.size()), plain_du(g.size());
    swiglu_forward(ctx, mat(plain, T, F), mat(gc, T, F), mat(uc, T, F));
    swiglu_backward(ctx, mat(plain_dg, T, F), mat(plain_du, T, F), mat(d, T, F), mat(gc, T, F), mat(uc, T, F));
    const auto out = run_forward(ctx, g, u, T, F, limit);
    expect_bits_equal(out.data(), plain.data(), T * F, "forward");
    const Grads gr = run_backward(ctx, d, g, u, T, F, limit);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(bits(gr.dgate[i]), g[i] > limit ? 0u : bits(plain_dg[i])) << "dgate element " << i;
      ASSERT_EQ(bits(gr.dup[i]), std::fabs(u[i]) > limit ? 0u : bits(plain_du[i])) << "dup element " << i;
    }
  }
  auto g = test::randn(T * F, 24, 30.0f), u = test::randn(T * F, 25, 30.0f), d = test::randn(T * F, 26);
  std::vector<float> plain(g.size()), plain_dg(g.size()), plain_du(g.size());
  swiglu_forward(ctx, mat(plain, T, F), mat(g, T, F), mat(u, T, F));
  swiglu_backward(ctx, mat(plain_dg, T, F), mat(plain_du, T, F), mat(d, T, F), mat(g, T, F), mat(u, T, F));
  const float inf = std::numeric_limits<float>::infinity();
  expect_bits_equal(run_forward(ctx, g, u, T, F, inf).data(), plain.data(), T * F, "forward, L = inf");
  const Grads gr = run_backward(ctx, d, g, u, T, F, inf);
  expect_bits_equal(gr.dgate.data(), plain_dg.data(), T * F, "dgate, L = inf");
  expect_bits_equal(gr.dup.data(), plain_du.data(), T * F, "dup, L = inf");
}

// Central differences of L = sum dout * out on the float kernel (accumulated in
// double), for elements at least 4h from a clamp boundary; inside the masks the
// forward is flat, so the difference is exactly 0 there.
TEST(SwiGluClamped, BackwardMatchesFiniteDifferencesAwayFromTheBoundaries) {
  Context ctx;
  const int64_t T = 4, F = 24;
  const float h = 1e-2f;
  auto g = test::randn(T * F, 31, 9.0f), u = test::randn(T * F, 32, 9.0f), d = test::randn(T * F, 33);
  for (size_t i = 0; i < g.size(); ++i) {  // keep every element clear of the boundaries
    if (std::fabs(g[i] - kLimit) < 4 * h) g[i] += 8 * h;
    if (std::fabs(std::fabs(u[i]) - kLimit) < 4 * h) u[i] += 8 * h;
  }
  auto loss = [&](const std::vector<float>& gv, const std::vector<float>& uv) {
    const auto out = run_forward(ctx, gv, uv, T, F, kLimit);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += double(d[i]) * out[i];
    return l;
  };
  std::vector<double> fd_g(g.size()), fd_u(u.size());
  for (size_t i = 0; i < g.size(); ++i) {
    auto gp = g, gm = g, up = u, um = u;
    gp[i] += h;
    gm[i] -= h;
    up[i] += h;
    um[i] -= h;
    // The step is exact in float differences only up to rounding of g +- h.
    fd_g[i] = (loss(gp, u) - loss(gm, u)) / (double(gp[i]) - double(gm[i]));
    fd_u[i] = (loss(g, up) - loss(g, um)) / (double(up[i]) - double(um[i]));
  }
  const Grads gr = run_backward(ctx, d, g, u, T, F, kLimit);
  int64_t masked_g = 0, masked_u = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] > kLimit) {
      ++masked_g;
      EXPECT_EQ(fd_g[i], 0.0) << "forward is flat past the gate limit, element " << i;
    }
    if (std::fabs(u[i]) > kLimit) {
      ++masked_u;
      EXPECT_EQ(fd_u[i], 0.0) << "forward is flat past the up limit, element " << i;
    }
  }
  EXPECT_GT(masked_g, 0);
  EXPECT_GT(masked_u, 0);
  // Curvature of silu over +-h bounds the central-difference error (~h^2 |f'''|).
  expect_close(gr.dgate, fd_g, 2e-3, "dgate vs finite differences", 1e-4);
  expect_close(gr.dup, fd_u, 2e-3, "dup vs finite differences", 1e-4);
}

TEST(SwiGluClamped, OutputsMayAliasInputsElementForElement) {
  Context ctx;
  const int64_t T = 5, F = 300;
  auto g = test::randn(T * F, 41, 9.0f), u = test::randn(T * F, 42, 9.0f), d = test::randn(T * F, 43);
  const auto out = run_forward(ctx, g, u, T, F, kLimit);
  const Grads gr = run_backward(ctx, d, g, u, T, F, kLimit);
  std::vector<float> g2 = g, u2 = u, d2 = d;
  swiglu_clamped_forward(ctx, mat(g2, T, F), mat(g2, T, F), mat(u, T, F), kLimit);
  expect_bits_equal(g2.data(), out.data(), T * F, "out in place of gate");
  swiglu_clamped_forward(ctx, mat(u2, T, F), mat(g, T, F), mat(u2, T, F), kLimit);
  expect_bits_equal(u2.data(), out.data(), T * F, "out in place of up");
  g2 = g;
  u2 = u;
  swiglu_clamped_backward(ctx, mat(g2, T, F), mat(u2, T, F), mat(d, T, F), mat(g2, T, F), mat(u2, T, F), kLimit);
  expect_bits_equal(g2.data(), gr.dgate.data(), T * F, "dgate in place of gate");
  expect_bits_equal(u2.data(), gr.dup.data(), T * F, "dup in place of up");
  std::vector<float> du(g.size());
  swiglu_clamped_backward(ctx, mat(d2, T, F), mat(du, T, F), mat(d2, T, F), mat(g, T, F), mat(u, T, F), kLimit);
  expect_bits_equal(d2.data(), gr.dgate.data(), T * F, "dgate in place of dout");
  expect_bits_equal(du.data(), gr.dup.data(), T * F, "dup beside dgate in place of dout");
}

TEST(SwiGluClamped, BatchAndThreadInvariance) {
  const int64_t N = 24, F = 700;
  auto g = test::randn(N * F, 51, 9.0f), u = test::randn(N * F, 52, 9.0f), d = test::randn(N * F, 53);
  struct Out {
    std::vector<float> o, dg, du;
  };
  auto run = [&](ThreadPool* p, int64_t r0, int64_t b) {
    Context ctx{p};
    Out r{std::vector<float>(sz(b * F)), std::vector<float>(sz(b * F)), std::vector<float>(sz(b * F))};
    Tensor gt = mat(g, N, F).slice_rows(r0, r0 + b), ut = mat(u, N, F).slice_rows(r0, r0 + b);
    Tensor dt = mat(d, N, F).slice_rows(r0, r0 + b);
    swiglu_clamped_forward(ctx, mat(r.o, b, F), gt, ut, kLimit);
    swiglu_clamped_backward(ctx, mat(r.dg, b, F), mat(r.du, b, F), dt, gt, ut, kLimit);
    return r;
  };
  std::vector<Out> alone;
  for (int64_t r = 0; r < N; ++r) alone.push_back(run(nullptr, r, 1));
  ThreadPool p1(1), p2(2);
  for (ThreadPool* p : {&p1, &p2})
    for (int64_t b : {int64_t(1), int64_t(3), int64_t(10), N}) {
      const int64_t r0 = (b * 7) % (N - b + 1);
      const Out got = run(p, r0, b);
      for (int64_t i = 0; i < b; ++i) {
        const Out& want = alone[sz(r0 + i)];
        expect_bits_equal(got.o.data() + i * F, want.o.data(), F, "out row");
        expect_bits_equal(got.dg.data() + i * F, want.dg.data(), F, "dgate row");
        expect_bits_equal(got.du.data() + i * F, want.du.data(), F, "dup row");
      }
    }
}

TEST(SwiGluClamped, NanPropagatesAndFarGatesStayFinite) {
  Context ctx;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> g = {nan, 1.0f, -1e30f, -300.0f, 1e30f, 2.0f};
  const std::vector<float> u = {1.0f, nan, 2.0f, 2.0f, 1e30f, -1e30f};
  const int64_t F = int64_t(g.size());
  const auto out = run_forward(ctx, g, u, 1, F, kLimit);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  for (int64_t i = 2; i < F; ++i) EXPECT_TRUE(std::isfinite(out[sz(i)])) << "element " << i;
  EXPECT_EQ(out[2], 0.0f);  // silu of a far negative gate is -0
  EXPECT_EQ(out[4], float(kLimit * sig(kLimit)) * kLimit);
  const Grads gr = run_backward(ctx, std::vector<float>(sz(F), 1.0f), g, u, 1, F, kLimit);
  for (int64_t i = 2; i < F; ++i) {
    EXPECT_TRUE(std::isfinite(gr.dgate[sz(i)]) && std::isfinite(gr.dup[sz(i)])) << "element " << i;
  }
  EXPECT_EQ(gr.dgate[4], 0.0f);
  EXPECT_EQ(gr.dup[4], 0.0f);
  EXPECT_EQ(gr.dup[5], 0.0f);
}

TEST(SwiGluClamped, ErrorsNameTheArgument) {
  Context ctx;
  std::vector<float> buf(1000);
  Tensor a(buf.data(), DType::F32, {4, 8}), bad(buf.data(), DType::F32, {4, 9});
  for (float limit : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    std::string msg = error_of([&] { swiglu_clamped_forward(ctx, a, a, a, limit); });
    EXPECT_NE(msg.find("swiglu_clamped_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
    msg = error_of([&] { swiglu_clamped_backward(ctx, a, a, a, a, a, limit); });
    EXPECT_NE(msg.find("swiglu_clamped_backward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
  }
  std::string msg = error_of([&] { swiglu_clamped_forward(ctx, a, a, bad, kLimit); });
  EXPECT_NE(msg.find("swiglu_clamped_forward: up"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(4, 9)"), std::string::npos) << msg;
  msg = error_of([&] { swiglu_clamped_forward(ctx, bad, a, a, kLimit); });
  EXPECT_NE(msg.find("out"), std::string::npos) << msg;
  msg = error_of([&] { swiglu_clamped_backward(ctx, a, bad, a, a, a, kLimit); });
  EXPECT_NE(msg.find("swiglu_clamped_backward: dup"), std::string::npos) << msg;
  msg = error_of([&] { swiglu_clamped_backward(ctx, a, a, bad, a, a, kLimit); });
  EXPECT_NE(msg.find("dout"), std::string::npos) << msg;
  std::vector<int32_t> ints(64);
  Tensor i32(ints.data(), DType::I32, {4, 8});
  msg = error_of([&] { swiglu_clamped_forward(ctx, a, i32, a, kLimit); });
  EXPECT_NE(msg.find("gate"), std::string::npos) << msg;
}

}  // namespace
}  // namespace lockstep::kernels
