// Entry point of the `lockstep` binary: dispatches to registered subcommands
// and turns lockstep::Error into a one-line message and exit code 2.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/cli/command.h"
#include "lockstep/kernels/gpu/device.h"

// The device runtimes built into this binary (cmake/gpu/CMakeLists.txt links
// them and defines these): kernels/gpu/runtime.cu compiled by nvcc or hipcc.
#if defined(LOCKSTEP_HAVE_CUDA)
namespace lockstep::kernels::gpu::cuda {
kernels::DeviceRuntime device_runtime();
}  // namespace lockstep::kernels::gpu::cuda
#endif
#if defined(LOCKSTEP_HAVE_HIP)
namespace lockstep::kernels::gpu::hip {
kernels::DeviceRuntime device_runtime();
}  // namespace lockstep::kernels::gpu::hip
#endif

namespace lockstep::cli {

std::map<std::string, Command>& registry() {
  static std::map<std::string, Command> commands;
  return commands;
}

Registrar::Registrar(Command c) {
  auto name = c.name;
  registry().emplace(std::move(name), std::move(c));
}

Args::Args(int argc, char** argv, const std::vector<std::string>& bool_flags) {
  auto is_bool = [&](const std::string& k) {
    for (const auto& b : bool_flags)
      if (b == k) return true;
    return k == "help";
  };
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    auto eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (is_bool(key)) {
      value = "1";
    } else {
      if (i + 1 >= argc) LS_THROW << "flag --" << key << " needs a value";
      value = argv[++i];
    }
    if (key == "set") {
      sets_.push_back(value);
    } else {
      values_[key] = value;
    }
  }
}

std::string Args::get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

std::optional<std::string> Args::maybe(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::require(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) LS_THROW << "missing required flag --" << key;
  return it->second;
}

int64_t Args::get_int(const std::string& key, int64_t fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    int64_t v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    LS_THROW << "flag --" << key << ": expected an integer, got '" << it->second << "'";
  }
}

double Args::get_double(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    LS_THROW << "flag --" << key << ": expected a number, got '" << it->second << "'";
  }
}

void Args::check_known(const std::vector<std::string>& known) const {
  for (const auto& [k, v] : values_) {
    bool ok = k == "help" || k == "log-level";
    for (const auto& n : known) ok = ok || n == k;
    if (!ok) LS_THROW << "unknown flag --" << k << " (see --help)";
  }
}

int64_t threads_flag(const Args& args) {
  const int64_t n = args.get_int("threads", 0);
  if (n < 0 || n > 1024) LS_THROW << "flag --threads: expected 0 (all cores) to 1024, got " << n;
  return n;
}

void set_device(Context& ctx, const Args& args, const std::string& fallback) {
  const std::string name = args.get("device", fallback);
  const std::string where = args.has("device") ? "--device" : "[model] device";
  ctx.gpu = kernels::device_backend(kernels::parse_device(name, where), where);
  if (ctx.gpu) {
    LS_LOG(Info) << "device " << name << ": GPU kernels through the " << ctx.gpu->name << " backend";
  }
}

namespace {
void print_usage() {
  std::ostringstream os;
  os << "lockstep " << LOCKSTEP_VERSION
     << " - RL post-training for language models with bit-aligned rollout and trainer\n\n"
     << "usage: lockstep <command> [flags]   (lockstep <command> --help, -h or lockstep help <command>\n"
     << "       for details)\n\ncommands:\n";
  for (const auto& [name, c] : registry()) {
    os << "  " << name << std::string(name.size() < 18 ? 18 - name.size() : 1, ' ') << c.summary << "\n";
  }
  std::cout << os.str();
}
}  // namespace

}  // namespace lockstep::cli

int main(int argc, char** argv) {
  using namespace lockstep;
  using namespace lockstep::cli;
#if defined(LOCKSTEP_HAVE_CUDA)
  kernels::register_device_runtime(kernels::gpu::cuda::device_runtime());
#endif
#if defined(LOCKSTEP_HAVE_HIP)
  kernels::register_device_runtime(kernels::gpu::hip::device_runtime());
#endif
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      (std::string(argv[1]) == "help" && argc == 2)) {
    print_usage();
    return argc < 2 ? 1 : 0;
  }
  if (std::string(argv[1]) == "help") {  // `lockstep help CMD`: that command's --help
    auto it = registry().find(argv[2]);
    if (it == registry().end()) {
      std::cerr << "lockstep: unknown command '" << argv[2] << "'\n\n";
      print_usage();
      return 2;
    }
    std::cout << it->second.help;
    return 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::cout << "lockstep " << LOCKSTEP_VERSION << "\n";
    return 0;
  }
  auto it = registry().find(argv[1]);
  if (it == registry().end()) {
    std::cerr << "lockstep: unknown command '" << argv[1] << "'\n\n";
    print_usage();
    return 2;
  }
  const Command& cmd = it->second;
  try {
    Args args(argc - 2, argv + 2, cmd.bool_flags);
    const auto& pos = args.positional();
    if (args.flag("help") || std::find(pos.begin(), pos.end(), "-h") != pos.end()) {
      std::cout << cmd.help;
      return 0;
    }
    if (args.has("log-level")) set_log_level(parse_log_level(args.get("log-level", "info")));
    return cmd.run(args);
  } catch (const Error& e) {
    std::cerr << "lockstep " << cmd.name << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "lockstep " << cmd.name << ": internal error: " << e.what() << "\n";
    return 3;
  }
}
