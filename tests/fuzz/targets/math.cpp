// Fuzz target: the math verifier's extractor, normalizer, parser and
// comparer. Input: label NUL response (no NUL: the input is both). Every
// input must finish quickly (run with -timeout=1) and never throw.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.h"
#include "lockstep/reward/math_text.h"
#include "lockstep/reward/math_verifier.h"

using namespace lockstep::reward;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view label = in.substr(0, nul);
  const std::string_view response = nul == std::string_view::npos ? in : in.substr(nul + 1);

  const auto extracted = extract_answer(response, default_math_extractors());
  extract_boxed(response);
  const std::string gold = label_to_answer(label);
  strip_answer(label);
  canonical_answer(response);
  choice_letter(label, true);
  choice_letter(response, false);
  looks_like_math(response);
  if (extracted) {
    const bool eq = math_answers_equivalent(gold, extracted->answer);
    // The convenience path is the same two steps.
    LS_FUZZ_EXPECT(math_response_correct(response, label) == eq, "math_response_correct disagrees");
  }
  math_answers_equivalent(label, response, 1e-3);
  // An answer equals itself once it is an answer a label can give.
  if (!gold.empty()) math_answers_equivalent(gold, gold);
  return 0;
}
