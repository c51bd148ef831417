// Subprocess: fork + execve with everything the child needs (argv, envp, the
// resolved path) built before the fork, since only async-signal-safe calls
// are allowed between fork and exec in a multi-threaded process. The channel
// is a socketpair (created close-on-exec) so that send() can use
// MSG_NOSIGNAL: a dead child is a failed write, never a SIGPIPE.
#include "lockstep/base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

#include "lockstep/base/error.h"

extern char** environ;

namespace lockstep {
namespace {

int millis_until(Subprocess::Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Subprocess::Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left);
}

std::vector<std::string> merged_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    bool replaced = false;
    for (const auto& x : extra) replaced = replaced || kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1);
    if (!replaced) env.push_back(std::move(kv));
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGTERM: return "SIGTERM";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "signal";
  }
}

// In the child, between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(int channel, int channel_fd, bool stdout_to_stderr, const char* path, char** argv,
                             char** envp) {
  // Move the channel above every fd we are about to assign, then into place
  // (dup2 clears close-on-exec on the copy).
  int high = fcntl(channel, F_DUPFD_CLOEXEC, 64);
  if (high < 0 || dup2(high, channel_fd) < 0) _exit(126);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0 && devnull != 0) {
    dup2(devnull, 0);
    close(devnull);
  }
  if (stdout_to_stderr) dup2(2, 1);
  // Nothing else of the parent's (sockets, files opened without O_CLOEXEC) leaks in.
  if (channel_fd > 3) close_range(3, unsigned(channel_fd - 1), 0);
  close_range(unsigned(channel_fd + 1), ~0U, 0);
  execve(path, argv, envp);
  _exit(127);
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string find_program(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

Subprocess::Subprocess(const SpawnOptions& options) {
  LS_CHECK(!options.argv.empty()) << "Subprocess: empty argv";
  LS_CHECK(options.channel_fd >= 3 && options.channel_fd < 64) << "Subprocess: channel fd must be in [3, 64)";
  std::string path = find_program(options.argv[0]);
  if (path.empty()) LS_THROW << "'" << options.argv[0] << "': program not found (PATH or path not executable)";
  std::vector<std::string> argv_s = options.argv;
  std::vector<std::string> env_s = merged_env(options.env);
  std::vector<char*> argv = c_strings(argv_s), envp = c_strings(env_s);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    LS_THROW << "socketpair: " << strerror(errno);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(sv[0]);
    close(sv[1]);
    LS_THROW << "fork: " << strerror(err);
  }
  if (pid == 0) exec_child(sv[1], options.channel_fd, options.stdout_to_stderr, path.c_str(), argv.data(), envp.data());
  close(sv[1]);
  pid_ = pid;
  fd_ = sv[0];
}

Subprocess::~Subprocess() { terminate(0.0); }

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(o.pid_), fd_(o.fd_), buffer_(std::move(o.buffer_)), status_(std::move(o.status_)) {
  o.pid_ = -1;
  o.fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    terminate(0.0);
    pid_ = o.pid_;
    fd_ = o.fd_;
    buffer_ = std::move(o.buffer_);
    status_ = std::move(o.status_);
    o.pid_ = -1;
    o.fd_ = -1;
  }
  return *this;
}

bool Subprocess::write_all(const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    if (fd_ < 0) return false;
    ssize_t n = send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      int ms = millis_until(deadline);
      if (ms == 0) return false;
      if (poll(&p, 1, ms) < 0 && errno != EINTR) return false;
      if (p.revents & (POLLERR | POLLHUP)) return false;
      continue;
    }
    return false;  // EPIPE, ECONNRESET: the child is gone
  }
  return true;
}

Subprocess::Read Subprocess::read_line(std::string* line, Clock::time_point deadline) {
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      line->assign(buffer_, 0, nl);
      buffer_.erase(0, nl + 1);
      return Read::Line;
    }
    if (fd_ < 0) return Read::Closed;
    pollfd p{fd_, POLLIN, 0};
    int r = poll(&p, 1, millis_until(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Read::Timeout;
    char buf[65536];
    ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      buffer_.append(buf, size_t(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close_channel();
      return Read::Closed;
    } else if (millis_until(deadline) == 0) {
      return Read::Timeout;
    }
  }
}

void Subprocess::close_channel() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Subprocess::reap(int wstatus) {
  if (WIFEXITED(wstatus)) {
    status_ = "exit code " + std::to_string(WEXITSTATUS(wstatus));
  } else if (WIFSIGNALED(wstatus)) {
    int sig = WTERMSIG(wstatus);
    status_ = "killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  } else {
    status_ = "ended";
  }
  pid_ = -1;
}

bool Subprocess::exited() {
  if (pid_ <= 0) return true;
  int ws = 0;
  pid_t r = waitpid(pid_, &ws, WNOHANG);
  if (r == pid_) {
    reap(ws);
    return true;
  }
  return false;
}

bool Subprocess::wait_exit(double seconds) {
  auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    if (exited()) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void Subprocess::terminate(double grace_s) {
  close_channel();
  buffer_.clear();
  if (pid_ <= 0) return;
  if (exited()) return;
  kill(pid_, grace_s > 0 ? SIGTERM : SIGKILL);
  if (grace_s > 0 && wait_exit(grace_s)) return;
  kill(pid_, SIGKILL);
  int ws = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &ws, 0);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    reap(ws);
  } else {
    pid_ = -1;  // not our child any more (someone else reaped it)
  }
}

}  // namespace lockstep
