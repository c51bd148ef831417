// Fuzz target: tokenizer.json (and tokenizer_config.json) loading, and the
// encoding, decoding and streaming decoding of arbitrary text and ids.
// Input: tokenizer.json NUL tokenizer_config.json NUL text (missing parts are
// empty). The text also goes through two fixed tokenizers (byte-level BPE
// with merges and a post-processor; SentencePiece-style byte fallback), so
// every input exercises encode/decode even when its tokenizer.json is bad.
// Checked: ids in range, decode never ill-formed UTF-8, the stream's pieces
// add up to decode(), and the byte-level BPE decodes its encoding back.
#include "lockstep/tokenizer/tokenizer.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "lockstep/base/log.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/unicode.h"

using namespace lockstep;
using namespace lockstep::tokenizer;
using Json = nlohmann::json;

namespace {

std::string byte_level_bpe_json() {
  Json vocab = Json::object();
  const auto& alpha = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) vocab[alpha[size_t(b)]] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"Ã", "©"}, {"1", "2"}};
  Json m = Json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  const Json added = Json::array({{{"id", id},
                                   {"content", "<|endoftext|>"},
                                   {"special", true},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}},
                                  {{"id", id + 1},
                                   {"content", "<|im_start|>"},
                                   {"special", true},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}},
                                  {{"id", id + 2},
                                   {"content", "<think>"},
                                   {"special", false},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}}});
  const Json bl = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const Json post = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", Json::array()},
      {"special_tokens",
       {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {id}}, {"tokens", {"<|endoftext|>"}}}}}}};
  const Json model = {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", m}};
  const Json t = {{"version", "1.0"},       {"truncation", nullptr}, {"padding", nullptr},
                  {"added_tokens", added},  {"normalizer", nullptr}, {"pre_tokenizer", bl},
                  {"post_processor", post}, {"decoder", bl},         {"model", model}};
  return t.dump();
}

std::string byte_fallback_json() {
  Json vocab = Json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int id = 259;
  for (const char* piece :
       {"\xe2\x96\x81", "t", "\xe2\x96\x81t", "h", "e", "\xe2\x96\x81the", "a", "\xc3\xa9"})
    vocab[piece] = id++;
  Json merges = Json::array({"\xe2\x96\x81 t", "\xe2\x96\x81t h", "\xe2\x96\x81th e"});
  vocab["\xe2\x96\x81th"] = id++;
  const Json added = Json::array({{{"id", 0},
                                   {"content", "<unk>"},
                                   {"special", true},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}},
                                  {{"id", 1},
                                   {"content", "<s>"},
                                   {"special", true},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}},
                                  {{"id", 2},
                                   {"content", "</s>"},
                                   {"special", true},
                                   {"normalized", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"single_word", false}}});
  const Json normalizer = {
      {"type", "Sequence"},
      {"normalizers",
       Json::array({{{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}},
                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}}})}};
  const Json decoder = {
      {"type", "Sequence"},
      {"decoders",
       Json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xe2\x96\x81"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  const Json model = {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", "<unk>"},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", true},
                      {"byte_fallback", true},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", merges}};
  const Json t = {{"version", "1.0"},          {"truncation", nullptr},    {"padding", nullptr},
                  {"added_tokens", added},     {"normalizer", normalizer}, {"pre_tokenizer", nullptr},
                  {"post_processor", nullptr}, {"decoder", decoder},       {"model", model}};
  return t.dump();
}

const Tokenizer& fixed_byte_level() {
  static const Tokenizer t = Tokenizer::from_json_text(byte_level_bpe_json(), "fixed/byte_level.json");
  return t;
}
const Tokenizer& fixed_byte_fallback() {
  static const Tokenizer t = Tokenizer::from_json_text(byte_fallback_json(), "fixed/byte_fallback.json");
  return t;
}

void check_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, const char* what) {
  for (const int32_t id : ids)
    LS_FUZZ_EXPECT(id >= 0 && id < tok.vocab_size(), std::string(what) + ": id " + std::to_string(id) +
                                                         " outside the vocabulary of " +
                                                         std::to_string(tok.vocab_size()));
}

// decode() is valid UTF-8 and equals the streamed pieces plus flush().
void check_decode(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (const bool skip : {false, true}) {
    const std::string whole = tok.decode(ids, skip);
    LS_FUZZ_EXPECT(utf8_is_valid(whole), "decode gave ill-formed UTF-8");
    DecodeStream stream = tok.decode_stream(skip);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = stream.step(id);
      LS_FUZZ_EXPECT(utf8_is_valid(piece), "a streamed piece is ill-formed UTF-8");
      streamed += piece;
    }
    const std::string rest = stream.flush();
    LS_FUZZ_EXPECT(utf8_is_valid(rest), "the stream's flush is ill-formed UTF-8");
    streamed += rest;
    LS_FUZZ_EXPECT(streamed == whole, "stream '" + streamed + "' != decode '" + whole + "'");
  }
}

// Ids from raw bytes: in and around the vocabulary (negative and past the end too).
std::vector<int32_t> ids_from_bytes(std::string_view s, int32_t vocab) {
  std::vector<int32_t> ids;
  const int64_t span = int64_t(vocab) + 8;
  for (size_t i = 0; i + 1 < s.size() && ids.size() < 512; i += 2) {
    const int64_t v = int64_t(uint8_t(s[i])) | (int64_t(uint8_t(s[i + 1])) << 8);
    ids.push_back(int32_t(v % span) - 4);
  }
  return ids;
}

void exercise(const Tokenizer& tok, std::string_view text) {
  const std::vector<int32_t> ids = tok.encode(text);
  check_ids(tok, ids, "encode");
  check_ids(tok, tok.encode(text, /*add_special_tokens=*/true), "encode with special tokens");
  check_decode(tok, ids);
  check_decode(tok, ids_from_bytes(text, tok.vocab_size()));
  for (const int32_t id : ids) {
    const std::optional<std::string> t = tok.id_to_token(id);
    if (t) LS_FUZZ_EXPECT(tok.token_to_id(*t).has_value(), "id_to_token has no token_to_id");
  }
  tok.token_to_id(text);
  fuzz::run_expecting_error([&] {
    const std::vector<ChatMessage> chat = {{"system", "be brief"}, {"user", std::string(text)}};
    tok.apply_chat_template(chat);
    check_ids(tok, tok.encode_chat(chat), "encode_chat");
  });
}

std::string_view field(std::string_view in, size_t k) {
  for (size_t i = 0; i < k; ++i) {
    const size_t nul = in.find('\0');
    if (nul == std::string_view::npos) return {};
    in.remove_prefix(nul + 1);
  }
  return in.substr(0, in.find('\0'));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::Error);  // "field ignored" warnings would flood the output
  fixed_byte_level();
  fixed_byte_fallback();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string_view json_text = field(in, 0), config_text = field(in, 1);
  // Text past 2 KiB finds nothing new and only slows every execution down.
  const std::string_view text = field(in, 2).substr(0, 2048);
  static fuzz::MemFile config_file("tokenizer_config.json");
  std::optional<TokenizerConfig> config;
  if (!config_text.empty()) {
    config_file.set(config_text.data(), config_text.size());
    fuzz::run_expecting_error([&] { config = TokenizerConfig::from_file(config_file.path()); });
  }
  std::optional<Tokenizer> tok;
  fuzz::run_expecting_error(
      [&] { tok = Tokenizer::from_json_text(std::string(json_text), "fuzz/tokenizer.json", config); });
  if (tok) exercise(*tok, text);

  const std::string_view fixed_text = text.empty() ? in.substr(0, 2048) : text;
  exercise(fixed_byte_fallback(), fixed_text);
  const Tokenizer& bl = fixed_byte_level();
  exercise(bl, fixed_text);
  // No normalizer, no prefix space: byte-level BPE gives the text back.
  LS_FUZZ_EXPECT(bl.decode(bl.encode(fixed_text)) == utf8_sanitize(fixed_text), "byte-level round trip");
  return 0;
}
