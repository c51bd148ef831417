// Tokens of the math answer language, shared by the tokenizer
// (math_lex.cpp) and the parser (math_parse.cpp). Internal to the verifier.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/reward/math_expr.h"

namespace lockstep::reward::math::detail {

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
  bool line_break = false;  // a line break came before this token
};

struct ParseError {};

// Splits an answer into tokens, absorbing LaTeX noise (\left, \!, $, \text
// wrappers, units). Throws ParseError on unsupported input or when a bound
// (kMaxTokens, kMaxDepth braces) is exceeded.
std::vector<Token> tokenize(std::string_view text);

}  // namespace lockstep::reward::math::detail
