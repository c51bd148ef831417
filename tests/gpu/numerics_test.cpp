// lockstep::num (kernels/numerics.h) against the CPU kernels it must match bit
// for bit: exp/log/sigmoid/silu on strided bit-pattern sweeps plus the special
// inputs, the bf16/fp8 conversions, and Lanes16/tree16 against the canonical
// reductions. The exhaustive 2^32 sweeps are in numerics_slow.cpp.
// Negative controls, tried by hand: an unfused last step in exp's polynomial
// (mul then add) fails the strided sweep (~440 of 1M exp patterns differ), and
// a tree16 combining +1, +2, +4, +8 fails Lanes16IsTheCanonicalReduction.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu/numerics_sweep.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/numerics.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::num::test {
namespace {

// A prime stride: every exponent, both signs and scattered mantissas (~1M patterns).
constexpr uint64_t kStride = 4093;

struct MathCase {
  const char* name;
  void (*cpu)(const float*, float*, int64_t);
  ScalarFn scalar;
};
const MathCase kMath[] = {
    {"exp", kernels::vexp, [](float x) { return num::exp(x); }},
    {"log", kernels::vlog, [](float x) { return num::log(x); }},
    {"sigmoid", kernels::vsigmoid, [](float x) { return num::sigmoid(x); }},
    {"silu", kernels::vsilu, [](float x) { return num::silu(x); }},
};

TEST(Numerics, MathMatchesTheCpuOnSpecialInputs) {
  const std::vector<float> x = special_inputs();
  std::vector<float> y(x.size());
  for (const auto& m : kMath) {
    m.cpu(x.data(), y.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(bits(m.scalar(x[i])), bits(y[i])) << m.name << "(0x" << std::hex << bits(x[i]) << ")";
  }
}

TEST(Numerics, MathMatchesTheCpuOnAStridedSweep) {
  for (const auto& m : kMath) {
    for (uint64_t first : {uint64_t{0}, uint64_t{1234}}) expect_exact(sweep_f32(m.cpu, m.scalar, kStride, first), m.name);
  }
}

// The CPU's scalar forms (exp1, ...) are numerics.h's: the same bits as the vector forms.
TEST(Numerics, ScalarCpuFormsAreTheVectorForms) {
  const std::vector<float> x = special_inputs();
  std::vector<float> y(x.size());
  const ScalarFn scalar1[] = {kernels::exp1, kernels::log1, kernels::sigmoid1, kernels::silu1};
  for (int f = 0; f < 4; ++f) {
    kMath[f].cpu(x.data(), y.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bits(scalar1[f](x[i])), bits(y[i])) << kMath[f].name << "1";
  }
}

// NaN in, the same NaN out; silu(-inf) is the CPU's default NaN, not CUDA's.
TEST(Numerics, NanBitsAreTheCpus) {
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u}) {
    const float x = from_bits(u);
    EXPECT_EQ(bits(num::exp(x)), u);
    EXPECT_EQ(bits(num::log(x)), u);
    EXPECT_EQ(bits(num::sigmoid(x)), u);
    EXPECT_EQ(bits(num::silu(x)), u);
  }
  EXPECT_EQ(bits(num::silu(-INFINITY)), 0xffc00000u);
}

TEST(Numerics, Bf16DecodeIsExhaustivelyTheCpus) {
  for (uint32_t h = 0; h < 0x10000u; ++h)
    ASSERT_EQ(bits(num::bf16_to_f32(static_cast<uint16_t>(h))), bits(lockstep::bf16_to_f32(static_cast<bf16_t>(h))))
        << std::hex << h;
}

TEST(Numerics, Fp8DecodeIsExhaustivelyTheCpus) {
  for (uint32_t q = 0; q < 0x100u; ++q) {
    const auto v = static_cast<uint8_t>(q);
    ASSERT_EQ(bits(num::fp8_e4m3_to_f32(v)), bits(lockstep::fp8_to_f32(v))) << std::hex << q;
    // The GEMM's widening is the decode times the scale (convert_fp8_to_f32's
    // rounding), except at NaN, which is never stored; scales stay below 2^8.
    if ((q & 0x7fu) == 0x7fu) continue;
    for (float scale : {1.0f, 0.75f, 3.14159274f, 0x1p-20f, 0x1p-126f, 0x1.fffffep7f}) {
      ASSERT_EQ(bits(num::fp8_widen_scaled(v, scale * 0x1p120f)), bits(lockstep::fp8_to_f32(v) * scale))
          << std::hex << q << " scale " << scale;
    }
  }
}

// Encodes every strided f32 pattern both ways (the exhaustive run is in numerics_slow.cpp),
// plus every value within a few ulps of each fp8 value and midpoint.
TEST(Numerics, EncodesMatchTheCpuOnAStridedSweep) {
  std::vector<uint32_t> patterns;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += kStride) patterns.push_back(static_cast<uint32_t>(u));
  for (uint32_t q = 0; q < 0x100u; ++q) {
    for (float v : {lockstep::fp8_to_f32(static_cast<uint8_t>(q)),
                    0.5f * (lockstep::fp8_to_f32(static_cast<uint8_t>(q)) + lockstep::fp8_to_f32(static_cast<uint8_t>(q + 1)))})
      for (int d = -3; d <= 3; ++d) patterns.push_back(bits(v) + static_cast<uint32_t>(d));
  }
  for (uint32_t u : patterns) {
    const float f = from_bits(u);
    ASSERT_EQ(num::f32_to_bf16(f), lockstep::f32_to_bf16(f)) << std::hex << u;
    ASSERT_EQ(num::f32_to_fp8_e4m3(f), lockstep::f32_to_fp8(f)) << std::hex << u;
    ASSERT_EQ(num::f32_to_fp8_e4m3(f, true), lockstep::f32_to_fp8(f, true)) << std::hex << u;
  }
}

// Normal values over a wide range of scales; with `specials`, about one in 64
// is NaN, +-inf or -0 (more would make nearly every sum NaN).
std::vector<float> random_values(std::mt19937& g, int64_t n, bool specials) {
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> scale(-20, 20), pick(0, specials ? 255 : 0);
  const float kSpecial[] = {NAN, INFINITY, -INFINITY, -0.0f};
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const int p = pick(g);
    x = p < 4 && specials ? kSpecial[p] : d(g) * std::ldexp(1.0f, scale(g));
  }
  return v;
}

// Same bits, or both NaN: a NaN made by arithmetic has no portable payload (x86
// returns the first operand's NaN or 0xffc00000, CUDA always 0x7fffffff, and the
// compiler picks the operand order of a commutative add), so reductions only
// promise NaN-ness.
bool same_value(float a, float b) { return bits(a) == bits(b) || (is_nan(a) && is_nan(b)); }

// The contract written out (simd.cpp shares tree16 with numerics.h, so the CPU
// alone cannot catch a change to it): lane i % 16 in index order, then the tree.
float written_sum(const std::vector<float>& x) {
  float lane[16] = {};
  for (size_t i = 0; i < x.size(); ++i) lane[i % 16] = lane[i % 16] + x[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
  return lane[0];
}

TEST(Numerics, Lanes16IsTheCanonicalReduction) {
  std::mt19937 g(7);
  for (int rep = 0; rep < 400; ++rep) {
    const int64_t n = rep % 101;
    const bool specials = rep % 3 == 0;
    const std::vector<float> a = random_values(g, n, specials), b = random_values(g, n, specials);
    Lanes16 sum, dot, sq;
    for (int64_t i = 0; i < n; ++i) {
      sum.add(i, a[i]);
      dot.fma(i, a[i], b[i]);
      sq.fma(i, a[i], a[i]);
    }
    EXPECT_PRED2(same_value, sum.reduce(), kernels::canonical_sum(a.data(), n)) << "n=" << n;
    EXPECT_PRED2(same_value, sum.reduce(), written_sum(a)) << "n=" << n;
    EXPECT_PRED2(same_value, dot.reduce(), kernels::canonical_dot(a.data(), b.data(), n)) << "n=" << n;
    EXPECT_PRED2(same_value, sq.reduce(), kernels::canonical_sum_sq(a.data(), n)) << "n=" << n;
  }
}

}  // namespace
}  // namespace lockstep::num::test
