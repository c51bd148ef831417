// Typed reading of one TOML section with errors that name the file and the
// key, and a final check that rejects keys nobody read (unknown keys are
// errors, docs/architecture.md section 6). Every [section] parser builds on this.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

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
  std::string get_enum(const std::string& key, const std::string& fallback,
                       const std::vector<std::string>& choices);
  std::vector<std::string> get_string_list(const std::string& key, const std::vector<std::string>& fallback);
  std::vector<int64_t> get_int_list(const std::string& key, const std::vector<int64_t>& fallback);
  // Keeps `key` out of a saved config: for a key that a shared reader reads but
  // this command refuses (its default would be refused when read back).
  void not_saved(const std::string& key) const;
  // Marks keys read by another parser as known.
  void accept(const std::vector<std::string>& keys);
  // Throws Error naming the first key that was never read.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  const std::string& source() const { return source_; }

 private:
  const toml::node* node(const std::string& key);
  // Hands the value a key took to the thread's TomlRecorder, if any; returns it.
  template <typename T>
  T note(const std::string& key, T value) const;

  const toml::table* table_;
  std::string source_, section_;
  std::set<std::string> known_;
};

// Collects, while alive, every key that a TomlSection reads on this thread
// with the value it took (the config's or the default), so that a run can
// save its config with every default written out. One at a time per thread.
class TomlRecorder {
 public:
  TomlRecorder();
  ~TomlRecorder();
  TomlRecorder(const TomlRecorder&) = delete;
  TomlRecorder& operator=(const TomlRecorder&) = delete;

  // The recorder alive on this thread, or null.
  static TomlRecorder* active();
  // Remembers [section] key = value; forget() drops it again.
  void record(const std::string& section, const std::string& key, const toml::node& value);
  void forget(const std::string& section, const std::string& key);
  // `root` with every recorded key it lacks added. A section named in
  // `only_if_present` is completed only if `root` has it (its presence alone
  // changes what a command does, e.g. [dist]).
  toml::table complete(const toml::table& root, const std::vector<std::string>& only_if_present = {}) const;

 private:
  toml::table seen_;
  TomlRecorder* outer_;
};

// The path rule. The keys below hold file or directory paths; a relative path
// written in a config file is taken from that file's folder, one given with
// --set from the current folder, and both are made absolute as the config is
// read, so a saved config works from any folder.
const std::vector<std::string>& config_path_keys();  // "section.key"
// Makes every relative path key of `root` absolute against `base_dir` (made
// absolute itself first); empty values and URLs are left alone.
void resolve_config_paths(toml::table& root, const std::string& base_dir);

// Parses a TOML file (Error with file, line and column on a syntax error),
// resolves its paths against the file's folder and applies `--set
// section.key=value` overrides; a value is parsed as TOML (numbers, booleans,
// quoted strings, arrays) and else taken as a bare string; a path given this
// way is resolved against the current folder.
toml::table load_toml_with_overrides(const std::string& path, const std::vector<std::string>& sets);
// Same, from text; its paths are resolved against `base_dir`, left as they
// are when it is empty (text that is no file, e.g. an embedded config).
toml::table parse_toml_with_overrides(const std::string& text, const std::string& source,
                                      const std::vector<std::string>& sets, const std::string& base_dir = "");

}  // namespace lockstep
