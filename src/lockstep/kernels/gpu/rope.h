// The GPU rotate-half RoPE entries (rope.cu, table forms of kernels/cpu/rope.h)
// with their launch geometry, for tests that run several; the backend table
// holds the default-geometry forms.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/rope.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct RopeLaunch {
  int threads = 256;   // per block, one (token, head, pair) each
  int max_blocks = 0;  // 0: one pass over the pairs; else a grid-stride loop over at most this many blocks
};

void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                  const RopeLaunch& cfg);
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, const RopeTable& table,
                   const RopeLaunch& cfg);

// The backend table's entries: the calls above with RopeLaunch{}.
// DeepSeek-V4's interleaved pairs (kernels::rope_interleaved_forward / _inverse).
void rope_interleaved_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                              const RopeLaunch& cfg);
void rope_interleaved_inverse(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                              const RopeLaunch& cfg);
void rope_interleaved_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table);
void rope_interleaved_inverse(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table);

void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table);
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, const RopeTable& table);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
