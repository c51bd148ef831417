// metrics.jsonl: one JSON object per step with its wall-clock time, written
// with a single write() and flushed to disk, so a crash loses at most the
// line being written. On resume, lines of the steps the run writes again are
// dropped (those after the checkpoint, and the step-0 eval when there is no
// checkpoint), and a torn last line is removed. Optionally the same scalars
// go to TensorBoard event files, and metrics take verl's names.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/metrics/metric_names.h"

namespace lockstep {
class TomlSection;
}

namespace lockstep::metrics {

class TensorBoardWriter;

// What the [log] section says about metrics.
struct LoggerOptions {
  bool tensorboard = false;                   // also write RUN_DIR/tensorboard/events.out.tfevents.*
  MetricNames names = MetricNames::Lockstep;  // the names lines and events carry
};

// Reads [log] tensorboard and, when with_names, [log] metric_names.
LoggerOptions read_logger_options(TomlSection& log_section, bool with_names);

class MetricsLogger {
 public:
  // No rewrite: new lines go after whatever the file holds.
  static constexpr int64_t kAppend = INT64_MIN;

  // Opens path for appending. Unless keep_through is kAppend, first keeps
  // only the complete lines whose "step" is <= keep_through (rewritten
  // atomically): a resumed run passes the step before the first one it
  // writes again (-1 keeps no line). With options.tensorboard, opens a new
  // events file in tensorboard/ beside `path` (a resumed run's starts with a
  // restart marker at keep_through + 1).
  explicit MetricsLogger(const std::string& path, int64_t keep_through = kAppend,
                         const LoggerOptions& options = {});
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Appends {"step": step, "time": unix seconds, ...metrics} as one line
  // (metric names as options.names says), and with TensorBoard one scalar
  // per numeric metric at `step`.
  void log(int64_t step, const nlohmann::json& metrics);
  const std::string& path() const { return path_; }
  // The events file, or "" without TensorBoard.
  std::string tensorboard_path() const;

 private:
  void append(const char* data, size_t n);
  void write_line(const std::string& line);

  std::string path_;
  int fd_ = -1;
  LoggerOptions options_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
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
