// Scoring a JSONL file: the engine of `lockstep reward`. Every line is
// validated before anything is scored, and the output is written to
// OUT.tmp and renamed, so bad input never leaves a half-written file.
#pragma once

#include <string>

#include "lockstep/reward/batch.h"
#include "lockstep/reward/reward.h"

namespace lockstep::reward {

struct JsonlSummary {
  BatchStats stats;
  double responses_per_s = 0.0;  // scored lines per second of scoring time
};

// Reads `in_path` (one JSON object per line with "response" (string) and
// "label"; optional "metadata" and "prompt"; blank lines are skipped),
// scores each line and writes `out_path`: the input fields in their order
// plus "reward" (null on failure), "correct", "extracted" and "failure"
// (null when none). Throws lockstep::Error naming the file and line for
// bad input, or the file for I/O errors.
JsonlSummary score_jsonl_file(const std::string& in_path, const std::string& out_path, const RewardOptions& options,
                              const BatchOptions& batch);

}  // namespace lockstep::reward
