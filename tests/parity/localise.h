// The parity suite's names for the localiser, which lives in
// src/lockstep/rollout/localise.h (lockstep check-alignment --localise uses it too).
#pragma once

#include "lockstep/rollout/localise.h"

namespace lockstep::parity {

using rollout::CaptureComparer;
using rollout::CaptureReference;
using rollout::Divergence;
using rollout::sample_name;
using rollout::samples_of;
using rollout::SampleTokens;
using rollout::trainer_reference;

}  // namespace lockstep::parity
