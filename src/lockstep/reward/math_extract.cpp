// Answer extraction from model responses. Every extractor is a single pass
// (or a bounded number of passes) over the text, so a megabyte of output or
// 100k unbalanced braces costs milliseconds.
#include <algorithm>
#include <cctype>

#include "lockstep/reward/math_text.h"

namespace lockstep::reward {
namespace {

// Extracted answers longer than this are cut: no real final answer is, and
// the comparison only ever looks at kMaxAnswerChars (math_expr.h).
constexpr size_t kMaxExtract = 4096;
constexpr int kMaxMergedBoxes = 32;
constexpr size_t kMaxBoxGap = 80;

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string cut(std::string_view s) { return std::string(s.substr(0, kMaxExtract)); }

struct Span {
  size_t start = 0, end = 0;  // the whole construct in the text
  std::string content;
};

// \boxed{...} or \boxed 5 at `pos` (the backslash); scanning stops at `limit`.
std::optional<Span> boxed_at(std::string_view t, size_t pos, size_t cmd_len, size_t limit) {
  size_t i = pos + cmd_len;
  while (i < limit && t[i] == ' ') ++i;
  if (i < limit && t[i] == '{') {
    int depth = 0;
    for (size_t j = i; j < limit; ++j) {
      char c = t[j];
      if (c == '\\') {  // \{ and \} are literal braces
        ++j;
        continue;
      }
      if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        return Span{pos, j + 1, std::string(t.substr(i + 1, std::min(j - i - 1, kMaxExtract)))};
      }
    }
    return std::nullopt;  // unbalanced: no answer
  }
  size_t j = i;
  while (j < limit && !is_space(t[j]) && t[j] != '$') ++j;
  if (j == i || i == pos + cmd_len) return std::nullopt;  // \boxedx is not a box
  return Span{pos, j, std::string(t.substr(i, std::min(j - i, kMaxExtract)))};
}

// Position and command length of the last \boxed / \fbox starting before `before`.
std::optional<std::pair<size_t, size_t>> last_box(std::string_view t, size_t before) {
  if (before == 0) return std::nullopt;
  size_t a = t.rfind("\\boxed", before - 1);
  size_t b = t.rfind("\\fbox", before - 1);
  if (a == std::string_view::npos && b == std::string_view::npos) return std::nullopt;
  if (a == std::string_view::npos || (b != std::string_view::npos && b > a)) return std::make_pair(b, size_t{5});
  return std::make_pair(a, size_t{6});
}

// "x =", "x_1 =", "y_{2} =" at gap[i]: the name of the next box's value.
size_t assignment_prefix(std::string_view gap, size_t i) {
  if (i >= gap.size() || !is_alpha(gap[i]) || (i > 0 && is_alpha(gap[i - 1]))) return 0;
  size_t j = i + 1;
  if (j < gap.size() && gap[j] == '_') {
    ++j;
    if (j < gap.size() && gap[j] == '{') {
      size_t close = gap.find('}', j);
      if (close == std::string_view::npos || close - j > 8) return 0;
      j = close + 1;
    } else if (j < gap.size() && std::isalnum(static_cast<unsigned char>(gap[j]))) {
      ++j;
    } else {
      return 0;
    }
  }
  while (j < gap.size() && is_space(gap[j])) ++j;
  return j < gap.size() && gap[j] == '=' ? j + 1 - i : 0;
}

// Text between two boxes that only separates them ("and", ",", spacing,
// "y =" naming the next value).
bool only_separators(std::string_view gap) {
  static const char* const kTokens[] = {"\\quad", "\\qquad", "\\text{", "\\textnormal{", "\\mbox{", "\\mathrm{",
                                        "\\(", "\\)", "\\[", "\\]", "\\,", "\\;", "\\ ", "\\\\", "and", "or",
                                        "\\hspace{", "\\enspace"};
  size_t i = 0;
  while (i < gap.size()) {
    char c = gap[i];
    if (is_space(c) || c == ',' || c == ';' || c == '$' || c == '&' || c == '}' || c == '.') {
      ++i;
      continue;
    }
    if (size_t len = assignment_prefix(gap, i)) {
      i += len;
      continue;
    }
    bool matched = false;
    for (const char* tok : kTokens) {
      std::string_view tv(tok);
      if (gap.substr(i, tv.size()) == tv) {
        i += tv.size();
        matched = true;
        break;
      }
    }
    if (!matched) return false;
  }
  return true;
}

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The first math span at the start of s ($..$, $$..$$, \(..\), \[..\]).
std::optional<Span> leading_span(std::string_view s) {
  auto take = [&](size_t open_len, std::string_view close) -> std::optional<Span> {
    size_t e = s.find(close, open_len);
    if (e == std::string_view::npos) return std::nullopt;
    return Span{0, e + close.size(), std::string(s.substr(open_len, std::min(e - open_len, kMaxExtract)))};
  };
  if (s.substr(0, 2) == "$$") return take(2, "$$");
  if (s.substr(0, 1) == "$") return take(1, "$");
  if (s.substr(0, 2) == "\\(") return take(2, "\\)");
  if (s.substr(0, 2) == "\\[") return take(2, "\\]");
  return std::nullopt;
}

// All math spans, in one pass; returns the last one. Inline math ($...$,
// \(...\)) does not span lines: `broken`, when given, receives the last
// inline pair of delimiters with a line break between them.
std::optional<Span> last_math_span(std::string_view t, std::optional<Span>* broken = nullptr) {
  std::optional<Span> last;
  size_t i = 0, n = t.size();
  auto record = [&](size_t start, size_t cs, size_t ce, size_t end) {
    last = Span{start, end, std::string(t.substr(cs, std::min(ce - cs, kMaxExtract)))};
  };
  while (i < n) {
    char c = t[i];
    if (c == '\\' && i + 1 < n) {
      if (t[i + 1] == '(' || t[i + 1] == '[') {
        bool inline_math = t[i + 1] == '(';
        std::string_view close = inline_math ? "\\)" : "\\]";
        size_t e = t.find(close, i + 2);
        if (e == std::string_view::npos) break;
        size_t line_break = t.find('\n', i + 2);
        if (inline_math && line_break < e) {
          if (broken) *broken = Span{i, e + 2, {}};
        } else {
          record(i, i + 2, e, e + 2);
        }
        i = e + 2;
        continue;
      }
      i += 2;  // an escaped character such as \$
      continue;
    }
    if (c == '$') {
      if (i + 1 < n && t[i + 1] == '$') {
        size_t e = t.find("$$", i + 2);
        if (e == std::string_view::npos) break;
        record(i, i + 2, e, e + 2);
        i = e + 2;
        continue;
      }
      // Inline math does not span lines.
      size_t j = i + 1;
      while (j < n && t[j] != '$' && t[j] != '\n') j += (t[j] == '\\' && j + 1 < n) ? 2 : 1;
      if (j < n && t[j] == '$') {
        record(i, i + 1, j, j + 1);
        i = j + 1;
      } else {
        size_t close = broken && j < n ? t.find('$', j) : std::string_view::npos;
        if (close != std::string_view::npos) *broken = Span{i, close + 1, {}};
        i = j;
      }
      continue;
    }
    ++i;
  }
  return last;
}

// The last number (with sign, thousands groups, decimals, a /d fraction and
// a % sign), not glued to a word before it ("AZ2" has no number).
std::optional<Span> last_number(std::string_view t) {
  std::optional<Span> last;
  size_t i = 0, n = t.size();
  while (i < n) {
    bool starts = is_digit(t[i]) || (t[i] == '.' && i + 1 < n && is_digit(t[i + 1]));
    if (!starts || (i > 0 && (is_digit(t[i - 1]) || is_alpha(t[i - 1]) || t[i - 1] == '_' || t[i - 1] == '^'))) {
      ++i;
      continue;
    }
    size_t start = i;
    if (start > 0 && t[start - 1] == '-' && (start < 2 || !std::isalnum(static_cast<unsigned char>(t[start - 2]))))
      --start;
    size_t j = i;
    while (j < n && is_digit(t[j])) ++j;
    // 1,234,567: groups of exactly three digits
    while (j + 3 < n && t[j] == ',' && is_digit(t[j + 1]) && is_digit(t[j + 2]) && is_digit(t[j + 3]) &&
           (j + 4 >= n || !is_digit(t[j + 4])))
      j += 4;
    if (j + 1 < n && t[j] == '.' && is_digit(t[j + 1])) {
      ++j;
      while (j < n && is_digit(t[j])) ++j;
    } else if (j + 1 < n && t[j] == ',' && is_digit(t[j + 1]) && (j + 2 >= n || !is_digit(t[j + 2]) ||
                                                                  j + 3 >= n || !is_digit(t[j + 3]))) {
      // "2,74": a decimal comma (1-2 digits after it; 3 would be thousands)
      j += 2;
      while (j < n && is_digit(t[j])) ++j;
    }
    if (j + 1 < n && t[j] == '/' && is_digit(t[j + 1])) {
      ++j;
      while (j < n && is_digit(t[j])) ++j;
    }
    size_t end = j;
    if (end < n && t[end] == '%') {
      ++end;
    } else if (end + 1 < n && t[end] == '\\' && t[end + 1] == '%') {
      end += 2;
    }
    last = Span{start, end, std::string(t.substr(start, end - start))};
    i = std::max(end, i + 1);
  }
  return last;
}

constexpr size_t kMaxVectorChars = 600;
// Closing parentheses looked at, from the end, for a tuple: the answer is
// near the end, and the bound keeps the scan linear.
constexpr int kMaxTupleCandidates = 64;

// Prose inside a candidate tuple: a run of two or more letters that is not
// a command name ("see 1, 2" is prose, "\frac{1}{2}, x" is not).
bool has_prose_run(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '\\') {
      ++i;
      while (i < s.size() && is_alpha(s[i])) ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_alpha(s[j])) ++j;
    if (j - i >= 2) return true;
    i = j > i ? j : i + 1;
  }
  return false;
}

// The last \begin{pmatrix}...\end{pmatrix} (bmatrix, ...) or
// \langle ...\rangle in t.
std::optional<Span> last_environment_vector(std::string_view t) {
  std::optional<Span> best;
  auto consider = [&](std::string_view open, std::string_view close) {
    size_t e = t.rfind(close);
    if (e == std::string_view::npos) return;
    size_t b = t.rfind(open, e);
    if (b == std::string_view::npos || e + close.size() - b > kMaxVectorChars) return;
    size_t end = e + close.size();
    if (!best || end > best->end) best = Span{b, end, std::string(t.substr(b, end - b))};
  };
  for (std::string_view env : {"pmatrix", "bmatrix", "Bmatrix", "vmatrix", "matrix"}) {
    std::string open = "\\begin{" + std::string(env) + "}", close = "\\end{" + std::string(env) + "}";
    consider(open, close);
  }
  consider("\\langle", "\\rangle");
  return best;
}

// The last "(a, b, ...)" of math items in t, not a function's arguments
// ("f(1, 2)"): closing parentheses are tried from the end, each matched
// backwards within kMaxVectorChars.
std::optional<Span> last_paren_tuple(std::string_view t) {
  size_t pos = t.size();
  for (int tried = 0; tried < kMaxTupleCandidates; ++tried) {
    size_t close = pos == 0 ? std::string_view::npos : t.rfind(')', pos - 1);
    if (close == std::string_view::npos) return std::nullopt;
    pos = close;
    int depth = 0;
    size_t b = std::string_view::npos;
    size_t stop = close > kMaxVectorChars ? close - kMaxVectorChars : 0;
    for (size_t j = close; j-- > stop;) {
      if (t[j] == ')') ++depth;
      if (t[j] == '(' && depth-- == 0) {
        b = j;
        break;
      }
    }
    if (b == std::string_view::npos) continue;
    std::string_view inner = t.substr(b + 1, close - b - 1);
    if (inner.find(',') == std::string_view::npos) continue;
    if (b > 0 && (is_alpha(t[b - 1]) || is_digit(t[b - 1]))) continue;
    if (has_prose_run(inner) || !looks_like_math(inner)) continue;
    return Span{b, close + 1, std::string(t.substr(b, close + 1 - b))};
  }
  return std::nullopt;
}

// The last vector or matrix written in running text, outside math spans.
std::optional<Span> last_vector(std::string_view t) {
  auto env = last_environment_vector(t);
  auto tup = last_paren_tuple(t);
  if (env && (!tup || env->end >= tup->end)) return env;
  return tup;
}

// Cuts s at the end of its first sentence: a newline, or . ! ? followed by
// a space or the end (a decimal point is not an end). $...$ is kept whole.
std::string_view first_sentence(std::string_view s) {
  bool in_math = false;
  size_t limit = std::min(s.size(), kMaxExtract);
  for (size_t i = 0; i < limit; ++i) {
    char c = s[i];
    if (c == '\\' && i + 1 < limit) {
      ++i;
      continue;
    }
    if (c == '$') in_math = !in_math;
    if (c == '\n') return s.substr(0, i);
    if (in_math) continue;
    if ((c == '.' || c == '!' || c == '?') && (i + 1 >= s.size() || is_space(s[i + 1]))) return s.substr(0, i);
  }
  return s.substr(0, limit);
}

// Joins "$1$ and $2$" into "1, 2"; appends % for "$20$ percent".
std::string math_spans_from(std::string_view s) {
  std::string out;
  size_t pos = 0;
  for (int k = 0; k < 16; ++k) {
    auto sp = leading_span(s.substr(pos));
    if (!sp) break;
    if (!out.empty()) out += ", ";
    out += sp->content;
    pos += sp->end;
    // Continue only across a separator on the same line.
    size_t q = pos;
    while (q < s.size() && (s[q] == ' ' || s[q] == ',')) ++q;
    std::string_view rest = s.substr(q);
    size_t skip = 0;
    if (rest.substr(0, 4) == "and ") skip = 4;
    else if (rest.substr(0, 3) == "or ") skip = 3;
    else if (q > pos && !rest.empty() && rest[0] == '$') skip = 0;
    else break;
    q += skip;
    while (q < s.size() && s[q] == ' ') ++q;
    if (q >= s.size() || (s[q] != '$' && s.substr(q, 2) != "\\(")) break;
    pos = q;
  }
  std::string_view after = trim(s.substr(std::min(pos, s.size())));
  std::string la = lower_ascii(after.substr(0, 10));
  if (!out.empty() && (after.substr(0, 1) == "%" || la.rfind("percent", 0) == 0)) out += "\\%";
  return out;
}

// The answer in the text that follows "answer is" / "Answer:".
std::optional<std::string> refine(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (is_space(s[i]) || s[i] == ':' || s[i] == '*')) ++i;
  s = s.substr(i);
  if (s.empty()) return std::nullopt;
  if (s.substr(0, 6) == "\\boxed" || s.substr(0, 5) == "\\fbox") return extract_boxed(s.substr(0, kMaxExtract));
  if (leading_span(s)) {
    std::string joined = math_spans_from(s.substr(0, kMaxExtract));
    if (!joined.empty()) return joined;
  }
  std::string_view sentence = trim(first_sentence(s));
  if (sentence.empty()) return std::nullopt;
  if (sentence.find("\\boxed") != std::string_view::npos) return extract_boxed(sentence);
  if (looks_like_math(sentence)) return std::string(sentence);
  // "The largest $n$ is 34": the part after the last verb.
  std::string low = lower_ascii(sentence);
  size_t best = std::string::npos, best_len = 0;
  for (std::string_view verb : {" is ", " are ", " be ", " equals ", " was ", " = ", " is: "}) {
    size_t p = low.rfind(verb);
    if (p != std::string::npos && (best == std::string::npos || p > best)) {
      best = p;
      best_len = verb.size();
    }
  }
  if (best != std::string::npos) {
    std::string_view tail = trim(sentence.substr(best + best_len));
    if (leading_span(tail)) {
      std::string joined = math_spans_from(tail);
      if (!joined.empty()) return joined;
    }
    if (!tail.empty() && looks_like_math(tail)) return std::string(tail);
  }
  if (auto sp = last_math_span(sentence)) return sp->content;
  if (auto num = last_number(sentence)) return num->content;
  if (sentence.size() <= 100) return std::string(sentence);  // a word answer ("Evelyn")
  return std::nullopt;
}

std::optional<std::string> run_extractor(Extractor ex, std::string_view t) {
  switch (ex) {
    case Extractor::Boxed:
      return extract_boxed(t);
    case Extractor::AnswerTag: {
      size_t close = t.rfind("</answer>");
      if (close == std::string_view::npos) return std::nullopt;
      size_t open = t.rfind("<answer>", close);
      if (open == std::string_view::npos) return std::nullopt;
      std::string_view inner = t.substr(open + 8, close - open - 8);
      if (inner.find("\\boxed") != std::string_view::npos || inner.find("\\fbox") != std::string_view::npos) {
        if (auto b = extract_boxed(inner)) return b;
      }
      return cut(trim(inner));
    }
    case Extractor::AnswerIs:
    case Extractor::AnswerColon: {
      std::string low = lower_ascii(t);
      size_t best = std::string::npos, len = 0;
      auto consider = [&](std::string_view key) {
        size_t p = low.rfind(key);
        if (p != std::string::npos && (best == std::string::npos || p > best)) {
          best = p;
          len = key.size();
        }
      };
      if (ex == Extractor::AnswerIs) {
        consider("answer is");
      } else {
        consider("answer:");
        consider("answer**:");
      }
      if (best == std::string::npos) return std::nullopt;
      return refine(t.substr(best + len));
    }
    case Extractor::LastMath: {
      std::string_view whole = trim(t);
      if (whole.size() <= 300 && looks_like_math(whole)) return std::string(whole);
      std::optional<Span> broken;
      auto sp = last_math_span(t, &broken);
      auto num = last_number(t);
      // A number inside inline delimiters broken across lines is no answer.
      if (num && broken && num->start > broken->start && num->end < broken->end) return std::nullopt;
      // A vector ends after the numbers in it: the one that ends last wins,
      // a math span on a tie (the vector is inside it).
      auto vec = last_vector(t);
      size_t sp_end = sp ? sp->end : 0, num_end = num ? num->end : 0, vec_end = vec ? vec->end : 0;
      if (sp && sp_end >= num_end && sp_end >= vec_end) return sp->content;
      if (vec && vec_end > num_end) return vec->content;
      if (num) return num->content;
      if (!whole.empty() && whole.size() <= 100) return std::string(whole);  // a word answer
      return std::nullopt;
    }
    case Extractor::LastNumber: {
      auto num = last_number(t);
      if (!num) return std::nullopt;
      return num->content;
    }
    case Extractor::Whole:
      return cut(trim(t));
  }
  return std::nullopt;
}

// "\boxed{200} ... \boxed{255} ... Final Answer: The final answer is $10,455$":
// a final-answer statement after the last box is the later answer, when it
// names a number (a trailing "the final answer is correct" does not).
std::optional<Extraction> final_answer_after_box(std::string_view t, const std::vector<Extractor>& order) {
  auto box = last_box(t, t.size());
  if (!box) return std::nullopt;
  auto span = boxed_at(t, box->first, box->second, t.size());
  if (!span) return std::nullopt;
  std::string_view tail = t.substr(span->end);
  if (lower_ascii(tail).find("final answer") == std::string::npos) return std::nullopt;
  for (Extractor ex : {Extractor::AnswerIs, Extractor::AnswerColon}) {
    if (std::find(order.begin(), order.end(), ex) == order.end()) continue;
    auto found = run_extractor(ex, tail);
    if (!found) continue;
    std::string answer = strip_answer(*found);
    if (answer.empty() || answer.find_first_of("0123456789") == std::string::npos || !looks_like_math(answer))
      continue;
    return Extraction{std::move(answer), ex};
  }
  return std::nullopt;
}

}  // namespace

std::optional<Extractor> extractor_from_name(std::string_view name) {
  if (name == "boxed") return Extractor::Boxed;
  if (name == "answer_tag") return Extractor::AnswerTag;
  if (name == "answer_is") return Extractor::AnswerIs;
  if (name == "answer_colon") return Extractor::AnswerColon;
  if (name == "last_math") return Extractor::LastMath;
  if (name == "last_number") return Extractor::LastNumber;
  if (name == "whole") return Extractor::Whole;
  return std::nullopt;
}

std::string extractor_name(Extractor e) {
  switch (e) {
    case Extractor::Boxed: return "boxed";
    case Extractor::AnswerTag: return "answer_tag";
    case Extractor::AnswerIs: return "answer_is";
    case Extractor::AnswerColon: return "answer_colon";
    case Extractor::LastMath: return "last_math";
    case Extractor::LastNumber: return "last_number";
    case Extractor::Whole: return "whole";
  }
  return "?";
}

std::vector<Extractor> default_math_extractors() {
  return {Extractor::Boxed, Extractor::AnswerTag, Extractor::AnswerIs, Extractor::AnswerColon, Extractor::LastMath};
}

std::optional<std::string> extract_boxed(std::string_view text) {
  auto box = last_box(text, text.size());
  if (!box) return std::nullopt;
  auto span = boxed_at(text, box->first, box->second, text.size());
  if (!span) return std::nullopt;
  std::string result = span->content;
  size_t start = span->start;
  for (int k = 0; k < kMaxMergedBoxes; ++k) {
    auto prev_box = last_box(text, start);
    if (!prev_box) break;
    auto prev = boxed_at(text, prev_box->first, prev_box->second, start);
    if (!prev || prev->end > start) break;
    std::string_view gap = text.substr(prev->end, start - prev->end);
    if (gap.size() > kMaxBoxGap || !only_separators(gap)) break;
    result = prev->content + ", " + result;
    start = prev->start;
    if (result.size() > kMaxExtract) break;
  }
  return result;
}

std::optional<Extraction> extract_answer(std::string_view response, const std::vector<Extractor>& order) {
  for (Extractor ex : order) {
    if (ex == Extractor::Boxed) {
      if (auto later = final_answer_after_box(response, order)) return later;
    }
    auto found = run_extractor(ex, response);
    if (!found) continue;
    std::string answer = strip_answer(*found);
    if (answer.empty()) continue;
    return Extraction{std::move(answer), ex};
  }
  return std::nullopt;
}

std::string label_to_answer(std::string_view label) {
  if (label.find("\\boxed") != std::string_view::npos || label.find("\\fbox") != std::string_view::npos) {
    if (auto b = extract_boxed(label)) return strip_answer(*b);
  }
  if (label.size() <= 1000) {
    std::string out;
    out.reserve(label.size());
    for (size_t i = 0; i < label.size(); ++i) {
      if (label[i] == '$' && (i == 0 || label[i - 1] != '\\')) continue;  // math delimiters, not \$
      out.push_back(label[i]);
    }
    return strip_answer(out);
  }
  auto ex = extract_answer(label, default_math_extractors());
  return ex ? ex->answer : strip_answer(label.substr(0, kMaxExtract));
}

}  // namespace lockstep::reward
