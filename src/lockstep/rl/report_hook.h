// The run report during and after an RL run: report.html is rewritten every
// log.report_interval steps and at the end. A report that cannot be written
// is a warning, never the end of a training run.
#pragma once

#include <string>

#include "lockstep/rl/loop.h"

namespace lockstep::rl {

// Writes RUN_DIR/report.html; prints warnings; returns false on failure.
bool write_run_report(const std::string& run_dir);

// Chains a report write every cfg.log.report_interval steps onto in.after_step.
void attach_reports(RlInputs& in, const RlConfig& cfg);

// The report at the end of a run.
inline void finish_report(const RlConfig& cfg) { write_run_report(cfg.out_dir); }

}  // namespace lockstep::rl
