// make_role_comms: the splits of the world communicator.
#include "lockstep/parallel/role_comms.h"

namespace lockstep::parallel {

RoleComms make_role_comms(const DistConfig& cfg) {
  RoleComms rc;
  rc.world = comm::Communicator::world(cfg.timeout_s);
  rc.world.set_bucket_bytes(cfg.bucket_bytes());
  rc.roles = compute_roles(cfg, rc.world.size(), rc.world.rank());
  const Roles& r = rc.roles;
  // Every split is collective over world: every rank makes each call.
  rc.trainers = rc.world.split(r.is_trainer ? 0 : -1, r.world_rank, "trainers");
  rc.dp = rc.world.split(r.is_trainer ? r.ep_rank : -1, r.dp_rank, "dp");
  rc.ep = rc.world.split(r.is_trainer ? r.dp_rank : -1, r.ep_rank, "ep");
  rc.rollout = rc.world.split(r.is_rollout ? 0 : -1, r.world_rank, "rollout");
  const bool in_sync = !r.colocated && (r.is_rollout || r.is_trainer_root());
  rc.weight_sync = rc.world.split(in_sync ? 0 : -1, r.world_rank, "weight_sync");
  return rc;
}

}  // namespace lockstep::parallel
