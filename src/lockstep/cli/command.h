// Subcommand registry and a small flag parser shared by every cli/*.cpp file.
// Each subcommand file registers itself with LS_REGISTER_COMMAND.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"

namespace lockstep::cli {

// Parsed command line: --key value, --key=value, --flag, and positionals.
class Args {
 public:
  Args(int argc, char** argv, const std::vector<std::string>& bool_flags);
  bool has(const std::string& key) const { return values_.count(key) > 0; }
  bool flag(const std::string& key) const { return has(key); }
  std::string get(const std::string& key, const std::string& fallback) const;
  std::string require(const std::string& key) const;  // throws Error naming --key
  std::optional<std::string> maybe(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  // Every --set a.b=c, in order.
  const std::vector<std::string>& sets() const { return sets_; }
  const std::vector<std::string>& positional() const { return positional_; }
  // Throws Error if a flag not in `known` was given.
  void check_known(const std::vector<std::string>& known) const;

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> sets_;
  std::vector<std::string> positional_;
};

// The --device flag (or `fallback`, e.g. a config's [model] device): points
// ctx.gpu at the chosen backend; throws for a device this build cannot run.
void set_device(Context& ctx, const Args& args, const std::string& fallback = "cpu");

// --threads N (0: all cores); Error for a negative or huge N.
int64_t threads_flag(const Args& args);

using CommandFn = std::function<int(const Args&)>;

struct Command {
  std::string name;
  std::string summary;
  std::string help;  // full --help text
  std::vector<std::string> bool_flags;
  CommandFn run;
};

std::map<std::string, Command>& registry();

struct Registrar {
  explicit Registrar(Command c);
};

}  // namespace lockstep::cli

#define LS_CONCAT_INNER(a, b) a##b
#define LS_CONCAT(a, b) LS_CONCAT_INNER(a, b)
// LS_REGISTER_COMMAND(Command{...}) at namespace scope in a cli/*.cpp file.
#define LS_REGISTER_COMMAND(...)                                         \
  static ::lockstep::cli::Registrar LS_CONCAT(ls_registrar_, __LINE__) { \
    __VA_ARGS__                                                          \
  }
