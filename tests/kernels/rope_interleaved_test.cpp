// Tests for interleaved-pair RoPE with YaRN (DeepSeek-V3/V4): the YaRN ramp at
// DeepSeek-V4's numbers, the table against a double reference, the rotation
// against a double reference, inverse and adjoint, the tail view of a wider
// head, invariance to threads and batch, and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/kernels/cpu/rope.h"

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

// DeepSeek-V4's compressed layers: theta 160000 with YaRN factor 16 over 65536.
constexpr double kV4Theta = 160000.0;
constexpr int64_t kV4RopeDim = 64;
YarnConfig v4_yarn() {
  YarnConfig y;
  y.factor = 16.0;
  y.original_max_positions = 65536;
  y.beta_fast = 32.0;
  y.beta_slow = 1.0;
  return y;
}

// YaRN as DeepSeek's precompute_freqs_cis writes it, in double.
double ref_inv_freq(int64_t j, int64_t dim, double theta, const YarnConfig& y) {
  const double base = 1.0 / std::pow(theta, double(2 * j) / double(dim));
  if (y.factor == 1.0 || y.original_max_positions == 0) return base;
  auto corr = [&](double beta) {
    return dim * std::log(double(y.original_max_positions) / (beta * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  const double lo = std::max(0.0, std::floor(corr(y.beta_fast)));
  double hi = std::min(double(dim - 1), std::ceil(corr(y.beta_slow)));
  if (lo == hi) hi += 0.001;
  const double ramp = std::min(1.0, std::max(0.0, (double(j) - lo) / (hi - lo)));
  const double smooth = 1.0 - ramp;  // 1 keeps the frequency, 0 interpolates it fully
  return base / y.factor * (1 - smooth) + base * smooth;
}

// The double rotation of pairs (2j, 2j + 1); sign -1 rotates by -angle.
std::vector<double> ref_rotate(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t T,
                               int64_t H, int64_t Dr, double theta, const YarnConfig& y, double sign) {
  std::vector<double> out(x.begin(), x.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < Dr / 2; ++j) {
        const double ang = sign * double(pos[sz(t)]) * ref_inv_freq(j, Dr, theta, y);
        const size_t i = sz((t * H + h) * Dr + 2 * j);
        const double a = x[i], b = x[i + 1];
        out[i] = a * std::cos(ang) - b * std::sin(ang);
        out[i + 1] = b * std::cos(ang) + a * std::sin(ang);
      }
  return out;
}

TEST(RopeInterleaved, YarnRampAtDeepSeekV4Numbers) {
  // The correction range itself: lo = 15, hi = 25.
  auto corr = [](double beta) {
    return 64.0 * std::log(65536.0 / (beta * 2 * std::numbers::pi)) / (2 * std::log(kV4Theta));
  };
  EXPECT_EQ(std::floor(corr(32.0)), 15.0);
  EXPECT_EQ(std::ceil(corr(1.0)), 25.0);
  const YarnConfig y = v4_yarn();
  for (int64_t j = 0; j < kV4RopeDim / 2; ++j) {
    const double omega = std::pow(kV4Theta, -double(2 * j) / double(kV4RopeDim));
    const double got = rope_inv_freq(j, kV4RopeDim, kV4Theta, y);
    if (j <= 15) {
      EXPECT_EQ(got, omega) << "pair " << j << " must be unscaled";
    } else if (j >= 25) {
      const double want = omega / 16.0;
      EXPECT_LE(std::fabs(got - want), std::nextafter(want, 1.0) - want)
          << "pair " << j << " must be omega / 16";
    } else {
      const double gamma = double(j - 15) / 10.0;
      EXPECT_NEAR(got, omega * (1 - gamma * (1 - 1.0 / 16)), 1e-15 * omega) << "pair " << j;
      EXPECT_LT(got, omega);
      EXPECT_GT(got, omega / 16.0);
    }
    EXPECT_NEAR(got, ref_inv_freq(j, kV4RopeDim, kV4Theta, y), 1e-15 * omega) << "pair " << j;
    // YaRN off: the plain frequency, exactly.
    EXPECT_EQ(rope_inv_freq(j, kV4RopeDim, 10000.0, YarnConfig{}),
              std::pow(10000.0, -double(2 * j) / double(kV4RopeDim)));
  }
}

TEST(RopeInterleaved, YarnRampEndingPastTheLastPair) {
  // A short rope_dim where ceil(d(beta_slow)) exceeds the last pair: the ramp
  // is clamped at rope_dim - 1, so the last pair is only partly interpolated.
  YarnConfig y;
  y.factor = 8.0;
  y.original_max_positions = 8192;
  const int64_t dim = 16;
  const double theta = 1000.0;  // lo = 4, ceil(d(beta_slow)) = 9 > the last pair 7
  for (int64_t j = 0; j < dim / 2; ++j) {
    const double want = ref_inv_freq(j, dim, theta, y);
    EXPECT_NEAR(rope_inv_freq(j, dim, theta, y), want, 1e-15 * want) << "pair " << j;
  }
  const double last = std::pow(theta, -double(dim - 2) / double(dim));
  EXPECT_GT(rope_inv_freq(dim / 2 - 1, dim, theta, y), last / 8.0);
}

TEST(RopeInterleaved, TableIsThePureFunctionAndMatchesDouble) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t P = 70000, half = kV4RopeDim / 2;  // beyond the original 65536
  const RopeTable tab = make_rope_table(ctx, kV4RopeDim, kV4Theta, P, v4_yarn());
  ASSERT_EQ(tab.head_dim, kV4RopeDim);
  ASSERT_EQ(tab.cos.size(), sz(P * half));
  for (int64_t p : {0, 1, 2, 100, 4095, 65535, 65536, 69999}) {
    for (int64_t j = 0; j < half; ++j) {
      const double ang = double(p) * rope_inv_freq(j, kV4RopeDim, kV4Theta, v4_yarn());
      ASSERT_EQ(tab.cos[sz(p * half + j)], float(std::cos(ang))) << p << " " << j;
      ASSERT_EQ(tab.sin[sz(p * half + j)], float(std::sin(ang))) << p << " " << j;
      // Against the independent double formula: the angles differ by rounding of the frequency only.
      const double ra = double(p) * ref_inv_freq(j, kV4RopeDim, kV4Theta, v4_yarn());
      ASSERT_NEAR(tab.cos[sz(p * half + j)], std::cos(ra), 1e-7) << p << " " << j;
      ASSERT_NEAR(tab.sin[sz(p * half + j)], std::sin(ra), 1e-7) << p << " " << j;
    }
  }
  // YaRN off: the same bits as the rotate-half table.
  const RopeTable plain = make_rope_table(ctx, kV4RopeDim, 10000.0, 5000, YarnConfig{});
  const RopeTable old = make_rope_table(ctx, kV4RopeDim, 10000.0, 5000);
  expect_bits_equal(plain.cos.data(), old.cos.data(), 5000 * half, "cos without yarn");
  expect_bits_equal(plain.sin.data(), old.sin.data(), 5000 * half, "sin without yarn");
}

TEST(RopeInterleaved, ForwardAndInverseMatchDoubleReference) {
  ThreadPool pool(2);
  Context ctx{&pool};
  uint32_t seed = 1;
  for (int64_t Dr : {2, 8, 64}) {
    for (const YarnConfig& y : {YarnConfig{}, v4_yarn()}) {
      const double theta = y.enabled() ? kV4Theta : 10000.0;
      const RopeTable tab = make_rope_table(ctx, Dr, theta, 8193, y);
      for (int64_t H : {1, 3}) {
        const int64_t T = 17;
        auto x = test::randn(T * H * Dr, seed++);
        auto pos = random_positions(T, 8192, seed++);
        Tensor pt(pos.data(), DType::I32, {T});
        const std::string what =
            "Dr=" + std::to_string(Dr) + " H=" + std::to_string(H) + (y.enabled() ? " yarn" : " plain");
        Guarded g(T * H * Dr);
        for (int64_t i = 0; i < T * H * Dr; ++i) g[i] = x[sz(i)];
        rope_interleaved_forward(ctx, g.tensor({T, H, Dr}), pt, tab);
        g.check("x");
        // f32 cos/sin of a double angle (plus the angle's rounding at pos 8192).
        expect_close(g.values(), ref_rotate(x, pos, T, H, Dr, theta, y, 1.0), 2e-6,
                     (what + " forward").c_str());
        for (int64_t i = 0; i < T * H * Dr; ++i) g[i] = x[sz(i)];
        rope_interleaved_inverse(ctx, g.tensor({T, H, Dr}), pt, tab);
        g.check("x");
        expect_close(g.values(), ref_rotate(x, pos, T, H, Dr, theta, y, -1.0), 2e-6,
                     (what + " inverse").c_str());
        // Forward then inverse restores x.
        rope_interleaved_forward(ctx, g.tensor({T, H, Dr}), pt, tab);
        expect_close(g.values(), std::vector<double>(x.begin(), x.end()), 1e-6,
                     (what + " round trip").c_str());
      }
    }
  }
}

TEST(RopeInterleaved, PositionZeroIsTheIdentity) {
  Context ctx;
  const RopeTable tab = make_rope_table(ctx, kV4RopeDim, kV4Theta, 4, v4_yarn());
  const int64_t T = 3, H = 2;
  auto x = test::randn(T * H * kV4RopeDim, 5);
  std::vector<int32_t> pos(sz(T), 0);
  Tensor pt(pos.data(), DType::I32, {T});
  std::vector<float> y = x;
  rope_interleaved_forward(ctx, Tensor(y.data(), DType::F32, {T, H, kV4RopeDim}), pt, tab);
  expect_bits_equal(y.data(), x.data(), T * H * kV4RopeDim, "forward at position 0");
  rope_interleaved_inverse(ctx, Tensor(y.data(), DType::F32, {T, H, kV4RopeDim}), pt, tab);
  expect_bits_equal(y.data(), x.data(), T * H * kV4RopeDim, "inverse at position 0");
}

// The inverse is the adjoint of the forward (the backward): <R x, y> == <x, R^T y>.
TEST(RopeInterleaved, InverseIsTheAdjoint) {
  Context ctx;
  const int64_t T = 9, H = 4, Dr = 64;
  const RopeTable tab = make_rope_table(ctx, Dr, kV4Theta, 70000, v4_yarn());
  auto pos = random_positions(T, 69999, 7);
  Tensor pt(pos.data(), DType::I32, {T});
  auto x = test::randn(T * H * Dr, 8), y = test::randn(T * H * Dr, 9);
  std::vector<float> rx = x, rty = y;
  rope_interleaved_forward(ctx, Tensor(rx.data(), DType::F32, {T, H, Dr}), pt, tab);
  rope_interleaved_inverse(ctx, Tensor(rty.data(), DType::F32, {T, H, Dr}), pt, tab);
  double lhs = 0, rhs = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += double(rx[i]) * y[i];
    rhs += double(x[i]) * rty[i];
    norm += std::fabs(double(x[i]) * y[i]);
  }
  EXPECT_NEAR(lhs, rhs, 1e-6 * norm);
}

// DeepSeek rotates only the last Dr of each head's Dh dims: a strided view of
// the tail rotates it as a contiguous tensor would and leaves the rest alone.
TEST(RopeInterleaved, TailViewOfWiderHeads) {
  ThreadPool pool(2);
  Context ctx{&pool};
  const int64_t T = 11, H = 3, Dh = 24, Dr = 8;
  const RopeTable tab = make_rope_table(ctx, Dr, kV4Theta, 1000, v4_yarn());
  auto pos = random_positions(T, 999, 11);
  Tensor pt(pos.data(), DType::I32, {T});
  const auto x = test::randn(T * H * Dh, 12);
  std::vector<float> tail(sz(T * H * Dr));  // (T, H, Dr) contiguous copy
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t d = 0; d < Dr; ++d) tail[sz(r * Dr + d)] = x[sz(r * Dh + Dh - Dr + d)];
  rope_interleaved_forward(ctx, Tensor(tail.data(), DType::F32, {T, H, Dr}), pt, tab);
  for (int inverse = 0; inverse < 2; ++inverse) {
    Guarded g(T * H * Dh);
    for (int64_t i = 0; i < T * H * Dh; ++i) g[i] = x[sz(i)];
    Tensor view(g.data() + (Dh - Dr), DType::F32, {T, H, Dr});
    view.stride[0] = H * Dh;
    view.stride[1] = Dh;
    if (inverse) {
      rope_interleaved_forward(ctx, view, pt, tab);
      rope_interleaved_inverse(ctx, view, pt, tab);
    } else {
      rope_interleaved_forward(ctx, view, pt, tab);
    }
    g.check("x");
    for (int64_t r = 0; r < T * H; ++r) {
      expect_bits_equal(g.data() + r * Dh, x.data() + r * Dh, Dh - Dr, "untouched head dims");
      if (!inverse) expect_bits_equal(g.data() + r * Dh + Dh - Dr, tail.data() + r * Dr, Dr, "rotated tail");
    }
    if (inverse) {
      std::vector<double> want(x.begin(), x.end());
      expect_close(g.values(), want, 1e-6, "tail round trip");
    }
  }
}

TEST(RopeInterleaved, BitsIndependentOfThreadsAndBatch) {
  const int64_t T = 200, H = 4, Dr = 64;
  Context c0;
  const RopeTable tab = make_rope_table(c0, Dr, kV4Theta, 20000, v4_yarn());
  auto pos = random_positions(T, 19999, 21);
  Tensor pt(pos.data(), DType::I32, {T});
  const auto x = test::randn(T * H * Dr, 22);
  std::vector<float> base = x;
  rope_interleaved_forward(c0, Tensor(base.data(), DType::F32, {T, H, Dr}), pt, tab);
  ThreadPool p1(1), p2(2);
  for (ThreadPool* p : {&p1, &p2}) {
    Context ctx{p};
    std::vector<float> y = x;
    rope_interleaved_forward(ctx, Tensor(y.data(), DType::F32, {T, H, Dr}), pt, tab);
    expect_bits_equal(y.data(), base.data(), T * H * Dr, "threads");
    const RopeTable t2 = make_rope_table(ctx, Dr, kV4Theta, 20000, v4_yarn());
    expect_bits_equal(t2.cos.data(), tab.cos.data(), 20000 * Dr / 2, "table cos vs threads");
    expect_bits_equal(t2.sin.data(), tab.sin.data(), 20000 * Dr / 2, "table sin vs threads");
  }
  for (int64_t t : {int64_t{0}, int64_t{77}, T - 1}) {
    std::vector<float> one(x.begin() + t * H * Dr, x.begin() + (t + 1) * H * Dr);
    int32_t p = pos[sz(t)];
    rope_interleaved_forward(c0, Tensor(one.data(), DType::F32, {1, H, Dr}), Tensor(&p, DType::I32, {1}),
                             tab);
    expect_bits_equal(one.data(), base.data() + t * H * Dr, H * Dr, "token alone");
  }
}

TEST(RopeInterleaved, BadArgumentsThrow) {
  Context ctx;
  const RopeTable tab = make_rope_table(ctx, 8, kV4Theta, 16, v4_yarn());
  std::vector<float> x(2 * 2 * 8);
  std::vector<int32_t> pos = {0, 3};
  Tensor xt(x.data(), DType::F32, {2, 2, 8}), pt(pos.data(), DType::I32, {2});
  EXPECT_EQ(error_of([&] { rope_interleaved_forward(ctx, xt, pt, tab); }), "");
  // Table built for another width.
  const std::string w = error_of([&] {
    rope_interleaved_inverse(ctx, Tensor(x.data(), DType::F32, {2, 4, 4}), pt, tab);
  });
  EXPECT_NE(w.find("rope_interleaved_inverse"), std::string::npos) << w;
  EXPECT_NE(w.find("table"), std::string::npos) << w;
  // Position beyond the table, negative position, positions of the wrong length.
  std::vector<int32_t> far = {0, 16}, neg = {0, -1};
  EXPECT_NE(error_of([&] {
              rope_interleaved_forward(ctx, xt, Tensor(far.data(), DType::I32, {2}), tab);
            }).find("position 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              rope_interleaved_forward(ctx, xt, Tensor(neg.data(), DType::I32, {2}), tab);
            }).find("positions"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              rope_interleaved_forward(ctx, xt, Tensor(pos.data(), DType::I32, {1}), tab);
            }).find("positions"),
            std::string::npos);
  // x: wrong rank, odd width, strided last dimension, wrong dtype.
  EXPECT_NE(error_of([&] {
              rope_interleaved_forward(ctx, Tensor(x.data(), DType::F32, {2, 16}), pt, tab);
            }).find("x (T, H, Dh)"),
            std::string::npos);
  Tensor strided = xt;
  strided.shape[2] = 4;
  strided.stride[2] = 2;
  EXPECT_NE(error_of([&] { rope_interleaved_forward(ctx, strided, pt, tab); }).find("contiguous"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              rope_interleaved_forward(ctx, Tensor(x.data(), DType::I32, {2, 2, 8}), pt, tab);
            }).find("x (T, H, Dh)"),
            std::string::npos);
  // Table and frequency arguments.
  EXPECT_NE(error_of([&] { make_rope_table(ctx, 7, kV4Theta, 4, v4_yarn()); }).find("rope_dim"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_rope_table(ctx, 8, -1.0, 4, v4_yarn()); }).find("theta"), std::string::npos);
  YarnConfig bad = v4_yarn();
  bad.beta_slow = 0;
  EXPECT_NE(error_of([&] { make_rope_table(ctx, 8, kV4Theta, 4, bad); }).find("beta"), std::string::npos);
  EXPECT_NE(error_of([&] { rope_inv_freq(4, 8, kV4Theta, v4_yarn()); }).find("pair 4"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::kernels
