// The run report: one self-contained HTML file (inline SVG charts, inline
// CSS, no network access needed to view it) built from a run directory's
// config.toml, metrics.jsonl, samples/, sft/metrics.jsonl and summary.json.
// `lockstep report` writes it on demand; `lockstep rl` and `lockstep demo`
// rewrite it every log.report_interval steps and at the end.
#pragma once

#include <string>
#include <vector>

namespace lockstep::report {

struct ReportResult {
  std::string path;                   // the HTML file written
  std::vector<std::string> warnings;  // also shown at the top of the page
  int charts = 0;                     // chart panels, "no data" panels included
};

// Writes the report of `run_dir` to `out_path` (empty: RUN_DIR/report.html),
// atomically: a reader sees the old file or the new one, never half of one.
// Throws lockstep::Error naming the path if run_dir is not a directory, if
// RUN_DIR/metrics.jsonl does not exist or cannot be read, or if the output
// cannot be written. Bad data (a torn or malformed line, NaN values, a bad
// samples file, config.toml or summary.json) only adds warnings.
ReportResult write_report(const std::string& run_dir, const std::string& out_path);

// The page itself, without writing it (write_report = this + an atomic write).
std::string render_report(const std::string& run_dir, ReportResult* result);

}  // namespace lockstep::report
