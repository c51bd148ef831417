// The math answer language: a tokenizer for LaTeX-ish answers, a parser with
// an explicit depth limit into a small expression tree, and its exact and
// numeric evaluation. Used by the math verifier to compare answers by value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/reward/bigint.h"

namespace lockstep::reward::math {

// Bounds that make every input terminate quickly (see docs/rewards.md).
inline constexpr size_t kMaxAnswerChars = 2000;  // longer answers are compared as strings only
inline constexpr size_t kMaxTokens = 1500;
inline constexpr int kMaxDepth = 300;            // parser recursion guard (about 40 nested brackets)
inline constexpr int kMaxPlusMinus = 3;          // a +- b terms: at most 2^3 variants

enum class NodeKind : uint8_t {
  Number,     // exact literal: values[value]; decimal says it was written with a point
  Symbol,     // variable: text = name ("x", "x_1", "\\alpha")
  Pi,
  E,
  Infinity,
  Neg,        // -kids[0]
  Add,        // kids[0] + kids[1] + ...
  Mul,        // kids[0] * kids[1] * ...
  Div,        // kids[0] / kids[1]
  Pow,        // kids[0] ^ kids[1]
  PlusMinus,  // kids[0] +- kids[1]; sub = index of this +- (sign choice bit), sub2 = 1 for \mp
  Func,       // sub = Fn, kids = arguments
  Percent,    // kids[0] % (evaluates to kids[0] / 100)
  Text,       // words: text, lower-cased
  Ellipsis,   // "..." (only equal to itself)
  EmptySet,
  Tuple,      // kids; sub = opening bracket char, sub2 = closing bracket char
  Set,        // \{ kids \}
  List,       // a bare "a, b; c and d" list
  Union,      // kids joined by \cup
  Matrix,     // sub rows, sub2 cols, kids row-major
  Relation,   // kids = operands, ops[i] relates kids[i] and kids[i+1]
  Ratio,      // kids[0] : kids[1] : ...
};

enum class Fn : uint8_t {
  Sqrt, Root /* kids: index, radicand */, Sin, Cos, Tan, Sec, Csc, Cot, Asin, Acos, Atan,
  Sinh, Cosh, Tanh, Ln, Log /* kids: base, x */, Exp, Abs, Floor, Ceil, Factorial, Binom,
  Gcd, Lcm, Max, Min
};

enum class RelOp : uint8_t { Eq, Approx, Lt, Le, Gt, Ge, Ne, In };

struct Node {
  NodeKind kind = NodeKind::Number;
  int sub = 0;
  int sub2 = 0;
  bool decimal = false;  // Number written with a decimal point
  bool grouped = false;  // came from a parenthesized group: f(2) keeps "(2)" an argument
  int places = 0;        // Number: digits written after the decimal point (0 for 1e-3 forms)
  int value = -1;        // Number: index into Expr::values
  std::vector<int> kids;
  std::vector<RelOp> ops;  // Relation only
  std::string text;        // Symbol name or Text words
};

// A parsed answer: nodes in an arena, root is the top node.
struct Expr {
  std::vector<Node> nodes;
  std::vector<Rational> values;
  std::vector<double> approx;  // values[i] as a double, computed once
  int root = -1;
  int n_plus_minus = 0;

  const Node& at(int i) const { return nodes[static_cast<size_t>(i)]; }
};

// Parses an answer string (already extracted from a response). Returns
// nullopt when the text is not a well-formed answer or breaks a bound.
std::optional<Expr> parse_answer(std::string_view text);

// Evaluation. Symbols take values from `symbol_value(name)`; `pm_mask` picks
// the sign of each +- (bit i set: minus for +- number i).
struct EvalEnv {
  const std::vector<std::string>* names = nullptr;  // symbol names, parallel to values
  const std::vector<double>* values = nullptr;
  uint32_t pm_mask = 0;
};

// Exact rational value, or nullopt if the node is not a rational number
// (irrational, symbolic, too large, undefined).
std::optional<Rational> eval_exact(const Expr& e, int node, uint32_t pm_mask);
// Double value: NaN when undefined, +-inf when it overflows.
double eval_double(const Expr& e, int node, const EvalEnv& env);

// Facts about a subtree used by the comparison.
void collect_symbols(const Expr& e, int node, std::vector<std::string>* names);
void collect_plus_minus(const Expr& e, int node, std::vector<int>* indices);
bool has_decimal(const Expr& e, int node);
bool is_scalar(const Expr& e, int node);  // a number-valued expression (not a tuple, set, relation...)

}  // namespace lockstep::reward::math

namespace lockstep::reward::math {

// True when `pred` denotes the same answer as `gold` (docs/rewards.md lists
// the rules). `rel_tol` is the relative tolerance for inexact numbers.
// Asymmetric in one respect: a response's "expression = value" counts as
// its value, while a label's equation must be matched as an equation.
bool equivalent(const Expr& gold, const Expr& pred, double rel_tol);

}  // namespace lockstep::reward::math
