// pass@k against exact combinatorics: for every n <= 60, c and k, the
// estimator must equal 1 - C(n-c, k)/C(n, k) computed with exact integer
// binomials (Pascal's triangle; C(60, 30) < 2^64), to 1e-12 — plus the edge
// cases, a brute-force subset count for small n, and the list of ks.
#include "lockstep/eval/pass_at_k.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lockstep/base/error.h"

namespace lockstep::eval {
namespace {

constexpr int kMaxN = 60;

// binom[n][k] exactly, n <= kMaxN.
std::vector<std::vector<uint64_t>> pascal() {
  std::vector<std::vector<uint64_t>> b(kMaxN + 1, std::vector<uint64_t>(kMaxN + 1, 0));
  for (int n = 0; n <= kMaxN; ++n) {
    b[size_t(n)][0] = 1;
    for (int k = 1; k <= n; ++k)
      b[size_t(n)][size_t(k)] = b[size_t(n - 1)][size_t(k - 1)] + b[size_t(n - 1)][size_t(k)];
  }
  return b;
}

TEST(PassAtK, MatchesExactBinomialsForEveryNCKUpTo60) {
  const auto b = pascal();
  int64_t cases = 0;
  for (int n = 1; n <= kMaxN; ++n) {
    for (int c = 0; c <= n; ++c) {
      for (int k = 1; k <= n; ++k) {
        // C(n-c, k) is 0 when k > n-c; the difference of two exact integers
        // is exact, and one long double division rounds it once.
        const uint64_t all = b[size_t(n)][size_t(k)];
        const uint64_t none_correct = k <= n - c ? b[size_t(n - c)][size_t(k)] : 0;
        const long double exact =
            static_cast<long double>(all - none_correct) / static_cast<long double>(all);
        const double got = pass_at_k(n, c, k);
        ASSERT_NEAR(got, static_cast<double>(exact), 1e-12) << "n=" << n << " c=" << c << " k=" << k;
        // Relative accuracy too: small values must not lose digits.
        if (exact > 0) {
          ASSERT_LE(std::fabs(got - double(exact)) / double(exact), 1e-13)
              << "n=" << n << " c=" << c << " k=" << k;
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 75640);  // sum over n of (n+1)*n
}

TEST(PassAtK, EqualsTheFractionOfKSubsetsHoldingACorrectSample) {
  // Brute force over every k-subset of n <= 12 samples (bit masks): the
  // definition the estimator comes from, independent of any binomial formula.
  for (int n = 1; n <= 12; ++n) {
    for (int c = 0; c <= n; ++c) {
      const uint32_t correct_mask = (1u << c) - 1;  // which samples are correct does not matter
      for (int k = 1; k <= n; ++k) {
        int64_t subsets = 0, hit = 0;
        for (uint32_t m = 0; m < (1u << n); ++m) {
          if (__builtin_popcount(m) != k) continue;
          ++subsets;
          hit += (m & correct_mask) != 0;
        }
        ASSERT_NEAR(pass_at_k(n, c, k), double(hit) / double(subsets), 1e-14)
            << "n=" << n << " c=" << c << " k=" << k;
      }
    }
  }
}

TEST(PassAtK, EdgeCasesAreExact) {
  for (int n : {1, 2, 7, 8, 100, 1024}) {
    for (int k = 1; k <= n; k = k * 2 + 1) EXPECT_EQ(pass_at_k(n, 0, k), 0.0) << n << " " << k;  // c = 0
    EXPECT_EQ(pass_at_k(n, n, 1), 1.0);  // all correct
    EXPECT_EQ(pass_at_k(n, 1, n), 1.0);  // k = n: every sample is drawn
    for (int c = 0; c <= n; c += std::max(1, n / 7)) EXPECT_EQ(pass_at_k(n, c, 1), double(c) / double(n));
  }
  EXPECT_EQ(pass_at_k(8, 5, 4), 1.0);               // n - c = 3 < k = 4: every 4-subset holds a correct one
  EXPECT_EQ(pass_at_k(8, 4, 4), 1.0 - 1.0 / 70.0);  // C(4,4)/C(8,4) = 1/70
  EXPECT_NEAR(pass_at_k(8, 1, 2), 0.25, 1e-16);     // 1 - (7/8)(6/7)... = 2/8
}

TEST(PassAtK, StaysAccurateForLargeN) {
  // Against lgamma (relative error ~1e-13 at this size): no overflow, no cancellation.
  auto log_binom = [](double n, double k) {
    return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
  };
  for (auto [n, c, k] :
       std::vector<std::array<int64_t, 3>>{{1000, 500, 100}, {1024, 3, 512}, {1024, 1, 1}, {1000, 10, 7}}) {
    const double ref = 1.0 - std::exp(log_binom(double(n - c), double(k)) - log_binom(double(n), double(k)));
    EXPECT_NEAR(pass_at_k(n, c, k), ref, 1e-10) << n << " " << c << " " << k;
  }
  // Monotone in c and in k.
  for (int64_t c = 1; c <= 256; ++c) ASSERT_GE(pass_at_k(256, c, 16), pass_at_k(256, c - 1, 16));
  for (int64_t k = 2; k <= 256; ++k) ASSERT_GE(pass_at_k(256, 9, k), pass_at_k(256, 9, k - 1));
}

TEST(PassAtK, RejectsImpossibleArguments) {
  EXPECT_THROW(pass_at_k(0, 0, 1), Error);
  EXPECT_THROW(pass_at_k(8, -1, 1), Error);
  EXPECT_THROW(pass_at_k(8, 9, 1), Error);
  EXPECT_THROW(pass_at_k(8, 2, 0), Error);
  EXPECT_THROW(pass_at_k(8, 2, 9), Error);
}

TEST(PassAtK, ReportsPowersOfTwoAndN) {
  EXPECT_EQ(pass_at_k_ks(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(pass_at_k_ks(2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(pass_at_k_ks(8), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(pass_at_k_ks(10), (std::vector<int64_t>{1, 2, 4, 8, 10}));
  EXPECT_EQ(pass_at_k_ks(1024).size(), 11u);
  EXPECT_THROW(pass_at_k_ks(0), Error);
}

}  // namespace
}  // namespace lockstep::eval
