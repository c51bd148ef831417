// Typed reading of one TOML section with errors that name the file and the
// key, and a final check that rejects keys nobody read (unknown keys are
// errors, docs/architecture.md section 6). Every [section] parser builds on this.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

namespace lockstep {

class TomlSection {
 public:
  // `table` may be null (section absent: every key takes its default).
  TomlSection(const toml::table* table, std::string source, std::string section);

  bool has(const std::string& key) const;
  // Each reads `key` if present (marking it known) and returns the fallback otherwise.
  // A value of the wrong type or out of range throws Error "<source>: [section] key: ...".
  int64_t get_int(const std::string& key, int64_t fallback, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  double get_double(const std::string& key, double fallback, double min = -1e300, double max = 1e300);
  bool get_bool(const std::string& key, bool fallback);
  std::string get_string(const std::string& key, const std::string& fallback);
  // A string that must be one of `choices`.
  std::string get_enum(const std::string& key, const std::string& fallback, const std::vector<std::string>& choices);
  std::vector<std::string> get_string_list(const std::string& key, const std::vector<std::string>& fallback);
  std::vector<int64_t> get_int_list(const std::string& key, const std::vector<int64_t>& fallback);
  // Marks keys read by another parser as known.
  void accept(const std::vector<std::string>& keys);
  // Throws Error naming the first key that was never read.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& source() const { return source_; }

 private:
  const toml::node* node(const std::string& key);

  const toml::table* table_;
  std::string source_, section_;
  std::set<std::string> known_;
};

// Parses a TOML file (Error with file, line and column on a syntax error) and
// applies `--set section.key=value` overrides; a value is parsed as TOML
// (numbers, booleans, quoted strings, arrays) and else taken as a bare string.
toml::table load_toml_with_overrides(const std::string& path, const std::vector<std::string>& sets);
// Same, from text.
toml::table parse_toml_with_overrides(const std::string& text, const std::string& source,
                                      const std::vector<std::string>& sets);

}  // namespace lockstep
