// Arbitrary-precision integers and exact rationals for the verifiers: big
// integer answers compare exactly, fractions are exact, and every operation
// is capped in size (kMaxBits) so no input can make arithmetic run long.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::reward {

// A signed integer of any size up to kMaxBits bits. Operations whose result
// would exceed the cap return std::nullopt (callers fall back to doubles).
class BigInt {
 public:
  // 8192 bits is about 2466 decimal digits: far past any real answer, small
  // enough that schoolbook multiplication and division stay in microseconds.
  static constexpr size_t kMaxBits = 8192;

  BigInt() = default;
  BigInt(int64_t v);  // NOLINT(google-explicit-constructor): integers convert naturally

  // Parses a run of ASCII digits (no sign); nullopt if empty, not digits, or too big.
  static std::optional<BigInt> from_decimal(std::string_view digits);

  bool is_zero() const { return mag_.empty(); }
  bool negative() const { return neg_; }
  int sign() const { return is_zero() ? 0 : (neg_ ? -1 : 1); }
  size_t bits() const;
  bool is_one() const { return !neg_ && mag_.size() == 1 && mag_[0] == 1; }
  bool is_even() const { return mag_.empty() || (mag_[0] & 1u) == 0; }
  std::optional<int64_t> to_int64() const;
  BigInt abs() const;
  BigInt operator-() const;

  // nullopt when the result would exceed kMaxBits.
  static std::optional<BigInt> add(const BigInt& a, const BigInt& b);
  static std::optional<BigInt> sub(const BigInt& a, const BigInt& b);
  static std::optional<BigInt> mul(const BigInt& a, const BigInt& b);
  // Truncating division: a = q*b + r, |r| < |b|, r has the sign of a. b != 0.
  static void divmod(const BigInt& a, const BigInt& b, BigInt* q, BigInt* r);
  static BigInt gcd(BigInt a, BigInt b);  // non-negative
  static int compare(const BigInt& a, const BigInt& b);

  // value = mantissa * 2^exponent with mantissa in [0.5, 1) (0 for zero):
  // lets callers take ratios of numbers far beyond the double range.
  std::pair<double, int64_t> frexp() const;
  double to_double() const;  // +-inf when out of range
  std::string to_string() const;

  friend bool operator==(const BigInt& a, const BigInt& b) { return compare(a, b) == 0; }

 private:
  static int compare_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);
  static std::vector<uint32_t> add_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);
  static std::vector<uint32_t> sub_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);  // a >= b
  void trim();

  bool neg_ = false;
  std::vector<uint32_t> mag_;  // little-endian base-2^32 limbs, no leading zero limbs
};

// An exact rational num/den in lowest terms with den > 0. Like BigInt, each
// operation returns nullopt when a part would exceed the size cap.
class Rational {
 public:
  Rational() : num_(0), den_(1) {}
  Rational(int64_t v) : num_(v), den_(1) {}  // NOLINT(google-explicit-constructor)
  static std::optional<Rational> make(BigInt num, BigInt den);  // den != 0

  // "123", "12.5", ".5", "1e-3": a decimal literal without sign.
  static std::optional<Rational> from_decimal(std::string_view text);

  const BigInt& num() const { return num_; }
  const BigInt& den() const { return den_; }
  bool is_zero() const { return num_.is_zero(); }
  bool is_integer() const { return den_.is_one(); }
  int sign() const { return num_.sign(); }

  static std::optional<Rational> add(const Rational& a, const Rational& b);
  static std::optional<Rational> sub(const Rational& a, const Rational& b);
  static std::optional<Rational> mul(const Rational& a, const Rational& b);
  static std::optional<Rational> div(const Rational& a, const Rational& b);  // nullopt if b == 0
  // a^e for an integer e; nullopt if the result would be too big or 0^negative.
  static std::optional<Rational> pow(const Rational& a, int64_t e);
  Rational negated() const;
  static int compare(const Rational& a, const Rational& b);
  double to_double() const;
  std::string to_string() const;

  friend bool operator==(const Rational& a, const Rational& b) { return compare(a, b) == 0; }

 private:
  BigInt num_, den_;
};

}  // namespace lockstep::reward
