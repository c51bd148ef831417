// Dataset row fields: dotted keys, message-list prompts, verl's data_source /
// extra_info, and the errors that name the [data] key behind a missing field.
#include "lockstep/data/fields.h"

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep::data {
namespace {

// verl's top-level row fields that a Python compute_score receives.
constexpr const char* kVerlFields[] = {"data_source", "extra_info"};

// "'label' (chosen by data.label_key" without the closing parenthesis.
std::string chosen(const std::string& field, const char* key) {
  return "'" + excerpt(field) + "' (chosen by data." + key;
}

std::vector<tokenizer::ChatMessage> parse_messages(const nlohmann::json& v, const std::string& path,
                                                   int64_t line, const std::string& field, const char* key) {
  if (!v.is_array() || v.empty())
    LS_THROW << path << ":" << line << ": field " << chosen(field, key)
             << ") must be a non-empty list of messages";
  std::vector<tokenizer::ChatMessage> out;
  for (const auto& m : v) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string())
      LS_THROW << path << ":" << line << ": each message of " << chosen(field, key)
               << ") needs string 'role' and 'content'";
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

// The prompt from messages_key, else prompt_key (a string or a message list).
PromptSource prompt_source(const JsonlRecord& r, const std::string& path, const DataConfig& cfg) {
  PromptSource src;
  if (const auto* m = find_field(r.value, cfg.messages_key)) {
    src.messages = parse_messages(*m, path, r.line, cfg.messages_key, "messages_key");
    return src;
  }
  const auto* p = find_field(r.value, cfg.prompt_key);
  if (!p)
    LS_THROW << path << ":" << r.line << ": missing field " << chosen(cfg.prompt_key, "prompt_key") << ") or "
             << chosen(cfg.messages_key, "messages_key") << ")";
  if (p->is_array()) {
    src.messages = parse_messages(*p, path, r.line, cfg.prompt_key, "prompt_key");
  } else if (p->is_string()) {
    src.text = p->get<std::string>();
  } else {
    LS_THROW << path << ":" << r.line << ": field " << chosen(cfg.prompt_key, "prompt_key")
             << ") must be a string or a list of messages, got " << p->type_name();
  }
  return src;
}

// A hint for verl rows read with the default label key.
std::string verl_label_hint(const nlohmann::json& row, const DataConfig& cfg) {
  if (cfg.label_key == "reward_model.ground_truth" || !find_field(row, "reward_model.ground_truth"))
    return "";
  return "; the row has 'reward_model.ground_truth' (verl's layout): set data.label_key = "
         "\"reward_model.ground_truth\"";
}

void check_label(const JsonlRecord& r, const std::string& path, const DataConfig& cfg,
                 const PromptNeeds& needs, const nlohmann::json* label, const nlohmann::json* metadata) {
  if (!needs.label || (label && !label->is_null())) return;
  if (needs.metadata_for_label && metadata && !metadata->is_null()) return;
  const std::string why = needs.why.empty() ? "" : "; " + needs.why;
  LS_THROW << path << ":" << r.line << ": " << (label ? "null field " : "missing field ")
           << chosen(cfg.label_key, "label_key") << why << ")" << verl_label_hint(r.value, cfg);
}

// Top-level data_source / extra_info join the metadata, where verl_kwargs
// finds them; a metadata that is not an object becomes their extra_info.
nlohmann::json with_verl_fields(const nlohmann::json& row, const DataConfig& cfg, nlohmann::json meta) {
  for (const char* name : kVerlFields) {
    if (cfg.metadata_key == name) continue;
    auto it = row.find(name);
    if (it == row.end()) continue;
    if (meta.is_null()) meta = nlohmann::json{{"extra_info", nullptr}};  // verl: None when the row has none
    if (!meta.is_object()) meta = nlohmann::json{{"extra_info", meta}};
    if (!meta.contains(name) || meta[name].is_null()) meta[name] = *it;
  }
  return meta;
}

}  // namespace

const nlohmann::json* find_field(const nlohmann::json& row, const std::string& key) {
  if (!row.is_object()) return nullptr;
  if (auto it = row.find(key); it != row.end()) return &*it;
  if (key.find('.') == std::string::npos) return nullptr;
  const nlohmann::json* v = &row;
  size_t start = 0;
  while (start <= key.size()) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!v->is_object()) return nullptr;
    auto it = v->find(part);
    if (it == v->end()) return nullptr;
    v = &*it;
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
  return nullptr;
}

PromptFields prompt_fields(const JsonlRecord& r, const std::string& path, const DataConfig& cfg,
                           const PromptNeeds& needs) {
  PromptFields f;
  f.prompt = prompt_source(r, path, cfg);
  const auto* label = find_field(r.value, cfg.label_key);
  const auto* metadata = find_field(r.value, cfg.metadata_key);
  check_label(r, path, cfg, needs, label, metadata);
  if (label) f.label = *label;
  f.metadata = with_verl_fields(r.value, cfg, metadata ? *metadata : nlohmann::json());
  return f;
}

SftFields sft_fields(const JsonlRecord& r, const std::string& path, const DataConfig& cfg) {
  SftFields f;
  if (const auto* m = find_field(r.value, cfg.messages_key)) {
    f.prompt.messages = parse_messages(*m, path, r.line, cfg.messages_key, "messages_key");
    if (f.prompt.messages.size() < 2 || f.prompt.messages.back().role != "assistant")
      LS_THROW << path << ":" << r.line << ": field " << chosen(cfg.messages_key, "messages_key")
               << ") must end with an assistant message (the response)";
    f.response = f.prompt.messages.back().content;
    f.prompt.messages.pop_back();
    return f;
  }
  f.prompt = prompt_source(r, path, cfg);
  const auto* resp = find_field(r.value, cfg.response_key);
  if (!resp)
    LS_THROW << path << ":" << r.line << ": missing field " << chosen(cfg.response_key, "response_key")
             << "; SFT trains on it)";
  if (!resp->is_string())
    LS_THROW << path << ":" << r.line << ": field " << chosen(cfg.response_key, "response_key")
             << ") must be a string";
  f.response = resp->get<std::string>();
  return f;
}

}  // namespace lockstep::data
