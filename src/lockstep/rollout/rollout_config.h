// The [rollout] section: engine limits, default sampling parameters and the
// rollout precision (f32 = aligned mode; bf16 / fp8 = fast mode).
#pragma once

#include <string>

#include "lockstep/base/toml_section.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::rollout {

struct RolloutSection {
  EngineConfig engine;
  SamplingParams sampling;  // n, temperature, top_p, top_k, min_p, max_new_tokens, seed
  std::string precision = "f32";  // f32 | bf16 | fp8
  int64_t fp8_block = 128;        // fp8: scale block (0 = one scale per tensor)
};

RolloutSection rollout_section_from_toml(TomlSection& s);
// "f32" -> F32, "bf16" -> BF16, "fp8" -> FP8E4M3; Error otherwise.
DType precision_dtype(const std::string& precision);

}  // namespace lockstep::rollout
