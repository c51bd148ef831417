// Row-wise adds and the elementwise sigmoid that the model code applies
// between kernels (bias, residual and shared-expert adds, the shared-expert
// gate). Each output element depends on its own inputs only, so every result
// is batch-invariant; each entry dispatches to the GPU backend (one f32
// operation per element there too, the same bits).
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// y (T, N) += b (N) on every row: y[t, n] = y[t, n] + b[n].
void add_row_bias(const Context& ctx, Tensor y, const Tensor& b);
// out (T, N) = a + b elementwise; out may alias a or b.
void add_rows(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b);
// y (T, N) += x * s[t] (x rounded product, then the add), or y += x when s is
// empty (no data): the gated shared expert of Qwen2-MoE.
void add_scaled_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& s);
// y = sigmoid(x) elementwise (vsigmoid's bits), over the n elements of two
// contiguous f32 tensors of the same size; y may alias x.
void sigmoid_forward(const Context& ctx, Tensor y, const Tensor& x);

namespace detail {
// The shape checks the CPU and GPU entries share (same messages); each
// returns (T, N). Rows have unit column stride; the row stride is free.
struct RowsShape {
  int64_t T, N;
};
RowsShape check_add_row_bias(const Tensor& y, const Tensor& b);
RowsShape check_add_rows(const Tensor& out, const Tensor& a, const Tensor& b);
RowsShape check_add_scaled_rows(const Tensor& y, const Tensor& x, const Tensor& s);
int64_t check_sigmoid(const Tensor& y, const Tensor& x);
}  // namespace detail

}  // namespace lockstep::kernels
