// Pre-tokenizers of tokenizer.json ("pre_tokenizer" field): they cut normalized
// text into the pieces the BPE model encodes one at a time.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/tokenizer/json_fields.h"
#include "lockstep/tokenizer/regex.h"

namespace lockstep::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and may rewrite) every piece; pieces are non-empty valid UTF-8 and
  // empty results are dropped, as in Hugging Face's PreTokenizedString.
  virtual void apply(std::vector<std::string>& pieces) const = 0;

  // Fast path for pipelines that only cut text and end with a byte-level
  // mapping: refines `spans` (byte ranges of `text`) in place instead of
  // building strings. Only called when supports_spans() is true.
  virtual void apply_spans(std::string_view text, std::vector<Span>& spans) const = 0;
  // True when apply_spans gives the same cuts as apply, before a byte-level
  // mapping that apply would do last (so the caller maps, or skips mapping).
  virtual bool supports_spans() const = 0;
  // True when apply ends by mapping bytes to the byte-level alphabet.
  virtual bool ends_with_byte_level() const = 0;
};

// Builds the pre-tokenizer described by `j`; nullptr for JSON null. Unsupported
// types and behaviours throw an Error naming the field.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where);

// How a split treats the matched delimiters (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_split_behavior(const std::string& name, const std::string& where);

// Cuts `piece` at the matches of `re` (with `invert`, the gaps count as the
// matches) and appends the non-empty parts that `behavior` keeps to `out`.
void split_by_pattern(std::string_view piece, const Regex& re, bool invert, SplitBehavior behavior,
                      std::vector<std::string>& out);
// The same cut of text[span], appending the parts as spans of `text`.
void split_span(std::string_view text, Span span, const Regex& re, bool invert, SplitBehavior behavior,
                std::vector<Span>& out);

// The pattern GPT-2 and ByteLevel(use_regex=true) split with.
extern const char kGpt2SplitPattern[];

}  // namespace lockstep::tokenizer
