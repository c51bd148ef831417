// Tokenizer and recursive-descent parser for LaTeX-ish math answers. LaTeX
// noise (\left, \!, \text{...} units, $...) is absorbed by the tokenizer; the
// parser guards its recursion depth and the token count, so hostile input
// fails fast instead of overflowing the stack.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "lockstep/reward/math_expr.h"

namespace lockstep::reward::math {
namespace {

enum class Tk : uint8_t {
  Num, Ident, Word, Func, Frac, Sqrt, Binom, Op, Rel, Open, Close, Bar, FloorOpen, FloorClose,
  CeilOpen, CeilClose, Sep, Colon, Percent, Pi, EConst, Inf, Cup, Ellipsis, Empty, MatBegin,
  MatEnd, Amp, RowSep, Bad, End
};

struct Token {
  Tk kind = Tk::End;
  std::string text;  // Num: digits; Ident: name; Word: lower-cased word; Op/Open/Close: symbol
  Fn fn = Fn::Sqrt;
  RelOp rel = RelOp::Eq;
};

struct ParseError {};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

template <size_t N>
bool in_list(std::string_view w, const char* const (&list)[N]) {
  for (const char* x : list)
    if (w == x) return true;
  return false;
}

// Short unit words that may follow a number in plain text. Longer words (4+
// letters) are treated as prose or units anyway; single letters stay symbols.
const char* const kShortUnits[] = {"cm", "mm", "km", "ft", "yd", "mi", "kg", "lb", "lbs", "oz", "hr", "hrs",
                                   "min", "ml", "sq", "cu", "mph", "kph", "sec", "cents", "deg", "rad",
                                   "units", "mins", "secs", "gal", "pts", "ths"};
const char* const kPercentWords[] = {"percent", "pct", "percentage", "percents"};
const char* const kGreek[] = {"alpha", "beta",  "gamma", "delta",   "epsilon", "varepsilon", "zeta",
                              "eta",   "theta", "vartheta", "iota", "kappa",   "lambda",     "mu",
                              "nu",    "xi",    "rho",   "sigma",   "tau",     "upsilon",    "phi",
                              "varphi", "chi",  "psi",   "omega",   "Gamma",   "Delta",      "Theta",
                              "Lambda", "Xi",   "Sigma", "Phi",     "Psi",     "Omega",      "ell"};
// Commands whose braced argument is plain text (words become Word tokens).
const char* const kTextCommands[] = {"text", "textbf", "textit", "textrm", "textnormal", "mbox", "hbox",
                                     "textsf", "texttt", "textup", "emph"};
// Commands that only style their argument: the argument is parsed as math.
const char* const kStyleCommands[] = {"mathrm", "mathbf", "mathit", "mathsf", "mathbb", "mathcal", "boldsymbol",
                                      "bm", "operatorname", "overline", "underline", "hat", "widehat",
                                      "vec", "bar", "tilde", "widetilde", "boxed", "fbox", "mathnormal",
                                      "displaystyle", "textstyle", "scriptstyle", "dot", "ddot", "mathring",
                                      "overrightarrow", "overleftrightarrow", "pmb", "smash", "underbrace",
                                      "overbrace"};
// Commands dropped together with their first braced argument.
const char* const kSkipArgCommands[] = {"hspace", "vspace", "phantom", "hphantom", "vphantom", "label", "tag",
                                        "color", "hskip", "kern", "mathstrut"};
// Commands that are dropped: sizing, spacing, decoration.
const char* const kIgnoredCommands[] = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl",
                                        "Bigr", "biggl", "biggr", "Biggl", "Biggr", "quad", "qquad", "limits",
                                        "nolimits", "circ", "degree", "displaystyle", "textstyle", "middle",
                                        "notag", "nonumber", "cr", "newline", "hline", "space", "enspace",
                                        "thinspace", "negthinspace", "medspace", "thickspace", "relax",
                                        "therefore", "because", "angle", "measuredangle", "triangle", "qed",
                                        "square", "blacksquare", "checkmark", "implies", "Rightarrow",
                                        "rightarrow", "Longrightarrow", "longrightarrow", "iff", "to"};
const char* const kMatrixEnvs[] = {"pmatrix", "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "matrix",
                                   "smallmatrix", "array"};

struct FnName {
  const char* name;
  Fn fn;
};
const FnName kFunctions[] = {{"sin", Fn::Sin},       {"cos", Fn::Cos},       {"tan", Fn::Tan},
                             {"sec", Fn::Sec},       {"csc", Fn::Csc},       {"cot", Fn::Cot},
                             {"arcsin", Fn::Asin},   {"arccos", Fn::Acos},   {"arctan", Fn::Atan},
                             {"asin", Fn::Asin},     {"acos", Fn::Acos},     {"atan", Fn::Atan},
                             {"sinh", Fn::Sinh},     {"cosh", Fn::Cosh},     {"tanh", Fn::Tanh},
                             {"ln", Fn::Ln},         {"log", Fn::Log},       {"exp", Fn::Exp},
                             {"abs", Fn::Abs},       {"gcd", Fn::Gcd},       {"lcm", Fn::Lcm},
                             {"max", Fn::Max},       {"min", Fn::Min},       {"cosec", Fn::Csc},
                             {"tg", Fn::Tan},        {"ctg", Fn::Cot}};

std::optional<Fn> function_named(std::string_view w) {
  for (const auto& f : kFunctions)
    if (w == f.name) return f.fn;
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Tokenizer

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  // Throws ParseError on unsupported input or when a bound is exceeded.
  std::vector<Token> run() {
    while (i_ < s_.size()) {
      if (out_.size() > kMaxTokens) throw ParseError{};
      step();
    }
    return std::move(out_);
  }

 private:
  struct Brace {
    bool suppressed;  // braces of \text{...} etc. produce no tokens
    bool text;        // inside a text argument: words are Word tokens
  };

  bool text_mode() const { return !braces_.empty() && braces_.back().text; }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }
  bool starts(std::string_view p) const { return s_.substr(i_, p.size()) == p; }

  void emit(Tk kind, std::string text = {}) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    if (kind != Tk::Num) pending_digit_args_ = 0;
    out_.push_back(std::move(t));
  }
  void emit_rel(RelOp r) {
    emit(Tk::Rel);
    out_.back().rel = r;
  }
  void emit_fn(Fn f) {
    emit(Tk::Func);
    out_.back().fn = f;
  }

  void skip_spaces() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }

  // Reads a balanced {...} starting at i_ (which must be '{'); returns the
  // inside and leaves i_ after the closing brace. Throws if unbalanced.
  std::string_view read_braced() {
    size_t start = i_ + 1;
    int depth = 0;
    for (size_t j = i_; j < s_.size(); ++j) {
      char c = s_[j];
      if (c == '\\') {
        ++j;
        continue;
      }
      if (c == '{') ++depth;
      if (c == '}' && --depth == 0) {
        i_ = j + 1;
        return s_.substr(start, j - start);
      }
    }
    throw ParseError{};
  }

  // A separator inside a number written with thousands groups ("1,000",
  // "1{,}000", "1\,000", "10,\!000", "1 000"). Returns its length or 0.
  size_t thousands_sep(size_t k) const {
    auto at = [&](size_t p, std::string_view pat) { return s_.substr(p, pat.size()) == pat; };
    size_t len = 0;
    if (at(k, "{,}")) len = 3;
    else if (at(k, ",\\!")) len = 3;
    else if (at(k, "\\,") || at(k, "\\!") || at(k, "\\ ")) len = 2;
    else if (k < s_.size() && (s_[k] == ',' || s_[k] == ' ') && bracket_depth_ == 0) return 1;
    else return 0;
    if (k + len < s_.size() && s_[k + len] == ' ') ++len;  // "11,\! 111"
    return len;
  }
  bool three_digits_at(size_t k) const {
    return k + 3 <= s_.size() && is_digit(s_[k]) && is_digit(s_[k + 1]) && is_digit(s_[k + 2]) &&
           (k + 3 == s_.size() || !is_digit(s_[k + 3]));
  }

  void lex_number() {
    std::string num;
    if (pending_digit_args_ > 0 && is_digit(peek())) {
      // \frac12: each argument is a single digit in LaTeX.
      --pending_digit_args_;
      num.push_back(s_[i_++]);
      out_.push_back(Token{Tk::Num, num, Fn::Sqrt, RelOp::Eq});
      return;
    }
    size_t j = i_;
    while (j < s_.size() && is_digit(s_[j])) num.push_back(s_[j++]);
    if (!num.empty() && num.size() <= 3 && num != "0") {
      // Thousands groups: every group after the first has exactly 3 digits.
      size_t k = j;
      std::string grouped = num;
      bool any = false;
      for (;;) {
        size_t sep = thousands_sep(k);
        if (sep == 0 || !three_digits_at(k + sep)) break;
        grouped.append(s_.substr(k + sep, 3));
        k += sep + 3;
        any = true;
      }
      if (any) {
        num = grouped;
        j = k;
      }
    }
    if (j + 1 < s_.size() && s_[j] == '.' && is_digit(s_[j + 1])) {
      num.push_back('.');
      ++j;
      while (j < s_.size() && is_digit(s_[j])) num.push_back(s_[j++]);
    }
    // Scientific notation written as 1.5e3 / 2E-4 (no space).
    if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
      size_t k = j + 1;
      if (k < s_.size() && (s_[k] == '-' || s_[k] == '+')) ++k;
      size_t d = k;
      while (d < s_.size() && is_digit(s_[d])) ++d;
      if (d > k && (d == s_.size() || !is_alpha(s_[d]))) {
        num.append(s_.substr(j, d - j));
        j = d;
      }
    }
    i_ = j;
    // A base subscript: 204_5, 1011_{2}.
    if (peek() == '_') {
      size_t save = i_;
      ++i_;
      std::string base;
      if (peek() == '{') {
        base = std::string(read_braced());
      } else if (is_digit(peek())) {
        while (is_digit(peek())) base.push_back(s_[i_++]);
      }
      base.erase(std::remove(base.begin(), base.end(), ' '), base.end());
      if (!base.empty() && base.size() <= 2 && std::all_of(base.begin(), base.end(), is_digit) &&
          num.find_first_of(".eE") == std::string::npos) {
        int b = std::stoi(base);
        if (b < 2 || b > 10) throw ParseError{};
        Rational v(0);
        for (char c : num) {
          if (c - '0' >= b) throw ParseError{};  // a digit not valid in this base
          auto next = Rational::add(*Rational::mul(v, Rational(b)), Rational(c - '0'));
          if (!next) throw ParseError{};
          v = *next;
        }
        emit(Tk::Num, v.num().to_string());
        return;
      }
      i_ = save;
    }
    emit(Tk::Num, num);
  }

  // x_1, x_{12}, a_n: the subscript becomes part of the symbol's name.
  std::string read_subscript() {
    if (peek() != '_') return {};
    size_t save = i_;
    ++i_;
    std::string sub;
    if (peek() == '{') {
      std::string_view inner = read_braced();
      if (inner.size() > 40) throw ParseError{};
      for (char c : inner)
        if (!std::isspace(static_cast<unsigned char>(c)) && c != '{' && c != '}') sub.push_back(c);
    } else if (std::isalnum(static_cast<unsigned char>(peek()))) {
      sub.push_back(s_[i_++]);
    } else if (peek() == '\\') {
      size_t j = i_ + 1;
      while (j < s_.size() && is_alpha(s_[j])) ++j;
      sub = std::string(s_.substr(i_, j - i_));
      i_ = j;
    }
    if (sub.empty()) {
      i_ = save;
      return {};
    }
    return "_" + sub;
  }

  void lex_letters() {
    size_t j = i_;
    while (j < s_.size() && is_alpha(s_[j])) ++j;
    std::string_view run = s_.substr(i_, j - i_);
    std::string w = lower(run);
    i_ = j;
    if (text_mode()) {
      if (run.size() == 1) {
        emit(Tk::Ident, std::string(run) + read_subscript());
      } else if (w == "and" || w == "or") {
        emit(Tk::Sep, w);
      } else if (in_list(w, kPercentWords)) {
        emit(Tk::Percent);
      } else {
        emit(Tk::Word, w);
      }
      return;
    }
    if (w == "and" || w == "or") return emit(Tk::Sep, w);
    if (run == "in") return emit_rel(RelOp::In);
    if (w == "pi") return emit(Tk::Pi);
    if (w == "inf" || w == "infinity" || w == "infty" || w == "oo") return emit(Tk::Inf);
    if (w == "sqrt") return emit(Tk::Sqrt);
    if (in_list(w, kPercentWords)) return emit(Tk::Percent);
    if (auto f = function_named(run)) return emit_fn(*f);
    if (run.size() >= 4 || (run.size() >= 2 && in_list(w, kShortUnits))) return emit(Tk::Word, w);
    // A run of 1-3 letters is a product of single-letter symbols (2ab, xyz).
    for (size_t k = 0; k < run.size(); ++k) {
      std::string name(1, run[k]);
      if (k + 1 == run.size()) name += read_subscript();
      if (name == "e") {
        emit(Tk::EConst);
      } else {
        emit(Tk::Ident, name);
      }
    }
  }

  void open_brace(bool suppressed, bool text) {
    braces_.push_back(Brace{suppressed, text || text_mode()});
    if (braces_.size() > static_cast<size_t>(kMaxDepth)) throw ParseError{};
  }

  void lex_command() {
    ++i_;  // the backslash
    if (i_ >= s_.size()) return;
    // "\\frac", "20\\%": text escaped twice (JSON, Python) means one backslash.
    // A real line break (\\) is followed by a space, a digit or the end.
    if (s_[i_] == '\\' && matrix_depth_ == 0 && i_ + 1 < s_.size() &&
        (is_alpha(s_[i_ + 1]) || s_[i_ + 1] == '%' || s_[i_ + 1] == '{' || s_[i_ + 1] == '}'))
      ++i_;
    char c = s_[i_];
    if (!is_alpha(c)) {
      ++i_;
      switch (c) {
        case '{': ++bracket_depth_; return emit(Tk::Open, "\\{");
        case '}': --bracket_depth_; return emit(Tk::Close, "\\}");
        case '%': return emit(Tk::Percent);
        case '\\': return matrix_depth_ > 0 ? emit(Tk::RowSep) : emit(Tk::Sep, ";");
        case '|': return emit(Tk::Bar);
        case '$': case ',': case '!': case ';': case ':': case ' ': case '(': case ')': case '[': case ']':
        case '>': case '<': case '/': case '-': case '\n': case '\t': case '&': case '#': case '_':
          return;  // spacing, math delimiters, escaped currency
        default:
          return;
      }
    }
    size_t j = i_;
    while (j < s_.size() && is_alpha(s_[j])) ++j;
    std::string name(s_.substr(i_, j - i_));
    i_ = j;

    if (name == "left" || name == "right" || name == "bigl" || name == "bigr" || name == "Bigl" ||
        name == "Bigr" || name == "big" || name == "Big" || name == "bigg" || name == "Bigg" ||
        name == "biggl" || name == "biggr" || name == "Biggl" || name == "Biggr" || name == "middle") {
      if (peek() == '.') ++i_;  // \left. is an invisible delimiter
      return;
    }
    if (name == "frac" || name == "dfrac" || name == "tfrac" || name == "cfrac") {
      emit(Tk::Frac);
      skip_spaces();
      pending_digit_args_ = 2;
      return;
    }
    if (name == "binom" || name == "dbinom" || name == "tbinom") {
      emit(Tk::Binom);
      skip_spaces();
      pending_digit_args_ = 2;
      return;
    }
    if (name == "sqrt") {
      emit(Tk::Sqrt);
      skip_spaces();
      pending_digit_args_ = 1;
      return;
    }
    if (in_list(name, kTextCommands) || in_list(name, kStyleCommands)) {
      bool text = in_list(name, kTextCommands);
      skip_spaces();
      if (peek() == '{') {
        ++i_;
        open_brace(true, text);
      }
      return;
    }
    if (in_list(name, kSkipArgCommands)) {
      skip_spaces();
      if (peek() == '{') read_braced();
      return;
    }
    if (name == "textcolor") {  // \textcolor{red}{x}: drop the colour, keep x
      skip_spaces();
      if (peek() == '{') read_braced();
      return;
    }
    if (name == "begin" || name == "end") {
      skip_spaces();
      if (peek() != '{') throw ParseError{};
      std::string env(read_braced());
      if (!env.empty() && env.back() == '*') env.pop_back();
      if (in_list(env, kMatrixEnvs)) {
        if (name == "begin") {
          ++matrix_depth_;
          emit(Tk::MatBegin);
          skip_spaces();
          if (env == "array" && peek() == '{') read_braced();  // column spec {cc}
        } else {
          --matrix_depth_;
          emit(Tk::MatEnd);
        }
      }
      return;  // other environments (align, aligned, ...) are transparent
    }
    if (name == "pi") return emit(Tk::Pi);
    if (name == "infty" || name == "infin" || name == "infinity") return emit(Tk::Inf);
    if (name == "cdot" || name == "times" || name == "ast" || name == "bullet") return emit(Tk::Op, "*");
    if (name == "div") return emit(Tk::Op, "/");
    if (name == "pm") return emit(Tk::Op, "pm");
    if (name == "mp") return emit(Tk::Op, "mp");
    if (name == "le" || name == "leq" || name == "leqslant" || name == "leqq") return emit_rel(RelOp::Le);
    if (name == "ge" || name == "geq" || name == "geqslant" || name == "geqq") return emit_rel(RelOp::Ge);
    if (name == "lt") return emit_rel(RelOp::Lt);
    if (name == "gt") return emit_rel(RelOp::Gt);
    if (name == "ne" || name == "neq") return emit_rel(RelOp::Ne);
    if (name == "approx" || name == "simeq" || name == "thickapprox" || name == "sim" || name == "cong")
      return emit_rel(RelOp::Approx);
    if (name == "equiv" || name == "coloneqq" || name == "eqqcolon") return emit_rel(RelOp::Eq);
    if (name == "in") return emit_rel(RelOp::In);
    if (name == "cup") return emit(Tk::Cup);
    if (name == "emptyset" || name == "varnothing" || name == "empty") return emit(Tk::Empty);
    if (name == "dots" || name == "ldots" || name == "cdots" || name == "dotsc" || name == "dotsb" ||
        name == "vdots")
      return emit(Tk::Ellipsis);
    if (name == "lfloor") return emit(Tk::FloorOpen);
    if (name == "rfloor") return emit(Tk::FloorClose);
    if (name == "lceil") return emit(Tk::CeilOpen);
    if (name == "rceil") return emit(Tk::CeilClose);
    if (name == "lvert" || name == "rvert" || name == "vert" || name == "mid" || name == "lVert" ||
        name == "rVert" || name == "Vert")
      return emit(Tk::Bar);
    if (name == "langle") {
      ++bracket_depth_;
      return emit(Tk::Open, "<");
    }
    if (name == "rangle") {
      --bracket_depth_;
      return emit(Tk::Close, ">");
    }
    if (name == "lbrace") {
      ++bracket_depth_;
      return emit(Tk::Open, "\\{");
    }
    if (name == "rbrace") {
      --bracket_depth_;
      return emit(Tk::Close, "\\}");
    }
    if (name == "lbrack") {
      ++bracket_depth_;
      return emit(Tk::Open, "[");
    }
    if (name == "rbrack") {
      --bracket_depth_;
      return emit(Tk::Close, "]");
    }
    if (name == "exp" || name == "ln" || name == "log" || name == "lg") {
      return emit_fn(name == "exp" ? Fn::Exp : (name == "lg" ? Fn::Log : function_named(name).value()));
    }
    if (auto f = function_named(name)) return emit_fn(*f);
    if (in_list(name, kGreek)) return emit(Tk::Ident, "\\" + name + read_subscript());
    if (name == "cap" || name == "setminus" || name == "subset" || name == "subseteq" || name == "notin" ||
        name == "forall" || name == "exists" || name == "int" || name == "sum" || name == "prod" ||
        name == "lim" || name == "partial" || name == "nabla")
      return emit(Tk::Bad);
    if (in_list(name, kIgnoredCommands)) return;
    // Unknown commands: with an argument, drop the command and parse the
    // group; alone, a named symbol (\hbar, \zzz).
    skip_spaces();
    if (peek() != '{') emit(Tk::Ident, "\\" + name + read_subscript());
  }

  // Non-ASCII characters that have a meaning in answers (UTF-8 sequences).
  bool lex_unicode() {
    struct U {
      const char* utf8;
      Tk kind;
      const char* text;
    };
    static const U table[] = {{"\xE2\x88\x92", Tk::Op, "-"},  {"\xC3\x97", Tk::Op, "*"},
                              {"\xC3\xB7", Tk::Op, "/"},      {"\xC2\xB7", Tk::Op, "*"},
                              {"\xE2\x8B\x85", Tk::Op, "*"},  {"\xC2\xB1", Tk::Op, "pm"},
                              {"\xCF\x80", Tk::Pi, ""},       {"\xE2\x88\x9E", Tk::Inf, ""},
                              {"\xE2\x88\xAA", Tk::Cup, ""},  {"\xE2\x88\x85", Tk::Empty, ""},
                              {"\xE2\x80\xA6", Tk::Ellipsis, ""}};
    for (const auto& u : table) {
      if (starts(u.utf8)) {
        i_ += std::strlen(u.utf8);
        emit(u.kind, u.text);
        return true;
      }
    }
    struct R {
      const char* utf8;
      RelOp rel;
    };
    static const R rels[] = {{"\xE2\x89\xA4", RelOp::Le}, {"\xE2\x89\xA5", RelOp::Ge},
                             {"\xE2\x89\xA0", RelOp::Ne}, {"\xE2\x89\x88", RelOp::Approx},
                             {"\xE2\x88\x88", RelOp::In}};
    for (const auto& r : rels) {
      if (starts(r.utf8)) {
        i_ += std::strlen(r.utf8);
        emit_rel(r.rel);
        return true;
      }
    }
    if (starts("\xE2\x88\x9A")) {  // square root sign
      i_ += 3;
      emit(Tk::Sqrt);
      return true;
    }
    if (starts("\xC2\xB2") || starts("\xC2\xB3")) {  // superscript 2 / 3
      bool two = s_[i_ + 1] == '\xB2';
      i_ += 2;
      emit(Tk::Op, "^");
      emit(Tk::Num, two ? "2" : "3");
      return true;
    }
    if (starts("\xC2\xB0")) {  // degree sign
      i_ += 2;
      return true;
    }
    return false;
  }

  void step() {
    char c = s_[i_];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i_;
      return;
    }
    if (is_digit(c) || (c == '.' && is_digit(peek(1)))) return lex_number();
    if (is_alpha(c)) return lex_letters();
    if (c == '\\') return lex_command();
    if (static_cast<unsigned char>(c) >= 0x80) {
      if (!lex_unicode()) ++i_;  // other symbols (currency, letters) are dropped
      return;
    }
    ++i_;
    switch (c) {
      case '{':
        if (text_mode()) {  // braces inside \text{...} are formatting
          open_brace(true, true);
        } else {
          open_brace(false, false);
          emit(Tk::Open, "{");
        }
        return;
      case '}':
        if (braces_.empty()) throw ParseError{};
        if (!braces_.back().suppressed) emit(Tk::Close, "}");
        braces_.pop_back();
        return;
      case '(': case '[':
        ++bracket_depth_;
        return emit(Tk::Open, std::string(1, c));
      case ')': case ']':
        --bracket_depth_;
        return emit(Tk::Close, std::string(1, c));
      case '|': return emit(Tk::Bar);
      case '+': return emit(Tk::Op, "+");
      case '-': return emit(Tk::Op, "-");
      case '*':
        if (peek() == '*') {  // Python-style power
          ++i_;
          return emit(Tk::Op, "^");
        }
        return emit(Tk::Op, "*");
      case '/': return emit(Tk::Op, "/");
      case '^':
        // ^\circ and ^{\circ} are degree marks: drop them.
        if (starts("\\circ")) {
          i_ += 5;
          return;
        }
        if (starts("{\\circ}") || starts("{ \\circ}") || starts("{\\circ }")) {
          i_ = s_.find('}', i_) + 1;
          return;
        }
        return emit(Tk::Op, "^");
      case '_': return emit(Tk::Op, "_");
      case '!':
        if (peek() == '=') {
          ++i_;
          return emit_rel(RelOp::Ne);
        }
        return emit(Tk::Op, "!");
      case '=':
        if (peek() == '=') ++i_;
        return emit_rel(RelOp::Eq);
      case '<':
        if (peek() == '=') {
          ++i_;
          return emit_rel(RelOp::Le);
        }
        return emit_rel(RelOp::Lt);
      case '>':
        if (peek() == '=') {
          ++i_;
          return emit_rel(RelOp::Ge);
        }
        return emit_rel(RelOp::Gt);
      case ',': return emit(Tk::Sep, ",");
      case ';': return emit(Tk::Sep, ";");
      case ':':
        if (peek() == '=') {
          ++i_;
          return emit_rel(RelOp::Eq);
        }
        return emit(Tk::Colon);
      case '&':
        if (matrix_depth_ > 0) emit(Tk::Amp);
        return;
      case '%': return emit(Tk::Percent);
      case '.':
        if (peek() == '.' && peek(1) == '.') {
          i_ += 2;
          return emit(Tk::Ellipsis);
        }
        return;  // a stray period
      default:
        return;  // $, ~, quotes, ?, ': formatting only
    }
  }

  std::string_view s_;
  size_t i_ = 0;
  std::vector<Token> out_;
  std::vector<Brace> braces_;
  int bracket_depth_ = 0;
  int matrix_depth_ = 0;
  int pending_digit_args_ = 0;
};

// Words are units or prose around an answer ("5 cm", "12 apples"): drop them
// (with a following ^2 as in "cm^2") unless the answer is only words.
std::vector<Token> drop_words(std::vector<Token> toks) {
  bool only_words = true;
  for (const auto& t : toks)
    if (t.kind != Tk::Word && t.kind != Tk::Sep) only_words = false;
  if (only_words) return toks;
  std::vector<Token> out;
  out.reserve(toks.size());
  for (size_t i = 0; i < toks.size(); ++i) {
    if (toks[i].kind != Tk::Word) {
      out.push_back(std::move(toks[i]));
      continue;
    }
    if (i + 1 < toks.size() && toks[i + 1].kind == Tk::Op && toks[i + 1].text == "^") {
      size_t j = i + 2;
      if (j < toks.size() && toks[j].kind == Tk::Open && toks[j].text == "{") {
        int depth = 0;
        for (; j < toks.size(); ++j) {
          if (toks[j].kind == Tk::Open) ++depth;
          if (toks[j].kind == Tk::Close && --depth == 0) break;
        }
      }
      i = std::min(j, toks.size() - 1);
    }
  }
  return out;
}

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
        return number(*v, text.find_first_of(".eE") != std::string::npos);
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
    std::vector<Token> toks = drop_words(Lexer(text).run());
    for (const auto& t : toks)
      if (t.kind == Tk::Bad) return std::nullopt;
    return Parser(std::move(toks)).run();
  } catch (const ParseError&) {
    return std::nullopt;
  }
}

}  // namespace lockstep::reward::math
