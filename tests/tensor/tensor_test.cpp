// Tests for tensor/: dtype conversions against brute-force references at the
// special values, and the Tensor view's shape checks.
#include "lockstep/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include "lockstep/tensor/dtype.h"

namespace lockstep {
namespace {

// Reference: nearest representable value among `cands` (ties to even code).
template <typename Code, typename Decode>
Code nearest_even(double x, int n_codes, Decode decode, bool skip_nan) {
  Code best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < n_codes; ++c) {
    double v = decode(static_cast<Code>(c));
    if (std::isnan(v) && skip_nan) continue;
    if (std::isinf(v)) continue;
    if (std::signbit(v) != std::signbit(x) && v != 0.0) continue;
    if (v == 0.0 && std::signbit(v) != std::signbit(x)) continue;
    double err = std::fabs(v - x);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = static_cast<Code>(c);
      best_err = err;
    }
  }
  return best;
}

}  // namespace

TEST(BF16, ExhaustiveRoundTrip) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float f = bf16_to_f32(static_cast<bf16_t>(c));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), c) << "code " << c;
    }
  }
}

TEST(BF16, SpecialValues) {
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  // Largest finite bf16 is 0x7f7f; f32 max rounds up to inf (IEEE overflow).
  EXPECT_EQ(f32_to_bf16(bf16_to_f32(0x7f7f)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Subnormals keep their top bits and round.
  float sub = std::numeric_limits<float>::denorm_min() * 0x10000;  // 2^-133
  EXPECT_EQ(f32_to_bf16(sub), 0x0001);
  EXPECT_EQ(bf16_to_f32(0x0001), sub);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(BF16, MatchesReferenceOnRandomFloats) {
  std::mt19937 gen(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = bits_f32(bits(gen));
    if (!std::isfinite(f)) continue;
    bf16_t got = f32_to_bf16(f);
    // The answer is one of the two bf16 neighbours of f (truncation and +1).
    uint32_t u = f32_bits(f);
    bf16_t lo = static_cast<bf16_t>(u >> 16), hi = static_cast<bf16_t>(lo + 1);
    // Past the largest finite value IEEE rounds as if the exponent were unbounded.
    double vhi = (hi & 0x7fff) == 0x7f80 ? std::copysign(std::ldexp(1.0, 128), f) : double(bf16_to_f32(hi));
    double dlo = std::fabs(double(bf16_to_f32(lo)) - f), dhi = std::fabs(vhi - f);
    bf16_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(got, want) << f;
  }
}

TEST(FP8, DecodeTable) {
  EXPECT_EQ(fp8_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(fp8_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_to_f32(0xff)));
}

TEST(FP8, ExhaustiveRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    float f = fp8_to_f32(static_cast<fp8_t>(c));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp8(f), c) << "code " << c;
  }
}

TEST(FP8, SpecialValues) {
  EXPECT_EQ(f32_to_fp8(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8(INFINITY), 0x7f);  // no inf in e4m3fn: NaN
  EXPECT_EQ(f32_to_fp8(-INFINITY), 0xff);
  EXPECT_EQ(f32_to_fp8(INFINITY, true), 0x7e);  // saturating: 448
  EXPECT_EQ(f32_to_fp8(-1e9f, true), 0xfe);
  EXPECT_EQ(f32_to_fp8(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8(464.0f), 0x7e);     // tie between 448 and (absent) 480: even -> 448
  EXPECT_EQ(f32_to_fp8(464.5f), 0x7f);     // beyond: overflow
  EXPECT_EQ(f32_to_fp8(std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal: tie to 0
  EXPECT_EQ(f32_to_fp8(std::ldexp(3.0f, -10)), 0x02);   // 1.5 quanta -> 2 (even)
  EXPECT_EQ(f32_to_fp8(std::ldexp(5.0f, -10)), 0x02);   // 2.5 quanta -> 2 (even)
  EXPECT_EQ(f32_to_fp8(std::ldexp(3.0f, -11)), 0x01);   // 0.75 quanta -> 1
  EXPECT_EQ(f32_to_fp8(-0.0f), 0x80);
}

TEST(FP8, MatchesReferenceOnRandomFloats) {
  std::mt19937 gen(2);
  std::uniform_real_distribution<float> mag(-12.0f, 9.5f);
  std::bernoulli_distribution neg(0.5);
  for (int i = 0; i < 20000; ++i) {
    float f = std::exp2(mag(gen)) * (neg(gen) ? -1.0f : 1.0f);
    uint8_t want = nearest_even<uint8_t>(f, 256, [](uint8_t c) { return double(fp8_to_f32(c)); }, true);
    if (std::fabs(f) > 464.0f) want = f < 0 ? 0xff : 0x7f;
    ASSERT_EQ(f32_to_fp8(f), want) << f;
  }
}

TEST(FP8, ScaledBulkConversion) {
  std::vector<float> x = {0.0f, 1.0f, -3.5f, 1000.0f};
  std::vector<fp8_t> q(4);
  std::vector<float> back(4);
  convert_f32_to_fp8(x.data(), q.data(), 4, 1000.0f / 448.0f, true);
  convert_fp8_to_f32(q.data(), back.data(), 4, 1000.0f / 448.0f);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) * 0.07 + 1e-2);
  EXPECT_THROW(convert_f32_to_fp8(x.data(), q.data(), 4, 0.0f, true), Error);
}

TEST(Tensor, ShapeAndViews) {
  std::vector<float> data(24);
  Tensor t(data.data(), DType::F32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_str(), "(2, 3, 4) f32");
  Tensor r = t.slice_rows(1, 2);
  EXPECT_EQ(r.ptr<float>(), data.data() + 12);
  EXPECT_EQ(t.reshape({6, 4}).dim(0), 6);
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.slice_rows(1, 3), Error);
  EXPECT_THROW(t.bf16(), Error);
}

TEST(Tensor, CheckShapeNamesBothShapes) {
  std::vector<float> data(6);
  Tensor t(data.data(), DType::F32, {2, 3});
  EXPECT_NO_THROW(check_shape(t, {2, -1}, "x"));
  try {
    check_shape(t, {3, 2}, "gemm input X");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("gemm input X"), std::string::npos) << m;
    EXPECT_NE(m.find("(3, 2)"), std::string::npos) << m;
    EXPECT_NE(m.find("(2, 3) f32"), std::string::npos) << m;
  }
}

TEST(Buffer, AlignedAndZeroed) {
  Buffer b(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(b.as<uint8_t>()[i], 0);
  Buffer c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(c.size(), 1000u);
}

// The resident set of this process (VmRSS), in bytes.
size_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

// A large buffer is zero without being written, so the pages nobody writes
// take no memory (the rollout's weight snapshot relies on it).
TEST(Buffer, UntouchedPagesTakeNoMemory) {
  constexpr size_t kMiB = 1 << 20;
  const size_t before = resident_bytes();
  Buffer b(256 * kMiB);
  const size_t allocated = resident_bytes();
  EXPECT_LT(allocated, before + 16 * kMiB) << "a fresh 256 MiB buffer became resident";
  for (size_t i = 0; i < 64 * kMiB; i += 4096) b.as<uint8_t>()[i] = 1;
  EXPECT_GE(resident_bytes(), allocated + 60 * kMiB) << "written pages are not resident: the measure is off";
  for (size_t i = 64 * kMiB; i < 256 * kMiB; i += 4096 * 61) ASSERT_EQ(b.as<uint8_t>()[i], 0) << i;
}

// Memory handed back and allocated again is zero again.
TEST(Buffer, ReusedMemoryIsZeroedAgain) {
  for (size_t n : {size_t(100), size_t(5000), size_t(3) << 20}) {
    {
      Buffer b(n);
      std::memset(b.data(), 0xAB, n);
    }
    Buffer c(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 64, 0u);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(c.as<uint8_t>()[i], 0) << n << " " << i;
  }
}

}  // namespace lockstep
