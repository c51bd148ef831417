// Prompt and SFT dataset loading.
#include "lockstep/data/dataset.h"

#include "lockstep/base/error.h"
#include "lockstep/data/fields.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/data/rows.h"

namespace lockstep::data {

DataConfig data_config_from_toml(TomlSection& s) {
  DataConfig c;
  c.train_file = s.get_string("train_file", c.train_file);
  c.eval_file = s.get_string("eval_file", c.eval_file);
  c.prompt_key = s.get_string("prompt_key", c.prompt_key);
  c.response_key = s.get_string("response_key", c.response_key);
  c.messages_key = s.get_string("messages_key", c.messages_key);
  c.label_key = s.get_string("label_key", c.label_key);
  c.metadata_key = s.get_string("metadata_key", c.metadata_key);
  c.apply_chat_template = s.get_bool("apply_chat_template", c.apply_chat_template);
  c.system_prompt = s.get_string("system_prompt", c.system_prompt);
  c.max_prompt_len = s.get_int("max_prompt_len", c.max_prompt_len, 1);
  c.max_len = s.get_int("max_len", c.max_len, 2);
  return c;
}

namespace {

std::vector<int32_t> encode_prompt(const tokenizer::Tokenizer& tok, const DataConfig& cfg,
                                   std::vector<tokenizer::ChatMessage> msgs, std::string* text) {
  if (!cfg.system_prompt.empty() && (msgs.empty() || msgs.front().role != "system"))
    msgs.insert(msgs.begin(), {"system", cfg.system_prompt});
  *text = tok.apply_chat_template(msgs, true);
  return tok.encode_chat(msgs, true);
}

// A prompt given as text goes through the chat template as a user message
// unless apply_chat_template is off; messages always do.
std::vector<int32_t> encode_source(const tokenizer::Tokenizer& tok, const DataConfig& cfg, PromptSource src,
                                   std::string* text) {
  if (!src.text) return encode_prompt(tok, cfg, std::move(src.messages), text);
  if (cfg.apply_chat_template) return encode_prompt(tok, cfg, {{"user", *src.text}}, text);
  *text = *src.text;
  return tok.encode(*src.text, true);
}

}  // namespace

int32_t end_of_turn_id(const tokenizer::Tokenizer& tok) {
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>"})
    if (auto id = tok.token_to_id(name)) return *id;
  if (auto e = tok.eos_id()) return *e;
  LS_THROW << "tokenizer has no end-of-turn or eos token";
}

std::vector<PromptExample> load_prompts(const std::string& path, const DataConfig& cfg,
                                        const tokenizer::Tokenizer& tok, const PromptNeeds& needs) {
  std::vector<PromptExample> out;
  for (const auto& r : read_rows(path)) {
    PromptFields f = prompt_fields(r, path, cfg, needs);
    PromptExample ex;
    ex.line = r.line;
    ex.prompt_ids = encode_source(tok, cfg, std::move(f.prompt), &ex.prompt_text);
    if (int64_t(ex.prompt_ids.size()) > cfg.max_prompt_len)
      LS_THROW << path << ":" << r.line << ": prompt has " << ex.prompt_ids.size()
               << " tokens, more than data.max_prompt_len = " << cfg.max_prompt_len;
    if (ex.prompt_ids.empty()) LS_THROW << path << ":" << r.line << ": prompt encodes to no tokens";
    ex.label = std::move(f.label);
    ex.metadata = std::move(f.metadata);
    out.push_back(std::move(ex));
  }
  if (out.empty()) LS_THROW << path << ": no examples";
  return out;
}

int64_t check_prompt_rows(const std::string& path, const DataConfig& cfg, const PromptNeeds& needs) {
  int64_t n = 0;
  for (const auto& r : read_rows(path)) {
    prompt_fields(r, path, cfg, needs);
    ++n;
  }
  if (n == 0) LS_THROW << path << ": no examples";
  return n;
}

std::vector<SftExample> load_sft_examples(const std::string& path, const DataConfig& cfg,
                                          const tokenizer::Tokenizer& tok) {
  const int32_t eot = end_of_turn_id(tok);
  std::vector<SftExample> out;
  for (const auto& r : read_rows(path)) {
    SftFields f = sft_fields(r, path, cfg);
    SftExample ex;
    ex.line = r.line;
    std::string text;
    ex.prompt_ids = encode_source(tok, cfg, std::move(f.prompt), &text);
    ex.response_ids = tok.encode(f.response, false);
    ex.response_ids.push_back(eot);
    if (ex.prompt_ids.empty()) LS_THROW << path << ":" << r.line << ": prompt encodes to no tokens";
    if (int64_t(ex.prompt_ids.size() + ex.response_ids.size()) > cfg.max_len)
      LS_THROW << path << ":" << r.line << ": example has " << ex.prompt_ids.size() + ex.response_ids.size()
               << " tokens, more than data.max_len = " << cfg.max_len;
    out.push_back(std::move(ex));
  }
  if (out.empty()) LS_THROW << path << ": no examples";
  return out;
}

}  // namespace lockstep::data
