// String normalizations of the math verifier: stripping delimiters and
// sentence punctuation, a canonical spelling for a first string comparison,
// multiple-choice letters, and the prose-or-math heuristic.
#include <cctype>

#include "lockstep/reward/math_text.h"

namespace lockstep::reward {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

template <size_t N>
bool in_list(std::string_view w, const char* const (&list)[N]) {
  for (const char* x : list)
    if (w == x) return true;
  return false;
}

const char* const kWrappers[] = {"text", "textbf", "textit", "textrm", "textnormal", "mbox", "hbox", "mathrm",
                                 "mathbf", "mathit", "operatorname", "boxed", "fbox", "textsf", "mathsf", "emph"};
const char* const kSizing[] = {"left", "right", "bigl", "bigr", "Bigl", "Bigr", "big", "Big", "bigg", "Bigg",
                               "biggl", "biggr", "Biggl", "Biggr", "displaystyle", "textstyle", "quad", "qquad"};

// Words of 4+ letters that do not make a text prose (units, spelled-out math).
const char* const kMathWords[] = {"sqrt", "frac", "infinity", "infty", "percent", "percentage", "degrees",
                                  "degree", "dollars", "dollar", "cents", "units", "unit", "meters", "metres",
                                  "inches", "inch", "feet", "foot", "miles", "mile", "hours", "hour", "minutes",
                                  "minute", "seconds", "second", "days", "weeks", "years", "square", "cubic",
                                  "pmatrix", "bmatrix", "matrix", "yards", "grams", "liters", "litres"};
// Short words that only occur in prose.
const char* const kStopWords[] = {"the", "is", "are", "of", "so", "we", "it", "to", "be", "was", "for", "has",
                                  "can", "not", "its", "if", "on", "at", "an", "as", "by", "our", "you", "get",
                                  "let", "has", "had", "but", "all", "any", "one", "two", "my", "me", "he",
                                  "she", "us", "do", "did", "yes", "no"};

std::string canonical_impl(std::string_view s, bool fold_words) {
  std::string out;
  std::vector<bool> drop;  // per open brace: is it a wrapper's brace to drop?
  size_t i = 0, n = s.size();
  while (i < n) {
    char c = s[i];
    if (is_space(c) || c == '$') {
      ++i;
      continue;
    }
    if (c == '^' && (s.substr(i, 6) == "^\\circ" || s.substr(i, 8) == "^{\\circ}")) {
      i += s[i + 1] == '{' ? 8 : 6;
      continue;
    }
    if (c == '\\' && i + 1 < n) {
      size_t j = i + 1;
      while (j < n && is_alpha(s[j])) ++j;
      if (j == i + 1) {  // \, \! \; \: \  \$: spacing and escaped dollars
        char d = s[i + 1];
        if (d == ',' || d == '!' || d == ';' || d == ':' || d == ' ' || d == '$') {
          i += 2;
          continue;
        }
        out.append(s.substr(i, 2));
        i += 2;
        continue;
      }
      std::string name(s.substr(i + 1, j - i - 1));
      i = j;
      if (in_list(name, kSizing)) {
        if (i < n && s[i] == '.') ++i;
        continue;
      }
      if (in_list(name, kWrappers)) {
        size_t k = i;
        while (k < n && is_space(s[k])) ++k;
        if (k < n && s[k] == '{') {
          drop.push_back(true);
          i = k + 1;
        }
        continue;
      }
      if (name == "dfrac" || name == "tfrac" || name == "cfrac") name = "frac";
      out += "\\" + name;
      continue;
    }
    if (c == '{') {
      drop.push_back(false);
      out.push_back(c);
    } else if (c == '}') {
      bool dropped = !drop.empty() && drop.back();
      if (!drop.empty()) drop.pop_back();
      if (!dropped) out.push_back(c);
    } else {
      out.push_back(c);
    }
    ++i;
  }
  while (!out.empty() && out.back() == '.' && !ends_with(out, "...")) out.pop_back();
  if (fold_words) {
    bool words = !out.empty();
    for (char c : out) words = words && is_alpha(c);
    if (words)
      for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

std::string strip_answer(std::string_view s) {
  std::string_view v = trim(s);
  for (int round = 0; round < 8; ++round) {
    std::string_view before = v;
    if (v.size() >= 4 && starts_with(v, "$$") && ends_with(v, "$$")) {
      v = v.substr(2, v.size() - 4);
    } else if (v.size() >= 2 && v.front() == '$' && v.back() == '$') {
      v = v.substr(1, v.size() - 2);
    } else if (v.size() >= 4 && ((starts_with(v, "\\(") && ends_with(v, "\\)")) ||
                                 (starts_with(v, "\\[") && ends_with(v, "\\]")))) {
      v = v.substr(2, v.size() - 4);
    }
    // A lone $ at either end ("$1,000.99", "5$") is a currency sign or a cut delimiter.
    if (!v.empty() && v.front() == '$') v.remove_prefix(1);
    if (!v.empty() && v.back() == '$' && !ends_with(v, "\\$")) v.remove_suffix(1);
    // Sentence punctuation at the end; an ellipsis is content.
    while (!v.empty() && (v.back() == '.' || v.back() == ',' || v.back() == ';' || v.back() == ':') &&
           !ends_with(v, "...")) {
      v.remove_suffix(1);
      v = trim(v);
    }
    for (std::string_view sp : {"\\,", "\\;", "\\!", "\\quad", "\\qquad", "\\ ", "\\."}) {
      if (ends_with(v, sp)) v.remove_suffix(sp.size());
    }
    if (!v.empty() && v.front() == '=' && !starts_with(v, "==")) v.remove_prefix(1);
    v = trim(v);
    if (v == before) break;
  }
  return std::string(v);
}

std::string canonical_answer(std::string_view s) { return canonical_impl(s, true); }

std::optional<char> choice_letter(std::string_view s, bool strict) {
  std::string c = canonical_impl(s, false);
  auto upper = [](char x) { return static_cast<char>(std::toupper(static_cast<unsigned char>(x))); };
  // Whole answer: X, (X), X., (X)., X)
  std::string_view v = c;
  bool paren = false;
  if (!v.empty() && v.front() == '(') {
    v.remove_prefix(1);
    paren = true;
  }
  while (!v.empty() && (v.back() == ')' || v.back() == '.' || v.back() == ':')) v.remove_suffix(1);
  if (v.size() == 1 && is_alpha(v[0])) {
    bool up = v[0] >= 'A' && v[0] <= 'Z';
    if (up || !strict || paren) return upper(v[0]);
    return std::nullopt;
  }
  // A choice with its text: "C. x = 42" (a letter, a point, then no digit).
  if (c.size() >= 3 && c[0] >= 'A' && c[0] <= 'Z' && c[1] == '.' && !std::isdigit(static_cast<unsigned char>(c[2])))
    return c[0];
  if (strict) return std::nullopt;
  // A response that opens with its choice: "(B) 42", "B) 42", "B: 42".
  if (c.size() >= 3 && c[0] == '(' && is_alpha(c[1]) && c[2] == ')') return upper(c[1]);
  if (c.size() >= 2 && c[0] >= 'A' && c[0] <= 'Z' && (c[1] == ')' || c[1] == ':')) return c[0];
  return std::nullopt;
}

bool looks_like_math(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    char c = s[i];
    if (c == '\\') {  // a command name is not prose
      ++i;
      while (i < n && is_alpha(s[i])) ++i;
      continue;
    }
    if (!is_alpha(c)) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && is_alpha(s[j])) ++j;
    bool in_braces = i > 0 && s[i - 1] == '{';  // \text{Evelyn}, \mathrm{cm}
    if (!in_braces) {
      std::string w(s.substr(i, j - i));
      for (auto& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (w.size() >= 4 && !in_list(w, kMathWords)) return false;
      if (w.size() >= 2 && w.size() <= 3 && in_list(w, kStopWords)) return false;
    }
    i = j;
  }
  return true;
}

}  // namespace lockstep::reward
