// A child process with one private message channel: spawn (argv, the
// channel on a chosen fd of the child, stdout folded into stderr), line
// reads and writes with deadlines, terminate (SIGTERM, a grace, SIGKILL) and
// reap. The destructor always kills and reaps, so a Subprocess never leaves a
// zombie. Used by reward/python_pool.h for pools of interpreter workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace lockstep {

struct SpawnOptions {
  // argv[0] is resolved on PATH (unless it holds a '/'), before any fork, so
  // a missing program is an Error naming it rather than a dead child.
  std::vector<std::string> argv;
  int channel_fd = 3;             // the child's end of the channel (a Unix stream socket)
  bool stdout_to_stderr = true;   // the child's fd 1 becomes its fd 2: prints cannot reach the channel
  std::vector<std::string> env;   // "KEY=VALUE" added to (or replacing in) the parent's environment
};

// Searches PATH for `program` (as execvp would); returns "" when not found.
std::string find_program(const std::string& program);

class Subprocess {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Read { Line, Timeout, Closed };

  Subprocess() = default;
  // Throws Error when the program is not found or fork fails.
  explicit Subprocess(const SpawnOptions& options);
  ~Subprocess();
  Subprocess(Subprocess&& o) noexcept;
  Subprocess& operator=(Subprocess&& o) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Writes all of `data`; false when the child closed its end or the
  // deadline passed first (never raises SIGPIPE).
  bool write_all(const std::string& data, Clock::time_point deadline);
  // The next '\n'-terminated line (without the '\n') into *line.
  Read read_line(std::string* line, Clock::time_point deadline);

  // Whether the child has exited (reaps it if so; then exit_status() is set).
  bool exited();
  // Waits up to `seconds` for the child to exit by itself; true if it did.
  bool wait_exit(double seconds);
  // The child sees end-of-file on its channel (a polite request to exit).
  void close_channel();
  // Closes the channel, sends SIGTERM, waits up to grace_s, then SIGKILL; reaps.
  void terminate(double grace_s = 0.2);
  // After the child was reaped: "exit code N" or "killed by signal N (SIGSEGV)".
  const std::string& exit_status() const { return status_; }

 private:
  void reap(int wstatus);

  pid_t pid_ = -1;
  int fd_ = -1;          // the parent's end of the channel
  std::string buffer_;   // bytes read past the last line returned
  std::string status_;
};

}  // namespace lockstep
