// metrics.jsonl: one JSON object per step, written with a single write() and
// flushed to disk, so a crash loses at most the line being written. On
// resume, lines of the steps the run writes again are dropped (those after
// the checkpoint, and the step-0 eval when there is no checkpoint), and a
// torn last line is removed.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep::metrics {

class MetricsLogger {
 public:
  // No rewrite: new lines go after whatever the file holds.
  static constexpr int64_t kAppend = INT64_MIN;

  // Opens path for appending. Unless keep_through is kAppend, first keeps
  // only the complete lines whose "step" is <= keep_through (rewritten
  // atomically): a resumed run passes the step before the first one it
  // writes again (-1 keeps no line).
  explicit MetricsLogger(const std::string& path, int64_t keep_through = kAppend);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Appends {"step": step, ...metrics} as one line.
  void log(int64_t step, const nlohmann::json& metrics);
  const std::string& path() const { return path_; }

 private:
  void append(const char* data, size_t n);

  std::string path_;
  int fd_ = -1;
};

// Reads metrics.jsonl; a malformed line (e.g. a torn last line) is skipped
// and counted in *bad_lines.
std::vector<nlohmann::json> read_metrics(const std::string& path, int* bad_lines = nullptr);

// One compact console line: "step 12 | loss 1.234 | grad_norm 0.5 | ...".
std::string format_console_line(int64_t step, const std::vector<std::pair<std::string, double>>& fields);
// The same after another head ("step 12/100").
std::string format_console_line(const std::string& head,
                                const std::vector<std::pair<std::string, double>>& fields);

}  // namespace lockstep::metrics
