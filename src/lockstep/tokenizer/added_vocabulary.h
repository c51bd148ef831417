// Added tokens of tokenizer.json ("added_tokens"): special and user tokens that
// are cut out of the text before normalization and pre-tokenization, with the
// matching rules of Hugging Face `tokenizers` (leftmost-longest; single_word,
// lstrip, rstrip; `normalized` tokens matched on normalized text).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/tokenizer/regex.h"

namespace lockstep::tokenizer {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool operator==(const AddedToken&) const = default;
};

// A part of a text: either plain text [begin, end) or an added token.
struct TextPart {
  uint32_t begin, end;
  int32_t token_id;  // -1 for plain text
};

// One set of patterns (the raw or the normalized ones) with its matcher.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher();
  // `patterns[i]` is the text matched for `tokens[i]` (its content, normalized
  // for `normalized` tokens).
  void build(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  // Cuts `text` into plain parts and added tokens covering all of it in order.
  void split(std::string_view text, std::vector<TextPart>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // sorted by byte
    int32_t token = -1;                                   // index into tokens_ when a pattern ends here
  };
  // Index of the longest pattern matching at text[pos], -1 if none; its length in *len.
  int32_t longest_at(std::string_view text, size_t pos, size_t* len) const;
  std::vector<Node> nodes_;
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
  Regex word_char_;  // Rust regex \w, for single_word
};

}  // namespace lockstep::tokenizer
