// Tests for the crash-test pause points (base/pause_point.h): inert without
// LOCKSTEP_PAUSE_AT, a trace with "POINT:0", and a process that stops at the
// N-th hit of its point until it is killed.
#include "lockstep/base/pause_point.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace lockstep {
namespace {

std::string notify_path(const char* tag) {
  return (std::filesystem::temp_directory_path() /
          ("lockstep-pause-" + std::string(tag) + "-" + std::to_string(::getpid())))
      .string();
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Sets the two variables for the scope of a test.
struct PauseEnv {
  PauseEnv(const char* at, const std::string& notify) {
    ::setenv("LOCKSTEP_PAUSE_AT", at, 1);
    ::setenv("LOCKSTEP_PAUSE_NOTIFY", notify.c_str(), 1);
    std::filesystem::remove(notify);
  }
  ~PauseEnv() {
    ::unsetenv("LOCKSTEP_PAUSE_AT");
    ::unsetenv("LOCKSTEP_PAUSE_NOTIFY");
  }
};

TEST(PausePoint, InertWithoutTheVariable) {
  ::unsetenv("LOCKSTEP_PAUSE_AT");
  pause_point("atomic.write", "/x");  // returns: nothing is armed
  EXPECT_FALSE(pause_point_armed("atomic.write"));
}

TEST(PausePoint, TraceRecordsEveryHitAndGoesOn) {
  const std::string notify = notify_path("trace");
  {
    PauseEnv env("*:0", notify);
    pause_point("atomic.write", "/run/a");
    pause_point("metrics.line", "/run/metrics.jsonl");
    EXPECT_FALSE(pause_point_armed("metrics.torn"));  // a trace splits no write
  }
  EXPECT_EQ(read_all(notify), "atomic.write /run/a\nmetrics.line /run/metrics.jsonl\n");
  std::filesystem::remove(notify);
}

TEST(PausePoint, StopsAtTheNthHitUntilKilled) {
  const std::string notify = notify_path("stop");
  PauseEnv env("metrics.line@run/:3", notify);
  EXPECT_TRUE(pause_point_armed("metrics.line"));
  EXPECT_FALSE(pause_point_armed("atomic.write"));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause_point("atomic.write", "run/other");  // another point: not counted
    for (int i = 1; i <= 5; ++i) {
      pause_point("metrics.line", "elsewhere/" + std::to_string(i));  // not where: not counted
      pause_point("metrics.line", "run/hit " + std::to_string(i));
    }
    std::_Exit(0);  // only if it did not stop
  }
  std::string note;
  for (int i = 0; i < 500 && note.find('\n') == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    note = read_all(notify);
  }
  EXPECT_EQ(note, "metrics.line run/hit 3\n");
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, WNOHANG), 0) << "the child did not wait at its pause point";
  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  std::filesystem::remove(notify);
}

}  // namespace
}  // namespace lockstep
