// Text-level steps of the math verifier: finding the final answer in a
// response (\boxed{}, <answer>, "the answer is", "Answer:", last math span or
// number) and the string normalizations done before parsing. All scans are
// linear in the response length.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::reward {

enum class Extractor {
  Boxed,        // last \boxed{...} / \fbox{...} (adjacent boxes are merged into a list)
  AnswerTag,    // last <answer>...</answer>
  AnswerIs,     // text after the last "answer is"
  AnswerColon,  // text after the last "Answer:"
  LastMath,     // a bare-expression response, else the last-ending $...$ span, vector/matrix or number
  LastNumber,   // the last number
  Whole,        // the whole response
};

std::optional<Extractor> extractor_from_name(std::string_view name);
std::string extractor_name(Extractor e);
// boxed, answer_tag, answer_is, answer_colon, last_math.
std::vector<Extractor> default_math_extractors();

struct Extraction {
  std::string answer;
  Extractor by;
};

// Tries the extractors in order; the first that finds something wins.
std::optional<Extraction> extract_answer(std::string_view response, const std::vector<Extractor>& order);

// The content of the last \boxed{...}, with boxes just before it that are
// separated only by "and", commas, spacing or a variable naming the next
// value ("$x=\boxed{2}$ and $y=\boxed{3}$") joined as "a, b".
std::optional<std::string> extract_boxed(std::string_view text);

// The answer inside a label: its \boxed{} if any, else the label without
// math delimiters; a long prose label goes through the default extractors.
std::string label_to_answer(std::string_view label);

// Trims whitespace, surrounding $...$ / \(...\) / \[...\] and trailing
// sentence punctuation (not an ellipsis).
std::string strip_answer(std::string_view s);

// A spelling-insensitive form for a first string comparison: no spaces,
// no $, no \left/\right, \text{} wrappers and spacing commands removed,
// \dfrac -> \frac; words-only answers are lower-cased.
std::string canonical_answer(std::string_view s);

// Multiple choice: "B", "(B)", "\text{(B)}", "B. text" -> 'B'. strict (for
// labels): the answer must be the letter, upper-case A-Z, or the letter with
// its text ("C. x = 42"). Otherwise (responses) "(B) 42" and "B) 42" also
// count.
std::optional<char> choice_letter(std::string_view s, bool strict);

// Heuristic: true when `s` reads as a math expression rather than prose.
bool looks_like_math(std::string_view s);

}  // namespace lockstep::reward
