// The GPU backend's embedding entries (embedding.cu) with their launch
// geometry exposed, so tests can run several block shapes; the backend table
// uses the defaults. Both give the CPU's bits (kernels/cpu/embedding.h).
#pragma once

#include "lockstep/kernels/cpu/embedding.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct EmbeddingLaunch {
  int threads = 128;         // threads per block (columns in flight)
  int tokens_per_block = 4;  // forward: output rows copied by one block
};

// Throws Error when `cfg` has no threads, too many, or no tokens per block.
void check_embedding_launch(const EmbeddingLaunch& cfg);

void embedding_forward(const Context& ctx, Tensor out, const Tensor& table, const Tensor& ids,
                       const EmbeddingLaunch& cfg);
void embedding_backward(const Context& ctx, Tensor dtable, const Tensor& dout, const Tensor& ids,
                        const EmbeddingLaunch& cfg);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
