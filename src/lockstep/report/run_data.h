// Reading a run directory for the report: metrics.jsonl into one series per
// metric name, and the samples/step_N.jsonl files. Bad lines never stop a
// report; they become warnings that name the file and, where known, the line.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/report/svg.h"

namespace lockstep::report {

// Every numeric metric of a metrics.jsonl, by lockstep name (a run logged
// with verl's names reads as if logged with lockstep's) and step. A value the
// run logged as non-finite (null, "nan", "inf") is kept as NaN/inf: charts
// skip it, tables show it. The wall-clock "time" of a line is not a metric:
// it is kept apart.
struct MetricTable {
  std::map<std::string, std::map<int64_t, double>> series;  // name -> step -> value
  int64_t rows = 0;                                         // lines read, with a step
  int64_t first_step = 0;
  int64_t last_step = -1;  // < first_step: no rows
  double first_time = 0;   // the earliest and latest "time" (unix seconds) of a line;
  double last_time = 0;    // both 0 when no line has one

  bool has(const std::string& name) const { return series.count(name) > 0; }
  // (step, value) pairs of `name`, in step order; empty if absent.
  std::vector<Point> points(const std::string& name) const;
  // Every name that starts with `prefix`, sorted.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;
};

// Reads `path` with metrics::read_metrics. Throws Error naming the file if it
// does not exist or cannot be read; malformed lines (a torn last line while a
// run writes), lines without a numeric "step" and non-finite values are
// reported in *warnings.
MetricTable load_metrics(const std::string& path, std::vector<std::string>* warnings);

struct SamplesFile {
  int64_t step = 0;  // parsed from the name: step_12.jsonl or step_000012.jsonl
  std::string path;
};

// The samples/step_N.jsonl files of a run directory in step order; empty if
// there is no samples/ folder. Other names are ignored.
std::vector<SamplesFile> list_samples_files(const std::string& run_dir);

struct SampleRow {
  int64_t step = 0;
  std::string prompt;
  std::string response;
  std::string finish_reason;  // "stop" | "length" | "" if absent
  double reward = 0;
  double advantage = 0;
  int64_t response_len = -1;  // -1: absent
  bool has_reward = false;
  bool has_advantage = false;
  std::string label;    // the prompt's label (a list or object as JSON); "" if absent
  int correct = -1;     // the verifier's verdict: 1 correct, 0 not, -1 absent
  std::string failure;  // "reward_failure": why scoring failed; "" if absent or null
};

// Up to max_rows rows from the start of one samples file (it is not read
// further). A malformed line is skipped with a warning naming file:line.
std::vector<SampleRow> read_samples(const SamplesFile& file, size_t max_rows,
                                    std::vector<std::string>* warnings);

}  // namespace lockstep::report
