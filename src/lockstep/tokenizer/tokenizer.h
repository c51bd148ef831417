// lockstep's tokenizer: loads a Hugging Face tokenizer.json (BPE, byte-level or
// with byte fallback) plus tokenizer_config.json, encodes text to the ids the
// reference implementation gives, decodes (also incrementally for streaming)
// and formats chats with the built-in templates. See docs/tokenizer.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/tokenizer/added_vocabulary.h"
#include "lockstep/tokenizer/chat_template.h"
#include "lockstep/tokenizer/tokenizer_config.h"

namespace lockstep::tokenizer {

struct TokenizerOptions {
  // "auto": recognise the chat_template of tokenizer_config.json; or one of
  // "chatml", "llama3", "deepseek", "raw" to choose a built-in template.
  std::string chat_template = "auto";
};

class DecodeStream;

// Immutable after loading; cheap to copy (shared state) and safe to use from
// several threads at once.
class Tokenizer {
 public:
  // `path` is a directory holding tokenizer.json (and optionally
  // tokenizer_config.json and chat_template.jinja), or a tokenizer.json file
  // (its directory's tokenizer_config.json is read when present).
  static Tokenizer load(const std::filesystem::path& path, const TokenizerOptions& options = {});
  // From the text of a tokenizer.json; `origin` names it in errors.
  static Tokenizer from_json_text(const std::string& tokenizer_json,
                                  const std::string& origin = "tokenizer.json",
                                  const std::optional<TokenizerConfig>& config = std::nullopt,
                                  const TokenizerOptions& options = {});

  // Token ids of `text`. Added/special tokens written in the text are
  // recognised. Ill-formed UTF-8 is first repaired (each maximal ill-formed
  // subpart becomes U+FFFD, as Python's errors="replace" does). With
  // `add_special_tokens`, the post-processor's tokens (e.g. BOS) are added, as
  // transformers' tokenizer(text) would.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Text of `ids`; unknown ids are skipped. Never returns ill-formed UTF-8.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The bytes one token decodes to, before ill-formed UTF-8 is repaired: a
  // token holding part of a character gives that part. Unknown ids: "".
  std::string token_bytes(int32_t id) const;
  // An incremental decoder for streaming output (see DecodeStream).
  DecodeStream decode_stream(bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // One past the largest id of the vocabulary and added tokens.
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  const TokenizerConfig& config() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;

  // The chat template in use; throws Error (saying how to choose one) when the
  // config's template was not recognised and none was chosen.
  const ChatTemplate& chat_template() const;
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = true) const;
  // Ids of the rendered chat. Templates write BOS themselves, so no special
  // tokens are added, except for `raw`, which encodes with add_special_tokens.
  std::vector<int32_t> encode_chat(const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt = true) const;

  struct Impl;

 private:
  friend class DecodeStream;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns ids into text one id at a time without ever emitting a broken UTF-8
// sequence: bytes of a character split across tokens are held back until the
// character is complete. With a ByteFallback decoder, a run of <0xNN> byte
// tokens is held back until a token ends it: one more byte token can turn the
// whole run, characters already complete included, into U+FFFDs. The
// concatenation of all step() results and flush() equals Tokenizer::decode of
// all ids.
class DecodeStream {
 public:
  // Text that became complete with `id` (often empty while a character is partial).
  std::string step(int32_t id);
  // Whatever is still held back, repaired to U+FFFD; call at the end of a stream.
  std::string flush();

 private:
  friend class Tokenizer;
  DecodeStream(std::shared_ptr<const Tokenizer::Impl> impl, bool skip_special)
      : impl_(std::move(impl)), skip_special_(skip_special) {}
  std::shared_ptr<const Tokenizer::Impl> impl_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // context ids followed by ids not yet fully emitted
  size_t prefix_ids_ = 0;     // ids_[0, prefix_ids_) are context whose text was emitted
  std::string prefix_bytes_;  // decoded bytes of that context
  size_t emitted_ = 0;        // bytes of the text after the context already emitted
  std::string pending_;       // byte-level fast path: decoded bytes not yet emitted
  bool in_byte_run_ = false;  // the last id decoding keeps is a byte token of a ByteFallback run
};

}  // namespace lockstep::tokenizer
