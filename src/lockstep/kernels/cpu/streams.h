// The residual streams of DeepSeek-V4's hyper-connections (x (T, n*D): n
// streams of width D side by side per token): adding one (T, D) tensor to
// every stream, filling every stream with one, and summing them. Each output
// element depends only on its own inputs (batch- and thread-invariant); each
// entry dispatches to the GPU backend, which gives the same bits.
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// x (T, n*D) += e (T, D) on every stream: x[t, i*D + d] = x[t, i*D + d] + e[t, d].
void add_to_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n);
// x (T, n*D): n copies of e (T, D), bit for bit.
void repeat_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n);
// The backward of repeat_streams: de (T, D) = the sum over streams of dx
// (T, n*D), plain adds in stream order from the first: ((dX_0 + dX_1) + dX_2) ...
// de may alias dx's first stream.
void sum_streams(const Context& ctx, Tensor de, const Tensor& dx, int64_t n);

namespace detail {
// The checks the CPU and GPU entries share (same messages): f32 rows with
// unit column stride, the streams (T, n*D) and the single tensor (T, D), n >= 1.
struct StreamsShape {
  int64_t T, D;
};
StreamsShape check_streams(const Tensor& streams, const Tensor& one, int64_t n, const char* fn,
                           const char* streams_name, const char* one_name);
}  // namespace detail

}  // namespace lockstep::kernels
