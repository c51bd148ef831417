// What a dataset row holds, read as lockstep reads it: [data] *_key settings
// that name nested fields with dots, a prompt given as text or as a message
// list, verl's top-level data_source / extra_info, and the checks that a row
// has what its reward or loss needs (errors name file, line, field and key).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/tokenizer/chat_template.h"

namespace lockstep::data {

// The value at `key` in `row`: a top-level field of that exact name when the
// row has one, else the dotted path through nested objects
// ("reward_model.ground_truth"); nullptr when absent.
const nlohmann::json* find_field(const nlohmann::json& row, const std::string& key);

// A row's prompt: a message list (from messages_key, or prompt_key holding a
// list of {role, content}) or a text (prompt_key holding a string).
struct PromptSource {
  std::vector<tokenizer::ChatMessage> messages;  // empty when given as text
  std::optional<std::string> text;
};

// An RL/eval row's fields: the prompt, the label (null when absent) and the
// metadata (null when absent; top-level data_source / extra_info are added).
struct PromptFields {
  PromptSource prompt;
  nlohmann::json label;
  nlohmann::json metadata;
};

// Reads and checks one RL/eval row; `needs` says whether a missing label is
// an error.
PromptFields prompt_fields(const JsonlRecord& r, const std::string& path, const DataConfig& cfg,
                           const PromptNeeds& needs);

// An SFT row's prompt and response: messages_key (or a message-list prompt)
// ending with the assistant's response, or prompt_key + response_key.
struct SftFields {
  PromptSource prompt;
  std::string response;
};

SftFields sft_fields(const JsonlRecord& r, const std::string& path, const DataConfig& cfg);

}  // namespace lockstep::data
