// DeepSeek-V4's attention core: each query attends to an explicit list of
// candidate rows of a key=value store (its sliding window and the compressed
// entries it may see), with a per-head "sink" logit that joins only the
// softmax denominator. Forward and the training backward, f32.
//
// Dimension letters: T query tokens, H heads, Dh head width (K = V = Dh),
// N store rows, C candidate columns per query.
//
// Numerics (per token t and head h, candidates j in column order, -1 skipped):
//   z_j = canonical_dot(q[t,h], kv[j], Dh) * scale
//   m   = max(sink[h], max_j z_j)
//   e_j = exp1(z_j - m);  l = canonical_sum(e over the valid columns, in order) + exp1(sink[h] - m)
//   p_j = e_j / l
//   out[t,h,d] = fma chain over the valid columns in order: acc = fma(p_j, kv[j][d], acc), from 0
//   lse[t,h] = m + log1(l)
// So a query's output is a pure function of its q row, its candidate rows in
// their order, the sink and the scale: decode, chunked prefill and the
// trainer give the same bits when they list the same candidates.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// q (T, H, Dh) f32 (unit last stride); store (N, Dh) f32 contiguous; cand (T, C) i32,
// each entry a row of store or -1; sink (H) f32; out (T, H, Dh) written;
// lse (T, H) written, or Tensor() to skip. A candidate outside [-1, N) throws.
void sparse_attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q, const Tensor& store,
                              const Tensor& cand, const Tensor& sink, float scale);

// Backward, given dout (T, H, Dh) and the forward's out and lse:
//   Dt = <dout, out>; dz_j = p_j * (<dout, kv_j> - Dt)
//   dq (T, H, Dh) written: sum_j dz_j * scale * kv_j
//   dstore (N, Dh) accumulated (+=): row j gets sum over (t, h, column) of
//       dz_j * scale * q[t,h] + p_j * dout[t,h], in (t, h, column) order
//   dsink (H) accumulated: -sum over t of p_sink * Dt, in t order
// Deterministic whatever the thread count. The f32 steps, per (t, h): Dt =
// canonical_dot(dout, out); p_j = exp1(z_j - lse); ds_j = p_j * (canonical_dot(dout,
// kv_j) - Dt) * scale; dq = fma chain of ds_j * kv_j over the columns from 0;
// each reference updates its store row in place, row = fma(p_j, dout, fma(ds_j,
// q, row)), so the bits do not depend on how tokens are chunked;
// dsink[h] -= exp1(sink[h] - lse) * Dt.
void sparse_attention_backward(const Context& ctx, Tensor dq, Tensor dstore, Tensor dsink, const Tensor& dout,
                               const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                               const Tensor& cand, const Tensor& sink, float scale);

namespace detail {
// The checks the CPU and GPU entries share (same messages); cand is read
// through host_readable, so they work on device memory too.
struct SparseShape {
  int64_t T, H, Dh, N, C;
};
// want_lse: whether lse is given (the forward writes it).
SparseShape check_sparse_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                                 const Tensor& cand, const Tensor& sink, bool& want_lse);
SparseShape check_sparse_backward(const Tensor& dq, const Tensor& dstore, const Tensor& dsink,
                                  const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& q,
                                  const Tensor& store, const Tensor& cand, const Tensor& sink);
// Tokens per chunk of the backward, whose scratch holds (tokens, H, C)
// coefficients twice; both backwards bound their scratch with it (the bits
// do not depend on the chunking).
int64_t sparse_backward_chunk_tokens(const SparseShape& s);
}  // namespace detail

}  // namespace lockstep::kernels
