// The [dist] section (docs/configuration.md) and the roles it assigns to the
// ranks of an MPI job: world ranks [0, trainer_ranks) train, the remaining
// rollout_ranks generate. Trainers form a data-parallel x expert-parallel grid,
// expert-parallel neighbours on consecutive ranks (trainer t: dp = t / EP,
// ep = t % EP), so an expert group stays on one node when ranks fill nodes in
// order. These are pure functions of (config, world size, rank): testable
// without MPI.
#pragma once

#include <cstdint>
#include <string>

#include "lockstep/base/toml_section.h"

namespace lockstep::parallel {

struct DistConfig {
  int64_t trainer_ranks = 0;         // 0: every rank that is not a rollout rank
  int64_t rollout_ranks = 0;         // 0: colocated, trainer ranks also generate
  int64_t expert_parallel = 1;       // EP: trainer ranks that share out each MoE layer's experts
  int64_t bucket_mb = 16;            // all-reduce / broadcast bucket (MiB)
  // > 0: the rollout generates one step ahead of training (on rollout ranks,
  // or in a single process on a thread of its own).
  int64_t max_weight_staleness = 0;
  int64_t rollout_threads = 0;  // one process, max_weight_staleness > 0: the engine's threads (0: the trainer's count)
  double timeout_s = 1800;           // a collective slower than this ends the job; 0: never
  // The same result for any number of data-parallel trainer ranks: canonical
  // micro-batches and an exact gradient sum (docs/distributed.md).
  bool world_invariant = false;

  size_t bucket_bytes() const { return size_t(bucket_mb) << 20; }
};

// Reads [dist]; `s` may wrap an absent section (all defaults). Types and
// ranges only: the world size is checked by compute_roles.
DistConfig dist_config_from_toml(TomlSection& s);

struct Roles {
  int world_size = 1, world_rank = 0;
  int trainer_ranks = 1, rollout_ranks = 0;
  bool colocated = true;     // no rollout ranks: trainers generate too
  bool is_trainer = true;
  bool is_rollout = false;   // a dedicated rollout rank
  int trainer_rank = 0;      // index among trainers, -1 on rollout ranks
  int rollout_rank = -1;     // index among rollout ranks, -1 on trainers
  int dp_size = 1, ep_size = 1;
  int dp_rank = 0, ep_rank = 0;  // -1 on rollout ranks
  static constexpr int kTrainerRoot = 0;  // world rank that logs, checkpoints, publishes weights
  bool is_trainer_root() const { return world_rank == kTrainerRoot; }
};

// Throws Error naming the [dist] key when the layout does not fit world_size.
Roles compute_roles(const DistConfig& cfg, int world_size, int world_rank);
// One line for logs: "rank 3/8: trainer 3 (dp 3/6, ep 0/1)".
std::string describe(const Roles& roles);

}  // namespace lockstep::parallel
