// Datasets from JSONL: prompts for RL/eval (prompt text or a `messages` list,
// a label and metadata) and prompt/response pairs for SFT, tokenized through
// the model's tokenizer and chat template. Keys are configurable ([data]).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/base/toml_section.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::data {

struct DataConfig {
  std::string train_file;
  std::string eval_file;
  std::string prompt_key = "prompt";
  std::string response_key = "response";
  std::string messages_key = "messages";
  std::string label_key = "label";
  std::string metadata_key = "metadata";
  bool apply_chat_template = true;  // prompt text becomes a user message of the chat template
  std::string system_prompt;        // prepended as a system message when not empty
  int64_t max_prompt_len = 1024;    // longer prompts are an error naming the line
  int64_t max_len = 2048;           // SFT: prompt + response tokens; longer ones are an error
};

DataConfig data_config_from_toml(TomlSection& s);

// What the rows must hold besides a prompt, decided by the reward that
// scores them (eval::prompt_needs): a row that lacks it is refused at load
// time, naming the file, line, field and the [data] key that chose it.
struct PromptNeeds {
  bool label = false;               // a row without label_key (or with a null one) is an error
  bool metadata_for_label = false;  // ... unless it has metadata_key (countdown's puzzle)
  std::string why;                  // said in the error: "this reward needs a label"
};

struct PromptExample {
  int64_t line = 0;
  std::string prompt_text;  // as rendered (chat template applied)
  std::vector<int32_t> prompt_ids;
  nlohmann::json label;     // null when absent
  nlohmann::json metadata;  // null when absent; top-level data_source / extra_info are added
};

struct SftExample {
  int64_t line = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> response_ids;  // ends with the end-of-turn token
};

// Each line holds `prompt_key` (a string, or a list of {role, content}) or
// `messages_key` (a list of {role, content}); label and metadata are optional
// unless `needs` says otherwise. Keys may name nested fields with dots
// (data/fields.h).
std::vector<PromptExample> load_prompts(const std::string& path, const DataConfig& cfg,
                                        const tokenizer::Tokenizer& tok, const PromptNeeds& needs = {});

// The checks of load_prompts that need no tokenizer (fields, labels), over
// every line of `path`; returns the number of rows. For `rl --check-config`.
int64_t check_prompt_rows(const std::string& path, const DataConfig& cfg, const PromptNeeds& needs);

// Each line holds prompt_key (text or messages) + response_key, or
// messages_key whose last message (from the assistant) is the response.
std::vector<SftExample> load_sft_examples(const std::string& path, const DataConfig& cfg,
                                          const tokenizer::Tokenizer& tok);

// The token that ends an assistant turn (<|im_end|>, <|eot_id|>, eos).
int32_t end_of_turn_id(const tokenizer::Tokenizer& tok);

}  // namespace lockstep::data
