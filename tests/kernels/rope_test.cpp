// Tests for RoPE: a double reference of the rotate-half rotation, the
// pure cos/sin function (table and on-the-fly agree), large positions,
// backward as the exact transpose/inverse, batch invariance, shapes.
#include "lockstep/kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
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

std::vector<int32_t> random_positions(int64_t T, int32_t max_pos, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, max_pos);
  std::vector<int32_t> p(sz(T));
  for (auto& v : p) v = d(g);
  return p;
}

// Double reference with HF's formula in double: inv_freq = theta^(-2i/Dh).
// sign = +1 rotates by +angle (forward), -1 by -angle (backward).
std::vector<double> ref_rope(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t T,
                             int64_t H, int64_t Dh, double theta, double sign) {
  std::vector<double> y(x.begin(), x.end());
  const int64_t half = Dh / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = sign * pos[sz(t)] / std::pow(theta, 2.0 * double(i) / double(Dh));
        const size_t lo = sz((t * H + h) * Dh + i), hi = lo + sz(half);
        const double a = x[lo], b = x[hi];
        y[lo] = a * std::cos(ang) - b * std::sin(ang);
        y[hi] = b * std::cos(ang) + a * std::sin(ang);
      }
  return y;
}

TEST(Rope, ForwardAndBackwardMatchDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t Dh : {2, 8, 64, 128}) {
    for (int64_t H : {1, 3}) {
      for (int64_t T : {1, 5, 33}) {
        for (double theta : {10000.0, 1000000.0}) {
          auto x = test::randn(T * H * Dh, seed++);
          auto pos = random_positions(T, 4096, seed++);
          Tensor pt(pos.data(), DType::I32, {T});
          const std::string what =
              "Dh=" + std::to_string(Dh) + " H=" + std::to_string(H) + " T=" + std::to_string(T);
          for (double sign : {1.0, -1.0}) {
            Guarded g(T * H * Dh);
            for (int64_t i = 0; i < T * H * Dh; ++i) g[i] = x[sz(i)];
            if (sign > 0) {
              rope_forward(ctx, g.tensor({T, H, Dh}), pt, theta);
            } else {
              rope_backward(ctx, g.tensor({T, H, Dh}), pt, theta);
            }
            g.check("x");
            // f32 cos/sin of a double angle: about 1 ulp of each factor.
            expect_close(g.values(), ref_rope(x, pos, T, H, Dh, theta, sign), 4e-7 * 4, what.c_str());
          }
        }
      }
    }
  }
}

TEST(Rope, CosSinAreThePureFunctionEverywhere) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t Dh = 128, half = Dh / 2, P = 40000;  // beyond 32768
  const double theta = 1000000.0;
  RopeTable tab = make_rope_table(ctx, Dh, theta, P);
  ASSERT_EQ(tab.cos.size(), sz(P * half));
  for (int64_t p : {0, 1, 2, 17, 4095, 32767, 32768, 39999}) {
    for (int64_t i = 0; i < half; ++i) {
      float c, s;
      rope_cos_sin(p, i, Dh, theta, &c, &s);
      ASSERT_EQ(c, tab.cos[sz(p * half + i)]) << p << " " << i;
      ASSERT_EQ(s, tab.sin[sz(p * half + i)]) << p << " " << i;
      // Pinned definition: angle in double, rounded once.
      const double ang = double(p) * std::pow(theta, -double(2 * i) / double(Dh));
      ASSERT_EQ(c, float(std::cos(ang)));
      ASSERT_EQ(s, float(std::sin(ang)));
    }
  }
  // Position 0 is the identity rotation.
  float c, s;
  rope_cos_sin(0, 5, Dh, theta, &c, &s);
  EXPECT_EQ(c, 1.0f);
  EXPECT_EQ(s, 0.0f);
  // Table and on-the-fly kernels give the same bits, forward and backward, up to 32768.
  const int64_t T = 64, H = 2;
  auto x = test::randn(T * H * Dh, 3);
  auto pos = random_positions(T, 32768, 4);
  pos[0] = 32768;
  pos[1] = 0;
  Tensor pt(pos.data(), DType::I32, {T});
  std::vector<float> a = x, b = x;
  rope_forward(ctx, Tensor(a.data(), DType::F32, {T, H, Dh}), pt, theta);
  rope_forward(ctx, Tensor(b.data(), DType::F32, {T, H, Dh}), pt, tab);
  expect_bits_equal(a.data(), b.data(), T * H * Dh, "forward table vs on the fly");
  rope_backward(ctx, Tensor(a.data(), DType::F32, {T, H, Dh}), pt, theta);
  rope_backward(ctx, Tensor(b.data(), DType::F32, {T, H, Dh}), pt, tab);
  expect_bits_equal(a.data(), b.data(), T * H * Dh, "backward table vs on the fly");
  // Large positions are still accurate against the double reference.
  std::vector<float> c2 = x;
  rope_forward(ctx, Tensor(c2.data(), DType::F32, {T, H, Dh}), pt, theta);
  expect_close(c2, ref_rope(x, pos, T, H, Dh, theta, 1.0), 2e-6, "positions up to 32768");
  // Position 32768 at token 0 rotates pair 0 by 32768 rad: check one element directly.
  const double ang = 32768.0;
  EXPECT_NEAR(c2[0], x[0] * std::cos(ang) - x[sz(half)] * std::sin(ang), 1e-5);
}

// backward is the transpose of forward (so, a rotation, also its inverse):
// <R x, y> == <x, R^T y> and R^T R x == x, to rounding.
TEST(Rope, BackwardIsTheTransposedRotation) {
  Context ctx;
  const int64_t T = 9, H = 4, Dh = 64, n = T * H * Dh;
  auto x = test::randn(n, 5), y = test::randn(n, 6);
  auto pos = random_positions(T, 32768, 7);
  Tensor pt(pos.data(), DType::I32, {T});
  std::vector<float> rx = x, rty = y;
  rope_forward(ctx, Tensor(rx.data(), DType::F32, {T, H, Dh}), pt, 10000.0);
  rope_backward(ctx, Tensor(rty.data(), DType::F32, {T, H, Dh}), pt, 10000.0);
  double lhs = 0, rhs = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    lhs += double(rx[sz(i)]) * y[sz(i)];
    rhs += double(x[sz(i)]) * rty[sz(i)];
    scale += std::fabs(double(x[sz(i)]) * y[sz(i)]);
  }
  EXPECT_NEAR(lhs, rhs, 1e-6 * scale);
  std::vector<float> back = rx;
  rope_backward(ctx, Tensor(back.data(), DType::F32, {T, H, Dh}), pt, 10000.0);
  expect_close(back, std::vector<double>(x.begin(), x.end()), 1e-6, "inverse");
  // Norm of each pair is preserved.
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < Dh / 2; ++i) {
      const size_t lo = sz(r * Dh + i), hi = lo + sz(Dh / 2);
      const double n0 = double(x[lo]) * x[lo] + double(x[hi]) * x[hi];
      const double n1 = double(rx[lo]) * rx[lo] + double(rx[hi]) * rx[hi];
      ASSERT_NEAR(n0, n1, 1e-6 * (n0 + 1e-30));
    }
}

// The gradient of L = <g, rope(x)> with respect to x is rope_backward(g);
// checked by central differences of the double reference.
TEST(Rope, BackwardMatchesFiniteDifferences) {
  Context ctx;
  const int64_t T = 3, H = 2, Dh = 8, n = T * H * Dh;
  auto x = test::randn(n, 8), g = test::randn(n, 9);
  auto pos = random_positions(T, 32768, 10);
  std::vector<double> fd(sz(n));
  const float h = 1e-2f;
  for (int64_t k = 0; k < n; ++k) {
    auto a = x, b = x;
    a[sz(k)] += h;
    b[sz(k)] -= h;
    const auto ya = ref_rope(a, pos, T, H, Dh, 10000.0, 1.0), yb = ref_rope(b, pos, T, H, Dh, 10000.0, 1.0);
    double la = 0, lb = 0;
    for (int64_t i = 0; i < n; ++i) {
      la += g[sz(i)] * ya[sz(i)];
      lb += g[sz(i)] * yb[sz(i)];
    }
    fd[sz(k)] = (la - lb) / (double(a[sz(k)]) - double(b[sz(k)]));
  }
  Guarded dx(n);
  for (int64_t i = 0; i < n; ++i) dx[i] = g[sz(i)];
  rope_backward(ctx, dx.tensor({T, H, Dh}), Tensor(pos.data(), DType::I32, {T}), 10000.0);
  dx.check("dx");
  expect_close(dx.values(), fd, 1e-5, "dx vs finite differences", 1e-6);
}

TEST(Rope, StridedHeadsInAFusedBuffer) {
  Context ctx;
  // q (T, H, Dh) inside a fused (T, H + 2*Hkv, Dh) qkv buffer.
  const int64_t T = 6, H = 4, Hkv = 2, Dh = 16, W = (H + 2 * Hkv) * Dh;
  auto qkv = test::randn(T * W, 11);
  auto pos = random_positions(T, 1000, 12);
  Tensor pt(pos.data(), DType::I32, {T});
  std::vector<float> fused = qkv;
  Tensor q(fused.data(), DType::F32, {T, H, Dh});
  q.stride[0] = W;
  rope_forward(ctx, q, pt, 10000.0);
  std::vector<float> dense(sz(T * H * Dh));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H * Dh; ++j) dense[sz(t * H * Dh + j)] = qkv[sz(t * W + j)];
  rope_forward(ctx, Tensor(dense.data(), DType::F32, {T, H, Dh}), pt, 10000.0);
  for (int64_t t = 0; t < T; ++t) {
    expect_bits_equal(fused.data() + t * W, dense.data() + t * H * Dh, H * Dh, "q part");
    expect_bits_equal(fused.data() + t * W + H * Dh, qkv.data() + t * W + H * Dh, 2 * Hkv * Dh,
                      "k, v untouched");
  }
}

TEST(Rope, BatchAndThreadInvariance) {
  const int64_t N = 64, H = 8, Dh = 128, n1 = H * Dh;
  auto x = test::randn(N * n1, 13);
  auto pos = random_positions(N, 32768, 14);
  std::vector<std::vector<float>> alone(sz(N));
  Context c0;
  for (int64_t r = 0; r < N; ++r) {
    alone[sz(r)].assign(x.begin() + r * n1, x.begin() + (r + 1) * n1);
    rope_forward(c0, Tensor(alone[sz(r)].data(), DType::F32, {1, H, Dh}),
                 Tensor(pos.data() + r, DType::I32, {1}), 1e6);
  }
  ThreadPool p1(1), p2(2);
  for (ThreadPool* p : {&p1, &p2}) {
    Context ctx{p};
    for (int64_t b = 1; b <= N; ++b) {
      const int64_t r0 = (b * 7) % (N - b + 1);
      std::vector<float> y(x.begin() + r0 * n1, x.begin() + (r0 + b) * n1);
      rope_forward(ctx, Tensor(y.data(), DType::F32, {b, H, Dh}), Tensor(pos.data() + r0, DType::I32, {b}),
                   1e6);
      for (int64_t i = 0; i < b; ++i)
        expect_bits_equal(y.data() + i * n1, alone[sz(r0 + i)].data(), n1, "row");
    }
  }
}

TEST(Rope, BadInputsAreErrors) {
  Context ctx;
  std::vector<float> buf(1000);
  std::vector<int32_t> pos = {0, 1, 2, 3};
  Tensor x(buf.data(), DType::F32, {4, 2, 8});
  std::string msg = error_of([&] { rope_forward(ctx, x, Tensor(pos.data(), DType::I32, {3}), 1e4); });
  EXPECT_NE(msg.find("(3,)"), std::string::npos) << msg;
  msg = error_of([&] {
    rope_forward(ctx, Tensor(buf.data(), DType::F32, {4, 2, 7}), Tensor(pos.data(), DType::I32, {4}), 1e4);
  });
  EXPECT_NE(msg.find("(4, 2, 7)"), std::string::npos) << msg;
  msg = error_of([&] {
    rope_forward(ctx, Tensor(buf.data(), DType::F32, {4, 16}), Tensor(pos.data(), DType::I32, {4}), 1e4);
  });
  EXPECT_NE(msg.find("(4, 16)"), std::string::npos) << msg;
  pos[2] = -5;
  msg = error_of([&] { rope_backward(ctx, x, Tensor(pos.data(), DType::I32, {4}), 1e4); });
  EXPECT_NE(msg.find("-5"), std::string::npos) << msg;
  pos[2] = 100;
  RopeTable tab = make_rope_table(ctx, 8, 1e4, 50);
  msg = error_of([&] { rope_forward(ctx, x, Tensor(pos.data(), DType::I32, {4}), tab); });
  EXPECT_NE(msg.find("100"), std::string::npos) << msg;
  RopeTable tab16 = make_rope_table(ctx, 16, 1e4, 200);
  msg = error_of([&] { rope_forward(ctx, x, Tensor(pos.data(), DType::I32, {4}), tab16); });
  EXPECT_NE(msg.find("(4, 2, 8)"), std::string::npos) << msg;
  EXPECT_THROW(rope_forward(ctx, x, Tensor(pos.data(), DType::I32, {4}), 0.0), Error);
}

}  // namespace
}  // namespace lockstep::kernels
