// TomlSection and the config loader with --set overrides.
#include "lockstep/base/toml_section.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/number_text.h"

namespace lockstep {

TomlSection::TomlSection(const toml::table* table, std::string source, std::string section)
    : table_(table), source_(std::move(source)), section_(std::move(section)) {}

bool TomlSection::has(const std::string& key) const {
  return table_ && table_->contains(key);
}

void TomlSection::fail(const std::string& key, const std::string& what) const {
  LS_THROW << source_ << ": [" << section_ << "] " << excerpt(key) << ": " << what;
}

template <typename T>
T TomlSection::note(const std::string& key, T value) const {
  TomlRecorder* r = TomlRecorder::active();
  if (!r) return value;
  if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int64_t>>) {
    toml::array a;
    for (const auto& e : value) a.push_back(e);
    r->record(section_, key, a);
  } else {
    r->record(section_, key, toml::value<T>(value));
  }
  return value;
}

const toml::node* TomlSection::node(const std::string& key) {
  known_.insert(key);
  if (!table_) return nullptr;
  return table_->get(key);
}

int64_t TomlSection::get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const toml::node* n = node(key);
  if (!n) return note(key, fallback);
  // Type first: value<int64_t>() of a float converts it, undefined past int64 (5e40).
  if (!n->is_integer()) fail(key, "expected an integer");
  auto v = n->value<int64_t>();
  if (!v) fail(key, "expected an integer");
  if (*v < min || *v > max) {
    std::ostringstream os;
    os << "value " << *v << " outside [" << min << ", " << max << "]";
    fail(key, os.str());
  }
  return note(key, *v);
}

double TomlSection::get_double(const std::string& key, double fallback, double min, double max) {
  const toml::node* n = node(key);
  if (!n) return note(key, fallback);
  if (!n->is_number()) fail(key, "expected a number");
  double v = n->is_integer() ? double(*n->value<int64_t>()) : *n->value<double>();
  if (!(v >= min && v <= max)) {
    std::ostringstream os;
    os << "value " << shortest(v) << " outside [" << shortest(min) << ", " << shortest(max) << "]";
    fail(key, os.str());
  }
  return note(key, v);
}

bool TomlSection::get_bool(const std::string& key, bool fallback) {
  const toml::node* n = node(key);
  if (!n) return note(key, fallback);
  if (!n->is_boolean()) fail(key, "expected true or false");
  return note(key, *n->value<bool>());
}

std::string TomlSection::get_string(const std::string& key, const std::string& fallback) {
  const toml::node* n = node(key);
  if (!n) return note(key, fallback);
  if (!n->is_string()) fail(key, "expected a string");
  return note(key, *n->value<std::string>());
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
  if (!n) return note(key, fallback);
  const toml::array* arr = n->as_array();
  if (!arr) fail(key, "expected an array of strings");
  std::vector<std::string> out;
  for (const auto& e : *arr) {
    if (!e.is_string()) fail(key, "expected an array of strings");
    out.push_back(*e.value<std::string>());
  }
  return note(key, out);
}

std::vector<int64_t> TomlSection::get_int_list(const std::string& key, const std::vector<int64_t>& fallback) {
  const toml::node* n = node(key);
  if (!n) return note(key, fallback);
  const toml::array* arr = n->as_array();
  if (!arr) fail(key, "expected an array of integers");
  std::vector<int64_t> out;
  for (const auto& e : *arr) {
    if (!e.is_integer()) fail(key, "expected an array of integers");
    out.push_back(*e.value<int64_t>());
  }
  return note(key, out);
}

void TomlSection::not_saved(const std::string& key) const {
  if (TomlRecorder* r = TomlRecorder::active()) r->forget(section_, key);
}

void TomlSection::accept(const std::vector<std::string>& keys) {
  known_.insert(keys.begin(), keys.end());
}

void TomlSection::finish() const {
  if (!table_) return;
  for (const auto& [k, v] : *table_) {
    std::string key(k.str());
    if (!known_.count(key))
      LS_THROW << source_ << ": unknown key '" << excerpt(key) << "' in [" << section_ << "]";
  }
}

namespace {
thread_local TomlRecorder* active_recorder = nullptr;
}  // namespace

TomlRecorder::TomlRecorder() : outer_(active_recorder) {
  active_recorder = this;
}
TomlRecorder::~TomlRecorder() {
  active_recorder = outer_;
}
TomlRecorder* TomlRecorder::active() {
  return active_recorder;
}

void TomlRecorder::record(const std::string& section, const std::string& key, const toml::node& value) {
  if (!seen_.contains(section)) seen_.insert(section, toml::table{});
  toml::table& t = *seen_[section].as_table();
  value.visit([&](const auto& v) { t.insert_or_assign(key, v); });
}

void TomlRecorder::forget(const std::string& section, const std::string& key) {
  if (toml::table* t = seen_[section].as_table()) t->erase(key);
}

toml::table TomlRecorder::complete(const toml::table& root,
                                   const std::vector<std::string>& only_if_present) const {
  toml::table out = root;
  for (const auto& [name, keys] : seen_) {
    const std::string section(name.str());
    const bool present = out.contains(section);
    if (!present &&
        std::find(only_if_present.begin(), only_if_present.end(), section) != only_if_present.end())
      continue;
    if (!present) out.insert(section, toml::table{});
    toml::table* t = out[section].as_table();
    if (!t) continue;  // not a section in `root`: its reader reported that already
    for (const auto& [k, v] : *keys.as_table()) {
      const std::string key(k.str());  // a copy: clang before 16 cannot capture a structured binding
      if (!t->contains(key)) v.visit([&](const auto& x) { t->insert(key, x); });
    }
  }
  return out;
}

const std::vector<std::string>& config_path_keys() {
  static const std::vector<std::string> keys = {"model.path",    "data.train_file", "data.eval_file",
                                                "train.out_dir", "reward.path",     "rollout.env_path",
                                                "eval.output",   "eval.summary",    "critic.path"};
  return keys;
}

namespace {

// `value` against `base_dir` if it is a relative path.
std::string resolve_one(const std::string& value, const std::filesystem::path& base_dir) {
  if (value.empty() || value.find("://") != std::string::npos) return value;
  const std::filesystem::path p(value);
  if (p.is_absolute()) return p.lexically_normal().string();
  return (base_dir / p).lexically_normal().string();
}

// The path key `section.key` of `root`, if it is set to a string, against `base_dir`.
void resolve_key(toml::table& root, const std::string& dotted, const std::filesystem::path& base_dir) {
  const auto dot = dotted.find('.');
  toml::table* sec = root[dotted.substr(0, dot)].as_table();
  if (!sec) return;
  toml::value<std::string>* v = (*sec)[dotted.substr(dot + 1)].as_string();
  if (v) *v = resolve_one(v->get(), base_dir);
}

bool is_path_key(const std::string& dotted) {
  const auto& keys = config_path_keys();
  return std::find(keys.begin(), keys.end(), dotted) != keys.end();
}

}  // namespace

void resolve_config_paths(toml::table& root, const std::string& base_dir) {
  const std::filesystem::path base = std::filesystem::absolute(base_dir.empty() ? "." : base_dir);
  for (const auto& k : config_path_keys()) resolve_key(root, k, base);
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
  // A path on the command line is the current folder's.
  if (is_path_key(path)) resolve_key(root, path, std::filesystem::current_path());
}

}  // namespace

toml::table parse_toml_with_overrides(const std::string& text, const std::string& source,
                                      const std::vector<std::string>& sets, const std::string& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    LS_THROW << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
             << excerpt(e.description(), 256);
  }
  if (!base_dir.empty()) resolve_config_paths(root, base_dir);
  for (const auto& s : sets) apply_override(root, s, source);
  return root;
}

toml::table load_toml_with_overrides(const std::string& path, const std::vector<std::string>& sets) {
  std::ifstream in(path);
  if (!in) LS_THROW << absolute_path(path) << ": cannot open config file";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string dir = std::filesystem::absolute(path).parent_path().string();
  return parse_toml_with_overrides(ss.str(), path, sets, dir);
}

}  // namespace lockstep
