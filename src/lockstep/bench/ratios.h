// Every ratio the training and rollout benchmarks measure, in one table: each
// figure beside the baseline the same run measured for it (the machine is
// shared and noisy, so a figure is only compared with what was measured
// around it). Used by `lockstep bench` without a benchmark name.
#pragma once

#include <vector>

#include "lockstep/bench/common.h"
#include "lockstep/bench/rollout.h"
#include "lockstep/bench/train.h"

namespace lockstep::perf {

// Columns: model, ratio, measured, baseline (same run), value. Rows:
//   training: model FLOP/s over the FMA peak;
//   decode at each batch: tokens/s over the roofline (the larger of the
//   step's FLOPs at the FMA peak and its bytes at the measured read bandwidth);
//   prefill: model FLOP/s over the FMA peak;
//   GRPO: generated tokens/s with prefix sharing over without.
Table ratio_table(const std::vector<TrainBenchResult>& train, const std::vector<RolloutBenchResult>& rollout);

}  // namespace lockstep::perf
