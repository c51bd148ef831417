// The GPU row-wise adds, the sigmoid (rows.cu, kernels/cpu/rows.h) and the
// fp8 activation quantizer (fp8_quant.cu, kernels/cpu/fp8_quant.h) with their
// launch geometry, for tests that run several; the backend table holds the
// default-geometry forms.
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct RowsLaunch {
  int threads = 256;   // per block, one element (one fp8 group for the quantizer) each
  int max_blocks = 0;  // 0: one pass; else a grid-stride loop over at most this many blocks
};

void add_row_bias(const Context& ctx, Tensor y, const Tensor& b, const RowsLaunch& cfg);
void add_rows(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b, const RowsLaunch& cfg);
void add_scaled_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& s, const RowsLaunch& cfg);
void sigmoid_forward(const Context& ctx, Tensor y, const Tensor& x, const RowsLaunch& cfg);
void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group, const RowsLaunch& cfg);

// The backend table's entries: the calls above with RowsLaunch{}.
void add_row_bias(const Context& ctx, Tensor y, const Tensor& b);
void add_rows(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b);
void add_scaled_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& s);
void sigmoid_forward(const Context& ctx, Tensor y, const Tensor& x);
void fp8_quantize_rows(const Context& ctx, Tensor x, int64_t group);

// The launch checks and grid size the two sources share.
void check_rows_launch(const RowsLaunch& cfg);
unsigned rows_grid(int64_t n, const RowsLaunch& cfg);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
