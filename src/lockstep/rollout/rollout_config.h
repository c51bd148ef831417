// The [rollout] section: engine limits and default sampling parameters. The
// engine's precision comes from [model] precision (model_source.h).
#pragma once

#include <string>

#include "lockstep/base/toml_section.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::rollout {

struct RolloutSection {
  EngineConfig engine;
  SamplingParams sampling;  // n, temperature, top_p, top_k, min_p, max_new_tokens, seed
  std::string precision = "f32";          // the engine's: [model] precision (f32 | bf16 | fp8)
  std::string trainer_precision = "f32";  // [model] trainer_precision; differs in fast mode
  int64_t fp8_block = 128;                // fp8: scale block (0 = one scale per tensor)
  // [rollout] device: the device of the rollout engine's kernels (values as
  // [model] device); empty: the model's, where the trainer runs. Set with the
  // trainer on the CPU, the engine packs its own copy of the weights on the
  // device and every weight sync copies the trainer's master in.
  std::string device;
  std::string device_where;  // "FILE: [rollout] device", for device errors
  bool aligned() const { return precision == trainer_precision; }
};

RolloutSection rollout_section_from_toml(TomlSection& s);
// "f32" -> F32, "bf16" -> BF16, "fp8" -> FP8E4M3; Error otherwise.
DType precision_dtype(const std::string& precision);

}  // namespace lockstep::rollout
