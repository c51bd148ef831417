// The GPU per-token logprob entries (softmax.cu, kernels/cpu/softmax.h) with
// their launch geometry, for tests that run several; the backend table holds
// the default-geometry forms.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct SoftmaxLaunch {
  // Rows per block; each row gets 16 threads, one per canonical lane, so a
  // block is (16, rows_per_block). 1..64.
  int rows_per_block = 8;
};

void token_logprob_forward(const Context& ctx, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                           const Tensor& targets, float temperature, const SoftmaxLaunch& cfg);
void token_logprob_backward(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                            const Tensor& logits, const Tensor& targets, float temperature,
                            const SoftmaxLaunch& cfg);
void token_logprob_stats(const Context& ctx, Tensor stats, const Tensor& logits, float temperature,
                         bool entropy, const SoftmaxLaunch& cfg);
void token_logprob_backward_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp,
                                 const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                 const Tensor& stats, int64_t col0, float temperature,
                                 const SoftmaxLaunch& cfg);

// The backend table's entries: the calls above with SoftmaxLaunch{}.
void token_logprob_forward(const Context& ctx, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                           const Tensor& targets, float temperature);
void token_logprob_backward(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                            const Tensor& logits, const Tensor& targets, float temperature);
void token_logprob_stats(const Context& ctx, Tensor stats, const Tensor& logits, float temperature,
                         bool entropy);
void token_logprob_backward_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp,
                                 const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                 const Tensor& stats, int64_t col0, float temperature);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
