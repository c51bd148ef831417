// Parsing of tokenizer_config.json.
#include "lockstep/tokenizer/tokenizer_config.h"

#include <fstream>
#include <sstream>

#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"

namespace lockstep::tokenizer {
namespace {

std::optional<std::string> token_field(const Json& j, const char* key, const std::string& where) {
  const Json* v = optional_field(j, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) return require_string(*v, "content", field_path(where, key));
  LS_THROW << field_path(where, key) << ": expected a string, {\"content\": ...} or null";
}

std::optional<bool> bool_field(const Json& j, const char* key, const std::string& where) {
  const Json* v = optional_field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) LS_THROW << field_path(where, key) << ": expected true or false";
  return v->get<bool>();
}

}  // namespace

TokenizerConfig TokenizerConfig::from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) LS_THROW << where << ": expected a JSON object";
  TokenizerConfig c;
  c.bos_token = token_field(j, "bos_token", where);
  c.eos_token = token_field(j, "eos_token", where);
  c.pad_token = token_field(j, "pad_token", where);
  c.unk_token = token_field(j, "unk_token", where);
  c.add_bos_token = bool_field(j, "add_bos_token", where);
  c.add_eos_token = bool_field(j, "add_eos_token", where);
  c.tokenizer_class = optional_string(j, "tokenizer_class", where).value_or("");
  if (const Json* m = optional_field(j, "model_max_length"); m && m->is_number())
    c.model_max_length = m->get<double>();
  if (const Json* t = optional_field(j, "chat_template")) {
    if (t->is_string()) {
      c.chat_template = t->get<std::string>();
    } else if (t->is_array()) {
      std::string tw = field_path(where, "chat_template");
      for (size_t i = 0; i < t->size(); ++i) {
        const Json& e = (*t)[i];
        std::string name = require_string(e, "name", index_path(tw, i));
        std::string body = require_string(e, "template", index_path(tw, i));
        if (name == "default" || !c.chat_template) c.chat_template = body;
        if (name == "default") break;
      }
    } else {
      LS_THROW << field_path(where, "chat_template") << ": expected a string or a list of {name, template}";
    }
  }
  return c;
}

TokenizerConfig TokenizerConfig::from_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) LS_THROW << absolute_path(path.string()) << ": cannot open";
  std::stringstream ss;
  ss << f.rdbuf();
  Json j;
  try {
    j = Json::parse(ss.str());
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e400
    LS_THROW << path.string() << ": invalid JSON: " << excerpt(e.what(), kJsonErrorBytes);
  }
  return from_json(j, path.string() + ":");
}

}  // namespace lockstep::tokenizer
