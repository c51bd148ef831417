// Shared pieces of the fuzz targets: the rule that lockstep::Error is a normal
// outcome (anything else escaping is a finding), a bound on error messages,
// and an in-memory file for parsers that read from a path.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "lockstep/base/error.h"

namespace lockstep::fuzz {

// A finding: the message goes to stderr and abort() makes libFuzzer save the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define LS_FUZZ_EXPECT(cond, msg)                                           \
  do {                                                                      \
    if (!(cond)) ::lockstep::fuzz::fail(std::string(#cond) + ": " + (msg)); \
  } while (0)

// An Error must say what is wrong in a line a person can read: not a copy of
// a large part of the input. With LOCKSTEP_FUZZ_STRICT_MESSAGES=1 in the
// environment, raw control bytes quoted from the input are findings too
// (sites quote input with excerpt(), base/excerpt.h; not all do yet).
inline constexpr size_t kMaxErrorMessage = 2048;
inline void check_error_message(std::string_view what) {
  if (what.size() > kMaxErrorMessage)
    fail("error message of " + std::to_string(what.size()) + " bytes (limit " +
         std::to_string(kMaxErrorMessage) + "): " + std::string(what.substr(0, 200)) + "...");
  static const bool strict = [] {
    const char* v = std::getenv("LOCKSTEP_FUZZ_STRICT_MESSAGES");
    return v != nullptr && std::string_view(v) == "1";
  }();
  if (!strict) return;
  for (const char c : what) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 && c != '\n' && c != '\t')
      fail("error message holds control byte " + std::to_string(u) + ": " + std::string(what.substr(0, 200)));
  }
}

// Runs fn; a lockstep::Error is the documented way to refuse bad input, every
// other exception escapes to libFuzzer (std::terminate: a crash, a finding).
template <typename Fn>
bool run_expecting_error(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const Error& e) {
    check_error_message(e.what());
    return false;
  }
}

// A file in memory (memfd), reachable by a path, for parsers that open files.
class MemFile {
 public:
  explicit MemFile(const char* name) {
    fd_ = ::memfd_create(name, MFD_CLOEXEC);
    if (fd_ < 0) fail("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the file's contents.
  void set(const void* data, size_t n) {
    if (::ftruncate(fd_, 0) != 0) fail("ftruncate failed");
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::pwrite(fd_, p + done, n - done, static_cast<off_t>(done));
      if (w <= 0) fail("pwrite failed");
      done += static_cast<size_t>(w);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace lockstep::fuzz
