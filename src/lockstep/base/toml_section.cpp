// TomlSection and the config loader with --set overrides.
#include "lockstep/base/toml_section.h"

#include <fstream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep {

TomlSection::TomlSection(const toml::table* table, std::string source, std::string section)
    : table_(table), source_(std::move(source)), section_(std::move(section)) {}

bool TomlSection::has(const std::string& key) const { return table_ && table_->contains(key); }

void TomlSection::fail(const std::string& key, const std::string& what) const {
  LS_THROW << source_ << ": [" << section_ << "] " << excerpt(key) << ": " << what;
}

const toml::node* TomlSection::node(const std::string& key) {
  known_.insert(key);
  if (!table_) return nullptr;
  return table_->get(key);
}

int64_t TomlSection::get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const toml::node* n = node(key);
  if (!n) return fallback;
  // Type first: value<int64_t>() of a float converts it, undefined past int64 (5e40).
  if (!n->is_integer()) fail(key, "expected an integer");
  auto v = n->value<int64_t>();
  if (!v) fail(key, "expected an integer");
  if (*v < min || *v > max) {
    std::ostringstream os;
    os << "value " << *v << " outside [" << min << ", " << max << "]";
    fail(key, os.str());
  }
  return *v;
}

double TomlSection::get_double(const std::string& key, double fallback, double min, double max) {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_number()) fail(key, "expected a number");
  double v = n->is_integer() ? double(*n->value<int64_t>()) : *n->value<double>();
  if (!(v >= min && v <= max)) {
    std::ostringstream os;
    os << "value " << v << " outside [" << min << ", " << max << "]";
    fail(key, os.str());
  }
  return v;
}

bool TomlSection::get_bool(const std::string& key, bool fallback) {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_boolean()) fail(key, "expected true or false");
  return *n->value<bool>();
}

std::string TomlSection::get_string(const std::string& key, const std::string& fallback) {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_string()) fail(key, "expected a string");
  return *n->value<std::string>();
}

std::string TomlSection::get_enum(const std::string& key, const std::string& fallback,
                                  const std::vector<std::string>& choices) {
  std::string v = get_string(key, fallback);
  for (const auto& c : choices)
    if (c == v) return v;
  std::string all;
  for (const auto& c : choices) all += (all.empty() ? "" : ", ") + c;
  fail(key, "'" + excerpt(v) + "' is not one of: " + all);
}

std::vector<std::string> TomlSection::get_string_list(const std::string& key,
                                                      const std::vector<std::string>& fallback) {
  const toml::node* n = node(key);
  if (!n) return fallback;
  const toml::array* arr = n->as_array();
  if (!arr) fail(key, "expected an array of strings");
  std::vector<std::string> out;
  for (const auto& e : *arr) {
    if (!e.is_string()) fail(key, "expected an array of strings");
    out.push_back(*e.value<std::string>());
  }
  return out;
}

std::vector<int64_t> TomlSection::get_int_list(const std::string& key, const std::vector<int64_t>& fallback) {
  const toml::node* n = node(key);
  if (!n) return fallback;
  const toml::array* arr = n->as_array();
  if (!arr) fail(key, "expected an array of integers");
  std::vector<int64_t> out;
  for (const auto& e : *arr) {
    if (!e.is_integer()) fail(key, "expected an array of integers");
    out.push_back(*e.value<int64_t>());
  }
  return out;
}

void TomlSection::accept(const std::vector<std::string>& keys) { known_.insert(keys.begin(), keys.end()); }

void TomlSection::finish() const {
  if (!table_) return;
  for (const auto& [k, v] : *table_) {
    std::string key(k.str());
    if (!known_.count(key))
      LS_THROW << source_ << ": unknown key '" << excerpt(key) << "' in [" << section_ << "]";
  }
}

namespace {

void apply_override(toml::table& root, const std::string& set, const std::string& source) {
  const auto eq = set.find('=');
  if (eq == std::string::npos || eq == 0)
    LS_THROW << "--set " << excerpt(set) << ": expected section.key=value";
  const std::string path = set.substr(0, eq), value = set.substr(eq + 1);
  const auto dot = path.find('.');
  if (dot == std::string::npos)
    LS_THROW << "--set " << excerpt(set) << ": the key needs a section (e.g. train.lr=1e-5)";
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  toml::table* sec = root[section].as_table();
  if (!sec) {
    root.insert_or_assign(section, toml::table{});
    sec = root[section].as_table();
  }
  // Parse the value as TOML; fall back to a bare string.
  try {
    toml::table t = toml::parse("v = " + value, source);
    sec->insert_or_assign(key, *t.get("v"));
  } catch (const toml::parse_error&) {
    sec->insert_or_assign(key, value);
  }
}

}  // namespace

toml::table parse_toml_with_overrides(const std::string& text, const std::string& source,
                                      const std::vector<std::string>& sets) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    LS_THROW << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
             << excerpt(e.description(), 256);
  }
  for (const auto& s : sets) apply_override(root, s, source);
  return root;
}

toml::table load_toml_with_overrides(const std::string& path, const std::vector<std::string>& sets) {
  std::ifstream in(path);
  if (!in) LS_THROW << path << ": cannot open config file";
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_toml_with_overrides(ss.str(), path, sets);
}

}  // namespace lockstep
