// The GPU backend's MoE entries (moe.cu): the router, the gather of token rows
// into expert order and the weighted combine, and their backward passes, with their launch geometry
// exposed so tests can run several block shapes; the backend table uses the
// defaults. Bits are the CPU's (kernels/cpu/moe.h) whatever the geometry.
#pragma once

#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

// Router: one block routes one token at a time (tokens blockIdx.x,
// blockIdx.x + gridDim.x, ...), its threads splitting the experts.
// max_blocks == 0: one block per token.
struct MoeRouteLaunch {
  int threads = 64;
  int max_blocks = 0;
};

// Block-size and group-count limits of the router kernel (its shared arrays).
constexpr int kRouteMaxThreads = 256;
constexpr int kRouteMaxGroups = 256;

// Gather and combine: a block moves `rows_per_block` rows (gather: (token,
// slot) pairs; combine: tokens), its `threads` threads splitting the columns.
struct MoeRowsLaunch {
  int threads = 128;
  int rows_per_block = 1;
};

// kernels::moe_route / moe_gather / moe_combine on device buffers. They throw
// as the CPU entries do; moe_route also for threads outside
// [1, kRouteMaxThreads] or n_group > kRouteMaxGroups (the CPU has no such
// limit). The plan stays on the host; its row_of is copied to the device.
void moe_route(const Context& ctx, Tensor topk_idx, Tensor topk_w, Tensor scores, const Tensor& router_logits,
               const Tensor& bias, const Tensor& replay_idx, const RouterConfig& cfg,
               const MoeRouteLaunch& launch);
void moe_gather(const Context& ctx, Tensor xe, const Tensor& x, const MoeDispatch& plan,
                const MoeRowsLaunch& launch);
void moe_combine(const Context& ctx, Tensor y, const Tensor& ye, const Tensor& topk_w,
                 const MoeDispatch& plan, const MoeRowsLaunch& launch);

// The backward entries, same rules: moe_route_backward runs one block per
// token (MoeRouteLaunch, the same thread limit), moe_gather_backward moves
// `rows_per_block` tokens per block, moe_combine_backward `rows_per_block`
// gathered (token, slot) rows per block.
void moe_route_backward(const Context& ctx, Tensor dlogits, const Tensor& dtopk_w, const Tensor& scores,
                        const Tensor& topk_idx, const RouterConfig& cfg, const MoeRouteLaunch& launch);
void moe_gather_backward(const Context& ctx, Tensor dx, const Tensor& dxe, const MoeDispatch& plan,
                         const MoeRowsLaunch& launch);
void moe_combine_backward(const Context& ctx, Tensor dye, Tensor dtopk_w, const Tensor& dy, const Tensor& ye,
                          const Tensor& topk_w, const MoeDispatch& plan, const MoeRowsLaunch& launch);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
