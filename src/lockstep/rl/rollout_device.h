// [rollout] device: the colocated rollout engine on another device than the
// trainer (the engine on a GPU backend, the trainer on the CPU kernels). The
// bits do not change across devices (the numerics contract), so such a run
// is still aligned: the same logprobs, metrics and checkpoints as on one.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

// The rollout engine's context: the trainer's, with [rollout] device's
// backend when set. Throws, naming the key, for a device this binary cannot
// run and for the combinations not supported yet (a trainer on a device
// with the engine elsewhere, LoRA adapters, which the engine reads from the
// trainer's memory in place).
Context rollout_context(const train::Trainer& trainer, const rollout::RolloutSection& cfg);

// Whether the engine's kernels run on another device than the trainer's.
inline bool crosses_devices(const Context& rollout, const train::Trainer& trainer) {
  return rollout.gpu != trainer.context().gpu;
}

}  // namespace lockstep::rl
