// Errors: one exception type for bad input and broken invariants, and the
// always-on LS_CHECK(cond) << "hint" macro. Nothing below cli/ calls exit().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lockstep {

// Thrown for bad input (config, data, checkpoint, HTTP) and failed checks.
// The message names the culprit: file, line, key or field.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

// Collects the message of a failed check; CheckThrower turns it into an Error.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* cond) {
    os_ << file << ":" << line << ": check failed: " << cond;
  }
  template <typename T>
  CheckMessage& operator<<(const T& v) {
    if (!has_hint_) {
      os_ << ": ";
      has_hint_ = true;
    }
    os_ << v;
    return *this;
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
  bool has_hint_ = false;
};

struct CheckThrower {
  // `&` binds looser than `<<`, so the whole message is built first.
  [[noreturn]] void operator&(const CheckMessage& m) const { throw Error(m.str()); }
};

}  // namespace detail

namespace detail {
// Message of a bad-input error, built from stream-able parts.
class ErrorStream {
 public:
  template <typename T>
  ErrorStream& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};
struct ErrorThrower {
  [[noreturn]] void operator&(const ErrorStream& m) const { throw Error(m.str()); }
};
}  // namespace detail

}  // namespace lockstep

// Always on, in every build type. Usage: LS_CHECK(n > 0) << "n=" << n;
#define LS_CHECK(cond)          \
  if (static_cast<bool>(cond)) { \
  } else                        \
    ::lockstep::detail::CheckThrower() & ::lockstep::detail::CheckMessage(__FILE__, __LINE__, #cond)

// Throws lockstep::Error for bad input: LS_THROW << path << ":" << line << ": bad key";
#define LS_THROW ::lockstep::detail::ErrorThrower() & ::lockstep::detail::ErrorStream()
