// Logging to stderr with a level threshold: LS_LOG(Info) << "loaded " << n;
#pragma once

#include <sstream>
#include <string>

namespace lockstep {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

// The process-wide threshold is the one piece of global state we allow: it is
// set once by the CLI (--log-level / LOCKSTEP_LOG) and only read afterwards.
void set_log_level(LogLevel level);
LogLevel log_level();
LogLevel parse_log_level(const std::string& name);  // throws Error on unknown names

namespace detail {
class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace lockstep

#define LS_LOG(level)                                                      \
  if (::lockstep::LogLevel::level < ::lockstep::log_level()) {             \
  } else                                                                   \
    ::lockstep::detail::LogLine(::lockstep::LogLevel::level)
