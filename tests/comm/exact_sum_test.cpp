// comm/exact_sum.h: the fixed-point grid (rounding onto it and back, ties to
// even), refused terms, the range the sums are exact in, and the point of it
// all: any order or grouping of the additions gives the same bits, where plain
// f32 sums in two orders do not.
#include "lockstep/comm/exact_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "lockstep/comm/reduce_order.h"

namespace lockstep::comm {
namespace {

Fixed fixed_of(float x) {
  Fixed f = 0;
  EXPECT_TRUE(to_fixed(x, &f)) << x;
  return f;
}

Fixed sum_of(const std::vector<float>& v, const std::vector<size_t>& order) {
  Fixed acc = 0;
  for (size_t i : order) acc = fixed_add(acc, fixed_of(v[i]));
  return acc;
}

// Mixed signs and magnitudes 1e-6..1e3: the order of an f32 sum matters.
std::vector<float> mixed(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) * std::pow(10.0f, float(e(g)));
  return v;
}

std::vector<size_t> iota_order(size_t n) {
  std::vector<size_t> o(n);
  std::iota(o.begin(), o.end(), size_t(0));
  return o;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(ExactSum, GridValuesRoundTripAndTiesGoToEven) {
  const float unit = std::ldexp(1.0f, -kFixedFractionBits);
  EXPECT_EQ(fixed_of(unit), Fixed(1));
  EXPECT_EQ(fixed_of(-unit), Fixed(-1));
  EXPECT_EQ(fixed_of(1.0f), Fixed(1) << kFixedFractionBits);
  EXPECT_EQ(fixed_of(0.75f * unit), Fixed(1));  // nearest
  EXPECT_EQ(fixed_of(0.25f * unit), Fixed(0));
  EXPECT_EQ(fixed_of(0.5f * unit), Fixed(0));    // tie: to even (0)
  EXPECT_EQ(fixed_of(1.5f * unit), Fixed(2));    // tie: to even (2)
  EXPECT_EQ(fixed_of(2.5f * unit), Fixed(2));    // tie: to even (2)
  EXPECT_EQ(fixed_of(-2.5f * unit), Fixed(-2));  // symmetric
  EXPECT_EQ(fixed_of(std::numeric_limits<float>::denorm_min()), Fixed(0));
  EXPECT_EQ(fixed_of(-0.0f), Fixed(0));
  // Every float on the grid comes back unchanged.
  for (float x : {1.0f, -3.25f, 1e-15f, 123456.789f, std::ldexp(1.0f, 31), -std::ldexp(1.7f, -50)})
    EXPECT_TRUE(same_bits(fixed_to_float(fixed_of(x)), x)) << x;
}

TEST(ExactSum, ConversionToFloatRoundsOnceToNearestEven) {
  const int f = kFixedFractionBits;
  // Ties at the 24th bit go to the even mantissa.
  EXPECT_EQ(fixed_to_float((Fixed(1) << 24) + 1), std::ldexp(float(1 << 24), -f));
  EXPECT_EQ(fixed_to_float((Fixed(1) << 24) + 3), std::ldexp(float((1 << 24) + 4), -f));
  // Rounding through double first would round twice and land on 2^53 units:
  // 2^53 + 2^29 + 1 units is above the midpoint 2^53 + 2^29, so up it goes.
  const Fixed v = (Fixed(1) << 53) + (Fixed(1) << 29) + 1;
  EXPECT_EQ(fixed_to_float(v), std::ldexp(1.0f + std::ldexp(1.0f, -23), 53 - f));
  EXPECT_NE(float(fixed_to_double(v)), fixed_to_float(v)) << "the double-rounding case is not one";
  EXPECT_EQ(fixed_to_float(-v), -fixed_to_float(v));
  // Wider than 63 bits: the bits below the 63 the conversion keeps still
  // decide a tie (2^100 + 2^76 is one; + 1 is above it), in both signs.
  const Fixed b100 = Fixed(1) << 100, b76 = Fixed(1) << 76;
  EXPECT_EQ(fixed_to_float(b100 + b76), std::ldexp(1.0f, 100 - f));
  EXPECT_EQ(fixed_to_float(b100 + b76 + 1), std::ldexp(1.0f + std::ldexp(1.0f, -23), 100 - f));
  EXPECT_EQ(fixed_to_float(-(b100 + b76 + 1)), -std::ldexp(1.0f + std::ldexp(1.0f, -23), 100 - f));
  EXPECT_EQ(fixed_to_float(b100 + 3 * b76), std::ldexp(1.0f + std::ldexp(1.0f, -22), 100 - f));
  EXPECT_EQ(fixed_to_float((Fixed(1) << 126) + 12345), std::ldexp(1.0f, 126 - f));
  EXPECT_EQ(fixed_to_double(Fixed(3)), std::ldexp(3.0, -f));
  EXPECT_EQ(fixed_to_float(0), 0.0f);
}

TEST(ExactSum, ConversionToFloatIsTheNearestFloat) {
  // A Fixed of at most 53 significant bits is exact in double, and the
  // hardware's double -> float conversion rounds once to nearest even.
  std::mt19937_64 g(5);
  for (int i = 0; i < 200000; ++i) {
    const int bits = 1 + int(g() % 53), shift = int(g() % (126 - bits));
    const uint64_t m = (g() >> (64 - bits)) | (uint64_t(1) << (bits - 1));
    Fixed v = Fixed(m) << shift;
    if (g() & 1) v = -v;
    const double d = fixed_to_double(v);
    ASSERT_EQ(std::ldexp(d, kFixedFractionBits), double(v))
        << "not exact in double: the check would be wrong";
    ASSERT_TRUE(same_bits(fixed_to_float(v), float(d))) << "bits " << bits << " shift " << shift;
  }
}

TEST(ExactSum, MatchesAnExactDoubleReference) {
  // Multiples of 2^-30 below 2^12 in magnitude: 1000 of them sum exactly in
  // double (below 2^22, 52 bits), so the reference has no rounding at all.
  std::mt19937 g(7);
  std::uniform_int_distribution<int32_t> mant(-(1 << 23), 1 << 23);
  std::uniform_int_distribution<int> e(-30, -11);
  std::vector<float> v(1000);
  double ref = 0;
  for (auto& x : v) {
    x = std::ldexp(float(mant(g)), e(g));
    ref += double(x);
  }
  const Fixed s = sum_of(v, iota_order(v.size()));
  EXPECT_EQ(fixed_to_double(s), ref);
  EXPECT_EQ(fixed_to_float(s), float(ref));
}

TEST(ExactSum, AnyOrderAndGroupingGivesTheSameBits) {
  const std::vector<float> v = mixed(4096, 11);
  const Fixed ref = sum_of(v, iota_order(v.size()));
  std::mt19937 g(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<size_t> order = iota_order(v.size());
    std::shuffle(order.begin(), order.end(), g);
    ASSERT_EQ(sum_of(v, order), ref) << "trial " << trial;
  }
  // P partial sums (contiguous runs, like ranks), added in rank order.
  for (int P : {2, 3, 4, 7}) {
    std::vector<Fixed> partial(size_t(P), 0);
    for (size_t i = 0; i < v.size(); ++i) {
      const size_t r = i * size_t(P) / v.size();
      partial[r] = fixed_add(partial[r], fixed_of(v[i]));
    }
    std::vector<const Fixed*> parts;
    for (const Fixed& p : partial) parts.push_back(&p);
    Fixed out = 0;
    sum_in_rank_order(parts.data(), P, 1, &out);
    ASSERT_EQ(out, ref) << "P = " << P;
  }
  // And close to a long double reference (the grid's rounding: 2^-81 per term).
  long double ld = 0;
  for (float x : v) ld += (long double)x;
  EXPECT_NEAR(double(fixed_to_double(ref)), double(ld),
              1e-12 * std::fabs(double(ld)) + 4096 * std::ldexp(1.0, -81));
}

TEST(ExactSum, NegativeControlPlainF32SumsDependOnTheOrder) {
  const std::vector<float> v = mixed(4096, 11);
  float forward = 0, backward = 0;
  for (size_t i = 0; i < v.size(); ++i) forward += v[i];
  for (size_t i = v.size(); i-- > 0;) backward += v[i];
  EXPECT_FALSE(same_bits(forward, backward)) << "the data does not show what the exact sum is for";
}

TEST(ExactSum, NonFiniteAndTooLargeTermsAreRefused) {
  Fixed f = 42;
  const float big = std::ldexp(1.0f, kFixedTermBits);
  for (float x : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), big, -big, std::numeric_limits<float>::max()}) {
    EXPECT_FALSE(to_fixed(x, &f)) << x;
    EXPECT_EQ(f, Fixed(42)) << "a refused term must leave the output alone";
  }
  EXPECT_TRUE(to_fixed(std::nextafter(big, 0.0f), &f));
  std::vector<float> g = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f, big};
  std::vector<Fixed> acc(4, 0);
  EXPECT_EQ(fold_into(g.data(), acc.data(), g.size()), 2);
  for (float x : g) EXPECT_EQ(x, 0.0f) << "fold_into zeroes what it folds";
  EXPECT_EQ(acc[0], fixed_of(1.0f));
  EXPECT_EQ(acc[1], Fixed(0));
  EXPECT_EQ(acc[2], fixed_of(2.0f));
  EXPECT_EQ(acc[3], Fixed(0));
  // first: the sums start over, whatever the buffer held.
  g = {1.0f, 0.0f, -2.0f, std::numeric_limits<float>::infinity()};
  std::vector<Fixed> stale = {Fixed(7), Fixed(-9), Fixed(11), Fixed(13)};
  EXPECT_EQ(fold_into(g.data(), stale.data(), g.size(), /*first=*/true), 1);
  EXPECT_EQ(stale[0], fixed_of(1.0f));
  EXPECT_EQ(stale[1], Fixed(0));
  EXPECT_EQ(stale[2], fixed_of(-2.0f));
  EXPECT_EQ(stale[3], Fixed(0));
}

TEST(ExactSum, TheLargestSumsStayExactThroughWrappingIntermediates) {
  // kFixedMaxTerms terms of the largest magnitude accepted: still exact.
  const float top = std::nextafter(std::ldexp(1.0f, kFixedTermBits), 0.0f);
  Fixed acc = 0;
  for (int64_t i = 0; i < kFixedMaxTerms; ++i) acc = fixed_add(acc, fixed_of(top));
  EXPECT_EQ(fixed_to_double(acc), double(top) * double(kFixedMaxTerms));
  // Intermediate sums may wrap around 2^127 as long as the total fits: two
  // huge positives, then their negatives back.
  const Fixed half = Fixed(1) << 126;
  Fixed w = fixed_add(fixed_add(half, half), fixed_add(-half, -half));  // half + half wraps
  EXPECT_EQ(w, Fixed(0));
}

}  // namespace
}  // namespace lockstep::comm
