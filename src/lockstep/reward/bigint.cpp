// BigInt and Rational: schoolbook arithmetic on base-2^32 limbs. Sizes are
// capped (BigInt::kMaxBits), so the quadratic algorithms stay cheap.
#include "lockstep/reward/bigint.h"

#include <algorithm>
#include <cmath>

namespace lockstep::reward {

namespace {

size_t mag_bits(const std::vector<uint32_t>& m) {
  if (m.empty()) return 0;
  return (m.size() - 1) * 32 + (32 - static_cast<size_t>(__builtin_clz(m.back())));
}

void trim_mag(std::vector<uint32_t>& m) {
  while (!m.empty() && m.back() == 0) m.pop_back();
}

std::vector<uint32_t> shl_mag(const std::vector<uint32_t>& m, size_t k) {
  if (m.empty()) return {};
  size_t limbs = k / 32, bits = k % 32;
  std::vector<uint32_t> out(m.size() + limbs + 1, 0);
  for (size_t i = 0; i < m.size(); ++i) {
    uint64_t v = static_cast<uint64_t>(m[i]) << bits;
    out[i + limbs] |= static_cast<uint32_t>(v);
    out[i + limbs + 1] |= static_cast<uint32_t>(v >> 32);
  }
  trim_mag(out);
  return out;
}

std::vector<uint32_t> shr_mag(const std::vector<uint32_t>& m, size_t k) {
  size_t limbs = k / 32, bits = k % 32;
  if (limbs >= m.size()) return {};
  std::vector<uint32_t> out(m.size() - limbs, 0);
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t lo = m[i + limbs];
    uint64_t hi = i + limbs + 1 < m.size() ? m[i + limbs + 1] : 0;
    out[i] = static_cast<uint32_t>(((hi << 32) | lo) >> bits);
  }
  trim_mag(out);
  return out;
}

size_t trailing_zero_bits(const std::vector<uint32_t>& m) {
  size_t n = 0;
  for (uint32_t limb : m) {
    if (limb == 0) {
      n += 32;
      continue;
    }
    return n + static_cast<size_t>(__builtin_ctz(limb));
  }
  return n;
}

// Divides a magnitude by a single limb in place; returns the remainder.
uint32_t divmod_small(std::vector<uint32_t>& m, uint32_t d) {
  uint64_t rem = 0;
  for (size_t i = m.size(); i-- > 0;) {
    uint64_t cur = (rem << 32) | m[i];
    m[i] = static_cast<uint32_t>(cur / d);
    rem = cur % d;
  }
  trim_mag(m);
  return static_cast<uint32_t>(rem);
}

}  // namespace

BigInt::BigInt(int64_t v) {
  neg_ = v < 0;
  uint64_t u = neg_ ? uint64_t(0) - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  while (u) {
    mag_.push_back(static_cast<uint32_t>(u));
    u >>= 32;
  }
}

void BigInt::trim() {
  trim_mag(mag_);
  if (mag_.empty()) neg_ = false;
}

size_t BigInt::bits() const { return mag_bits(mag_); }

std::optional<BigInt> BigInt::from_decimal(std::string_view digits) {
  if (digits.empty()) return std::nullopt;
  // log2(10) < 3.33: reject before doing the quadratic work.
  if (digits.size() * 332 / 100 > kMaxBits + 8) return std::nullopt;
  BigInt out;
  size_t i = 0;
  while (i < digits.size()) {
    // Consume up to 9 digits at a time: 10^9 < 2^32.
    uint32_t chunk = 0, scale = 1;
    for (int k = 0; k < 9 && i < digits.size(); ++k, ++i) {
      char c = digits[i];
      if (c < '0' || c > '9') return std::nullopt;
      chunk = chunk * 10 + static_cast<uint32_t>(c - '0');
      scale *= 10;
    }
    uint64_t carry = chunk;
    for (auto& limb : out.mag_) {
      uint64_t v = static_cast<uint64_t>(limb) * scale + carry;
      limb = static_cast<uint32_t>(v);
      carry = v >> 32;
    }
    if (carry) out.mag_.push_back(static_cast<uint32_t>(carry));
  }
  out.trim();
  if (out.bits() > kMaxBits) return std::nullopt;
  return out;
}

std::optional<int64_t> BigInt::to_int64() const {
  if (bits() > 63) return std::nullopt;
  uint64_t u = 0;
  for (size_t i = mag_.size(); i-- > 0;) u = (u << 32) | mag_[i];
  return neg_ ? -static_cast<int64_t>(u) : static_cast<int64_t>(u);
}

BigInt BigInt::abs() const {
  BigInt r = *this;
  r.neg_ = false;
  return r;
}

BigInt BigInt::operator-() const {
  BigInt r = *this;
  if (!r.is_zero()) r.neg_ = !r.neg_;
  return r;
}

int BigInt::compare_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  for (size_t i = a.size(); i-- > 0;) {
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  }
  return 0;
}

std::vector<uint32_t> BigInt::add_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  const auto& big = a.size() >= b.size() ? a : b;
  const auto& small = a.size() >= b.size() ? b : a;
  std::vector<uint32_t> out(big.size() + 1, 0);
  uint64_t carry = 0;
  for (size_t i = 0; i < big.size(); ++i) {
    uint64_t v = static_cast<uint64_t>(big[i]) + (i < small.size() ? small[i] : 0) + carry;
    out[i] = static_cast<uint32_t>(v);
    carry = v >> 32;
  }
  out[big.size()] = static_cast<uint32_t>(carry);
  trim_mag(out);
  return out;
}

std::vector<uint32_t> BigInt::sub_mag(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  std::vector<uint32_t> out(a.size(), 0);
  int64_t borrow = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    int64_t v = static_cast<int64_t>(a[i]) - (i < b.size() ? b[i] : 0) - borrow;
    borrow = v < 0 ? 1 : 0;
    if (v < 0) v += int64_t(1) << 32;
    out[i] = static_cast<uint32_t>(v);
  }
  trim_mag(out);
  return out;
}

std::optional<BigInt> BigInt::add(const BigInt& a, const BigInt& b) {
  BigInt r;
  if (a.neg_ == b.neg_) {
    r.mag_ = add_mag(a.mag_, b.mag_);
    r.neg_ = a.neg_;
  } else {
    int c = compare_mag(a.mag_, b.mag_);
    if (c == 0) return BigInt();
    if (c > 0) {
      r.mag_ = sub_mag(a.mag_, b.mag_);
      r.neg_ = a.neg_;
    } else {
      r.mag_ = sub_mag(b.mag_, a.mag_);
      r.neg_ = b.neg_;
    }
  }
  r.trim();
  if (r.bits() > kMaxBits) return std::nullopt;
  return r;
}

std::optional<BigInt> BigInt::sub(const BigInt& a, const BigInt& b) { return add(a, -b); }

std::optional<BigInt> BigInt::mul(const BigInt& a, const BigInt& b) {
  if (a.is_zero() || b.is_zero()) return BigInt();
  if (a.bits() + b.bits() > kMaxBits + 1) return std::nullopt;
  BigInt r;
  r.mag_.assign(a.mag_.size() + b.mag_.size(), 0);
  for (size_t i = 0; i < a.mag_.size(); ++i) {
    uint64_t carry = 0;
    for (size_t j = 0; j < b.mag_.size(); ++j) {
      uint64_t v = static_cast<uint64_t>(a.mag_[i]) * b.mag_[j] + r.mag_[i + j] + carry;
      r.mag_[i + j] = static_cast<uint32_t>(v);
      carry = v >> 32;
    }
    size_t k = i + b.mag_.size();
    while (carry) {
      uint64_t v = static_cast<uint64_t>(r.mag_[k]) + carry;
      r.mag_[k] = static_cast<uint32_t>(v);
      carry = v >> 32;
      ++k;
    }
  }
  r.neg_ = a.neg_ != b.neg_;
  r.trim();
  if (r.bits() > kMaxBits) return std::nullopt;
  return r;
}

void BigInt::divmod(const BigInt& a, const BigInt& b, BigInt* q, BigInt* r) {
  // b == 0 is a caller bug; every caller checks first.
  BigInt quot, rem;
  if (compare_mag(a.mag_, b.mag_) < 0) {
    rem = a;
  } else if (b.mag_.size() == 1) {
    quot.mag_ = a.mag_;
    uint32_t rr = divmod_small(quot.mag_, b.mag_[0]);
    if (rr) rem.mag_.push_back(rr);
  } else if (b.mag_.size() == 2) {
    uint64_t d = (static_cast<uint64_t>(b.mag_[1]) << 32) | b.mag_[0];
    quot.mag_.assign(a.mag_.size(), 0);
    unsigned __int128 r = 0;
    for (size_t i = a.mag_.size(); i-- > 0;) {
      r = (r << 32) | a.mag_[i];
      quot.mag_[i] = static_cast<uint32_t>(r / d);
      r %= d;
    }
    for (uint64_t v = static_cast<uint64_t>(r); v; v >>= 32) rem.mag_.push_back(static_cast<uint32_t>(v));
  } else {
    // Shift-subtract, one bit at a time: sizes are capped, so this is cheap
    // enough and has no tricky normalization steps.
    size_t n = mag_bits(a.mag_);
    quot.mag_.assign(a.mag_.size(), 0);
    std::vector<uint32_t> cur;
    for (size_t i = n; i-- > 0;) {
      cur = shl_mag(cur, 1);
      if ((a.mag_[i / 32] >> (i % 32)) & 1u) {
        if (cur.empty()) cur.push_back(0);
        cur[0] |= 1u;
      }
      if (compare_mag(cur, b.mag_) >= 0) {
        cur = sub_mag(cur, b.mag_);
        quot.mag_[i / 32] |= 1u << (i % 32);
      }
    }
    rem.mag_ = cur;
  }
  quot.neg_ = a.neg_ != b.neg_;
  rem.neg_ = a.neg_;
  quot.trim();
  rem.trim();
  if (q) *q = std::move(quot);
  if (r) *r = std::move(rem);
}

namespace {
// m mod d for a divisor that fits in 64 bits.
uint64_t mod_u64(const std::vector<uint32_t>& m, uint64_t d) {
  unsigned __int128 rem = 0;
  for (size_t i = m.size(); i-- > 0;) rem = ((rem << 32) | m[i]) % d;
  return static_cast<uint64_t>(rem);
}
uint64_t to_u64(const std::vector<uint32_t>& m) {
  uint64_t u = 0;
  for (size_t i = m.size(); i-- > 0;) u = (u << 32) | m[i];
  return u;
}
}  // namespace

BigInt BigInt::gcd(BigInt a, BigInt b) {
  std::vector<uint32_t> x = a.mag_, y = b.mag_;
  if (x.empty()) return b.abs();
  if (y.empty()) return a.abs();
  // One side small (the common case: reducing a big fraction by a small
  // denominator): one remainder pass, then machine-word Euclid.
  if (x.size() <= 2 || y.size() <= 2) {
    if (x.size() > 2 || (y.size() <= 2 && compare_mag(x, y) > 0)) std::swap(x, y);
    uint64_t small = to_u64(x);
    uint64_t r = mod_u64(y, small);
    while (r) {
      uint64_t t = small % r;
      small = r;
      r = t;
    }
    BigInt g;
    for (uint64_t v = small; v; v >>= 32) g.mag_.push_back(static_cast<uint32_t>(v));
    return g;
  }
  // Binary GCD: only shifts and subtractions, no division.
  size_t shift = std::min(trailing_zero_bits(x), trailing_zero_bits(y));
  x = shr_mag(x, trailing_zero_bits(x));
  while (!y.empty()) {
    y = shr_mag(y, trailing_zero_bits(y));
    if (compare_mag(x, y) > 0) std::swap(x, y);
    y = sub_mag(y, x);
  }
  BigInt g;
  g.mag_ = shl_mag(x, shift);
  g.trim();
  return g;
}

int BigInt::compare(const BigInt& a, const BigInt& b) {
  if (a.neg_ != b.neg_) return a.neg_ ? -1 : 1;
  int c = compare_mag(a.mag_, b.mag_);
  return a.neg_ ? -c : c;
}

std::pair<double, int64_t> BigInt::frexp() const {
  size_t n = bits();
  if (n == 0) return {0.0, 0};
  // The top 64 bits carry more precision than a double holds.
  std::vector<uint32_t> top = n > 64 ? shr_mag(mag_, n - 64) : mag_;
  uint64_t u = 0;
  for (size_t i = top.size(); i-- > 0;) u = (u << 32) | top[i];
  size_t kept = std::min<size_t>(n, 64);
  double m = std::ldexp(static_cast<double>(u), -static_cast<int>(kept));
  int64_t e = static_cast<int64_t>(n);
  if (m >= 1.0) {  // u rounded up to 2^kept: renormalize
    m = 0.5;
    ++e;
  }
  return {neg_ ? -m : m, e};
}

double BigInt::to_double() const {
  auto [m, e] = frexp();
  if (e > 2000) return m < 0 ? -HUGE_VAL : HUGE_VAL;
  return std::ldexp(m, static_cast<int>(e));
}

std::string BigInt::to_string() const {
  if (is_zero()) return "0";
  std::vector<uint32_t> m = mag_;
  std::vector<uint32_t> chunks;  // base 10^9, little-endian
  while (!m.empty()) chunks.push_back(divmod_small(m, 1000000000u));
  std::string s = neg_ ? "-" : "";
  s += std::to_string(chunks.back());
  for (size_t i = chunks.size() - 1; i-- > 0;) {
    std::string part = std::to_string(chunks[i]);
    s += std::string(9 - part.size(), '0') + part;
  }
  return s;
}

std::optional<Rational> Rational::make(BigInt num, BigInt den) {
  if (den.is_zero()) return std::nullopt;
  if (den.negative()) {
    num = -num;
    den = -den;
  }
  Rational r;
  if (!den.is_one() && !num.is_zero()) {
    BigInt g = BigInt::gcd(num, den);
    if (!g.is_one()) {
      BigInt::divmod(num, g, &num, nullptr);
      BigInt::divmod(den, g, &den, nullptr);
    }
  } else if (num.is_zero()) {
    den = BigInt(1);
  }
  r.num_ = std::move(num);
  r.den_ = std::move(den);
  return r;
}

std::optional<Rational> Rational::from_decimal(std::string_view text) {
  std::string digits;
  size_t frac_len = 0;
  size_t i = 0;
  bool dot = false, any = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      digits.push_back(c);
      any = true;
      if (dot) ++frac_len;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!any) return std::nullopt;
  int64_t exp10 = 0;
  if (i < text.size()) {
    if (text[i] != 'e' && text[i] != 'E') return std::nullopt;
    ++i;
    bool neg = false;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) neg = text[i++] == '-';
    if (i >= text.size() || text.size() - i > 4) return std::nullopt;  // |exponent| < 10^4
    for (; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') return std::nullopt;
      exp10 = exp10 * 10 + (text[i] - '0');
    }
    if (neg) exp10 = -exp10;
  }
  exp10 -= static_cast<int64_t>(frac_len);
  auto num = BigInt::from_decimal(digits);
  if (!num) return std::nullopt;
  auto scale = pow(Rational(10), exp10);
  if (!scale) return std::nullopt;
  return mul(*make(*num, BigInt(1)), *scale);
}

std::optional<Rational> Rational::add(const Rational& a, const Rational& b) {
  if (a.den_.is_one() && b.den_.is_one()) {
    auto n = BigInt::add(a.num_, b.num_);
    if (!n) return std::nullopt;
    Rational r;
    r.num_ = std::move(*n);
    return r;
  }
  auto x = BigInt::mul(a.num_, b.den_);
  auto y = BigInt::mul(b.num_, a.den_);
  auto d = BigInt::mul(a.den_, b.den_);
  if (!x || !y || !d) return std::nullopt;
  auto n = BigInt::add(*x, *y);
  if (!n) return std::nullopt;
  return make(std::move(*n), std::move(*d));
}

std::optional<Rational> Rational::sub(const Rational& a, const Rational& b) { return add(a, b.negated()); }

std::optional<Rational> Rational::mul(const Rational& a, const Rational& b) {
  auto n = BigInt::mul(a.num_, b.num_);
  auto d = BigInt::mul(a.den_, b.den_);
  if (!n || !d) return std::nullopt;
  if (d->is_one()) {
    Rational r;
    r.num_ = std::move(*n);
    return r;
  }
  return make(std::move(*n), std::move(*d));
}

std::optional<Rational> Rational::div(const Rational& a, const Rational& b) {
  if (b.is_zero()) return std::nullopt;
  auto n = BigInt::mul(a.num_, b.den_);
  auto d = BigInt::mul(a.den_, b.num_);
  if (!n || !d) return std::nullopt;
  return make(std::move(*n), std::move(*d));
}

std::optional<Rational> Rational::pow(const Rational& a, int64_t e) {
  if (e == 0) return Rational(1);
  if (a.is_zero()) return e > 0 ? std::optional<Rational>(Rational(0)) : std::nullopt;
  Rational base = a;
  if (e < 0) {
    auto inv = div(Rational(1), a);
    if (!inv) return std::nullopt;
    base = *inv;
  }
  uint64_t n = e < 0 ? uint64_t(0) - static_cast<uint64_t>(e) : static_cast<uint64_t>(e);
  bool unit = base.num_.abs().is_one() && base.den_.is_one();
  if (unit) return (base.num_.negative() && (n & 1)) ? Rational(-1) : Rational(1);
  // Reject before computing: the result has about n * bits(base) bits.
  size_t b = std::max(base.num_.bits(), base.den_.bits());
  if (n > BigInt::kMaxBits || (b > 1 && (b - 1) * n > BigInt::kMaxBits)) return std::nullopt;
  Rational result(1);
  while (n) {
    if (n & 1) {
      auto r = mul(result, base);
      if (!r) return std::nullopt;
      result = std::move(*r);
    }
    n >>= 1;
    if (n) {
      auto sq = mul(base, base);
      if (!sq) return std::nullopt;
      base = std::move(*sq);
    }
  }
  return result;
}

Rational Rational::negated() const {
  Rational r = *this;
  r.num_ = -r.num_;
  return r;
}

int Rational::compare(const Rational& a, const Rational& b) {
  if (a.den_ == b.den_) return BigInt::compare(a.num_, b.num_);
  // Cross-multiplication cannot overflow the cap by more than a factor: both
  // sides are at most 2*kMaxBits, so fall back to doubles only past that.
  auto x = BigInt::mul(a.num_, b.den_);
  auto y = BigInt::mul(b.num_, a.den_);
  if (x && y) return BigInt::compare(*x, *y);
  double da = a.to_double(), db = b.to_double();
  return da < db ? -1 : (da > db ? 1 : 0);
}

double Rational::to_double() const {
  auto [mn, en] = num_.frexp();
  auto [md, ed] = den_.frexp();
  if (mn == 0.0) return 0.0;
  int64_t e = en - ed;
  if (e > 2000) return mn < 0 ? -HUGE_VAL : HUGE_VAL;
  if (e < -2000) return 0.0;
  return std::ldexp(mn / md, static_cast<int>(e));
}

std::string Rational::to_string() const {
  return den_.is_one() ? num_.to_string() : num_.to_string() + "/" + den_.to_string();
}

}  // namespace lockstep::reward
