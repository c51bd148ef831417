// The communicators of a lockstep job, built from [dist]: world, the trainer
// group and its data-parallel / expert-parallel sub-groups, the rollout group,
// and the weight-sync group (trainer root + rollout ranks) that
// broadcast_weights uses. Ranks outside a group hold a null Communicator.
#pragma once

#include "lockstep/dist/communicator.h"
#include "lockstep/dist/dist_config.h"

namespace lockstep::dist {

struct RoleComms {
  Roles roles;
  Communicator world;
  Communicator trainers;     // trainer ranks, in trainer order
  Communicator dp;           // trainers with this rank's ep index, ordered by dp index (replicas of its experts)
  Communicator ep;           // trainers with this rank's dp index, ordered by ep index (its expert-parallel group)
  Communicator rollout;      // rollout ranks (disaggregated only)
  Communicator weight_sync;  // trainer root (rank 0 here) + rollout ranks (disaggregated only)
};

// Collective over MPI_COMM_WORLD (needs a live Environment). Checks the
// layout against the world size.
RoleComms make_role_comms(const DistConfig& cfg);

}  // namespace lockstep::dist
