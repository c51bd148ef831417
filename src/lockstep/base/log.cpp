// Implementation of the stderr logger; one write per line so lines from
// different threads do not interleave.
#include "lockstep/base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "lockstep/base/error.h"

namespace lockstep {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("LOCKSTEP_LOG");
  if (env == nullptr) return LogLevel::Info;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    return LogLevel::Info;
  }
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

const char* level_tag(LogLevel l) {
  switch (l) {
    case LogLevel::Debug: return "D";
    case LogLevel::Info: return "I";
    case LogLevel::Warn: return "W";
    case LogLevel::Error: return "E";
    default: return "?";
  }
}

}  // namespace

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn" || name == "warning") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  if (name == "off") return LogLevel::Off;
  LS_THROW << "unknown log level '" << name << "' (expected debug, info, warn, error or off)";
}

namespace detail {
LogLine::~LogLine() {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[16];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::string line = std::string("[") + stamp + " " + level_tag(level_) + "] " + os_.str() + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}
}  // namespace detail

}  // namespace lockstep
