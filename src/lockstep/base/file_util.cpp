// Whole-file reads and the temporary-file-then-rename writer used by every
// checkpoint file (config.json, safetensors shards, index).
#include "lockstep/base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/pause_point.h"

namespace lockstep {

std::string read_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) LS_THROW << path << ": cannot open: " << std::strerror(errno);
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

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace lockstep
