// Added-token matching: a byte trie gives the leftmost-longest match (what the
// aho-corasick automaton in HF does); then single_word/lstrip/rstrip adjust it.
#include "lockstep/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {

AddedTokenMatcher::AddedTokenMatcher()
    : word_char_(R"(^[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", "added token word class") {
  nodes_.emplace_back();
}

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns) {
  nodes_.assign(1, Node{});
  tokens_.clear();
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& p = patterns[i];
    if (p.empty()) continue;  // an empty pattern never matches
    int32_t node = 0;
    for (char c : p) {
      auto b = static_cast<unsigned char>(c);
      auto& next = nodes_[static_cast<size_t>(node)].next;
      auto it = std::lower_bound(next.begin(), next.end(), b,
                                 [](const std::pair<unsigned char, int32_t>& e, unsigned char k) { return e.first < k; });
      if (it != next.end() && it->first == b) {
        node = it->second;
      } else {
        auto child = static_cast<int32_t>(nodes_.size());
        next.insert(it, {b, child});
        nodes_.emplace_back();
        node = child;
      }
    }
    // The first pattern wins for equal contents (aho-corasick reports the lowest pattern index).
    if (nodes_[static_cast<size_t>(node)].token < 0) {
      nodes_[static_cast<size_t>(node)].token = static_cast<int32_t>(tokens_.size());
      tokens_.push_back(tokens[i]);
    }
    first_byte_[static_cast<unsigned char>(p[0])] = true;
  }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = 0, best = -1;
  for (size_t k = pos; k < text.size(); ++k) {
    const auto& next = nodes_[static_cast<size_t>(node)].next;
    auto b = static_cast<unsigned char>(text[k]);
    auto it = std::lower_bound(next.begin(), next.end(), b,
                               [](const std::pair<unsigned char, int32_t>& e, unsigned char key) { return e.first < key; });
    if (it == next.end() || it->first != b) break;
    node = it->second;
    if (nodes_[static_cast<size_t>(node)].token >= 0) {
      best = nodes_[static_cast<size_t>(node)].token;
      *len = k + 1 - pos;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextPart>& out) const {
  auto n = static_cast<uint32_t>(text.size());
  if (tokens_.empty()) {
    out.push_back({0, n, -1});
    return;
  }
  auto is_word_char = [&](size_t at) {
    size_t len = utf8_next(text, at).len;
    return word_char_.search(text.substr(at, len));
  };
  size_t start_offset = 0;  // end of the previous accepted match
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t len = 0;
    int32_t t = longest_at(text, pos, &len);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<size_t>(t)];
    size_t start = pos, stop = pos + len;
    // The automaton moves past a match whatever is decided about it below.
    pos = stop;
    if (start < start_offset) continue;  // swallowed by the previous token's rstrip
    if (tok.single_word) {
      bool word_before = false;
      if (start > 0) {
        size_t k = start - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        word_before = is_word_char(k);
      }
      bool word_after = stop < text.size() && is_word_char(stop);
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        if (!is_white_space(utf8_next(text, k).cp)) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        Utf8Step st = utf8_next(text, stop);
        if (!is_white_space(st.cp)) break;
        stop += st.len;
      }
      pos = std::max(pos, stop);
    }
    if (start_offset < start) out.push_back({static_cast<uint32_t>(start_offset), static_cast<uint32_t>(start), -1});
    out.push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(stop), tok.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({static_cast<uint32_t>(start_offset), n, -1});
}

}  // namespace lockstep::tokenizer
