// LOCKSTEP_PAUSE_AT parsing, the hit count and the wait (see pause_point.h).
#include "lockstep/base/pause_point.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lockstep {

namespace {

struct Armed {
  std::string point;
  std::string where;  // counted only where `detail` contains this ("POINT@WHERE:N")
  int64_t nth = 1;
};

// The point named by LOCKSTEP_PAUSE_AT, read on every call (a few calls per
// step, and no state to keep in sync with the environment).
bool armed_point(Armed* out) {
  const char* env = std::getenv("LOCKSTEP_PAUSE_AT");
  if (env == nullptr || *env == '\0') return false;
  std::string s(env);
  const size_t colon = s.rfind(':');
  out->nth = 1;
  if (colon != std::string::npos) {
    out->nth = std::atoll(s.c_str() + colon + 1);
    s.resize(colon);
  }
  const size_t at = s.find('@');
  out->where = at == std::string::npos ? "" : s.substr(at + 1);
  out->point = s.substr(0, at);
  return out->nth >= 0;
}

// Hits of the armed point so far in this process. The one piece of process
// state of the hook: the N of "POINT:N" counts across the whole process.
std::atomic<int64_t> g_hits{0};

}  // namespace

bool pause_point_armed(const char* point) {
  Armed a;
  return armed_point(&a) && a.nth >= 1 && a.point == point;
}

void pause_point(const char* point, const std::string& detail) {
  Armed a;
  if (!armed_point(&a) || (a.point != point && a.point != "*")) return;
  if (detail.find(a.where) == std::string::npos) return;
  const bool trace = a.nth == 0;
  if (!trace && g_hits.fetch_add(1) + 1 != a.nth) return;
  const std::string line = std::string(point) + " " + detail + "\n";
  const char* notify = std::getenv("LOCKSTEP_PAUSE_NOTIFY");
  int fd = 2;
  if (notify != nullptr && *notify != '\0') fd = ::open(notify, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    // One write, so a reader sees the whole line or nothing.
    const ssize_t w = ::write(fd, line.data(), line.size());
    (void)w;
    if (fd != 2) ::close(fd);
  }
  if (trace) return;
  for (;;) ::pause();  // until the test's SIGKILL
}

}  // namespace lockstep
