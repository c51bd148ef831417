// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available) for
// the tokenizer's split patterns. Safe to share between threads; match scratch
// lives in per-thread storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::tokenizer {

struct Span {
  uint32_t begin, end;  // byte offsets, end exclusive
};

class Regex {
 public:
  // Compiles with PCRE2_UTF | PCRE2_UCP so \s, \w, \d and POSIX classes follow
  // Unicode, as Oniguruma does in Hugging Face `tokenizers`. `literal` matches
  // the pattern text as a plain string. `what` names the pattern in errors.
  Regex(const std::string& pattern, const std::string& what, bool literal = false);
  Regex(const Regex&) = default;
  Regex& operator=(const Regex&) = default;

  // Appends every match in `subject` (valid UTF-8), left to right and without
  // overlap. An empty match directly after the previous match is skipped, as
  // Oniguruma's find_iter does.
  void find_all(std::string_view subject, std::vector<Span>& out) const;
  // True when the pattern matches somewhere in `subject`.
  bool search(std::string_view subject) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
  std::string what_;
};

}  // namespace lockstep::tokenizer
