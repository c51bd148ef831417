// Internal state of a loaded Tokenizer, shared by tokenizer.cpp and
// decode_stream.cpp. Not part of the public API.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/tokenizer/added_vocabulary.h"
#include "lockstep/tokenizer/bpe.h"
#include "lockstep/tokenizer/chat_template.h"
#include "lockstep/tokenizer/decoder.h"
#include "lockstep/tokenizer/normalizer.h"
#include "lockstep/tokenizer/post_processor.h"
#include "lockstep/tokenizer/pre_tokenizer.h"
#include "lockstep/tokenizer/tokenizer.h"
#include "lockstep/tokenizer/tokenizer_config.h"

namespace lockstep::tokenizer {

struct Tokenizer::Impl {
  std::string origin;  // "path/tokenizer.json", for messages
  BpeModel model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;  // what add_special_tokens applies (may be null)
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;  // with their final ids, in file order
  Vocab added_ids;                // content -> id
  AddedTokenMatcher raw_matcher;         // tokens with normalized=false, matched on the raw text
  AddedTokenMatcher normalized_matcher;  // tokens with normalized=true, matched after normalization
  // Pre-tokenizer only cuts and ends with the byte-level mapping, and the model
  // takes raw bytes: pieces go from the text to the model as spans, unmapped.
  bool span_fast_path = false;
  int32_t vocab_size = 0;
  std::vector<std::string> token_text;  // id -> token string ("" for holes)
  std::vector<uint8_t> known;           // id -> 1 when the id exists
  std::vector<uint8_t> special;         // id -> 1 when decoding with skip_special_tokens drops it
  std::vector<std::string> byte_level_bytes;  // id -> decoded bytes, when the decoder is a lone ByteLevel
  // id -> 1 for a <0xNN> byte token, when the decoder decodes runs of them as
  // a whole (ByteFallback); empty otherwise. DecodeStream holds a run back.
  std::vector<uint8_t> byte_run_token;
  TokenizerConfig config;
  std::optional<ChatTemplate> chat;
  std::string chat_error;  // why `chat` is empty

  Impl(BpeModel m) : model(std::move(m)) {}
  // Decoded bytes of `ids`, before the final UTF-8 repair.
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special) const;
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
};

}  // namespace lockstep::tokenizer
