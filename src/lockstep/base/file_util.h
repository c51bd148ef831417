// File helpers for checkpoints: whole-file reads, and AtomicFile, which writes
// to a temporary file and renames it over the target only once everything is
// written and synced, so a reader never sees a half-written file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep {

// The whole file as bytes; Error naming the path if it cannot be read.
std::string read_file_text(const std::string& path);

// `path` made absolute against the current folder, for messages: a file that
// cannot be opened is named by its full path, whatever folder the user is in.
std::string absolute_path(const std::string& path);

class AtomicFile {
 public:
  // Creates "<path>.tmp.<pid>.<n>" next to `path` (same filesystem, so the
  // final rename is atomic).
  explicit AtomicFile(std::string path);
  // Not committed: the temporary file is removed, `path` is left as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Throws Error naming the final path on any short or failed write (disk
  // full, file size limit, ...).
  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  // fsync, close, rename over `path`.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, const std::string& text);

// Removes the temporary files of AtomicFiles ("<name>.tmp.<pid>.<n>") in
// `dir` (not below it) whose writer process is gone: what a killed run left.
// Best effort; returns how many it removed.
int remove_stale_temporaries(const std::string& dir);

// fsync of a directory, so renames inside it survive a crash. Best effort.
void sync_directory(const std::string& dir);

}  // namespace lockstep
