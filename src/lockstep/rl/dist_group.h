// The RL loop's TrainerGroup over the trainer ranks of an MPI job: each rank
// trains on its contiguous, equal-count shard of every mini-batch
// (parallel::split_even), small vectors are summed in rank order, and one rank
// writes the run's files.
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/rl/loop.h"

namespace lockstep::rl {

// `trainers` must outlive the group. One trainer: no shard, no sum.
TrainerGroup make_trainer_group(comm::Communicator& trainers, bool writer);

}  // namespace lockstep::rl
