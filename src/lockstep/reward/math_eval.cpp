// Evaluation of parsed answers: exact rational arithmetic where the value is
// rational (big integers, fractions, perfect roots), doubles otherwise. Every
// step is bounded: sizes by BigInt::kMaxBits, loops by explicit caps, and
// recursion by the parse depth.
#include <cmath>
#include <numeric>

#include "lockstep/reward/math_expr.h"

namespace lockstep::reward::math {
namespace {

constexpr int kMaxEvalDepth = kMaxDepth + 16;
constexpr int64_t kMaxExactExponent = 100000;
constexpr int64_t kMaxFactorial = 3000;  // 3000! is ~30k bits: the size cap stops it earlier
constexpr int64_t kMaxRootIndex = 64;

std::optional<int64_t> as_int(const Rational& r) {
  if (!r.is_integer()) return std::nullopt;
  return r.num().to_int64();
}

// Integer q-th root of x >= 0 if x is a perfect q-th power.
std::optional<BigInt> int_root(const BigInt& x, int64_t q) {
  if (x.is_zero()) return BigInt(0);
  if (x.bits() > 1000) return std::nullopt;
  double r = std::round(std::pow(x.to_double(), 1.0 / static_cast<double>(q)));
  for (double cand : {r - 1, r, r + 1}) {
    if (cand < 1 || cand > 9.0e15) continue;  // beyond 2^53 the candidate is not exact
    BigInt c(static_cast<int64_t>(cand));
    auto p = Rational::pow(*Rational::make(c, BigInt(1)), q);
    if (p && p->num() == x) return c;
  }
  return std::nullopt;
}

// r with r^q == v exactly, when one exists (odd roots of negatives too).
std::optional<Rational> exact_root(const Rational& v, int64_t q) {
  if (q < 2 || q > kMaxRootIndex) return std::nullopt;
  bool neg = v.sign() < 0;
  if (neg && q % 2 == 0) return std::nullopt;
  auto n = int_root(v.num().abs(), q);
  auto d = int_root(v.den(), q);
  if (!n || !d) return std::nullopt;
  auto r = Rational::make(neg ? -*n : *n, *d);
  return r;
}

std::optional<Rational> exact_pow(const Rational& base, const Rational& exp) {
  if (exp.is_integer()) {
    auto e = exp.num().to_int64();
    if (!e || *e > kMaxExactExponent || *e < -kMaxExactExponent) return std::nullopt;
    return Rational::pow(base, *e);
  }
  auto q = exp.den().to_int64();
  auto p = exp.num().to_int64();
  if (!q || !p || *p > kMaxExactExponent || *p < -kMaxExactExponent) return std::nullopt;
  auto root = exact_root(base, *q);
  if (!root) return std::nullopt;
  return Rational::pow(*root, *p);
}

std::optional<Rational> exact_floor(const Rational& v, bool ceil) {
  BigInt q, r;
  BigInt::divmod(v.num(), v.den(), &q, &r);  // truncates toward zero
  if (!r.is_zero()) {
    if (!ceil && v.sign() < 0) {
      auto m = BigInt::sub(q, BigInt(1));
      if (!m) return std::nullopt;
      q = *m;
    }
    if (ceil && v.sign() > 0) {
      auto m = BigInt::add(q, BigInt(1));
      if (!m) return std::nullopt;
      q = *m;
    }
  }
  return Rational::make(q, BigInt(1));
}

std::optional<Rational> exact_factorial(const Rational& v) {
  auto n = as_int(v);
  if (!n || *n < 0 || *n > kMaxFactorial) return std::nullopt;
  Rational acc(1);
  for (int64_t k = 2; k <= *n; ++k) {
    auto next = Rational::mul(acc, Rational(k));
    if (!next) return std::nullopt;
    acc = std::move(*next);
  }
  return acc;
}

std::optional<Rational> exact_binom(const Rational& nv, const Rational& kv) {
  auto n = as_int(nv);
  auto k = as_int(kv);
  if (!n || !k || *n < 0 || *n > 1000000) return std::nullopt;
  if (*k < 0 || *k > *n) return Rational(0);
  int64_t kk = std::min(*k, *n - *k);
  if (kk > 5000) return std::nullopt;
  Rational acc(1);
  for (int64_t i = 0; i < kk; ++i) {
    auto m = Rational::mul(acc, Rational(*n - i));
    if (!m) return std::nullopt;
    auto d = Rational::div(*m, Rational(i + 1));
    if (!d) return std::nullopt;
    acc = std::move(*d);
  }
  return acc;
}

std::optional<Rational> ex(const Expr& e, int i, uint32_t mask, int depth);

// Exact value of a function node: roots, floor/ceil, factorial, binomial,
// max/min, gcd/lcm, and exp/ln at the points where they are rational.
std::optional<Rational> ex_func(const Expr& e, const Node& n, uint32_t mask, int depth) {
  std::vector<Rational> args;
  for (size_t k = 0; k < n.kids.size(); ++k) {
    auto v = ex(e, n.kids[k], mask, depth + 1);
    if (!v) return std::nullopt;
    args.push_back(std::move(*v));
  }
  switch (static_cast<Fn>(n.sub)) {
    case Fn::Sqrt: return exact_root(args[0], 2);
    case Fn::Root: {
      auto q = as_int(args[0]);
      if (!q) return std::nullopt;
      return exact_root(args[1], *q);
    }
    case Fn::Abs: return args[0].sign() < 0 ? args[0].negated() : args[0];
    case Fn::Floor: return exact_floor(args[0], false);
    case Fn::Ceil: return exact_floor(args[0], true);
    case Fn::Factorial: return exact_factorial(args[0]);
    case Fn::Binom: return exact_binom(args[0], args[1]);
    case Fn::Max:
    case Fn::Min: {
      Rational best = args[0];
      for (const auto& a : args) {
        int c = Rational::compare(a, best);
        if ((static_cast<Fn>(n.sub) == Fn::Max) ? c > 0 : c < 0) best = a;
      }
      return best;
    }
    case Fn::Gcd:
    case Fn::Lcm: {
      BigInt acc = args[0].num().abs();
      for (const auto& a : args) {
        if (!a.is_integer()) return std::nullopt;
        if (static_cast<Fn>(n.sub) == Fn::Gcd) {
          acc = BigInt::gcd(acc, a.num());
        } else {
          BigInt g = BigInt::gcd(acc, a.num());
          if (g.is_zero()) return Rational(0);
          auto prod = BigInt::mul(acc, a.num().abs());
          if (!prod) return std::nullopt;
          BigInt::divmod(*prod, g, &acc, nullptr);
        }
      }
      return Rational::make(acc, BigInt(1));
    }
    case Fn::Exp:
      if (args[0].is_zero()) return Rational(1);
      return std::nullopt;
    case Fn::Ln:
      if (args[0] == Rational(1)) return Rational(0);
      return std::nullopt;
    default:
      return std::nullopt;  // transcendental: only numeric evaluation
  }
}

std::optional<Rational> ex(const Expr& e, int i, uint32_t mask, int depth) {
  if (depth > kMaxEvalDepth) return std::nullopt;
  const Node& n = e.at(i);
  auto kid = [&](size_t k) { return ex(e, n.kids[k], mask, depth + 1); };
  switch (n.kind) {
    case NodeKind::Number:
      return e.values[static_cast<size_t>(n.value)];
    case NodeKind::Neg: {
      auto a = kid(0);
      if (!a) return std::nullopt;
      return a->negated();
    }
    case NodeKind::Add:
    case NodeKind::Mul: {
      Rational acc(n.kind == NodeKind::Add ? 0 : 1);
      for (size_t k = 0; k < n.kids.size(); ++k) {
        auto v = kid(k);
        if (!v) return std::nullopt;
        auto next = n.kind == NodeKind::Add ? Rational::add(acc, *v) : Rational::mul(acc, *v);
        if (!next) return std::nullopt;
        acc = std::move(*next);
      }
      return acc;
    }
    case NodeKind::Div: {
      auto a = kid(0);
      if (!a) return std::nullopt;
      auto b = kid(1);
      if (!b) return std::nullopt;
      return Rational::div(*a, *b);
    }
    case NodeKind::Pow: {
      auto b = kid(0);
      if (!b) return std::nullopt;
      auto x = kid(1);
      if (!x) return std::nullopt;
      return exact_pow(*b, *x);
    }
    case NodeKind::PlusMinus: {
      auto a = kid(0);
      auto b = kid(1);
      if (!a || !b) return std::nullopt;
      bool minus = (((mask >> n.sub) & 1u) != 0) != (n.sub2 != 0);
      return minus ? Rational::sub(*a, *b) : Rational::add(*a, *b);
    }
    case NodeKind::Percent: {
      auto a = kid(0);
      if (!a) return std::nullopt;
      return Rational::div(*a, Rational(100));
    }
    case NodeKind::Func: return ex_func(e, n, mask, depth);
    default:
      return std::nullopt;
  }
}

double int_or_nan(double x) { return std::floor(x) == x ? x : NAN; }

double ev(const Expr& e, int i, const EvalEnv& env, int depth);

double ev_symbol(const Node& n, const EvalEnv& env) {
  if (env.names && env.values) {
    for (size_t k = 0; k < env.names->size(); ++k)
      if ((*env.names)[k] == n.text) return (*env.values)[k];
  }
  return NAN;
}

double ev_pow(const Expr& e, const Node& n, const EvalEnv& env, int depth) {
  double b = ev(e, n.kids[0], env, depth + 1), x = ev(e, n.kids[1], env, depth + 1);
  if (b < 0 && std::floor(x) != x) {
    // (-8)^(1/3): a real odd root exists when the exponent is p/q, q odd.
    auto q = ex(e, n.kids[1], env.pm_mask, depth + 1);
    if (!q || q->den().is_even()) return NAN;
    double r = std::pow(-b, x);
    return q->num().is_even() ? r : -r;
  }
  return std::pow(b, x);
}

// The index-th root of x.
double ev_root(double index, double x) {
  if (index == 2) return x < 0 ? NAN : std::sqrt(x);
  if (index == 3) return std::cbrt(x);
  if (x < 0) return (std::fmod(index, 2.0) == 1.0) ? -std::pow(-x, 1.0 / index) : NAN;
  return std::pow(x, 1.0 / index);
}

double ev_log(double base, double x) {
  if (x <= 0 || base <= 0 || base == 1) return NAN;
  return std::log(x) / std::log(base);
}

// C(a, k): exact for integers up to k = 1000 (rounded product), lgamma beyond.
double ev_binom(double a, double k) {
  if (std::floor(a) == a && std::floor(k) == k) {
    if (k < 0 || k > a) return 0;
    k = std::min(k, a - k);
    if (k <= 1000) {
      double r = 1;
      for (double j = 0; j < k; ++j) r = r * (a - j) / (j + 1);
      return std::round(r);
    }
  }
  return std::exp(std::lgamma(a + 1) - std::lgamma(k + 1) - std::lgamma(a - k + 1));
}

// gcd or lcm of integer arguments below 9e15; NaN for anything else.
double ev_gcd_lcm(const Expr& e, const Node& n, const EvalEnv& env, int depth) {
  int64_t acc = 0;
  for (size_t k = 0; k < n.kids.size(); ++k) {
    double v = int_or_nan(ev(e, n.kids[k], env, depth + 1));
    if (!(std::fabs(v) < 9.0e15)) return NAN;
    auto iv = static_cast<int64_t>(std::fabs(v));
    if (k == 0) {
      acc = iv;
    } else if (static_cast<Fn>(n.sub) == Fn::Gcd) {
      acc = std::gcd(acc, iv);
    } else if (acc != 0 && iv != 0) {
      // lcm = acc / gcd * iv, computed wide: std::lcm overflow is undefined.
      __int128 l = static_cast<__int128>(acc / std::gcd(acc, iv)) * iv;
      if (l > static_cast<__int128>(9.0e15)) return NAN;
      acc = static_cast<int64_t>(l);
    } else {
      acc = 0;
    }
  }
  return static_cast<double>(acc);
}

// max or min of the arguments; a is the first one's value.
double ev_max_min(const Expr& e, const Node& n, const EvalEnv& env, int depth, double a) {
  double best = a;
  for (size_t k = 1; k < n.kids.size(); ++k) {
    double v = ev(e, n.kids[k], env, depth + 1);
    best = static_cast<Fn>(n.sub) == Fn::Max ? std::max(best, v) : std::min(best, v);
  }
  return best;
}

double ev_func(const Expr& e, const Node& n, const EvalEnv& env, int depth) {
  auto kid = [&](size_t k) { return ev(e, n.kids[k], env, depth + 1); };
  double a = kid(0);
  switch (static_cast<Fn>(n.sub)) {
    case Fn::Sqrt: return a < 0 ? NAN : std::sqrt(a);
    case Fn::Root: return ev_root(a, kid(1));
    case Fn::Sin: return std::sin(a);
    case Fn::Cos: return std::cos(a);
    case Fn::Tan: return std::tan(a);
    case Fn::Sec: return 1.0 / std::cos(a);
    case Fn::Csc: return 1.0 / std::sin(a);
    case Fn::Cot: return 1.0 / std::tan(a);
    case Fn::Asin: return std::asin(a);
    case Fn::Acos: return std::acos(a);
    case Fn::Atan: return std::atan(a);
    case Fn::Sinh: return std::sinh(a);
    case Fn::Cosh: return std::cosh(a);
    case Fn::Tanh: return std::tanh(a);
    case Fn::Ln: return a <= 0 ? NAN : std::log(a);
    case Fn::Log: return ev_log(a, kid(1));
    case Fn::Exp: return std::exp(a);
    case Fn::Abs: return std::fabs(a);
    case Fn::Floor: return std::floor(a);
    case Fn::Ceil: return std::ceil(a);
    case Fn::Factorial: return a < 0 ? NAN : std::tgamma(a + 1);
    case Fn::Binom: return ev_binom(a, kid(1));
    case Fn::Gcd:
    case Fn::Lcm: return ev_gcd_lcm(e, n, env, depth);
    case Fn::Max:
    case Fn::Min: return ev_max_min(e, n, env, depth, a);
  }
  return NAN;
}

double ev(const Expr& e, int i, const EvalEnv& env, int depth) {
  if (depth > kMaxEvalDepth) return NAN;
  const Node& n = e.at(i);
  auto kid = [&](size_t k) { return ev(e, n.kids[k], env, depth + 1); };
  switch (n.kind) {
    case NodeKind::Number: return e.approx[static_cast<size_t>(n.value)];
    case NodeKind::Symbol: return ev_symbol(n, env);
    case NodeKind::Pi: return M_PI;
    case NodeKind::E: return M_E;
    case NodeKind::Infinity: return HUGE_VAL;
    case NodeKind::Neg: return -kid(0);
    case NodeKind::Add: {
      double s = 0;
      for (size_t k = 0; k < n.kids.size(); ++k) s += kid(k);
      return s;
    }
    case NodeKind::Mul: {
      double p = 1;
      for (size_t k = 0; k < n.kids.size(); ++k) p *= kid(k);
      return p;
    }
    case NodeKind::Div: {
      double a = kid(0), b = kid(1);
      return b == 0 ? NAN : a / b;  // x/0 is undefined, not infinity
    }
    case NodeKind::Pow: return ev_pow(e, n, env, depth);
    case NodeKind::PlusMinus: {
      bool minus = (((env.pm_mask >> n.sub) & 1u) != 0) != (n.sub2 != 0);
      return minus ? kid(0) - kid(1) : kid(0) + kid(1);
    }
    case NodeKind::Percent: return kid(0) / 100.0;
    case NodeKind::Func: return ev_func(e, n, env, depth);
    default:
      return NAN;
  }
}

template <typename Visit>
void walk(const Expr& e, int root, Visit&& visit) {
  std::vector<int> stack{root};
  while (!stack.empty()) {
    int i = stack.back();
    stack.pop_back();
    const Node& n = e.at(i);
    visit(n);
    for (int k : n.kids) stack.push_back(k);
  }
}

}  // namespace

std::optional<Rational> eval_exact(const Expr& e, int node, uint32_t pm_mask) { return ex(e, node, pm_mask, 0); }

double eval_double(const Expr& e, int node, const EvalEnv& env) { return ev(e, node, env, 0); }

void collect_symbols(const Expr& e, int node, std::vector<std::string>* names) {
  walk(e, node, [&](const Node& n) {
    if (n.kind != NodeKind::Symbol) return;
    for (const auto& s : *names)
      if (s == n.text) return;
    names->push_back(n.text);
  });
}

void collect_plus_minus(const Expr& e, int node, std::vector<int>* indices) {
  walk(e, node, [&](const Node& n) {
    if (n.kind == NodeKind::PlusMinus) indices->push_back(n.sub);
  });
}

bool has_decimal(const Expr& e, int node) {
  bool found = false;
  walk(e, node, [&](const Node& n) { found = found || (n.kind == NodeKind::Number && n.decimal); });
  return found;
}

bool is_scalar(const Expr& e, int node) {
  switch (e.at(node).kind) {
    case NodeKind::Number: case NodeKind::Symbol: case NodeKind::Pi: case NodeKind::E:
    case NodeKind::Infinity: case NodeKind::Neg: case NodeKind::Add: case NodeKind::Mul:
    case NodeKind::Div: case NodeKind::Pow: case NodeKind::PlusMinus: case NodeKind::Func:
    case NodeKind::Percent:
      return true;
    default:
      return false;
  }
}

}  // namespace lockstep::reward::math
