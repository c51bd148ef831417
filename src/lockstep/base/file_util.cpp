// Whole-file reads and the temporary-file-then-rename writer used by every
// checkpoint file (config.json, safetensors shards, index).
#include "lockstep/base/file_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/pause_point.h"

namespace lockstep {

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

std::string read_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) LS_THROW << absolute_path(path) << ": cannot open: " << std::strerror(errno);
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) LS_THROW << path << ": read failed";
  return os.str();
}

namespace {
// Distinguishes temporary files of concurrent writers within one process.
std::atomic<uint64_t> g_tmp_counter{0};
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_tmp_counter++);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    LS_THROW << path_ << ": cannot create temporary file " << tmp_path_ << ": " << std::strerror(errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  LS_CHECK(fd_ >= 0 && !committed_) << "write to a closed AtomicFile " << path_;
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Writes of more than ~2 GiB are split by the kernel anyway; cap the request.
    const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    const ssize_t w = ::write(fd_, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      LS_THROW << path_ << ": write failed after " << written_ << " bytes: " << std::strerror(errno);
    }
    if (w == 0) LS_THROW << path_ << ": write made no progress after " << written_ << " bytes";
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
  pause_point("atomic.write", path_);  // the temporary file is partly written
}

void AtomicFile::commit() {
  LS_CHECK(fd_ >= 0 && !committed_) << "commit of a closed AtomicFile " << path_;
  if (::fsync(fd_) != 0) LS_THROW << path_ << ": fsync failed: " << std::strerror(errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) LS_THROW << path_ << ": close failed: " << std::strerror(errno);
  pause_point("atomic.rename", path_);  // whole and synced, not yet in place
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    LS_THROW << path_ << ": rename from " << tmp_path_ << " failed: " << std::strerror(errno);
  committed_ = true;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

namespace {
// The writer's pid of an AtomicFile temporary "<name>.tmp.<pid>.<n>", or -1.
long temporary_writer(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return -1;
  const std::string rest = name.substr(at + 5);  // "<pid>.<n>"
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == rest.size()) return -1;
  if (rest.find_first_not_of("0123456789.") != std::string::npos ||
      rest.find('.', dot + 1) != std::string::npos)
    return -1;
  return std::atol(rest.c_str());
}

// Whether process `pid` may still write: it exists and is not a zombie (a
// killed writer whose parent has not reaped it yet).
bool writer_alive(long pid) {
  if (pid == long(::getpid())) return true;
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}
}  // namespace

int remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  int removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const long pid = temporary_writer(e.path().filename().string());
    if (pid <= 0 || !e.is_regular_file(ec)) continue;
    if (writer_alive(pid)) continue;  // this process, or another still running
    if (std::filesystem::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace lockstep
