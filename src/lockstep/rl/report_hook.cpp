// report.html during and after an RL run.
#include "lockstep/rl/report_hook.h"

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/report/report.h"

namespace lockstep::rl {

bool write_run_report(const std::string& run_dir) {
  try {
    const report::ReportResult r = report::write_report(run_dir, "");
    for (const auto& w : r.warnings) LS_LOG(Warn) << "report: " << w;
    return true;
  } catch (const std::exception& e) {
    LS_LOG(Warn) << "report not written: " << e.what();
    return false;
  }
}

void attach_reports(RlInputs& in, const RlConfig& cfg) {
  if (cfg.log.report_interval <= 0) return;
  auto previous = in.after_step;
  const int64_t every = cfg.log.report_interval;
  const std::string dir = cfg.out_dir;
  in.after_step = [previous, every, dir](int64_t step) {
    if (previous) previous(step);
    if (step % every == 0) write_run_report(dir);
  };
}

}  // namespace lockstep::rl
