// Rollout over MPI (docs/distributed.md). Two backends for the RL loop and
// the loop of a rollout rank:
// - MpiRollout (disaggregated): on the trainer root it sends each rollout
//   rank a contiguous share of the requests (whole groups), gathers the
//   results in request order and broadcasts them to the other trainer ranks;
//   sync() broadcasts the trainer's weights (parallel::broadcast_weights:
//   bucketed, versioned, checksummed). Other trainer ranks only receive.
//   submit() sends the requests and returns, collect() gathers the results:
//   the rollout ranks generate while the trainers train.
// - SpreadRollout (colocated, several trainer ranks): every trainer rank's
//   own engine generates a share of the requests on its (identical) weights
//   and the shares are exchanged, so every rank sees every result.
// - serve_rollout: a rollout rank's engine on its own copy of the weights,
//   answering the trainer root's commands until it says stop.
// A request's sampling seed decides its samples; the split over ranks does
// not (requests without a seed get one derived from the run's seed).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/model/lora.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/weight_broadcast.h"
#include "lockstep/rl/rollout_backend.h"

namespace lockstep::rl {

class MpiRollout : public RolloutBackend {
 public:
  // `sync`: the weight_sync communicator (trainer root = its rank 0, then the
  // rollout ranks) on the trainer root, null on the other trainer ranks.
  // `trainers`: the trainer ranks (null or size 1: a single trainer). Both
  // must outlive this object. The trainer root sends its weights at once, so
  // rollout ranks never generate from weights they loaded themselves.
  MpiRollout(train::Trainer& trainer, comm::Communicator* sync, comm::Communicator* trainers,
             const rollout::RolloutSection& cfg, uint64_t seed);
  // submit() then collect().
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests, const RolloutProgress& progress,
                                               int64_t* generated_tokens) override;
  void sync(train::Trainer& trainer) override;
  // Root: the generate command and every rollout rank's share of the
  // requests; returns once they are sent. A rollout rank sends its results
  // before it reads another command, so collect() must come before the next
  // sync() or generate() (they would wait for ranks that wait for the root).
  bool can_overlap() const override { return true; }
  void submit(std::vector<rollout::Request> requests) override;
  // Root: receives the results in rank (= request) order, then broadcasts
  // them to the other trainer ranks, which only receive.
  std::vector<rollout::RequestResult> collect(const RolloutProgress& progress, int64_t* generated_tokens) override;
  // The rollout ranks run the trainer's f32 kernels on the same bits.
  bool aligned() const override { return aligned_; }
  size_t last_sync_bytes() const override { return last_sync_.bytes; }
  const parallel::WeightSyncStats& last_sync() const { return last_sync_; }
  // Trainer root: tells the rollout ranks to leave serve_rollout. Call once,
  // after the run; a no-op on other trainer ranks.
  void shutdown();

 private:
  bool is_root() const { return sync_ != nullptr; }
  comm::Communicator* sync_;
  comm::Communicator* trainers_;
  bool aligned_;
  uint64_t seed_;
  uint64_t calls_ = 0;
  bool stopped_ = false;
  parallel::WeightSyncStats last_sync_;
  // The batch in flight: its request count and (root) each rollout rank's share.
  bool in_flight_ = false;
  size_t in_flight_n_ = 0;
  std::vector<parallel::Range> in_flight_shares_;
};

class SpreadRollout : public RolloutBackend {
 public:
  // `trainers` must outlive this object.
  SpreadRollout(train::Trainer& trainer, comm::Communicator& trainers, const rollout::RolloutSection& cfg,
                uint64_t seed);
  std::vector<rollout::RequestResult> generate(std::vector<rollout::Request> requests, const RolloutProgress& progress,
                                               int64_t* generated_tokens) override;
  void sync(train::Trainer& trainer) override { local_.sync(trainer); }
  bool aligned() const override { return local_.aligned(); }

 private:
  LocalRollout local_;
  comm::Communicator& trainers_;
  uint64_t seed_;
  uint64_t calls_ = 0;
};

struct ServeStats {
  int64_t generate_calls = 0, requests = 0, generated_tokens = 0, syncs = 0;
  double generate_seconds = 0, sync_seconds = 0;  // time in each kind of command
  uint64_t version = 0;                           // of the last weights received
};

// A rollout rank (rank != 0 of `sync`): builds an engine on `params` (the
// model's f32 buffer, ParamLayout(config); overwritten by every weight
// broadcast) in the precision of `cfg`, then serves the trainer root's
// commands until it sends stop. lora ([lora], enabled): the trainer trains
// adapters on the frozen base, and every sync carries only the adapters.
ServeStats serve_rollout(comm::Communicator& sync, const Context& ctx, const ModelConfig& config,
                         float* params, const rollout::RolloutSection& cfg, uint64_t seed,
                         const model::LoraConfig& lora = {});

// Gives requests without a sampling seed one derived from (seed, call, index),
// so their samples do not depend on which rank's engine runs them.
void fill_missing_seeds(std::vector<rollout::Request>& requests, uint64_t seed, uint64_t call);

}  // namespace lockstep::rl
