// Embedding lookup (row copies) and its backward on the GPU. The backward
// gives each column to one thread, which adds the tokens in token order: the
// CPU's order for every element (kernels/cpu/embedding.h), with no atomics.
#include "lockstep/kernels/gpu/embedding.h"
#include "lockstep/kernels/gpu/registry.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;

namespace {

struct EmbeddingArgs {
  int64_t T = 0, D = 0;
  const int32_t* ids = nullptr;  // (T,), every id already checked to be in [0, V)
  float* rows = nullptr;         // out (T, D) or dtable (V, D)
  int64_t rows_ld = 0;
  const float* src = nullptr;  // table (V, D) or dout (T, D)
  int64_t src_ld = 0;
  int tokens_per_block = 1;
};

// out[t, :] = table[ids[t], :] for the block's tokens; a plain copy keeps every bit.
LS_GLOBAL void embedding_forward_kernel(EmbeddingArgs g) {
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * g.tokens_per_block;
  const int64_t t1 = t0 + g.tokens_per_block < g.T ? t0 + g.tokens_per_block : g.T;
  for (int64_t t = t0; t < t1; ++t) {
    const float* from = g.src + static_cast<int64_t>(g.ids[t]) * g.src_ld;
    float* to = g.rows + t * g.rows_ld;
    for (int64_t c = threadIdx.x; c < g.D; c += blockDim.x) to[c] = from[c];
  }
}

// dtable[ids[t], c] += dout[t, c] for t = 0..T-1 in order, column c per thread.
LS_GLOBAL void embedding_backward_kernel(EmbeddingArgs g) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= g.D) return;
  for (int64_t t = 0; t < g.T; ++t) {
    float* row = g.rows + static_cast<int64_t>(g.ids[t]) * g.rows_ld;
    row[c] = ls_add(row[c], g.src[t * g.src_ld + c]);  // the CPU's row + src
  }
}

}  // namespace

void check_embedding_launch(const EmbeddingLaunch& cfg) {
  if (cfg.threads < 1 || cfg.threads > 1024 || cfg.tokens_per_block < 1)
    LS_THROW << "embedding (gpu): launch of " << cfg.threads << " threads and " << cfg.tokens_per_block
             << " tokens per block; need 1..1024 threads and at least one token";
}

void embedding_forward(const Context& ctx, Tensor out, const Tensor& table, const Tensor& ids,
                       const EmbeddingLaunch& cfg) {
  check_embedding_forward(out, table, ids);
  check_embedding_launch(cfg);
  EmbeddingArgs g;
  g.T = out.shape[0];
  g.D = table.shape[1];
  if (g.T == 0 || g.D == 0) return;
  g.ids = static_cast<const int32_t*>(ids.data);
  g.rows = static_cast<float*>(out.data);
  g.rows_ld = out.stride[0];
  g.src = static_cast<const float*>(table.data);
  g.src_ld = table.stride[0];
  g.tokens_per_block = cfg.tokens_per_block;
  LS_LAUNCH(ctx, embedding_forward_kernel, dim3(blocks_for(g.T, cfg.tokens_per_block)),
            dim3(static_cast<unsigned>(cfg.threads)))
  (g);
}

void embedding_backward(const Context& ctx, Tensor dtable, const Tensor& dout, const Tensor& ids,
                        const EmbeddingLaunch& cfg) {
  check_embedding_backward(dtable, dout, ids);
  check_embedding_launch(cfg);
  EmbeddingArgs g;
  g.T = dout.shape[0];
  g.D = dtable.shape[1];
  if (g.T == 0 || g.D == 0) return;
  g.ids = static_cast<const int32_t*>(ids.data);
  g.rows = static_cast<float*>(dtable.data);
  g.rows_ld = dtable.stride[0];
  g.src = static_cast<const float*>(dout.data);
  g.src_ld = dout.stride[0];
  LS_LAUNCH(ctx, embedding_backward_kernel, dim3(blocks_for(g.D, cfg.threads)),
            dim3(static_cast<unsigned>(cfg.threads)))
  (g);
}

void register_embedding(GpuBackend& b) {
  b.embedding_forward = [](const Context& ctx, Tensor out, const Tensor& table, const Tensor& ids) {
    embedding_forward(ctx, out, table, ids, EmbeddingLaunch{});
  };
  b.embedding_backward = [](const Context& ctx, Tensor dtable, const Tensor& dout, const Tensor& ids) {
    embedding_backward(ctx, dtable, dout, ids, EmbeddingLaunch{});
  };
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
