// The GPU RMSNorm entries (rmsnorm.cu) with their launch geometry, for tests
// that run several block shapes; the backend table holds the default-geometry
// forms, which take kernels/cpu/rmsnorm.h's arguments exactly.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct RmsnormLaunch {
  // Rows per block of the row kernels; each row gets 16 threads, one per
  // canonical lane, so a block is (16, rows_per_block). 1..64.
  int rows_per_block = 8;
  // Threads per block of the dw kernel (one thread per column, tokens in order).
  int dw_threads = 256;
};

void rmsnorm_forward(const Context& ctx, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps,
                     const RmsnormLaunch& cfg);
void add_rmsnorm_forward(const Context& ctx, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x,
                         const Tensor& r, const Tensor& w, float eps, const RmsnormLaunch& cfg);
void rmsnorm_backward(const Context& ctx, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd, const RmsnormLaunch& cfg);

// The backend table's entries: the calls above with RmsnormLaunch{}.
void rmsnorm_forward(const Context& ctx, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps);
void add_rmsnorm_forward(const Context& ctx, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x,
                         const Tensor& r, const Tensor& w, float eps);
void rmsnorm_backward(const Context& ctx, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
