// Recursive-descent parser for math answers, over the tokens of
// math_lex.cpp. It guards its recursion depth (kMaxDepth) and item counts,
// so hostile input fails fast instead of overflowing the stack.
#include <algorithm>

#include "lockstep/reward/math_expr.h"
#include "lockstep/reward/math_token.h"

namespace lockstep::reward::math {
namespace {

using detail::ParseError;
using detail::Tk;
using detail::Token;

// ---------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) { toks_.push_back(Token{}); }

  Expr run() {
    bool only_words = true;
    for (size_t i = 0; i + 1 < toks_.size(); ++i)
      if (toks_[i].kind != Tk::Word && toks_[i].kind != Tk::Sep) only_words = false;
    if (toks_.size() == 1) throw ParseError{};
    if (only_words) {
      e_.root = parse_text_list();
    } else {
      std::vector<int> items = parse_items(Tk::End, "");
      e_.root = items.size() == 1 ? items[0] : make_list(NodeKind::List, std::move(items));
    }
    if (peek().kind != Tk::End) throw ParseError{};
    return std::move(e_);
  }

 private:
  struct Guard {
    explicit Guard(int* d) : d_(d) {
      if (++*d_ > kMaxDepth) throw ParseError{};
    }
    ~Guard() { --*d_; }
    int* d_;
  };

  const Token& peek(size_t k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool is(Tk k, std::string_view text = {}) const {
    return peek().kind == k && (text.empty() || peek().text == text);
  }
  void expect(Tk k, std::string_view text = {}) {
    if (!is(k, text)) throw ParseError{};
    next();
  }

  int add(Node n) {
    e_.nodes.push_back(std::move(n));
    return static_cast<int>(e_.nodes.size()) - 1;
  }
  int make(NodeKind k, std::vector<int> kids, int sub = 0, int sub2 = 0) {
    Node n;
    n.kind = k;
    n.kids = std::move(kids);
    n.sub = sub;
    n.sub2 = sub2;
    return add(std::move(n));
  }
  int make_list(NodeKind k, std::vector<int> kids) { return make(k, std::move(kids)); }
  int number(const Rational& v, bool decimal) {
    e_.values.push_back(v);
    e_.approx.push_back(v.to_double());
    Node n;
    n.kind = NodeKind::Number;
    n.value = static_cast<int>(e_.values.size()) - 1;
    n.decimal = decimal;
    return add(std::move(n));
  }

  int parse_text_list() {
    std::vector<int> items;
    std::string cur;
    auto flush = [&] {
      if (cur.empty()) return;
      Node n;
      n.kind = NodeKind::Text;
      n.text = cur;
      items.push_back(add(std::move(n)));
      cur.clear();
    };
    while (!is(Tk::End)) {
      const Token& t = next();
      if (t.kind == Tk::Sep) {
        flush();
      } else {
        if (!cur.empty()) cur.push_back(' ');
        cur += t.text;
      }
    }
    flush();
    if (items.empty()) throw ParseError{};
    return items.size() == 1 ? items[0] : make_list(NodeKind::List, std::move(items));
  }

  bool is_close(Tk close, std::string_view text) const {
    if (close == Tk::End) return is(Tk::End);
    return is(close, text);
  }

  // item (sep item)* until the closing token (not consumed). A trailing
  // separator before the close is allowed.
  std::vector<int> parse_items(Tk close, std::string_view close_text, std::string_view alt_close = {}) {
    Guard g(&depth_);
    std::vector<int> items;
    auto closing = [&] { return is_close(close, close_text) || (!alt_close.empty() && is(close, alt_close)); };
    if (closing()) return items;
    items.push_back(parse_relation());
    while (is(Tk::Sep)) {
      while (is(Tk::Sep)) next();  // "1, 2, and 3"
      if (closing()) break;
      items.push_back(parse_relation());
      if (items.size() > 256) throw ParseError{};
    }
    return items;
  }

  int parse_relation() {
    Guard g(&depth_);
    int first = parse_ratio();
    if (!is(Tk::Rel)) return first;
    Node n;
    n.kind = NodeKind::Relation;
    n.kids.push_back(first);
    while (is(Tk::Rel)) {
      n.ops.push_back(next().rel);
      n.kids.push_back(parse_ratio());
      if (n.kids.size() > 32) throw ParseError{};
    }
    return add(std::move(n));
  }

  int parse_ratio() {
    Guard g(&depth_);
    int first = parse_union();
    if (!is(Tk::Colon)) return first;
    std::vector<int> kids{first};
    while (is(Tk::Colon)) {
      next();
      kids.push_back(parse_union());
    }
    return make(NodeKind::Ratio, std::move(kids));
  }

  int parse_union() {
    Guard g(&depth_);
    int first = parse_expr();
    if (!is(Tk::Cup)) return first;
    std::vector<int> kids{first};
    while (is(Tk::Cup)) {
      next();
      kids.push_back(parse_expr());
    }
    return make(NodeKind::Union, std::move(kids));
  }

  int plus_minus(int a, int b, bool mp) {
    if (e_.n_plus_minus >= kMaxPlusMinus) throw ParseError{};
    return make(NodeKind::PlusMinus, {a, b}, e_.n_plus_minus++, mp ? 1 : 0);
  }

  int parse_expr() {
    Guard g(&depth_);
    std::vector<int> terms{parse_term()};
    while (is(Tk::Op, "+") || is(Tk::Op, "-") || is(Tk::Op, "pm") || is(Tk::Op, "mp")) {
      std::string op = next().text;
      int t = parse_term();
      if (op == "+") {
        terms.push_back(t);
      } else if (op == "-") {
        terms.push_back(make(NodeKind::Neg, {t}));
      } else {
        int acc = terms.size() == 1 ? terms[0] : make(NodeKind::Add, terms);
        terms = {plus_minus(acc, t, op == "mp")};
      }
      if (terms.size() > 512) throw ParseError{};
    }
    return terms.size() == 1 ? terms[0] : make(NodeKind::Add, std::move(terms));
  }

  bool starts_factor() const {
    switch (peek().kind) {
      case Tk::Num: case Tk::Ident: case Tk::Pi: case Tk::EConst: case Tk::Func: case Tk::Frac:
      case Tk::Sqrt: case Tk::Binom: case Tk::FloorOpen: case Tk::CeilOpen: case Tk::Inf:
      case Tk::MatBegin:  // A B, 2A: products with a matrix
        return true;
      case Tk::Open:
        return peek().text == "(" || peek().text == "{";
      case Tk::Bar:
        return abs_depth_ == 0;
      default:
        return false;
    }
  }

  bool is_int_literal(int i) const {
    const Node& n = e_.at(i);
    return n.kind == NodeKind::Number && !n.decimal && !n.grouped && e_.values[static_cast<size_t>(n.value)].is_integer();
  }

  int parse_term() {
    Guard g(&depth_);
    std::vector<int> factors{parse_unary()};
    for (;;) {
      if (is(Tk::Op, "*")) {
        next();
        factors.push_back(parse_unary());
      } else if (is(Tk::Op, "/")) {
        next();
        int den = parse_unary();
        int num = factors.size() == 1 ? factors[0] : make(NodeKind::Mul, factors);
        factors = {make(NodeKind::Div, {num, den})};
      } else if (factors.size() == 1 && mixed_number_ahead(factors[0])) {
        // "4 4/9" in plain text is the mixed number 4 + 4/9.
        int whole = factors[0];
        bool neg = e_.at(whole).kind == NodeKind::Neg;
        int mag = neg ? e_.at(whole).kids[0] : whole;
        int a = parse_primary();
        next();  // the '/'
        int b = parse_primary();
        // 11 6/6 or 4 4/0 is not a mixed number, nor a product: no answer.
        const Rational& num = e_.values[static_cast<size_t>(e_.at(a).value)];
        const Rational& den = e_.values[static_cast<size_t>(e_.at(b).value)];
        if (den.is_zero() || Rational::compare(num, den) >= 0) throw ParseError{};
        int sum = make(NodeKind::Add, {mag, make(NodeKind::Div, {a, b})});
        factors = {parse_postfix_ops(neg ? make(NodeKind::Neg, {sum}) : sum)};
      } else if (starts_factor()) {
        bool frac_next = is(Tk::Frac);
        int f = parse_power();
        // A mixed number: 2\frac{1}{2} means 2 + 1/2 (the common convention).
        const Node& fn = e_.at(f);
        if (frac_next && factors.size() == 1 && fn.kind == NodeKind::Div && fn.sub == 1 &&
            is_int_literal(fn.kids[0]) && is_int_literal(fn.kids[1])) {
          int whole = factors[0];
          bool neg = e_.at(whole).kind == NodeKind::Neg;
          int mag = neg ? e_.at(whole).kids[0] : whole;
          if (is_int_literal(mag)) {
            int sum = make(NodeKind::Add, {mag, f});
            factors = {neg ? make(NodeKind::Neg, {sum}) : sum};
            continue;
          }
        }
        factors.push_back(f);
      } else {
        break;
      }
      if (factors.size() > 512) throw ParseError{};
    }
    return factors.size() == 1 ? factors[0] : make(NodeKind::Mul, std::move(factors));
  }

  // After a lone integer: "int / int" not followed by more arithmetic.
  bool mixed_number_ahead(int whole) const {
    if (e_.at(whole).kind == NodeKind::Neg) whole = e_.at(whole).kids[0];
    if (!is_int_literal(whole)) return false;
    auto int_tok = [](const Token& t) { return t.kind == Tk::Num && t.text.find_first_of(".eE") == std::string::npos; };
    if (!int_tok(peek(0)) || !(peek(1).kind == Tk::Op && peek(1).text == "/") || !int_tok(peek(2))) return false;
    if (peek(0).line_break) return false;  // "11\n5/6": two lines, not one number
    const Token& after = peek(3);
    return !(after.kind == Tk::Op && (after.text == "^" || after.text == "*" || after.text == "/" || after.text == "!")) &&
           after.kind != Tk::Ident && after.kind != Tk::Num && !(after.kind == Tk::Open && after.text == "(");
  }
  int parse_unary() {
    Guard g(&depth_);
    if (is(Tk::Op, "-")) {
      next();
      return make(NodeKind::Neg, {parse_unary()});
    }
    if (is(Tk::Op, "+")) {
      next();
      return parse_unary();
    }
    if (is(Tk::Op, "pm") || is(Tk::Op, "mp")) {
      bool mp = next().text == "mp";
      int zero = number(Rational(0), false);
      return plus_minus(zero, parse_unary(), mp);
    }
    return parse_power();
  }

  int parse_power() {
    Guard g(&depth_);
    int base = parse_postfix();
    if (!is(Tk::Op, "^")) return base;
    next();
    int exp = parse_unary();  // right-associative: 2^3^2 = 2^(3^2)
    int p = make(NodeKind::Pow, {base, exp});
    return parse_postfix_ops(p);
  }

  int parse_postfix() {
    Guard g(&depth_);
    return parse_postfix_ops(parse_primary());
  }

  int parse_postfix_ops(int p) {
    for (;;) {
      if (is(Tk::Op, "!")) {
        next();
        p = make(NodeKind::Func, {p}, static_cast<int>(Fn::Factorial));
      } else if (is(Tk::Percent)) {
        next();
        p = make(NodeKind::Percent, {p});
      } else {
        return p;
      }
    }
  }

  // The argument of \frac, \sqrt, \binom: a {group} or a single primary.
  int parse_arg() {
    Guard g(&depth_);
    if (is(Tk::Open, "{")) {
      next();
      std::vector<int> items = parse_items(Tk::Close, "}");
      expect(Tk::Close, "}");
      if (items.size() != 1) throw ParseError{};
      return items[0];
    }
    return parse_primary();
  }

  int parse_function(Fn fn) {
    Guard g(&depth_);
    int power = -1;
    int base = -1;
    // \sin^2 x, \sin^{-1} x, \log_2 x, \log_{10}(x): exponent and base come
    // before the argument.
    for (int k = 0; k < 2; ++k) {
      if (is(Tk::Op, "^") && power < 0) {
        next();
        power = parse_arg_signed();
      } else if (is(Tk::Op, "_") && base < 0 && fn == Fn::Log) {
        next();
        base = parse_arg();
      }
    }
    std::vector<int> args;
    if (is(Tk::Open, "(")) {
      next();
      args = parse_items(Tk::Close, ")");
      expect(Tk::Close, ")");
    } else {
      args.push_back(parse_power());
    }
    if (args.empty() || args.size() > 16) throw ParseError{};
    bool multi = fn == Fn::Gcd || fn == Fn::Lcm || fn == Fn::Max || fn == Fn::Min;
    if (!multi && args.size() != 1) throw ParseError{};
    if (power >= 0) {
      // sin^{-1} is the inverse function, not a reciprocal.
      auto pv = eval_exact(e_, power, 0);
      if (pv && *pv == Rational(-1) && (fn == Fn::Sin || fn == Fn::Cos || fn == Fn::Tan)) {
        fn = fn == Fn::Sin ? Fn::Asin : (fn == Fn::Cos ? Fn::Acos : Fn::Atan);
        power = -1;
      }
    }
    int f;
    if (fn == Fn::Log) {
      int b = base >= 0 ? base : make(NodeKind::E, {});
      f = make(NodeKind::Func, {b, args[0]}, static_cast<int>(Fn::Log));
    } else {
      f = make(NodeKind::Func, std::move(args), static_cast<int>(fn));
    }
    return power >= 0 ? make(NodeKind::Pow, {f, power}) : f;
  }

  int parse_arg_signed() {
    if (is(Tk::Op, "-")) {
      next();
      return make(NodeKind::Neg, {parse_arg()});
    }
    return parse_arg();
  }

  // ( items ) / [ items ) ...: a group, a tuple or an interval.
  int parse_bracketed(char open) {
    Guard g(&depth_);
    std::vector<int> items = parse_items(Tk::Close, open == '<' ? ">" : ")", open == '<' ? "" : "]");
    if (!is(Tk::Close)) throw ParseError{};
    char close = next().text[0];
    if (open == '<' ? close != '>' : (close != ')' && close != ']')) throw ParseError{};
    if (items.empty()) throw ParseError{};
    if (items.size() == 1) {
      if ((open == '(' && close == ')') || (open == '[' && close == ']')) {
        e_.nodes[static_cast<size_t>(items[0])].grouped = true;
        return items[0];
      }
      if (open != '<') throw ParseError{};
    }
    return make(NodeKind::Tuple, std::move(items), open, close);
  }

  int parse_matrix() {
    Guard g(&depth_);
    std::vector<std::vector<int>> rows(1);
    while (!is(Tk::MatEnd)) {
      if (is(Tk::End)) throw ParseError{};
      if (is(Tk::Amp)) {
        next();
        if (rows.back().empty()) throw ParseError{};
        rows.back().push_back(-1);  // placeholder for the next cell
        continue;
      }
      if (is(Tk::RowSep)) {
        next();
        rows.emplace_back();
        continue;
      }
      int cell = parse_relation();
      if (!rows.back().empty() && rows.back().back() == -1) {
        rows.back().back() = cell;
      } else if (rows.back().empty()) {
        rows.back().push_back(cell);
      } else {
        throw ParseError{};
      }
    }
    next();
    while (!rows.empty() && rows.back().empty()) rows.pop_back();  // trailing \\ before \end
    if (rows.empty()) throw ParseError{};
    size_t cols = rows[0].size();
    std::vector<int> kids;
    for (const auto& r : rows) {
      if (r.size() != cols) throw ParseError{};
      for (int c : r) {
        if (c < 0) throw ParseError{};
        kids.push_back(c);
      }
    }
    return make(NodeKind::Matrix, std::move(kids), static_cast<int>(rows.size()), static_cast<int>(cols));
  }

  int parse_primary() {
    Guard g(&depth_);
    const Token& t = peek();
    switch (t.kind) {
      case Tk::Num: {
        std::string text = next().text;
        auto v = Rational::from_decimal(text);
        if (!v) throw ParseError{};
        int n = number(*v, text.find_first_of(".eE") != std::string::npos);
        size_t point = text.find('.');
        if (point != std::string::npos && text.find_first_of("eE") == std::string::npos)
          e_.nodes[static_cast<size_t>(n)].places = static_cast<int>(text.size() - point - 1);
        return n;
      }
      case Tk::Ident: {
        Node n;
        n.kind = NodeKind::Symbol;
        n.text = next().text;
        return add(std::move(n));
      }
      case Tk::Pi: next(); return make(NodeKind::Pi, {});
      case Tk::EConst: next(); return make(NodeKind::E, {});
      case Tk::Inf: next(); return make(NodeKind::Infinity, {});
      case Tk::Empty: next(); return make(NodeKind::EmptySet, {});
      case Tk::Ellipsis: next(); return make(NodeKind::Ellipsis, {});
      case Tk::Func: return parse_function(next().fn);
      case Tk::Frac: {
        next();
        int a = parse_arg();
        int b = parse_arg();
        return make(NodeKind::Div, {a, b}, 1);  // sub = 1: written as \frac (mixed numbers)
      }
      case Tk::Binom: {
        next();
        int a = parse_arg();
        int b = parse_arg();
        return make(NodeKind::Func, {a, b}, static_cast<int>(Fn::Binom));
      }
      case Tk::Sqrt: {
        next();
        if (is(Tk::Open, "[")) {
          next();
          int index = parse_expr();
          expect(Tk::Close, "]");
          int arg = parse_arg();
          return make(NodeKind::Func, {index, arg}, static_cast<int>(Fn::Root));
        }
        return make(NodeKind::Func, {parse_arg()}, static_cast<int>(Fn::Sqrt));
      }
      case Tk::Open: {
        std::string open = next().text;
        if (open == "(" || open == "[" || open == "<") return parse_bracketed(open[0]);
        if (open == "{") {
          std::vector<int> items = parse_items(Tk::Close, "}");
          expect(Tk::Close, "}");
          if (items.empty()) throw ParseError{};
          return items.size() == 1 ? items[0] : make_list(NodeKind::List, std::move(items));
        }
        // \{ ... \}
        std::vector<int> items = parse_items(Tk::Close, "\\}");
        expect(Tk::Close, "\\}");
        return make_list(NodeKind::Set, std::move(items));
      }
      case Tk::Bar: {
        next();
        ++abs_depth_;
        int inner = parse_expr();
        --abs_depth_;
        expect(Tk::Bar);
        return make(NodeKind::Func, {inner}, static_cast<int>(Fn::Abs));
      }
      case Tk::FloorOpen: {
        next();
        int inner = parse_expr();
        expect(Tk::FloorClose);
        return make(NodeKind::Func, {inner}, static_cast<int>(Fn::Floor));
      }
      case Tk::CeilOpen: {
        next();
        int inner = parse_expr();
        expect(Tk::CeilClose);
        return make(NodeKind::Func, {inner}, static_cast<int>(Fn::Ceil));
      }
      case Tk::MatBegin:
        next();
        return parse_matrix();
      default:
        throw ParseError{};
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int abs_depth_ = 0;
  Expr e_;
};

}  // namespace

std::optional<Expr> parse_answer(std::string_view text) {
  if (text.size() > kMaxAnswerChars) return std::nullopt;
  try {
    std::vector<Token> toks = detail::tokenize(text);
    for (const auto& t : toks)
      if (t.kind == Tk::Bad) return std::nullopt;
    return Parser(std::move(toks)).run();
  } catch (const ParseError&) {
    return std::nullopt;
  }
}

}  // namespace lockstep::reward::math
