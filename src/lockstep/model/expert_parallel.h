// Expert parallelism (EP) of the MoE layers (docs/distributed.md, "Expert
// parallelism"): the routed experts of every MoE layer are cut into equal
// contiguous shards, one per rank of an EP group, and a rank runs only its
// own shard's experts. In each MoE layer a rank routes its own tokens as
// usual, sends every gathered (token, slot) row to the rank owning its expert
// (all-to-all), runs its experts on the rows it received from every rank, and
// sends the outputs back (all-to-all again), where moe_combine sums them in
// slot order as without EP. Backward sends the output gradients the same way
// and the input gradients back.
//
// Why the logprobs keep their bits: an expert's GEMMs compute each output row
// as one FMA chain over the reduction dimension, whatever other rows share
// the call (docs/architecture.md section 4), so a row's expert output does not depend on
// which rank computed it or next to which rows; combine then runs on the
// token's own rank in slot order. Only the experts' weight gradients change
// order: the owner sums over the rows of every rank of its group in one chain,
// where EP = 1 sums each rank's rows and then adds the ranks' partials.
//
// The model does not depend on MPI: ExpertComm is the transport an EP group
// needs, implemented over MPI by parallel::make_expert_comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::model {

class ExpertComm {
 public:
  virtual ~ExpertComm() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // send_bytes[q] bytes to rank q, recv_bytes[q] from it; blocks contiguous
  // in rank order on both sides.
  virtual void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                            const std::vector<size_t>& recv_bytes) = 0;
  // The largest x over the group's ranks.
  virtual int64_t max(int64_t x) = 0;
  // The sum of x over the group's ranks, in rank order (the same on every rank).
  virtual double sum(double x) = 0;
  // out (size() * bytes) = every rank's `bytes` of `in`, in rank order; `in`
  // must not overlap `out`.
  virtual void all_gather(const void* in, size_t bytes, void* out) = 0;
  // The same, received by rank `root` only (out is ignored elsewhere).
  virtual void gather(const void* in, size_t bytes, void* out, int root) = 0;
};

// The experts [first, first + count) of every MoE layer that a rank holds.
struct ExpertShard {
  int64_t first = 0;
  int64_t count = -1;  // -1: all of them (no expert parallelism)

  // Shard `rank` of `size` equal contiguous shards of E experts; throws an
  // Error when size does not divide E.
  static ExpertShard of_rank(int64_t num_experts, int size, int rank);
  bool all() const { return count < 0; }
  bool contains(int64_t e) const { return all() || (e >= first && e < first + count); }
  bool operator==(const ExpertShard& o) const { return first == o.first && count == o.count; }
};

// How one MoE layer's gathered rows travel through an EP group; forward
// and backward share it. Rows sent to rank q are the plan's rows of q's
// experts (contiguous in the plan: experts are sorted); rows received here
// are reordered expert-major (expert, then source rank, then the source's
// row order), so each of this rank's experts runs on one block of rows.
struct ExpertRoute {
  std::vector<size_t> send_rows;  // (P) rows to rank q
  std::vector<size_t> recv_rows;  // (P) rows from rank q
  // The received rows, expert-major: offsets over all E experts (only this
  // rank's experts have rows), for for_each_expert. num_tokens = rows, top_k
  // = 1, row i is token i (a plan per-row kernels such as moe_scale_rows take).
  kernels::MoeDispatch local;
  std::vector<int64_t> order;  // expert-major row i is received row order[i]
  // (E, P): rows of expert e received from rank q, at by_source[e * P + q]
  // (0 for the other ranks' experts). Within expert e's block of `local`,
  // rank q's rows follow rank q-1's: an expert's weight gradient can be taken
  // per source (TrainerConfig::world_invariant).
  std::vector<int64_t> by_source;

  int64_t num_in() const { return static_cast<int64_t>(order.size()); }
  int64_t ranks() const { return static_cast<int64_t>(recv_rows.size()); }
};

// Exchanges the plan's per-expert row counts over the group (one small
// all-to-all). `shard` must be this rank's ExpertShard::of_rank.
ExpertRoute expert_route(ExpertComm& comm, const kernels::MoeDispatch& plan, const ExpertShard& shard);

// rows (plan rows, D) f32 in plan order go to their experts' owners; out
// (route.num_in(), D) receives this rank's rows expert-major. staging
// (route.num_in(), D) is scratch. In device memory (a GPU backend's) the
// rows travel through host copies, and staging is not used.
void expert_dispatch(const Context& ctx, ExpertComm& comm, const ExpertRoute& route, const Tensor& rows, Tensor out,
                     Tensor staging);

// The way back: in (route.num_in(), D) expert-major returns to the rows'
// sources; out (plan rows, D) receives this rank's rows in plan order.
void expert_return(const Context& ctx, ExpertComm& comm, const ExpertRoute& route, const Tensor& in, Tensor out,
                   Tensor staging);

}  // namespace lockstep::model
