// MetricsLogger implementation (POSIX write + fdatasync per line; the
// TensorBoard record after the line).
#include "lockstep/metrics/metrics_logger.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/pause_point.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/metrics/tensorboard_writer.h"

namespace lockstep::metrics {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A metric's value as a TensorBoard scalar: numbers and booleans (null is a
// NaN the JSON cannot hold); false for anything else (a string, an object).
bool scalar_value(const nlohmann::json& v, float* out) {
  if (v.is_number() || v.is_boolean()) {
    *out = v.is_boolean() ? (v.get<bool>() ? 1.0f : 0.0f) : float(v.get<double>());
    return true;
  }
  if (v.is_null()) {
    *out = std::nanf("");
    return true;
  }
  return false;
}

}  // namespace

LoggerOptions read_logger_options(TomlSection& s, bool with_names) {
  LoggerOptions o;
  o.tensorboard = s.get_bool("tensorboard", o.tensorboard);
  if (with_names)
    o.names = parse_metric_names(s.get_enum("metric_names", to_string(o.names), {"lockstep", "verl"}));
  return o;
}

std::vector<nlohmann::json> read_metrics(const std::string& path, int* bad_lines) {
  std::vector<nlohmann::json> out;
  if (bad_lines) *bad_lines = 0;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      if (bad_lines) ++*bad_lines;
    }
  }
  return out;
}

MetricsLogger::MetricsLogger(const std::string& path, int64_t keep_through, const LoggerOptions& options)
    : path_(path), options_(options) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  if (keep_through != kAppend && std::filesystem::exists(path)) {
    std::ifstream in(path);
    std::string line, kept;
    while (std::getline(in, line)) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.value("step", int64_t(0)) <= keep_through) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
      }
    }
    in.close();
    write_file_atomic(path, kept);  // a crash leaves the old file or the new one
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) LS_THROW << path << ": cannot open for writing: " << std::strerror(errno);
  if (options_.tensorboard) {
    const std::string dir =
        (parent.empty() ? std::filesystem::path("tensorboard") : parent / "tensorboard").string();
    tensorboard_ = std::make_unique<TensorBoardWriter>(dir, unix_seconds(),
                                                       keep_through == kAppend ? -1 : keep_through + 1);
  }
}

MetricsLogger::~MetricsLogger() {
  if (fd_ >= 0) ::close(fd_);
}

std::string MetricsLogger::tensorboard_path() const {
  return tensorboard_ ? tensorboard_->path() : std::string();
}

void MetricsLogger::log(int64_t step, const nlohmann::json& metrics) {
  const double now = unix_seconds();
  nlohmann::json j = {{"step", step}, {"time", now}};
  std::vector<std::pair<std::string, float>> scalars;
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const std::string name = exported_name(it.key(), options_.names);
    j[name] = it.value();
    float v = 0;
    if (tensorboard_ && scalar_value(it.value(), &v)) scalars.emplace_back(name, v);
  }
  write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (tensorboard_) tensorboard_->write_scalars(step, now, scalars);
  pause_point("metrics.line", path_);  // the step's line is in, its checkpoint not yet
}

// One write() per line; a crash test's "metrics.torn" pause splits it to
// leave a torn last line, as a full disk or a power cut can.
void MetricsLogger::write_line(const std::string& line) {
  const size_t half = pause_point_armed("metrics.torn") ? line.size() / 2 : line.size();
  append(line.data(), half);
  if (half < line.size()) {
    pause_point("metrics.torn", path_);
    append(line.data() + half, line.size() - half);
  }
  if (::fdatasync(fd_) != 0 && errno != EINVAL)
    LS_THROW << path_ << ": fdatasync failed: " << std::strerror(errno);
}

void MetricsLogger::append(const char* data, size_t n) {
  size_t off = 0;
  while (off < n) {
    const ssize_t w = ::write(fd_, data + off, n - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      LS_THROW << path_ << ": write failed: " << std::strerror(errno);
    }
    off += size_t(w);
  }
}

std::string format_console_line(int64_t step, const std::vector<std::pair<std::string, double>>& fields) {
  return format_console_line("step " + std::to_string(step), fields);
}

std::string format_console_line(const std::string& head,
                                const std::vector<std::pair<std::string, double>>& fields) {
  std::ostringstream os;
  os << head;
  char buf[64];
  for (const auto& [k, v] : fields) {
    std::snprintf(buf, sizeof buf, "%.4g", v);
    os << " | " << k << " " << buf;
  }
  return os.str();
}

}  // namespace lockstep::metrics
