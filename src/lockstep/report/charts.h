// Which charts the run report draws, and from which metric names (DESIGN §6;
// docs/report.md lists them). Every chart is always present; one whose
// metrics are absent renders as a "no data" panel naming them.
#pragma once

#include <string>
#include <vector>

#include "lockstep/report/run_data.h"
#include "lockstep/report/svg.h"

namespace lockstep::report {

// An eval metric name split as eval/<set>/<metric>; the set may itself
// contain '/'. False if `name` is not of that form.
bool split_eval_name(const std::string& name, std::string* set, std::string* metric);

// Every eval/<set>/<metric> name of `metrics`, by set, then pass@k by k, then
// the other metrics by name (pass@4 before pass@16).
std::vector<std::string> sorted_eval_names(const MetricTable& metrics);

// The report's charts, in page order. `sft` (the demo's sft/metrics.jsonl)
// adds an SFT loss chart when not null.
std::vector<Chart> build_charts(const MetricTable& metrics, const MetricTable* sft);

}  // namespace lockstep::report
