// TensorBoard event encoding and the events file (see tensorboard_writer.h).
#include "lockstep/metrics/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lockstep/base/error.h"
#include "lockstep/metrics/proto_wire.h"
#include "lockstep/metrics/tfrecord.h"

namespace lockstep::metrics {
namespace {

// Field numbers of tensorboard.Event, Summary, Summary.Value and SessionLog.
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
              kEventSessionLog = 7;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2;
constexpr int kSessionLogStatus = 1;
constexpr uint64_t kSessionStart = 1;
// Names tried per second before giving up (a file per process and second is the rule).
constexpr int kMaxNameTries = 1000;

ProtoWriter event_head(double wall_time, int64_t step) {
  ProtoWriter e;
  e.field_double(kEventWallTime, wall_time);
  e.field_varint(kEventStep, uint64_t(step));
  return e;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  std::string s(buf);
  for (char& c : s)
    if (c == '/') c = '_';
  return s;
}

}  // namespace

std::string file_version_event(double wall_time) {
  ProtoWriter e;
  e.field_double(kEventWallTime, wall_time);
  e.field_bytes(kEventFileVersion, "brain.Event:2");
  return e.bytes();
}

std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, float>>& values) {
  ProtoWriter summary;
  for (const auto& [tag, v] : values) {
    ProtoWriter value;
    value.field_bytes(kValueTag, tag);
    value.field_float(kValueSimpleValue, v);
    summary.field_bytes(kSummaryValue, value.bytes());
  }
  ProtoWriter e = event_head(wall_time, step);
  e.field_bytes(kEventSummary, summary.bytes());
  return e.bytes();
}

std::string session_start_event(double wall_time, int64_t step) {
  ProtoWriter log;
  log.field_varint(kSessionLogStatus, kSessionStart);
  ProtoWriter e = event_head(wall_time, step);
  e.field_bytes(kEventSessionLog, log.bytes());
  return e.bytes();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double wall_time, int64_t restart_step) {
  std::filesystem::create_directories(dir);
  char stem[64];
  std::snprintf(stem, sizeof stem, "events.out.tfevents.%010lld.", (long long)wall_time);
  const std::string base = dir + "/" + stem + host_name() + "." + std::to_string(::getpid()) + ".";
  for (int k = 0; k < kMaxNameTries && fd_ < 0; ++k) {
    path_ = base + std::to_string(k);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) LS_THROW << path_ << ": cannot create: " << std::strerror(errno);
  }
  if (fd_ < 0) LS_THROW << base << "*: no free events file name";
  write_record(file_version_event(wall_time));
  if (restart_step >= 0) write_record(session_start_event(wall_time, restart_step));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write_scalars(int64_t step, double wall_time,
                                      const std::vector<std::pair<std::string, float>>& values) {
  write_record(scalars_event(wall_time, step, values));
}

void TensorBoardWriter::write_record(const std::string& payload) {
  const std::string rec = tfrecord_frame(payload);
  size_t off = 0;
  while (off < rec.size()) {
    const ssize_t w = ::write(fd_, rec.data() + off, rec.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      LS_THROW << path_ << ": write failed: " << std::strerror(errno);
    }
    off += size_t(w);
  }
}

}  // namespace lockstep::metrics
