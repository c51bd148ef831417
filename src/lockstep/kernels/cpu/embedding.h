// Token embedding lookup and its backward (scatter-add into the table).
// Both are exact copies/adds per element, so the rollout engine and the trainer
// get the same bits; the backward adds tokens in token order for every column.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// out[t, :] = table[ids[t], :].
//   out   (T, D) f32, rows may be strided (stride[0] >= D)
//   table (V, D) f32, rows may be strided
//   ids   (T,)   i32, contiguous
// Every id is checked before anything is written: an id outside [0, V) throws
// Error naming the id, its position t and V.
void embedding_forward(const Context& ctx, Tensor out, const Tensor& table, const Tensor& ids);

// dtable[ids[t], :] += dout[t, :] for t = 0..T-1 in that order (a parameter
// gradient: it accumulates). Threads split the D columns, never the tokens, so
// a row hit by several tokens gets its adds in token order whatever the thread
// count. Ids are validated as in embedding_forward, before any write.
//   dtable (V, D) f32, rows may be strided
//   dout   (T, D) f32, rows may be strided
//   ids    (T,)   i32, contiguous
void embedding_backward(const Context& ctx, Tensor dtable, const Tensor& dout, const Tensor& ids);

// The argument checks of the two entries (every id included), throwing Error
// with the entry's message; the GPU backend runs the same ones.
void check_embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids);
void check_embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids);

}  // namespace lockstep::kernels
