// The GPU entries of paged-cache attention (kernels/cpu/attention.h), with the
// launch geometry as a parameter so tests can run several block shapes. Same
// arguments, errors and bits as the CPU kernels; the batch tensors (n_ctx,
// n_new, block_table) are read on the host, the caches and token tensors are
// device memory.
#pragma once

#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

// Widest head the kernels take: the block keeps q, and the output's partial
// sums, in shared memory of this many floats.
constexpr int kMaxHeadDim = 256;

struct KvWriteLaunch {
  int threads = 128;  // per block; a block writes one token's (Hkv, Dh) K and V rows
};

// One block per (token, query head) in the forward and in the dq pass of the
// backward, one per (token, kv head) in its dk/dv pass. Threads split the keys
// (or queries) of a key block for the dot products and the head width for the
// fma chains, so any count from 1 gives the same bits; 64 covers both a
// kKeyBlock of scores and a 64-wide head in one step.
struct AttentionLaunch {
  int threads = 64;
};

void kv_cache_write(const Context& ctx, Tensor k_cache, Tensor v_cache, const Tensor& k_new,
                    const Tensor& v_new, const AttentionBatch& batch, const KvWriteLaunch& launch);
void attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q, const Tensor& k_cache,
                       const Tensor& v_cache, const AttentionBatch& batch, float scale,
                       const AttentionLaunch& launch);
void attention_backward(const Context& ctx, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const AttentionBatch& batch, float scale,
                        const AttentionLaunch& launch);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
