// Prompt and SFT dataset loading.
#include "lockstep/data/dataset.h"

#include "lockstep/base/error.h"
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

std::vector<tokenizer::ChatMessage> parse_messages(const JsonlRecord& r, const std::string& path,
                                                   const std::string& key) {
  const auto& v = require_field(r, path, key);
  if (!v.is_array() || v.empty())
    LS_THROW << path << ":" << r.line << ": field '" << key << "' must be a non-empty list of messages";
  std::vector<tokenizer::ChatMessage> out;
  for (const auto& m : v) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string())
      LS_THROW << path << ":" << r.line << ": each message of '" << key << "' needs string 'role' and 'content'";
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

std::vector<int32_t> encode_prompt(const tokenizer::Tokenizer& tok, const DataConfig& cfg,
                                   std::vector<tokenizer::ChatMessage> msgs, std::string* text) {
  if (!cfg.system_prompt.empty() && (msgs.empty() || msgs.front().role != "system"))
    msgs.insert(msgs.begin(), {"system", cfg.system_prompt});
  *text = tok.apply_chat_template(msgs, true);
  return tok.encode_chat(msgs, true);
}

}  // namespace

int32_t end_of_turn_id(const tokenizer::Tokenizer& tok) {
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<｜end▁of▁sentence｜>"})
    if (auto id = tok.token_to_id(name)) return *id;
  if (auto e = tok.eos_id()) return *e;
  LS_THROW << "tokenizer has no end-of-turn or eos token";
}

std::vector<PromptExample> load_prompts(const std::string& path, const DataConfig& cfg,
                                        const tokenizer::Tokenizer& tok) {
  std::vector<PromptExample> out;
  for (const auto& r : read_rows(path)) {
    PromptExample ex;
    ex.line = r.line;
    if (r.value.contains(cfg.messages_key)) {
      ex.prompt_ids = encode_prompt(tok, cfg, parse_messages(r, path, cfg.messages_key), &ex.prompt_text);
    } else if (r.value.contains(cfg.prompt_key)) {
      std::string p = require_string(r, path, cfg.prompt_key);
      if (cfg.apply_chat_template) {
        ex.prompt_ids = encode_prompt(tok, cfg, {{"user", p}}, &ex.prompt_text);
      } else {
        ex.prompt_text = p;
        ex.prompt_ids = tok.encode(p, true);
      }
    } else {
      LS_THROW << path << ":" << r.line << ": missing field '" << cfg.prompt_key << "' (or '" << cfg.messages_key
               << "')";
    }
    if (int64_t(ex.prompt_ids.size()) > cfg.max_prompt_len)
      LS_THROW << path << ":" << r.line << ": prompt has " << ex.prompt_ids.size()
               << " tokens, more than data.max_prompt_len = " << cfg.max_prompt_len;
    if (ex.prompt_ids.empty()) LS_THROW << path << ":" << r.line << ": prompt encodes to no tokens";
    if (auto it = r.value.find(cfg.label_key); it != r.value.end()) ex.label = *it;
    if (auto it = r.value.find(cfg.metadata_key); it != r.value.end()) ex.metadata = *it;
    out.push_back(std::move(ex));
  }
  if (out.empty()) LS_THROW << path << ": no examples";
  return out;
}

std::vector<SftExample> load_sft_examples(const std::string& path, const DataConfig& cfg,
                                          const tokenizer::Tokenizer& tok) {
  const int32_t eot = end_of_turn_id(tok);
  std::vector<SftExample> out;
  for (const auto& r : read_rows(path)) {
    SftExample ex;
    ex.line = r.line;
    std::string text, response;
    if (r.value.contains(cfg.messages_key)) {
      auto msgs = parse_messages(r, path, cfg.messages_key);
      if (msgs.size() < 2 || msgs.back().role != "assistant")
        LS_THROW << path << ":" << r.line << ": '" << cfg.messages_key
                 << "' must end with an assistant message (the response)";
      response = msgs.back().content;
      msgs.pop_back();
      ex.prompt_ids = encode_prompt(tok, cfg, msgs, &text);
    } else {
      std::string p = require_string(r, path, cfg.prompt_key);
      response = require_string(r, path, cfg.response_key);
      ex.prompt_ids = cfg.apply_chat_template ? encode_prompt(tok, cfg, {{"user", p}}, &text) : tok.encode(p, true);
    }
    ex.response_ids = tok.encode(response, false);
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
