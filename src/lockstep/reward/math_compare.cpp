// Equivalence of two parsed answers: numbers exactly (or within a relative
// tolerance when a decimal or an irrational is involved), expressions with
// variables at pseudo-random points, and structure for tuples, sets,
// intervals, matrices, equations and inequalities.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "lockstep/reward/math_expr.h"

namespace lockstep::reward::math {
namespace {

constexpr int kTrials = 12;         // random points per comparison; the last 4 are negative
constexpr int kMinChecks = 3;       // points where both sides must be defined
constexpr size_t kMaxItems = 64;    // list/set sizes compared (pairwise matching is quadratic)
constexpr int kMaxCompareDepth = 48;
constexpr size_t kMaxMatrixCells = 1600;  // numeric matrix arithmetic (products are cubic)
// Expressions with variables are compared in floating point at random
// points: round-off makes an exact match too strict.
constexpr double kSymbolicTol = 1e-9;

struct Ref {
  const Expr* e;
  int i;
  const Node& n() const { return e->at(i); }
  Ref kid(size_t k) const { return Ref{e, n().kids[k]}; }
};

struct Item {
  Ref ref;
  int mask;  // fixed +- choice, or -1
};

struct Interval {
  Ref lo{nullptr, -1}, hi{nullptr, -1};
  int lo_inf = 0, hi_inf = 0;  // -1 / +1 when the end is -inf / +inf
  bool lo_closed = false, hi_closed = false;
};

struct Constraint {
  Ref l, r;  // l - r  (op)  0
  RelOp op;  // Lt, Le or Ne
};

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// The value of a variable at trial t: the same on both sides of a
// comparison, in [0.3, 2.9] (negated for the last trials, so that
// sqrt(x^2) and x are told apart).
double point_value(const std::string& name, int trial) {
  uint64_t h = splitmix(hash_name(name) ^ (static_cast<uint64_t>(trial + 1) * 0xD1B54A32D192ED03ull));
  double u = static_cast<double>(h >> 11) * 0x1.0p-53;
  double v = 0.3 + 2.6 * u;
  return trial >= kTrials - 4 ? -v : v;
}

bool close(double x, double y, double tol) {
  if (!std::isfinite(x) || !std::isfinite(y)) return false;
  return std::fabs(x - y) <= tol * std::max(std::fabs(x), std::fabs(y)) + 1e-12;
}

int inf_sign(Ref r) {
  const Node& n = r.n();
  if (n.kind == NodeKind::Infinity) return 1;
  if (n.kind == NodeKind::Neg && r.kid(0).n().kind == NodeKind::Infinity) return -1;
  if (n.kind == NodeKind::Add && n.kids.size() == 1) return inf_sign(r.kid(0));
  return 0;
}

bool name_like(Ref r, int depth = 0) {
  if (depth > 16) return false;
  const Node& n = r.n();
  switch (n.kind) {
    case NodeKind::Symbol:
      return true;
    case NodeKind::Mul:
    case NodeKind::Div:
    case NodeKind::Ratio: {
      if (!name_like(r.kid(0), depth + 1)) return false;
      for (size_t k = 1; k < n.kids.size(); ++k) {
        Ref kid = r.kid(k);
        if (!kid.n().grouped && !name_like(kid, depth + 1)) return false;
      }
      return true;
    }
    case NodeKind::Pow:
      return name_like(r.kid(0), depth + 1);
    case NodeKind::Tuple:
      for (size_t k = 0; k < n.kids.size(); ++k)
        if (!name_like(r.kid(k), depth + 1)) return false;
      return true;
    case NodeKind::Func:
      return name_like(r.kid(n.kids.size() - 1), depth + 1);
    default:
      return false;
  }
}

bool variable_free(Ref r) {
  std::vector<std::string> names;
  collect_symbols(*r.e, r.i, &names);
  return names.empty();
}

bool ops_in(const Node& n, std::initializer_list<RelOp> allowed) {
  if (n.kind != NodeKind::Relation) return false;
  for (RelOp op : n.ops) {
    bool ok = false;
    for (RelOp a : allowed) ok = ok || op == a;
    if (!ok) return false;
  }
  return true;
}

bool is_equation(Ref r) { return ops_in(r.n(), {RelOp::Eq, RelOp::Approx}); }
bool is_inequality(Ref r) { return ops_in(r.n(), {RelOp::Lt, RelOp::Le, RelOp::Gt, RelOp::Ge, RelOp::Ne}); }

// x \in S  ->  S  when x is a name.
Ref strip_in(Ref r) {
  const Node& n = r.n();
  if (n.kind == NodeKind::Relation && n.ops.size() == 1 && n.ops[0] == RelOp::In && name_like(r.kid(0)))
    return r.kid(1);
  return r;
}

// x = 5  ->  5  (a list item that names its value).
Ref strip_assignment(Ref r) {
  const Node& n = r.n();
  if (n.kind == NodeKind::Relation && n.ops.size() == 1 &&
      (n.ops[0] == RelOp::Eq || n.ops[0] == RelOp::Approx) && name_like(r.kid(0)))
    return r.kid(1);
  return strip_in(r);
}

// A decimal written with at least this many places may stand for a fraction
// without a finite decimal expansion when it is that fraction rounded or cut
// to its places (0.333 = 1/3, 0.667 = 2/3, but 0.33 != 1/3, 4.67 != 14/3) ...
constexpr int kMinApproxPlaces = 3;
constexpr int kMaxApproxPlaces = 40;
// ... and lies within this relative distance of it (so 0.001 is not 1/1500).
constexpr int64_t kApproxRelTolDenominator = 1000;  // 1e-3
constexpr size_t kMaxApproxDenBits = 256;

// The places of a decimal literal, possibly negated; -1 for anything else.
int decimal_places(Ref r) {
  const Node& n = r.n();
  if (n.kind == NodeKind::Neg) return decimal_places(r.kid(0));
  if (n.kind == NodeKind::Number && n.decimal) return n.places;
  return -1;
}

// True when v has a finite decimal expansion (its denominator is 2^a 5^b).
bool terminates(const Rational& v) {
  BigInt d = v.den();
  for (int64_t p : {2, 5}) {
    for (;;) {
      BigInt q, r;
      BigInt::divmod(d, BigInt(p), &q, &r);
      if (!r.is_zero()) break;
      d = q;
    }
  }
  return d.is_one();
}

// d, written with `places` decimal places, is the exact value v rounded or
// truncated to those places, and within the relative tolerance of it.
bool decimal_stands_for(const Rational& d, int places, const Rational& v) {
  if (places < kMinApproxPlaces || places > kMaxApproxPlaces) return false;
  if (v.den().bits() > kMaxApproxDenBits || terminates(v)) return false;
  auto scale = Rational::pow(Rational(10), places);
  if (!scale) return false;
  auto vs = Rational::mul(v, *scale), ds = Rational::mul(d, *scale);
  if (!vs || !ds || !ds->is_integer()) return false;
  BigInt q, r;  // q = v * 10^places truncated toward zero
  BigInt::divmod(vs->num(), vs->den(), &q, &r);
  auto other = vs->sign() < 0 ? BigInt::sub(q, BigInt(1)) : BigInt::add(q, BigInt(1));
  if (!other || !(ds->num() == q || ds->num() == *other)) return false;
  auto diff = Rational::sub(d, v);
  if (!diff) return false;
  auto lhs = Rational::mul(*diff, Rational(kApproxRelTolDenominator));
  if (!lhs) return false;
  Rational abs_lhs = lhs->sign() < 0 ? lhs->negated() : *lhs;
  Rational abs_v = v.sign() < 0 ? v.negated() : v;
  return Rational::compare(abs_lhs, abs_v) <= 0;
}

struct Equation {
  Ref lhs{nullptr, -1}, rhs{nullptr, -1};
  bool has_value = false;
  Ref value{nullptr, -1};
};

// Reduces an equation chain. Returns false and sets *only_value when the
// chain is a computation whose last part is the answer (1 = x = 0 -> 0).
bool reduce_equation(Ref r, bool is_pred, Equation* eq, Ref* only_value) {
  const Node& n = r.n();
  size_t keep = n.kids.size();
  // x = 1/3 \approx 0.33 and \frac{\sqrt3}{3} \approx 0.577: an approximation
  // after a value is dropped (x \approx 11 alone still means x = 11).
  for (size_t k = 0; k < n.ops.size(); ++k) {
    if (n.ops[k] == RelOp::Approx && (k > 0 || !name_like(r.kid(0)))) {
      keep = k + 1;
      break;
    }
  }
  if (keep == 1) {
    *only_value = r.kid(0);
    return false;
  }
  if (keep >= 3) {
    if (!name_like(r.kid(0))) {
      *only_value = r.kid(keep - 1);
      return false;
    }
    eq->lhs = r.kid(0);
    eq->rhs = r.kid(keep - 1);
  } else {
    eq->lhs = r.kid(0);
    eq->rhs = r.kid(1);
  }
  bool lname = name_like(eq->lhs), rname = name_like(eq->rhs);
  if (lname) {
    eq->has_value = true;
    eq->value = eq->rhs;
  } else if (rname) {
    eq->has_value = true;
    eq->value = eq->lhs;
  } else if (is_pred && variable_free(eq->lhs)) {
    // A response's "1/2 + 1/3 = 5/6": the last value is its answer.
    eq->has_value = true;
    eq->value = eq->rhs;
  }
  return true;
}

class Comparer {
 public:
  explicit Comparer(double tol) : tol_(tol) {}

  bool top(Ref a, Ref b, int depth) {
    if (depth > kMaxCompareDepth) return false;
    a = strip_in(a);
    b = strip_in(b);
    bool ea = is_equation(a), eb = is_equation(b);
    if (ea || eb) {
      Equation ga, pb;
      Ref va{nullptr, -1}, vb{nullptr, -1};
      if (ea && !reduce_equation(a, false, &ga, &va)) return top(va, b, depth + 1);
      if (eb && !reduce_equation(b, true, &pb, &vb)) return top(a, vb, depth + 1);
      if (ea && eb) {
        if (ga.has_value && pb.has_value && top(ga.value, pb.value, depth + 1)) return true;
        return proportional(ga.lhs, ga.rhs, pb.lhs, pb.rhs, false);
      }
      if (ea) return ga.has_value && top(ga.value, b, depth + 1);
      return pb.has_value && top(a, pb.value, depth + 1);
    }
    bool ia = is_inequality(a), ib = is_inequality(b);
    if (ia || ib) {
      if (ia && ib && constraints_equal(a, b)) return true;
      Interval x, y;
      if (!(ia ? inequality_interval(a, &x) : as_interval(a, &x))) return false;
      if (!(ib ? inequality_interval(b, &y) : as_interval(b, &y))) return false;
      return interval_equal(x, y);
    }
    return equal(a, b, depth + 1);
  }

 private:
  bool equal(Ref a, Ref b, int depth) {
    const Node& x = a.n();
    const Node& y = b.n();
    bool sa = is_scalar(*a.e, a.i), sb = is_scalar(*b.e, b.i);
    if (matrix_arithmetic(a) || matrix_arithmetic(b)) return matrix_values_equal(a, b);
    if (sa && sb) return scalar_equal(a, -1, b, -1);
    if (auto decided = structure_equal(a, b, depth)) return *decided;
    auto kind_is = [](const Node& n, NodeKind k) { return n.kind == k; };
    auto collection = [](const Node& n) { return n.kind == NodeKind::List || n.kind == NodeKind::Set; };
    auto empty_set = [](const Node& n) {
      return n.kind == NodeKind::EmptySet || (n.kind == NodeKind::Set && n.kids.empty());
    };
    if (empty_set(x) || empty_set(y)) return empty_set(x) && empty_set(y);
    if (kind_is(x, NodeKind::Text) && kind_is(y, NodeKind::Text)) return x.text == y.text;
    if (kind_is(x, NodeKind::Ellipsis) || kind_is(y, NodeKind::Ellipsis)) return x.kind == y.kind;
    if (kind_is(x, NodeKind::Tuple) && kind_is(y, NodeKind::Tuple)) {
      if (bracket(x.sub) != bracket(y.sub) || bracket(x.sub2) != bracket(y.sub2)) return false;
      return ordered(items_of(a), items_of(b), depth);
    }
    if (kind_is(x, NodeKind::Matrix) && kind_is(y, NodeKind::Matrix)) {
      if (x.sub != y.sub || x.sub2 != y.sub2) return false;
      for (size_t k = 0; k < x.kids.size(); ++k)
        if (!top(a.kid(k), b.kid(k), depth + 1)) return false;
      return true;
    }
    if (kind_is(x, NodeKind::Matrix) || kind_is(y, NodeKind::Matrix)) {
      // A row or column vector written as a tuple.
      const Node& m = kind_is(x, NodeKind::Matrix) ? x : y;
      const Node& t = kind_is(x, NodeKind::Matrix) ? y : x;
      if (t.kind != NodeKind::Tuple || bracket(t.sub) != '(' || (m.sub != 1 && m.sub2 != 1)) return false;
      if (m.kids.size() != t.kids.size()) return false;
      for (size_t k = 0; k < m.kids.size(); ++k)
        if (!top(a.kid(k), b.kid(k), depth + 1)) return false;
      return true;
    }
    if (kind_is(x, NodeKind::Union) && kind_is(y, NodeKind::Union)) {
      std::vector<Item> ia, ib;
      for (size_t k = 0; k < x.kids.size(); ++k) ia.push_back({a.kid(k), -1});
      for (size_t k = 0; k < y.kids.size(); ++k) ib.push_back({b.kid(k), -1});
      return unordered(ia, ib, depth);
    }
    if (kind_is(x, NodeKind::Ratio) || kind_is(y, NodeKind::Ratio)) return ratio_equal(a, b);
    // Lists, sets, tuples and +- scalars: sets compare without order; a
    // bare list against a tuple keeps the tuple's order.
    bool ca = collection(x) || (sa && has_plus_minus(a));
    bool cb = collection(y) || (sb && has_plus_minus(b));
    bool ta = kind_is(x, NodeKind::Tuple), tb = kind_is(y, NodeKind::Tuple);
    if ((ca || ta) && (cb || tb)) {
      bool set_a = kind_is(x, NodeKind::Set), set_b = kind_is(y, NodeKind::Set);
      if ((ta || tb) && !set_a && !set_b) return ordered(items_of(a), items_of(b), depth);
      return unordered(items_of(a), items_of(b), depth);
    }
    return false;
  }

  // A numeric matrix: rows x cols values, row-major.
  struct NumMatrix {
    int rows = 0, cols = 0;
    std::vector<double> v;
  };

  // Sums, products and negations with a matrix among their operands
  // ("A + B", "A B", "2A"): their value is a matrix, not a number.
  static bool matrix_arithmetic(Ref r, int depth = 0) {
    const Node& n = r.n();
    bool arithmetic = n.kind == NodeKind::Add || n.kind == NodeKind::Mul || n.kind == NodeKind::Neg;
    if (depth > 8 || !arithmetic) return false;
    for (size_t k = 0; k < n.kids.size(); ++k) {
      Ref kid = r.kid(k);
      if (kid.n().kind == NodeKind::Matrix || matrix_arithmetic(kid, depth + 1)) return true;
    }
    return false;
  }

  // The value of a matrix expression with numeric entries: a matrix, a sum of
  // matrices of one shape, a product of matrices and numbers, a negation. A
  // plain number is a 1x1 "scalar" (rows = cols = 0).
  static bool numeric_matrix(Ref r, NumMatrix* out, int depth = 0) {
    const Node& n = r.n();
    if (depth > 8) return false;
    if (n.kind == NodeKind::Matrix) {
      if (static_cast<size_t>(n.sub) * static_cast<size_t>(n.sub2) > kMaxMatrixCells) return false;
      *out = NumMatrix{n.sub, n.sub2, {}};
      for (size_t k = 0; k < n.kids.size(); ++k) {
        Ref cell = r.kid(k);
        if (!is_scalar(*cell.e, cell.i) || !variable_free(cell)) return false;
        out->v.push_back(eval_double(*cell.e, cell.i, EvalEnv{}));
      }
      return true;
    }
    if (!matrix_arithmetic(r)) {
      if (!is_scalar(*r.e, r.i) || !variable_free(r)) return false;
      *out = NumMatrix{0, 0, {eval_double(*r.e, r.i, EvalEnv{})}};
      return true;
    }
    if (!numeric_matrix(r.kid(0), out, depth + 1)) return false;
    if (n.kind == NodeKind::Neg) {
      for (double& x : out->v) x = -x;
      return true;
    }
    for (size_t k = 1; k < n.kids.size(); ++k) {
      NumMatrix m;
      if (!numeric_matrix(r.kid(k), &m, depth + 1)) return false;
      if (!(n.kind == NodeKind::Add ? matrix_add(out, m) : matrix_mul(out, m))) return false;
    }
    return true;
  }

  static bool matrix_add(NumMatrix* acc, const NumMatrix& m) {
    if (acc->rows != m.rows || acc->cols != m.cols || acc->rows == 0) return false;
    for (size_t k = 0; k < acc->v.size(); ++k) acc->v[k] += m.v[k];
    return true;
  }

  static bool matrix_mul(NumMatrix* acc, const NumMatrix& m) {
    if (acc->rows == 0 || m.rows == 0) {  // a number times a matrix
      double c = acc->rows == 0 ? acc->v[0] : m.v[0];
      NumMatrix out = acc->rows == 0 ? m : *acc;
      for (double& x : out.v) x *= c;
      *acc = std::move(out);
      return true;
    }
    if (acc->cols != m.rows) return false;
    NumMatrix out{acc->rows, m.cols, std::vector<double>(static_cast<size_t>(acc->rows) * m.cols, 0.0)};
    for (int i = 0; i < acc->rows; ++i)
      for (int j = 0; j < m.cols; ++j)
        for (int k = 0; k < acc->cols; ++k)
          out.v[static_cast<size_t>(i) * m.cols + j] +=
              acc->v[static_cast<size_t>(i) * acc->cols + k] * m.v[static_cast<size_t>(k) * m.cols + j];
    *acc = std::move(out);
    return true;
  }

  bool matrix_values_equal(Ref a, Ref b) {
    NumMatrix x, y;
    if (!numeric_matrix(a, &x) || !numeric_matrix(b, &y)) return false;
    if (x.rows != y.rows || x.cols != y.cols || x.rows == 0) return false;
    for (size_t k = 0; k < x.v.size(); ++k)
      if (!close(x.v[k], y.v[k], tol_) && !(x.v[k] == 0 && y.v[k] == 0)) return false;
    return true;
  }

  struct Assignment {
    std::string name;
    Ref value;
  };

  // "x=1, y=2": a list of assignments to two or more distinct variables,
  // sorted by name.
  static bool assignments(Ref r, std::vector<Assignment>* out) {
    const Node& n = r.n();
    if (n.kind != NodeKind::List || n.kids.size() < 2 || n.kids.size() > kMaxItems) return false;
    for (size_t k = 0; k < n.kids.size(); ++k) {
      Ref item = r.kid(k);
      const Node& m = item.n();
      if (m.kind != NodeKind::Relation || m.ops.size() != 1 || m.ops[0] != RelOp::Eq) return false;
      if (item.kid(0).n().kind != NodeKind::Symbol) return false;
      out->push_back({item.kid(0).n().text, item.kid(1)});
    }
    auto by_name = [](const Assignment& p, const Assignment& q) { return p.name < q.name; };
    std::sort(out->begin(), out->end(), by_name);
    for (size_t k = 1; k < out->size(); ++k)
      if ((*out)[k].name == (*out)[k - 1].name) return false;
    return true;
  }

  // Both sides assign: the same variables with equal values. One side a
  // tuple: the values in the alphabetical order of their variables, as in
  // (x, y) or (a, b, c).
  bool assignments_equal(const std::vector<Assignment>& ma, Ref b, const std::vector<Assignment>* mb,
                         int depth) {
    if (mb) {
      if (ma.size() != mb->size()) return false;
      for (size_t k = 0; k < ma.size(); ++k)
        if (ma[k].name != (*mb)[k].name || !top(ma[k].value, (*mb)[k].value, depth + 1)) return false;
      return true;
    }
    const Node& t = b.n();
    if (t.kids.size() != ma.size()) return false;
    for (size_t k = 0; k < ma.size(); ++k)
      if (!top(ma[k].value, b.kid(k), depth + 1)) return false;
    return true;
  }

  // The one variable of an inequality, or "" when it has none or several.
  static std::string inequality_variable(Ref r) {
    std::vector<std::string> names;
    collect_symbols(*r.e, r.i, &names);
    return names.size() == 1 ? names[0] : std::string();
  }

  // A union of intervals, or a list of inequalities in one variable
  // ("x < 1 or x > 2"), as its intervals.
  static bool interval_parts(Ref r, std::vector<Interval>* out) {
    const Node& n = r.n();
    if (n.kids.size() > kMaxItems) return false;
    std::string var;
    for (size_t k = 0; k < n.kids.size(); ++k) {
      Ref part = r.kid(k);
      Interval iv;
      if (n.kind == NodeKind::Union) {
        if (!as_interval(part, &iv) && !inequality_interval(part, &iv)) return false;
      } else {
        std::string v = inequality_variable(part);
        if (v.empty() || (k > 0 && v != var) || !inequality_interval(part, &iv)) return false;
        var = v;
      }
      out->push_back(iv);
    }
    return !out->empty();
  }

  bool intervals_match(const std::vector<Interval>& a, const std::vector<Interval>& b) {
    if (a.size() != b.size()) return false;
    std::vector<bool> used(b.size(), false);
    for (const auto& x : a) {
      bool found = false;
      for (size_t k = 0; k < b.size() && !found; ++k) {
        if (used[k] || !interval_equal(x, b[k])) continue;
        used[k] = found = true;
      }
      if (!found) return false;
    }
    return true;
  }

  // Comparisons decided by structure before the generic list, set and tuple
  // rules: assignment lists, and unions against lists of inequalities.
  // nullopt when none applies.
  std::optional<bool> structure_equal(Ref a, Ref b, int depth) {
    std::vector<Assignment> ma, mb;
    bool am = assignments(a, &ma), bm = assignments(b, &mb);
    if (am && bm) return assignments_equal(ma, b, &mb, depth);
    if (am && b.n().kind == NodeKind::Tuple) return assignments_equal(ma, b, nullptr, depth);
    if (bm && a.n().kind == NodeKind::Tuple) return assignments_equal(mb, a, nullptr, depth);
    bool ua = a.n().kind == NodeKind::Union, ub = b.n().kind == NodeKind::Union;
    bool la = a.n().kind == NodeKind::List, lb = b.n().kind == NodeKind::List;
    if ((ua && lb) || (la && ub)) {
      std::vector<Interval> ia, ib;
      if (interval_parts(a, &ia) && interval_parts(b, &ib)) return intervals_match(ia, ib);
    }
    return std::nullopt;
  }

  static char bracket(int c) {
    if (c == '<') return '(';
    if (c == '>') return ')';
    return static_cast<char>(c);
  }

  bool has_plus_minus(Ref r) {
    std::vector<int> pm;
    collect_plus_minus(*r.e, r.i, &pm);
    return !pm.empty();
  }

  std::vector<int> masks_of(Ref r) {
    std::vector<int> pm;
    collect_plus_minus(*r.e, r.i, &pm);
    std::vector<int> masks;
    size_t k = std::min<size_t>(pm.size(), kMaxPlusMinus);
    for (int c = 0; c < (1 << k); ++c) {
      int m = 0;
      for (size_t j = 0; j < k; ++j)
        if ((c >> j) & 1) m |= 1 << pm[j];
      masks.push_back(m);
    }
    return masks;
  }

  void add_item(Ref r, std::vector<Item>* out, int depth) {
    if (depth > 8 || out->size() > kMaxItems) return;
    r = strip_assignment(r);
    const Node& n = r.n();
    if (n.kind == NodeKind::List) {
      for (size_t k = 0; k < n.kids.size(); ++k) add_item(r.kid(k), out, depth + 1);
      return;
    }
    if (is_scalar(*r.e, r.i) && has_plus_minus(r)) {
      for (int m : masks_of(r)) out->push_back({r, m});
      return;
    }
    out->push_back({r, -1});
  }

  std::vector<Item> items_of(Ref r) {
    std::vector<Item> out;
    const Node& n = r.n();
    if (n.kind == NodeKind::List || n.kind == NodeKind::Set || n.kind == NodeKind::Tuple) {
      for (size_t k = 0; k < n.kids.size(); ++k) add_item(r.kid(k), &out, 0);
    } else {
      add_item(r, &out, 0);
    }
    return out;
  }

  bool item_equal(const Item& x, const Item& y, int depth) {
    if ((x.mask >= 0 || y.mask >= 0) && is_scalar(*x.ref.e, x.ref.i) && is_scalar(*y.ref.e, y.ref.i))
      return scalar_equal(x.ref, x.mask, y.ref, y.mask);
    return top(x.ref, y.ref, depth + 1);
  }

  bool ordered(const std::vector<Item>& a, const std::vector<Item>& b, int depth) {
    if (a.size() != b.size() || a.size() > kMaxItems) return false;
    for (size_t k = 0; k < a.size(); ++k)
      if (!item_equal(a[k], b[k], depth)) return false;
    return true;
  }

  // Set equality: each item of one side equals some item of the other
  // (repeats do not count, as for sets of solutions).
  bool unordered(const std::vector<Item>& a, const std::vector<Item>& b, int depth) {
    if (a.empty() || b.empty() || a.size() > kMaxItems || b.size() > kMaxItems) return a.empty() && b.empty();
    std::vector<bool> matched_b(b.size(), false);
    for (const auto& x : a) {
      bool found = false;
      for (size_t k = 0; k < b.size(); ++k) {
        if (matched_b[k] && found) continue;
        if (item_equal(x, b[k], depth)) {
          found = true;
          matched_b[k] = true;
        }
      }
      if (!found) return false;
    }
    for (size_t k = 0; k < b.size(); ++k) {
      if (matched_b[k]) continue;
      bool found = false;
      for (size_t i = 0; i < a.size() && !found; ++i) found = item_equal(a[i], b[k], depth);
      if (!found) return false;
    }
    return true;
  }

  // Percent: 50% also matches 50 (the number the "%" annotates).
  bool scalar_equal(Ref a, int ma, Ref b, int mb) {
    Ref alts_a[2] = {a, a}, alts_b[2] = {b, b};
    int na = 1, nb = 1;
    if (a.n().kind == NodeKind::Percent) alts_a[na++] = a.kid(0);
    if (b.n().kind == NodeKind::Percent) alts_b[nb++] = b.kid(0);
    for (int i = 0; i < na; ++i)
      for (int j = 0; j < nb; ++j)
        if (variants_equal(alts_a[i], ma, alts_b[j], mb)) return true;
    return false;
  }

  bool variants_equal(Ref a, int ma, Ref b, int mb) {
    std::vector<int> va = ma >= 0 ? std::vector<int>{ma} : masks_of(a);
    std::vector<int> vb = mb >= 0 ? std::vector<int>{mb} : masks_of(b);
    if (va.size() == 1 && vb.size() == 1) return value_equal(a, va[0], b, vb[0]);
    // a +- b denotes a set of values: compare as sets.
    for (int x : va) {
      bool found = false;
      for (int y : vb) found = found || value_equal(a, x, b, y);
      if (!found) return false;
    }
    for (int y : vb) {
      bool found = false;
      for (int x : va) found = found || value_equal(a, x, b, y);
      if (!found) return false;
    }
    return true;
  }

  bool value_equal(Ref a, int ma, Ref b, int mb) {
    int ia = inf_sign(a), ib = inf_sign(b);
    if (ia || ib) return ia == ib;
    std::vector<std::string> names;
    collect_symbols(*a.e, a.i, &names);
    collect_symbols(*b.e, b.i, &names);
    if (names.empty()) {
      auto xa = eval_exact(*a.e, a.i, static_cast<uint32_t>(ma));
      auto xb = eval_exact(*b.e, b.i, static_cast<uint32_t>(mb));
      if (xa && xb) {
        if (*xa == *xb) return true;
        // Exact rationals written without a decimal point must match exactly
        // (1/3 is not 0.3333, 10^20+1 is not 10^20).
        bool da = has_decimal(*a.e, a.i), db = has_decimal(*b.e, b.i);
        if (!da && !db) return false;
        // A decimal that rounds a fraction given exactly (0.333 for 1/3).
        if (da != db && (da ? decimal_stands_for(*xa, decimal_places(a), *xb)
                            : decimal_stands_for(*xb, decimal_places(b), *xa)))
          return true;
      }
      EvalEnv ea, eb;
      ea.pm_mask = static_cast<uint32_t>(ma);
      eb.pm_mask = static_cast<uint32_t>(mb);
      return close(eval_double(*a.e, a.i, ea), eval_double(*b.e, b.i, eb), tol_);
    }
    std::vector<double> vals(names.size());
    EvalEnv ea{&names, &vals, static_cast<uint32_t>(ma)};
    EvalEnv eb{&names, &vals, static_cast<uint32_t>(mb)};
    int checks = 0;
    for (int t = 0; t < kTrials; ++t) {
      for (size_t k = 0; k < names.size(); ++k) vals[k] = point_value(names[k], t);
      double da = eval_double(*a.e, a.i, ea), db = eval_double(*b.e, b.i, eb);
      if (!std::isfinite(da) || !std::isfinite(db)) continue;
      if (!close(da, db, std::max(tol_, kSymbolicTol))) return false;
      ++checks;
    }
    return checks >= kMinChecks;
  }

  // (la - ra) = c * (lb - rb) for a constant c (c > 0 when positive_only).
  bool proportional(Ref la, Ref ra, Ref lb, Ref rb, bool positive_only) {
    std::vector<std::string> names;
    for (Ref r : {la, ra, lb, rb}) collect_symbols(*r.e, r.i, &names);
    std::vector<double> vals(names.size());
    EvalEnv env{&names, &vals, 0};
    int trials = names.empty() ? 1 : kTrials;
    double ratio = NAN;
    int checks = 0;
    for (int t = 0; t < trials; ++t) {
      for (size_t k = 0; k < names.size(); ++k) vals[k] = point_value(names[k], t);
      double a1 = eval_double(*la.e, la.i, env), a2 = eval_double(*ra.e, ra.i, env);
      double b1 = eval_double(*lb.e, lb.i, env), b2 = eval_double(*rb.e, rb.i, env);
      double fa = a1 - a2, fb = b1 - b2;
      if (!std::isfinite(fa) || !std::isfinite(fb)) continue;
      bool za = std::fabs(fa) <= kSymbolicTol * std::max({std::fabs(a1), std::fabs(a2), 1.0});
      bool zb = std::fabs(fb) <= kSymbolicTol * std::max({std::fabs(b1), std::fabs(b2), 1.0});
      ++checks;
      if (za && zb) continue;
      if (za != zb) return false;
      double r = fa / fb;
      if (std::isnan(ratio)) {
        ratio = r;
      } else if (!close(r, ratio, std::max(tol_, kSymbolicTol))) {
        return false;
      }
    }
    if (positive_only && !std::isnan(ratio) && ratio <= 0) return false;
    return checks >= std::min(kMinChecks, trials);
  }

  std::vector<Constraint> constraints(Ref r) {
    const Node& n = r.n();
    std::vector<Constraint> out;
    for (size_t k = 0; k < n.ops.size(); ++k) {
      Ref p = r.kid(k), q = r.kid(k + 1);
      switch (n.ops[k]) {
        case RelOp::Lt: out.push_back({p, q, RelOp::Lt}); break;
        case RelOp::Le: out.push_back({p, q, RelOp::Le}); break;
        case RelOp::Gt: out.push_back({q, p, RelOp::Lt}); break;
        case RelOp::Ge: out.push_back({q, p, RelOp::Le}); break;
        default: out.push_back({p, q, RelOp::Ne}); break;
      }
    }
    return out;
  }

  bool constraints_equal(Ref a, Ref b) {
    auto ca = constraints(a), cb = constraints(b);
    if (ca.size() != cb.size()) return false;
    for (size_t k = 0; k < ca.size(); ++k) {
      if (ca[k].op != cb[k].op) return false;
      if (!proportional(ca[k].l, ca[k].r, cb[k].l, cb[k].r, ca[k].op != RelOp::Ne)) return false;
    }
    return true;
  }

  static bool as_interval(Ref r, Interval* out) {
    const Node& n = r.n();
    if (n.kind != NodeKind::Tuple || n.kids.size() != 2) return false;
    if ((n.sub != '(' && n.sub != '[') || (n.sub2 != ')' && n.sub2 != ']')) return false;
    out->lo = r.kid(0);
    out->hi = r.kid(1);
    out->lo_inf = inf_sign(out->lo);
    out->hi_inf = inf_sign(out->hi);
    out->lo_closed = n.sub == '[';
    out->hi_closed = n.sub2 == ']';
    return true;
  }

  // a < x <= b, x > a, ...: the interval of the one variable.
  static bool inequality_interval(Ref r, Interval* out) {
    const Node& n = r.n();
    if (!is_inequality(r)) return false;
    for (RelOp op : n.ops)
      if (op == RelOp::Ne) return false;
    auto bound = [](Ref p) { return !name_like(p) && variable_free(p); };
    if (n.kids.size() == 2) {
      Ref p = r.kid(0), q = r.kid(1);
      RelOp op = n.ops[0];
      if (bound(p) && name_like(q)) {  // flip "5 < x" to "x > 5"
        std::swap(p, q);
        op = op == RelOp::Lt ? RelOp::Gt : op == RelOp::Gt ? RelOp::Lt : op == RelOp::Le ? RelOp::Ge : RelOp::Le;
      }
      if (!name_like(p) || !bound(q)) return false;
      if (op == RelOp::Lt || op == RelOp::Le) {
        out->lo_inf = -1;
        out->hi = q;
        out->hi_closed = op == RelOp::Le;
      } else {
        out->hi_inf = 1;
        out->lo = q;
        out->lo_closed = op == RelOp::Ge;
      }
      return true;
    }
    if (n.kids.size() == 3 && bound(r.kid(0)) && name_like(r.kid(1)) && bound(r.kid(2))) {
      bool up = (n.ops[0] == RelOp::Lt || n.ops[0] == RelOp::Le) && (n.ops[1] == RelOp::Lt || n.ops[1] == RelOp::Le);
      bool down = (n.ops[0] == RelOp::Gt || n.ops[0] == RelOp::Ge) && (n.ops[1] == RelOp::Gt || n.ops[1] == RelOp::Ge);
      if (!up && !down) return false;
      Ref lo = up ? r.kid(0) : r.kid(2), hi = up ? r.kid(2) : r.kid(0);
      RelOp lo_op = up ? n.ops[0] : n.ops[1], hi_op = up ? n.ops[1] : n.ops[0];
      out->lo = lo;
      out->hi = hi;
      out->lo_inf = inf_sign(lo);
      out->hi_inf = inf_sign(hi);
      out->lo_closed = lo_op == RelOp::Le || lo_op == RelOp::Ge;
      out->hi_closed = hi_op == RelOp::Le || hi_op == RelOp::Ge;
      return true;
    }
    return false;
  }

  bool interval_equal(const Interval& x, const Interval& y) {
    if (x.lo_inf != y.lo_inf || x.hi_inf != y.hi_inf) return false;
    if (!x.lo_inf && (x.lo_closed != y.lo_closed || !scalar_equal(x.lo, -1, y.lo, -1))) return false;
    if (!x.hi_inf && (x.hi_closed != y.hi_closed || !scalar_equal(x.hi, -1, y.hi, -1))) return false;
    return true;
  }

  // Ratios a:b compare by proportion; a 2-part ratio also equals a/b.
  bool ratio_equal(Ref a, Ref b) {
    auto parts = [](Ref r) {
      std::vector<double> v;
      EvalEnv env;
      const Node& n = r.n();
      if (n.kind == NodeKind::Ratio) {
        for (size_t k = 0; k < n.kids.size(); ++k) v.push_back(eval_double(*r.e, n.kids[k], env));
      } else if (is_scalar(*r.e, r.i)) {
        v = {eval_double(*r.e, r.i, env), 1.0};
      }
      return v;
    };
    auto pa = parts(a), pb = parts(b);
    if (pa.size() != pb.size() || pa.size() < 2) return false;
    for (size_t k = 1; k < pa.size(); ++k) {
      if (pa[k] == 0 || pb[k] == 0) return false;
      if (!close(pa[0] / pa[k], pb[0] / pb[k], tol_)) return false;
    }
    return true;
  }

  double tol_;
};

}  // namespace

bool equivalent(const Expr& gold, const Expr& pred, double rel_tol) {
  if (gold.root < 0 || pred.root < 0) return false;
  Comparer c(rel_tol);
  return c.top(Ref{&gold, gold.root}, Ref{&pred, pred.root}, 0);
}

}  // namespace lockstep::reward::math
