// Test fixtures for the tokenizer tests: small tokenizer.json files built in
// code (no files are shipped), temp directories, and a slow independent BPE.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::tokenizer::test {

using Json = nlohmann::json;

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("lockstep_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream f(path_ / name, std::ios::binary);
    f << text;
  }

 private:
  std::filesystem::path path_;
};

// The byte-level spelling of UTF-8 text ("a b" -> "aĠb").
inline std::string bl(const std::string& s) {
  std::string out;
  byte_level_encode(s, out);
  return out;
}

inline Json byte_level_pre(bool add_prefix_space = false, bool use_regex = true) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

inline Json added_token(int id, const std::string& content, bool special = true, bool normalized = false,
                        bool lstrip = false, bool rstrip = false, bool single_word = false) {
  return {{"id", id},         {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

// A byte-level BPE: ids 0..255 are the bytes (in the GPT-2 alphabet), then one
// token per merge, in merge order (merges are given in byte-level spelling).
struct BpeFixture {
  std::vector<std::pair<std::string, std::string>> merges;
  Json added_tokens = Json::array();
  Json normalizer = nullptr;
  Json pre_tokenizer = byte_level_pre();
  Json post_processor = nullptr;
  Json decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  bool ignore_merges = false;
  bool array_merges = false;  // write merges as ["a", "b"] instead of "a b"

  // id of a token string of the fixture (bytes or merge results).
  int id(const std::string& token) const {
    const auto& alpha = byte_level_alphabet();
    for (int b = 0; b < 256; ++b)
      if (alpha[static_cast<size_t>(b)] == token) return b;
    for (size_t i = 0; i < merges.size(); ++i)
      if (merges[i].first + merges[i].second == token) return 256 + static_cast<int>(i);
    ADD_FAILURE() << "no token " << token;
    return -1;
  }

  Json vocab() const {
    Json v = Json::object();
    const auto& alpha = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) v[alpha[static_cast<size_t>(b)]] = b;
    for (size_t i = 0; i < merges.size(); ++i) v[merges[i].first + merges[i].second] = 256 + static_cast<int>(i);
    return v;
  }

  std::string json() const {
    Json m = Json::array();
    for (const auto& [a, b] : merges) {
      if (array_merges) {
        m.push_back(Json::array({a, b}));
      } else {
        m.push_back(a + " " + b);
      }
    }
    Json model = {{"type", "BPE"},         {"dropout", nullptr},      {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},           {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},     {"byte_fallback", false},  {"ignore_merges", ignore_merges},
                  {"vocab", vocab()},      {"merges", m}};
    Json t = {{"version", "1.0"},          {"truncation", nullptr},      {"padding", nullptr},
              {"added_tokens", added_tokens}, {"normalizer", normalizer}, {"pre_tokenizer", pre_tokenizer},
              {"post_processor", post_processor}, {"decoder", decoder},  {"model", model}};
    return t.dump();
  }

  Tokenizer load(const TokenizerOptions& opts = {}) const {
    return Tokenizer::from_json_text(json(), "fixture/tokenizer.json", std::nullopt, opts);
  }
};

// An independent, slow BPE over strings (GPT-2's original algorithm): split the
// piece into characters, then repeatedly merge every occurrence of the best
// ranked adjacent pair, scanning left to right.
inline std::vector<std::string> reference_bpe(const std::string& piece,
                                              const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> word;
  for (size_t i = 0; i < piece.size();) {
    size_t len = 1;
    auto c = static_cast<unsigned char>(piece[i]);
    if (c >= 0xF0) len = 4;
    else if (c >= 0xE0) len = 3;
    else if (c >= 0xC0) len = 2;
    word.push_back(piece.substr(i, len));
    i += len;
  }
  while (word.size() > 1) {
    int best = INT32_MAX;
    std::pair<std::string, std::string> best_pair;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        best_pair = it->first;
      }
    }
    if (best == INT32_MAX) break;
    std::vector<std::string> next;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == best_pair.first && word[i + 1] == best_pair.second) {
        next.push_back(word[i] + word[i + 1]);
        i += 2;
      } else {
        next.push_back(word[i]);
        ++i;
      }
    }
    word.swap(next);
  }
  return word;
}

}  // namespace lockstep::tokenizer::test
