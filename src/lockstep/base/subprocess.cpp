// Subprocess: posix_spawn with the program resolved on PATH first (a missing
// program is an Error here, not a child that dies). The channel
// is a socketpair (created close-on-exec) so that send() can use
// MSG_NOSIGNAL: a dead child is a failed write, never a SIGPIPE.
#include "lockstep/base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) LS_THROW << "socketpair: " << strerror(errno);
  // The child's end moves above the fds it is dup2'ed onto, so that dup2
  // never maps an fd onto itself (which would keep its close-on-exec flag).
  int child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, 64);
  close(sv[1]);
  if (child_end < 0) {
    close(sv[0]);
    LS_THROW << "fcntl: " << strerror(errno);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (options.stdout_to_stderr) posix_spawn_file_actions_adddup2(&fa, 2, 1);
  posix_spawn_file_actions_adddup2(&fa, child_end, options.channel_fd);
  // Nothing else of the parent's (sockets, files opened without O_CLOEXEC) leaks in.
  posix_spawn_file_actions_addclosefrom_np(&fa, options.channel_fd + 1);
  // The child starts with no signal blocked and default handlers, whatever
  // this process's threads (or the MPI library) set up.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  // posix_spawn (vfork-like in glibc) rather than fork: no copy of a large
  // trainer's page tables, and nothing runs between fork and exec.
  int err = posix_spawn(&pid, path.c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(child_end);
  if (err != 0) {
    close(sv[0]);
    LS_THROW << "'" << path << "': cannot start (" << strerror(err) << ")";
  }
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
