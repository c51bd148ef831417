// The [train] section: optimizer, micro-batching, SFT loop and checkpoint keys
// (docs/configuration.md lists them all).
#pragma once

#include <string>

#include "lockstep/base/toml_section.h"
#include "lockstep/train/sft.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {

struct TrainSection {
  TrainerConfig trainer;
  SftConfig sft;
  std::string out_dir = "runs/sft";
  int64_t threads = 0;  // 0: LOCKSTEP_THREADS or the core count
};

TrainSection train_section_from_toml(TomlSection& s);

}  // namespace lockstep::train
