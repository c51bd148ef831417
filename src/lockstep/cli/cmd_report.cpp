// `lockstep report RUN_DIR [--out FILE]`: writes the run's self-contained HTML
// report (inline SVG charts; see docs/report.md) and prints its path.
#include <cstdio>
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/cli/command.h"
#include "lockstep/report/report.h"

namespace lockstep::cli {
namespace {

const char* const kHelp =
    "usage: lockstep report RUN_DIR [--out FILE]\n"
    "\n"
    "Writes one self-contained HTML file (inline SVG charts and CSS; it needs no network\n"
    "access to view) from a run directory: config.toml, metrics.jsonl, samples/step_N.jsonl,\n"
    "and, if present, sft/metrics.jsonl and summary.json. Open it in any browser.\n"
    "\n"
    "Charts: reward (mean ± std), eval pass@1/pass@k, truncated ratio, response length,\n"
    "train/rollout logprob gap, KL, clip fractions, entropy, grad norm, loss, learning rate,\n"
    "step time by phase, tokens/s; accuracy and each reward/extra/<key> when the run logs\n"
    "them. A chart whose metrics are absent shows \"no data\". Also: the first vs last eval,\n"
    "a few samples (with label, verdict and reward failure), summary.json, every metric's\n"
    "range, the config. Runs logged with [log] metric_names = \"verl\" read the same.\n"
    "\n"
    "Bad lines (e.g. a torn last line while the run is writing) and non-finite values are\n"
    "skipped with a warning, printed here and shown in the page. A missing RUN_DIR or\n"
    "metrics.jsonl is an error (exit code 2). The file is written atomically.\n"
    "\n"
    "flags:\n"
    "  --out FILE    output path (default RUN_DIR/report.html)\n"
    "\n"
    "`lockstep rl` and `lockstep demo` rewrite RUN_DIR/report.html every log.report_interval\n"
    "steps and at the end. See docs/report.md.\n";

int run_report(const Args& args) {
  args.check_known({"out"});
  const auto& pos = args.positional();
  if (pos.empty()) LS_THROW << "report: name a run directory: `lockstep report RUN_DIR [--out FILE]`";
  if (pos.size() > 1) LS_THROW << "report: expected one run directory, got " << pos.size() << " arguments";
  const auto result = report::write_report(pos[0], args.get("out", ""));
  for (const auto& w : result.warnings) std::cerr << "lockstep report: warning: " << w << "\n";
  std::printf("report: %s (%d charts%s)\n", result.path.c_str(), result.charts,
              result.warnings.empty() ? "" : ", see warnings");
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "report", "write a run directory's HTML report (inline SVG charts)", kHelp, {}, run_report});

}  // namespace
}  // namespace lockstep::cli
