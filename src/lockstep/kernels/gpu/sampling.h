// The GPU sampling entry (sampling.cu, kernels/cpu/sampling.h) with its launch
// geometry, for tests that run several; the backend table holds the
// default-geometry form.
#pragma once

#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/sampling.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct SampleLaunch {
  // Threads per block (one block per draw): a power of two in [1, 1024]. They
  // share the row's scans, the sort and the chunk sums; the result does not
  // depend on it.
  int threads = 256;
  // Tests only: (R) random numbers to use instead of each draw's Philox
  // number (empty: Philox, as the backend table's entry always does).
  std::vector<double> draws;
};

void sample_rows(const Context& ctx, Tensor tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows,
                 const SampleLaunch& cfg);

// The backend table's entry: the call above with SampleLaunch{}.
void sample_rows(const Context& ctx, Tensor tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
