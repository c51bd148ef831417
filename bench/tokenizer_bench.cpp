// Tokenizer throughput (MB/s of UTF-8 text) for encode, decode and streaming
// decode on ~10 MB of generated mixed text: English-like prose, code, CJK,
// Cyrillic, emoji, digits and whitespace runs. The tokenizer is a synthetic
// byte-level BPE whose merges spell the text's frequent words, in a Qwen2-like
// and a Llama-3-like configuration; set LOCKSTEP_BENCH_TOKENIZER=DIR to also
// measure a real tokenizer.json. Run: build/bench_tokenizer
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/pre_tokenizer.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace {

using lockstep::tokenizer::Tokenizer;
using Json = nlohmann::json;

constexpr size_t kTextBytes = 10 * 1000 * 1000;

const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kLlamaPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string make_text() {
  std::mt19937 rng(2024);
  const std::vector<std::string> words = {
      "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this",
      "model", "token", "reward", "policy", "gradient", "training", "language", "system", "value", "function",
      "however", "because", "between", "through", "example", "different", "important", "information", "problem",
      "answer", "question", "number", "people", "world", "government", "university", "research", "development",
      "I'm", "don't", "it's", "we're", "they've", "you'll", "Hello", "The", "In", "We", "This", "RL", "GPU", "API"};
  const std::vector<std::string> cjk = {"的", "是", "不", "了", "在", "人", "有", "我", "他", "这", "个", "们", "中",
                                        "来", "上", "大", "为", "和", "国", "地", "到", "以", "说", "时", "要", "就",
                                        "の", "に", "は", "を", "た", "が", "で", "て", "と", "し", "れ", "さ", "ア", "イ"};
  const std::vector<std::string> cyr = {"привет", "мир", "модель", "обучение", "данные", "и", "в", "не", "что"};
  const std::vector<std::string> emoji = {"🙂", "🚀", "👍🏽", "🤖", "✨", "❤️"};
  std::string out;
  out.reserve(kTextBytes + 4096);
  while (out.size() < kTextBytes) {
    unsigned kind = rng() % 100;
    if (kind < 60) {  // a prose paragraph
      int n = 20 + static_cast<int>(rng() % 80);
      for (int i = 0; i < n; ++i) {
        out += words[rng() % words.size()];
        unsigned r = rng() % 20;
        out += r == 0 ? ", " : r == 1 ? ". " : r == 2 ? " " + std::to_string(rng() % 100000) + " " : " ";
      }
      out += "\n\n";
    } else if (kind < 80) {  // code
      int n = 3 + static_cast<int>(rng() % 12);
      out += "def f_" + std::to_string(rng() % 1000) + "(x, y):\n";
      for (int i = 0; i < n; ++i) {
        out += std::string(4 * (1 + rng() % 3), ' ') + "value_" + std::to_string(i) + " = x[" +
               std::to_string(rng() % 64) + "] * y + " + std::to_string(rng() % 10) + "  # " +
               words[rng() % words.size()] + "\n";
      }
      out += "    return value_0\n\n";
    } else if (kind < 92) {  // CJK
      int n = 30 + static_cast<int>(rng() % 100);
      for (int i = 0; i < n; ++i) out += cjk[rng() % cjk.size()];
      out += "。\n";
    } else if (kind < 97) {
      for (int i = 0; i < 20; ++i) out += cyr[rng() % cyr.size()] + " ";
      out += "\n";
    } else {
      for (int i = 0; i < 10; ++i) out += emoji[rng() % emoji.size()] + std::string(1 + rng() % 3, ' ');
      out += "\t\t\n";
    }
  }
  return out;
}

const std::string& text() {
  static const std::string t = make_text();
  return t;
}

// A byte-level BPE whose merges build the most frequent pieces of the text
// character by character (each merge: prefix + next character).
std::string synthetic_tokenizer_json(bool llama_like) {
  using namespace lockstep::tokenizer;
  Regex re(llama_like ? kLlamaPattern : kQwenPattern, "bench pattern");
  std::vector<std::string> pieces;
  split_by_pattern(std::string_view(text()).substr(0, 2000000), re, false, SplitBehavior::Isolated, pieces);
  std::map<std::string, int> freq;
  for (const auto& p : pieces) {
    std::string m;
    byte_level_encode(p, m);
    ++freq[m];
  }
  std::vector<std::pair<int, std::string>> top;
  for (const auto& [w, n] : freq) top.emplace_back(-n, w);
  std::sort(top.begin(), top.end());
  Json vocab = Json::object();
  const auto& alpha = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) vocab[alpha[static_cast<size_t>(b)]] = b;
  Json merges = Json::array();
  int next = 256;
  for (size_t k = 0; k < top.size() && k < 8000; ++k) {
    const std::string& w = top[k].second;
    std::string prefix;
    size_t i = 0;
    auto char_len = [&](size_t at) {
      auto c = static_cast<unsigned char>(w[at]);
      return c >= 0xF0 ? 4u : c >= 0xE0 ? 3u : c >= 0xC0 ? 2u : 1u;
    };
    prefix = w.substr(0, char_len(0));
    i = prefix.size();
    while (i < w.size()) {
      std::string ch = w.substr(i, char_len(i));
      std::string merged = prefix + ch;
      if (!vocab.contains(merged)) {
        vocab[merged] = next++;
        merges.push_back(Json::array({prefix, ch}));
      }
      prefix = merged;
      i += ch.size();
    }
  }
  Json split = {{"type", "Split"}, {"pattern", {{"Regex", llama_like ? kLlamaPattern : kQwenPattern}}},
                {"behavior", "Isolated"}, {"invert", false}};
  Json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  Json t = {{"version", "1.0"},
            {"added_tokens", Json::array({{{"id", next}, {"content", "<|endoftext|>"}, {"special", true},
                                           {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                           {"single_word", false}}})},
            {"normalizer", llama_like ? Json(nullptr) : Json({{"type", "NFC"}})},
            {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, bl}}}},
            {"post_processor", nullptr},
            {"decoder", bl},
            {"model",
             {{"type", "BPE"}, {"ignore_merges", llama_like}, {"vocab", vocab}, {"merges", merges}}}};
  return t.dump();
}

const Tokenizer& tokenizer(int which) {
  static const Tokenizer qwen = Tokenizer::from_json_text(synthetic_tokenizer_json(false), "qwen-like");
  static const Tokenizer llama = Tokenizer::from_json_text(synthetic_tokenizer_json(true), "llama3-like");
  if (which == 0) return qwen;
  if (which == 1) return llama;
  static const Tokenizer real = Tokenizer::load(std::getenv("LOCKSTEP_BENCH_TOKENIZER"));
  return real;
}

void label(benchmark::State& state, int which) {
  const char* names[] = {"qwen2-like synthetic", "llama3-like synthetic", "LOCKSTEP_BENCH_TOKENIZER"};
  state.SetLabel(names[which]);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text().size()));
}

void BM_Encode(benchmark::State& state) {
  int which = static_cast<int>(state.range(0));
  const Tokenizer& t = tokenizer(which);
  size_t n = 0;
  for (auto _ : state) {
    auto ids = t.encode(text());
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.counters["tokens"] = static_cast<double>(n);
  label(state, which);
}

void BM_Decode(benchmark::State& state) {
  int which = static_cast<int>(state.range(0));
  const Tokenizer& t = tokenizer(which);
  std::vector<int32_t> ids = t.encode(text());
  for (auto _ : state) {
    std::string s = t.decode(ids);
    benchmark::DoNotOptimize(s.data());
  }
  label(state, which);
}

void BM_DecodeStream(benchmark::State& state) {
  int which = static_cast<int>(state.range(0));
  const Tokenizer& t = tokenizer(which);
  std::vector<int32_t> ids = t.encode(text());
  for (auto _ : state) {
    auto ds = t.decode_stream();
    size_t bytes = 0;
    for (int32_t id : ids) bytes += ds.step(id).size();
    bytes += ds.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  label(state, which);
}

void args(benchmark::internal::Benchmark* b) {
  b->Arg(0)->Arg(1);
  if (std::getenv("LOCKSTEP_BENCH_TOKENIZER") != nullptr) b->Arg(2);
  // Rates use CPU time (Google Benchmark's default): stable on a shared machine.
  b->Unit(benchmark::kMillisecond)->Iterations(2);
}

BENCHMARK(BM_Encode)->Apply(args);
BENCHMARK(BM_Decode)->Apply(args);
BENCHMARK(BM_DecodeStream)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
