// The communicators of a lockstep job, built from [dist]: world, the trainer
// group and its data-parallel / expert-parallel sub-groups, the rollout group,
// and the weight-sync group (trainer root + rollout ranks) that
// broadcast_weights uses. Ranks outside a group hold a null comm::Communicator.
#pragma once

#include "lockstep/comm/communicator.h"
#include "lockstep/parallel/dist_config.h"

namespace lockstep::parallel {

struct RoleComms {
  Roles roles;
  comm::Communicator world;
  comm::Communicator trainers;     // trainer ranks, in trainer order
  comm::Communicator dp;           // trainers with this rank's ep index, ordered by dp index (replicas of its experts)
  comm::Communicator ep;           // trainers with this rank's dp index, ordered by ep index (its expert-parallel group)
  comm::Communicator rollout;      // rollout ranks (disaggregated only)
  comm::Communicator weight_sync;  // trainer root (rank 0 here) + rollout ranks (disaggregated only)
};

// Collective over MPI_COMM_WORLD (needs a live comm::Environment). Checks the
// layout against the world size.
RoleComms make_role_comms(const DistConfig& cfg);

}  // namespace lockstep::parallel
