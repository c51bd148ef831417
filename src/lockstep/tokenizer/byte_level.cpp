// GPT-2 byte<->unicode map and the merge-free byte-level tokenizer writer.
#include "lockstep/tokenizer/byte_level.h"

#include <fstream>

#include "lockstep/base/error.h"
#include "lockstep/tokenizer/chat_template.h"
#include "lockstep/tokenizer/json_fields.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

bool is_printable_byte(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 0x144> from_cp{};  // every mapped code point is below U+0144
  Tables() {
    from_cp.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      to_cp[b] = is_printable_byte(b) ? b : next++;
      utf8_append(to_utf8[b], to_cp[b]);
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) LS_THROW << path.string() << ": cannot open for writing";
  f << text;
  f.close();
  if (!f) LS_THROW << path.string() << ": write failed";
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) {
  return tables().to_cp[b];
}

int unicode_to_byte(uint32_t cp) {
  return cp < tables().from_cp.size() ? tables().from_cp[cp] : -1;
}

const std::array<std::string, 256>& byte_level_alphabet() {
  return tables().to_utf8;
}

void byte_level_encode(std::string_view bytes, std::string& out) {
  // Every mapped code point is below U+0800: one or two UTF-8 bytes.
  const auto& t = tables().to_cp;
  size_t start = out.size();
  out.resize(start + 2 * bytes.size());
  char* p = out.data() + start;
  for (char c : bytes) {
    uint32_t cp = t[static_cast<unsigned char>(c)];
    if (cp < 0x80) {
      *p++ = static_cast<char>(cp);
    } else {
      *p++ = static_cast<char>(0xC0 | (cp >> 6));
      *p++ = static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  out.resize(static_cast<size_t>(p - out.data()));
}

bool byte_level_decode(std::string_view text, std::string& out) {
  size_t start = out.size();
  for (size_t i = 0; i < text.size();) {
    Utf8Step st = utf8_next(text, i);
    int b = st.valid ? unicode_to_byte(st.cp) : -1;
    if (b < 0) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(b));
    i += st.len;
  }
  return true;
}

std::vector<std::string> ascii_filler_pieces(int64_t count) {
  constexpr int kFirst = 0x20, kChars = 0x7F - 0x20;  // printable ASCII, space included
  std::vector<std::string> pieces;
  if (count <= 0) return pieces;
  pieces.reserve(static_cast<size_t>(count));
  // Odometer over strings of `len` characters; len grows when one wraps.
  for (size_t len = 2; static_cast<int64_t>(pieces.size()) < count; ++len) {
    std::vector<int> digit(len, 0);
    while (static_cast<int64_t>(pieces.size()) < count) {
      std::string s(len, ' ');
      for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>(kFirst + digit[i]);
      pieces.push_back(std::move(s));
      size_t pos = len;
      while (pos > 0 && ++digit[pos - 1] == kChars) digit[--pos] = 0;
      if (pos == 0) break;  // every string of this length was written
    }
  }
  return pieces;
}

void write_byte_level_tokenizer(const std::filesystem::path& dir,
                                const std::vector<std::string>& special_tokens, int64_t vocab_size) {
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    const std::string& s = special_tokens[i];
    if (s.empty() || !utf8_is_valid(s))
      LS_THROW << "write_byte_level_tokenizer: special token " << i << " is empty or not UTF-8";
    for (size_t k = 0; k < i; ++k)
      if (special_tokens[k] == s)
        LS_THROW << "write_byte_level_tokenizer: special token '" << s << "' given twice";
    // A single-character special would shadow a byte token of the same spelling.
    if (utf8_length(s) == 1 && s.size() <= 2 && unicode_to_byte(utf8_next(s, 0).cp) >= 0)
      LS_THROW << "write_byte_level_tokenizer: special token '" << s << "' collides with a byte token";
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) LS_THROW << dir.string() << ": cannot create directory: " << ec.message();

  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_alphabet()[static_cast<size_t>(b)]] = b;
  Json added = Json::array();
  Json added_decoder = Json::object();
  for (size_t i = 0; i < special_tokens.size(); ++i) {
    int id = 256 + static_cast<int>(i);
    Json t = {{"id", id},        {"content", special_tokens[i]}, {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false},          {"special", true}};
    added.push_back(t);
    Json d = t;
    d.erase("id");
    added_decoder[std::to_string(id)] = d;
    // In the model's vocabulary too: `tokenizers` gives an added token the id
    // its text has there, and otherwise the next id after the whole vocabulary
    // (which the filler pieces below would move).
    vocab[special_tokens[i]] = id;
  }
  const int64_t first_filler = 256 + static_cast<int64_t>(special_tokens.size());
  const std::vector<std::string> fillers = ascii_filler_pieces(vocab_size - first_filler);
  for (size_t i = 0; i < fillers.size(); ++i) {
    std::string spelled;
    byte_level_encode(fillers[i], spelled);
    vocab[spelled] = first_filler + static_cast<int64_t>(i);
  }
  Json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  Json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", Json::array()}}},
  };

  auto has = [&](const std::string& s) {
    for (const auto& t : special_tokens)
      if (t == s) return true;
    return false;
  };
  Json eos = nullptr, pad = nullptr;
  if (!special_tokens.empty()) {
    eos = has("<|im_end|>") ? "<|im_end|>" : special_tokens.back();
    pad = has("<|endoftext|>") ? Json("<|endoftext|>") : eos;
  }
  Json cfg = {
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"added_tokens_decoder", added_decoder},
      {"bos_token", nullptr},
      {"eos_token", eos},
      {"pad_token", pad},
      {"unk_token", nullptr},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 1 << 20},
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"chat_template", chatml_jinja_template()},
  };
  write_file(dir / "tokenizer.json", tok.dump(2) + "\n");
  write_file(dir / "tokenizer_config.json", cfg.dump(2) + "\n");
}

}  // namespace lockstep::tokenizer
