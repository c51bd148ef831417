// Tokenizer for LaTeX-ish math answers: numbers (thousands groups, decimal
// points, exponents, bases), symbols, commands, text arguments and units.
// Linear in the input; stops at kMaxTokens tokens or kMaxDepth braces.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "lockstep/reward/math_token.h"

namespace lockstep::reward::math::detail {
namespace {

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
// Commands dropped together with their first braced argument (\textcolor{red}{x}
// drops the colour and keeps x).
const char* const kSkipArgCommands[] = {"hspace", "vspace", "phantom", "hphantom", "vphantom", "label", "tag",
                                        "color", "hskip", "kern", "mathstrut", "textcolor"};
// Delimiter sizes: dropped, the delimiter after them is lexed on its own.
const char* const kSizingCommands[] = {"left", "right", "bigl", "bigr", "Bigl", "Bigr", "big", "Big", "bigg",
                                       "Bigg", "biggl", "biggr", "Biggl", "Biggr", "middle"};
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
// Commands the verifier does not evaluate (set operations, quantifiers,
// calculus): they lex to a Bad token, and parse_answer gives up on the answer.
const char* const kUnsupportedCommands[] = {"cap", "setminus", "subset", "subseteq", "notin", "forall", "exists",
                                            "int", "sum", "prod", "lim", "partial", "nabla"};

// Commands that stand for one token.
struct CommandToken {
  const char* name;
  Tk kind;
  const char* text;
};
const CommandToken kCommandTokens[] = {
    {"pi", Tk::Pi, ""},           {"infty", Tk::Inf, ""},          {"infin", Tk::Inf, ""},
    {"infinity", Tk::Inf, ""},    {"cdot", Tk::Op, "*"},           {"times", Tk::Op, "*"},
    {"ast", Tk::Op, "*"},         {"bullet", Tk::Op, "*"},         {"div", Tk::Op, "/"},
    {"pm", Tk::Op, "pm"},         {"mp", Tk::Op, "mp"},            {"cup", Tk::Cup, ""},
    {"emptyset", Tk::Empty, ""},  {"varnothing", Tk::Empty, ""},   {"empty", Tk::Empty, ""},
    {"dots", Tk::Ellipsis, ""},   {"ldots", Tk::Ellipsis, ""},     {"cdots", Tk::Ellipsis, ""},
    {"dotsc", Tk::Ellipsis, ""},  {"dotsb", Tk::Ellipsis, ""},     {"vdots", Tk::Ellipsis, ""},
    {"lfloor", Tk::FloorOpen, ""}, {"rfloor", Tk::FloorClose, ""}, {"lceil", Tk::CeilOpen, ""},
    {"rceil", Tk::CeilClose, ""}, {"lvert", Tk::Bar, ""},          {"rvert", Tk::Bar, ""},
    {"vert", Tk::Bar, ""},        {"mid", Tk::Bar, ""},            {"lVert", Tk::Bar, ""},
    {"rVert", Tk::Bar, ""},       {"Vert", Tk::Bar, ""}};
// Bracket commands: Open or Close tokens that also count in the bracket depth.
const CommandToken kCommandBrackets[] = {{"langle", Tk::Open, "<"},  {"rangle", Tk::Close, ">"},
                                         {"lbrace", Tk::Open, "\\{"}, {"rbrace", Tk::Close, "\\}"},
                                         {"lbrack", Tk::Open, "["},  {"rbrack", Tk::Close, "]"}};

struct CommandRel {
  const char* name;
  RelOp rel;
};
const CommandRel kCommandRelations[] = {
    {"le", RelOp::Le},         {"leq", RelOp::Le},          {"leqslant", RelOp::Le},
    {"leqq", RelOp::Le},       {"ge", RelOp::Ge},           {"geq", RelOp::Ge},
    {"geqslant", RelOp::Ge},   {"geqq", RelOp::Ge},         {"lt", RelOp::Lt},
    {"gt", RelOp::Gt},         {"ne", RelOp::Ne},           {"neq", RelOp::Ne},
    {"approx", RelOp::Approx}, {"simeq", RelOp::Approx},    {"thickapprox", RelOp::Approx},
    {"sim", RelOp::Approx},    {"cong", RelOp::Approx},     {"equiv", RelOp::Eq},
    {"coloneqq", RelOp::Eq},   {"eqqcolon", RelOp::Eq},     {"in", RelOp::In}};

template <typename Row, size_t N>
const Row* find_row(std::string_view name, const Row (&table)[N]) {
  for (const Row& r : table)
    if (name == r.name) return &r;
  return nullptr;
}

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
    t.line_break = line_break_;
    line_break_ = false;
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
      out_.push_back(Token{Tk::Num, num, Fn::Sqrt, RelOp::Eq, line_break_});
      line_break_ = false;
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
      // One letter after a number is a unit (5\text{ m}, 3\text{ g}).
      bool after_number = !out_.empty() && out_.back().kind == Tk::Num;
      if (run.size() == 1 && !after_number) {
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
    if (!is_alpha(s_[i_])) return lex_escaped_char();
    size_t j = i_;
    while (j < s_.size() && is_alpha(s_[j])) ++j;
    std::string name(s_.substr(i_, j - i_));
    i_ = j;
    // The families are tried in this order: a name in two lists (\displaystyle
    // is a style and an ignored command) takes the first.
    if (lex_sizing(name) || lex_structure(name) || lex_argument_command(name) || lex_environment(name) ||
        lex_command_token(name) || lex_named_command(name))
      return;
    if (in_list(name, kUnsupportedCommands)) return emit(Tk::Bad);
    if (in_list(name, kIgnoredCommands)) return;
    // Unknown commands: with an argument, drop the command and parse the
    // group; alone, a named symbol (\hbar, \zzz).
    skip_spaces();
    if (peek() != '{') emit(Tk::Ident, "\\" + name + read_subscript());
  }

  // A backslash and a non-letter: escaped braces, \%, a line break, spacing.
  void lex_escaped_char() {
    char c = s_[i_++];
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

  bool lex_sizing(const std::string& name) {
    if (!in_list(name, kSizingCommands)) return false;
    if (peek() == '.') ++i_;  // \left. is an invisible delimiter
    return true;
  }

  // \frac, \binom, \sqrt; their arguments may be bare digits (\frac12).
  bool lex_structure(const std::string& name) {
    Tk kind;
    int digit_args;
    if (name == "frac" || name == "dfrac" || name == "tfrac" || name == "cfrac") {
      kind = Tk::Frac;
      digit_args = 2;
    } else if (name == "binom" || name == "dbinom" || name == "tbinom") {
      kind = Tk::Binom;
      digit_args = 2;
    } else if (name == "sqrt") {
      kind = Tk::Sqrt;
      digit_args = 1;
    } else {
      return false;
    }
    emit(kind);
    skip_spaces();
    pending_digit_args_ = digit_args;
    return true;
  }

  // Text and style commands open a brace that emits no tokens; skip-argument
  // commands drop their first braced argument.
  bool lex_argument_command(const std::string& name) {
    const bool text = in_list(name, kTextCommands);
    if (text || in_list(name, kStyleCommands)) {
      skip_spaces();
      if (peek() == '{') {
        ++i_;
        open_brace(true, text);
      }
      return true;
    }
    if (in_list(name, kSkipArgCommands)) {
      skip_spaces();
      if (peek() == '{') read_braced();
      return true;
    }
    return false;
  }

  bool lex_environment(const std::string& name) {
    if (name != "begin" && name != "end") return false;
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
    return true;  // other environments (align, aligned, ...) are transparent
  }

  // Symbols, operators, relations and brackets spelled as commands.
  bool lex_command_token(const std::string& name) {
    if (const CommandToken* t = find_row(name, kCommandTokens)) {
      emit(t->kind, t->text);
      return true;
    }
    if (const CommandRel* r = find_row(name, kCommandRelations)) {
      emit_rel(r->rel);
      return true;
    }
    if (const CommandToken* b = find_row(name, kCommandBrackets)) {
      bracket_depth_ += b->kind == Tk::Open ? 1 : -1;
      emit(b->kind, b->text);
      return true;
    }
    return false;
  }

  // Functions (\lg is log base 10, as \log) and Greek letters.
  bool lex_named_command(const std::string& name) {
    if (name == "lg") {
      emit_fn(Fn::Log);
      return true;
    }
    if (auto f = function_named(name)) {
      emit_fn(*f);
      return true;
    }
    if (in_list(name, kGreek)) {
      emit(Tk::Ident, "\\" + name + read_subscript());
      return true;
    }
    return false;
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
      line_break_ = line_break_ || c == '\n';
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
  bool line_break_ = false;  // a line break since the last token
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

}  // namespace

std::vector<Token> tokenize(std::string_view text) { return drop_words(Lexer(text).run()); }

}  // namespace lockstep::reward::math::detail
