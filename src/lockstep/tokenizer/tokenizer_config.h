// tokenizer_config.json, the transformers-side settings next to tokenizer.json:
// bos/eos/pad/unk token names, add_bos_token/add_eos_token, the chat template.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "lockstep/tokenizer/json_fields.h"

namespace lockstep::tokenizer {

struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token, add_eos_token;  // unset when the file does not say
  std::optional<std::string> chat_template;          // Jinja source, when present
  std::string tokenizer_class;
  std::optional<double> model_max_length;

  // Token fields may be a string, an AddedToken object ({"content": ...}) or null.
  // `chat_template` may be a string or a list of {"name", "template"} (the one
  // named "default" is used, else the first).
  static TokenizerConfig from_json(const Json& j, const std::string& where);
  static TokenizerConfig from_file(const std::filesystem::path& path);
};

}  // namespace lockstep::tokenizer
