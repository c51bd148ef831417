// Tests for Subprocess with /bin/sh children: a line echoed over the
// channel, stdout folded into stderr (never onto the channel), EOF and the
// exit status of a child that exits or is killed by a signal, a read that
// times out, terminate() of a child that ignores SIGTERM, no zombies, no
// leaked fd, and a missing program named before any spawn.
#include "lockstep/base/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "lockstep/base/error.h"

namespace lockstep {
namespace {

using Clock = Subprocess::Clock;

Subprocess sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"sh", "-c", script};
  return Subprocess(o);
}

Clock::time_point in_seconds(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

TEST(BaseSubprocess, EchoesALineOverTheChannel) {
  // The child prints to stdout first: that must not reach the channel.
  Subprocess p = sh("echo noise; read -r line <&3; echo \"got $line\" >&3");
  ASSERT_TRUE(p.running());
  ASSERT_TRUE(p.write_all("hello\n", in_seconds(10)));
  std::string line;
  ASSERT_EQ(p.read_line(&line, in_seconds(10)), Subprocess::Read::Line);
  EXPECT_EQ(line, "got hello");
  EXPECT_EQ(p.read_line(&line, in_seconds(10)), Subprocess::Read::Closed);  // the child exited
  EXPECT_TRUE(p.wait_exit(10));
  EXPECT_EQ(p.exit_status(), "exit code 0");
}

TEST(BaseSubprocess, ReportsExitCodeAndSignal) {
  Subprocess a = sh("exit 7");
  ASSERT_TRUE(a.wait_exit(10));
  EXPECT_EQ(a.exit_status(), "exit code 7");
  Subprocess b = sh("kill -SEGV $$");
  ASSERT_TRUE(b.wait_exit(10));
  EXPECT_EQ(b.exit_status(), "killed by signal 11 (SIGSEGV)");
}

TEST(BaseSubprocess, ReadTimesOutAndTerminateKillsAStubbornChild) {
  Subprocess p = sh("trap '' TERM; while :; do sleep 1; done");
  const pid_t pid = p.pid();
  std::string line;
  EXPECT_EQ(p.read_line(&line, in_seconds(0.05)), Subprocess::Read::Timeout);
  p.terminate(0.05);  // SIGTERM is ignored: SIGKILL after the grace
  EXPECT_FALSE(p.running());
  EXPECT_EQ(p.exit_status(), "killed by signal 9 (SIGKILL)");
  EXPECT_TRUE(gone(pid));
  EXPECT_FALSE(p.write_all("late\n", in_seconds(1)));  // no SIGPIPE, just false
}

TEST(BaseSubprocess, DestructorReaps) {
  pid_t pid;
  {
    Subprocess p = sh("sleep 30");
    pid = p.pid();
  }
  EXPECT_TRUE(gone(pid));
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
}

TEST(BaseSubprocess, OnlyTheChannelAndStdioReachTheChild) {
  const int first = open("/dev/null", O_RDONLY);
  const int leaky = fcntl(first, F_DUPFD, 10);  // no close-on-exec, above the channel's fd
  close(first);
  ASSERT_GE(leaky, 10);
  const std::string fd = std::to_string(leaky);
  Subprocess p = sh("if [ -e /proc/self/fd/" + fd + " ]; then echo leaked >&3; else echo closed >&3; fi");
  std::string line;
  ASSERT_EQ(p.read_line(&line, in_seconds(10)), Subprocess::Read::Line);
  EXPECT_EQ(line, "closed");
  close(leaky);
}

TEST(BaseSubprocess, MissingProgramIsAnError) {
  SpawnOptions o;
  o.argv = {"no-such-program-here"};
  EXPECT_THROW(Subprocess{o}, Error);
  EXPECT_EQ(find_program("no-such-program-here"), "");
  EXPECT_EQ(find_program("/tmp"), "");  // a directory is not a program
  EXPECT_NE(find_program("sh"), "");
}

}  // namespace
}  // namespace lockstep
