// The RL loop's TrainerGroup over the trainer ranks of an MPI job: each rank
// trains on its contiguous, equal-count shard of every mini-batch
// (parallel::split_even), sums are taken in rank order, and one rank writes
// the run's files.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.h"
#include "lockstep/rl/trainer_group.h"

namespace lockstep::rl {

// `trainers` must outlive the group. One trainer: OneRank.
std::shared_ptr<TrainerGroup> make_trainer_group(comm::Communicator& trainers, bool writer);

}  // namespace lockstep::rl
