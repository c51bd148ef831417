// The [critic] section of `lockstep rl` (PPO with a learned critic and GAE,
// [algo] advantage = "gae"): where the critic starts and how it trains.
// Optimizer keys the section leaves out take [train]'s values.
#pragma once

#include <string>

#include "lockstep/base/toml_section.h"
#include "lockstep/train/critic.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

struct CriticSection {
  // A Hugging Face directory (or a checkpoints/latest file) to start the
  // critic from; its value_head.safetensors, if any, gives the head. Empty:
  // the policy's initial weights and a zero head.
  std::string path;
  train::CriticConfig critic;  // lr, schedule, weight_decay, grad_clip, micro_batch_tokens, cliprange_value
};

// Reads [critic]; `policy` is [train]'s trainer config (the defaults of the
// optimizer keys and micro_batch_tokens).
CriticSection critic_section_from_toml(TomlSection& s, const train::TrainerConfig& policy);

}  // namespace lockstep::rl
