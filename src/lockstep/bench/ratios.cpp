// The ratio table of ratios.h.
#include "lockstep/bench/ratios.h"

#include <algorithm>

namespace lockstep::perf {
namespace {

// " (bf16)" after a ratio measured at another precision than f32.
std::string at_precision(DType p) {
  return p == DType::F32 ? "" : " (" + precision_name(p) + ")";
}

}  // namespace

Table ratio_table(const std::vector<TrainBenchResult>& train,
                  const std::vector<RolloutBenchResult>& rollout) {
  Table t({"model", "ratio", "measured", "baseline (same run)", "value"});
  for (const TrainBenchResult& r : train)
    t.add({r.model, "training FLOP/s / FMA peak" + at_precision(r.opt.precision),
           fmt("%.1f GFLOP/s (%.0f tok/s)", r.gflops, r.tokens_per_s), fmt("%.1f GFLOP/s", r.peak.gflops()),
           fmt("%.1f%%", 100.0 * r.gflops / r.peak.gflops())});
  for (const RolloutBenchResult& r : rollout) {
    const std::string p = at_precision(r.opt.precision);
    for (const DecodeResult& d : r.decode) {
      t.add({r.model, fmt("decode batch %lld / roofline", (long long)d.batch) + p,
             fmt("%.0f tok/s", d.tokens_per_s),
             fmt("%.0f tok/s (%s bound)", d.roofline_tokens_per_s, d.memory_bound() ? "memory" : "compute"),
             fmt("%.1f%%", 100.0 * d.tokens_per_s / d.roofline_tokens_per_s)});
    }
    t.add({r.model, "prefill FLOP/s / FMA peak" + p, fmt("%.1f GFLOP/s", r.prefill_gflops),
           fmt("%.1f GFLOP/s", r.peak.gflops()), fmt("%.1f%%", 100.0 * r.prefill_gflops / r.peak.gflops())});
    t.add({r.model, "GRPO prefix sharing / none" + p, fmt("%.0f tok/s", r.grpo_shared.tokens_per_s()),
           fmt("%.0f tok/s", r.grpo_unshared.tokens_per_s()),
           fmt("%.2fx", r.grpo_shared.tokens_per_s() / std::max(r.grpo_unshared.tokens_per_s(), 1e-9))});
  }
  return t;
}

}  // namespace lockstep::perf
