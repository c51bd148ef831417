// Helpers shared by the model tests: a scratch directory removed at scope
// exit, whole-file reads/writes, small configs built in code, and a check
// that a callable throws lockstep::Error whose message contains given parts.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/model/config.h"

namespace lockstep::test {

class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("lockstep-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& child = "") const {
    return child.empty() ? path_.string() : (path_ / child).string();
  }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Runs fn, which must throw lockstep::Error with every one of `parts` in its message.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
    return;
  }
  ADD_FAILURE() << "expected lockstep::Error";
}

// A tiny Qwen3-MoE-style config: 3 layers (layer 1 dense via mlp_only_layers).
inline ModelConfig tiny_moe_config() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 64;
  c.hidden_size = 16;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 24;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  c.eos_token_ids = {3};
  return c;
}

// A tiny dense Llama-style config.
inline ModelConfig tiny_dense_config() {
  ModelConfig c;
  c.architecture = Architecture::Llama;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.head_dim = 4;
  c.intermediate_size = 20;
  c.tie_word_embeddings = true;
  return c;
}

// Calls parse on `base` with each field, and each field of a nested object, in
// turn replaced by a string of kilobytes: any Error it throws must be a line
// (an excerpt of the value), not a copy of it. Returns the cases tried.
inline size_t expect_short_errors_for_long_strings(const nlohmann::json& base,
                                                   const std::function<void(const nlohmann::json&)>& parse) {
  const std::string y(6000, 'y');
  std::vector<nlohmann::json> cases;
  for (auto it = base.begin(); it != base.end(); ++it) {
    nlohmann::json j = base;
    j[it.key()] = y;
    cases.push_back(j);
    if (it.value().is_object())
      for (auto in = it.value().begin(); in != it.value().end(); ++in) {
        nlohmann::json k = base;
        k[it.key()][in.key()] = y;
        cases.push_back(k);
      }
  }
  for (const nlohmann::json& j : cases) {
    try {
      parse(j);
    } catch (const lockstep::Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 512u) << e.what();
    }
  }
  return cases.size();
}

}  // namespace lockstep::test
