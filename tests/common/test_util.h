// Shared test helpers: seeded random data, buffers with sentinel guards past
// the end, and tolerances derived from norms (gemma.cpp style).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "lockstep/tensor/tensor.h"

namespace lockstep::test {

inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<float> uniform(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// A float buffer of n elements followed by kGuard sentinel values; check()
// fails the test if anything wrote past the end.
class Guarded {
 public:
  static constexpr int kGuard = 64;
  static constexpr uint32_t kSentinel = 0x7fc0beefu;  // a NaN no kernel produces

  explicit Guarded(int64_t n, float fill = 0.0f) : n_(n), v_(static_cast<size_t>(n + kGuard)) {
    for (int64_t i = 0; i < n; ++i) v_[static_cast<size_t>(i)] = fill;
    for (int i = 0; i < kGuard; ++i) std::memcpy(&v_[static_cast<size_t>(n + i)], &kSentinel, 4);
  }
  float* data() { return v_.data(); }
  const float* data() const { return v_.data(); }
  float& operator[](int64_t i) { return v_[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return v_[static_cast<size_t>(i)]; }
  int64_t size() const { return n_; }
  std::vector<float> values() const { return std::vector<float>(v_.begin(), v_.begin() + n_); }
  void check(const char* what) const {
    for (int i = 0; i < kGuard; ++i) {
      uint32_t u;
      std::memcpy(&u, &v_[static_cast<size_t>(n_ + i)], 4);
      ASSERT_EQ(u, kSentinel) << what << ": wrote past the end at +" << i;
    }
  }
  Tensor tensor(std::initializer_list<int64_t> shape) { return Tensor(v_.data(), DType::F32, shape); }

 private:
  int64_t n_;
  std::vector<float> v_;
};

// max |got - want| must stay below rel * (||want||_inf + 1e-30) + abs_floor.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                         const char* what, double abs_floor = 0.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  double tol = rel * (scale + 1e-30) + abs_floor;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::fabs(double(got[i]) - want[i]) <= tol)
        << what << ": element " << i << " got " << got[i] << " want " << want[i] << " tol " << tol;
  }
}

// Bitwise equality of two float ranges, reporting the first difference.
inline void expect_bits_equal(const float* a, const float* b, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t ua, ub;
    std::memcpy(&ua, a + i, 4);
    std::memcpy(&ub, b + i, 4);
    ASSERT_EQ(ua, ub) << what << ": first differing element " << i << " (" << a[i] << " vs " << b[i] << ")";
  }
}

}  // namespace lockstep::test
