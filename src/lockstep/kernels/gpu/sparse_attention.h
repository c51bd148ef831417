// The GPU entries of DeepSeek-V4's sparse attention with a sink
// (kernels/cpu/sparse_attention.h), with the launch geometry as a parameter
// so tests can run several block shapes. Same arguments, errors and bits as
// the CPU kernels; every tensor is device memory (cand is copied out for the
// range checks and the backward's per-row reference lists).
#pragma once

#include "lockstep/kernels/cpu/sparse_attention.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct SparseAttentionLaunch {
  // One block per token (forward, and the backward's dq pass) or per store
  // row (the backward's dstore pass); threads split the candidates for the
  // dot products and the head width for the fma chains, so any count in
  // [1, 1024] gives the same bits.
  int threads = 64;
  // 0: one pass (up to 2048 blocks for the kernels with a scratch row per
  // block); else a grid-stride loop over at most this many blocks.
  int max_blocks = 0;
};

void sparse_attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q,
                              const Tensor& store, const Tensor& cand, const Tensor& sink, float scale,
                              const SparseAttentionLaunch& cfg);
void sparse_attention_backward(const Context& ctx, Tensor dq, Tensor dstore, Tensor dsink, const Tensor& dout,
                               const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                               const Tensor& cand, const Tensor& sink, float scale,
                               const SparseAttentionLaunch& cfg);

// The backend table's entries: the calls above with SparseAttentionLaunch{}.
void sparse_attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q,
                              const Tensor& store, const Tensor& cand, const Tensor& sink, float scale);
void sparse_attention_backward(const Context& ctx, Tensor dq, Tensor dstore, Tensor dsink, const Tensor& dout,
                               const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                               const Tensor& cand, const Tensor& sink, float scale);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
