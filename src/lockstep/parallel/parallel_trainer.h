// The trainer side of an MPI job's layout (RoleComms), shared by `lockstep
// rl` and `lockstep sft`: expert parallelism over the rank's EP group when
// [dist] expert_parallel > 1, then the gradient sum over the trainers (every
// trainer for non-expert tensors, the replicas of its experts for those).
#pragma once

#include <memory>
#include <string>

#include "lockstep/parallel/role_comms.h"
#include "lockstep/model/expert_parallel.h"
#include "lockstep/train/trainer.h"

namespace lockstep::parallel {

// Returns the expert-parallel transport the trainer now uses (null without
// EP): keep it, and `rc`, alive while the trainer runs. Throws an Error naming
// `config_path`, [dist] expert_parallel and the model's number of experts
// when EP does not divide them.
std::unique_ptr<model::ExpertComm> make_parallel_trainer(train::Trainer& trainer, RoleComms& rc,
                                                         const std::string& config_path);

}  // namespace lockstep::parallel
