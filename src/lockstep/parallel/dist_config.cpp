// [dist] parsing and the role layout.
#include "lockstep/parallel/dist_config.h"

#include <sstream>

#include "lockstep/base/error.h"

namespace lockstep::parallel {

DistConfig dist_config_from_toml(TomlSection& s) {
  DistConfig c;
  c.trainer_ranks = s.get_int("trainer_ranks", c.trainer_ranks, 0, 1 << 20);
  c.rollout_ranks = s.get_int("rollout_ranks", c.rollout_ranks, 0, 1 << 20);
  c.expert_parallel = s.get_int("expert_parallel", c.expert_parallel, 1, 1 << 16);
  c.bucket_mb = s.get_int("bucket_mb", c.bucket_mb, 1, 1024);
  c.max_weight_staleness = s.get_int("max_weight_staleness", c.max_weight_staleness, 0, 1 << 20);
  c.rollout_threads = s.get_int("rollout_threads", c.rollout_threads, 0, 4096);
  c.timeout_s = s.get_double("timeout_s", c.timeout_s, 0.0, 7 * 24 * 3600.0);
  c.world_invariant = s.get_bool("world_invariant", c.world_invariant);
  return c;
}

Roles compute_roles(const DistConfig& cfg, int world_size, int world_rank) {
  LS_CHECK(world_size >= 1 && world_rank >= 0 && world_rank < world_size)
      << "rank " << world_rank << " of a world of " << world_size;
  const int64_t W = world_size;
  if (cfg.rollout_ranks < 0 || cfg.trainer_ranks < 0 || cfg.expert_parallel < 1)
    LS_THROW << "[dist]: trainer_ranks and rollout_ranks must be >= 0, expert_parallel >= 1";
  if (cfg.rollout_ranks >= W)
    LS_THROW << "[dist] rollout_ranks = " << cfg.rollout_ranks << " leaves no trainer rank in a job of " << W
             << " rank" << (W == 1 ? "" : "s") << " (launch more ranks with mpirun -np / srun -n, or lower rollout_ranks)";
  const int64_t T = cfg.trainer_ranks > 0 ? cfg.trainer_ranks : W - cfg.rollout_ranks;
  if (T + cfg.rollout_ranks != W)
    LS_THROW << "[dist] trainer_ranks (" << T << ") + rollout_ranks (" << cfg.rollout_ranks << ") = "
             << T + cfg.rollout_ranks << ", but the job has " << W
             << " ranks (mpirun -np / srun -n); set trainer_ranks = 0 to use every rank that is not a rollout rank";
  if (T % cfg.expert_parallel != 0)
    LS_THROW << "[dist] expert_parallel = " << cfg.expert_parallel << " does not divide the " << T
             << " trainer ranks (trainers form a data-parallel x expert-parallel grid)";
  if (cfg.max_weight_staleness < 0) LS_THROW << "[dist] max_weight_staleness must be >= 0";
  Roles r;
  r.world_size = world_size;
  r.world_rank = world_rank;
  r.trainer_ranks = int(T);
  r.rollout_ranks = int(cfg.rollout_ranks);
  r.colocated = cfg.rollout_ranks == 0;
  r.ep_size = int(cfg.expert_parallel);
  r.dp_size = int(T / cfg.expert_parallel);
  r.is_trainer = world_rank < T;
  r.is_rollout = !r.is_trainer;
  if (r.is_trainer) {
    r.trainer_rank = world_rank;
    r.rollout_rank = -1;
    r.dp_rank = world_rank / r.ep_size;
    r.ep_rank = world_rank % r.ep_size;
  } else {
    r.trainer_rank = -1;
    r.rollout_rank = world_rank - int(T);
    r.dp_rank = r.ep_rank = -1;
  }
  return r;
}

std::string describe(const Roles& r) {
  std::ostringstream os;
  os << "rank " << r.world_rank << "/" << r.world_size << ": ";
  if (r.is_trainer) {
    os << "trainer " << r.trainer_rank << " (dp " << r.dp_rank << "/" << r.dp_size << ", ep " << r.ep_rank << "/"
       << r.ep_size << ")" << (r.colocated ? ", also generates (colocated)" : "");
  } else {
    os << "rollout " << r.rollout_rank << "/" << r.rollout_ranks;
  }
  return os.str();
}

}  // namespace lockstep::parallel
