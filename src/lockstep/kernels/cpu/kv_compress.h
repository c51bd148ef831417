// DeepSeek-V4's KV compression: a compressor turns every block of c tokens
// into one compressed entry (HCA, c = 128: the block's own tokens; CSA, c = 4:
// overlapping windows of 2c tokens), and the lightning indexer scores the
// compressed entries a query may see and keeps the best top-k. Forward and
// backward of the compressor, forward of the indexer (its selection is a
// constant for the rest of the model), f32.
//
// Dimension letters: c ratio, kappa = 2 when overlapping (c == 4) else 1,
// Dc compressed width (head_dim, or index_head_dim for the indexer's own
// compressor), P = kappa * c candidate slots of one entry, Ne entries,
// N token rows in the per-token store.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// The per-token store holds, for every token row, its compressor inputs
// [C (kappa*Dc) | Z (kappa*Dc)] (the wkv and wgate projections): (N, 2*kappa*Dc).
//
// Entry e draws from rows[e, 0..P): for HCA (kappa 1) slot p in [0, c) is the
// block's token p; for CSA slots [0, c) are the previous block's tokens (they
// use channels [0, Dc) of C and Z) and slots [c, 2c) the block's own tokens
// (channels [Dc, 2Dc)). A slot of -1 is masked (the previous half of a
// sequence's block 0): Z = -inf, C = 0. Slot p's score adds ape[p mod c] (the
// ape row of its in-block position, taken from the same channel half).
// Per entry and channel ch < Dc, over the valid slots in slot order:
//   z_p = Z[row_p][half_p*Dc + ch] + ape[p mod c][half_p*Dc + ch]
//   mx  = max_p z_p;  e_p = exp1(z_p - mx);  s = sum of e_p in slot order (plain adds)
//   out[e][ch] = (fma chain over slots: acc = fma(e_p, C[row_p][half_p*Dc + ch], acc), from 0) / s
// out (Ne, Dc) written. ape (c, kappa*Dc). rows (Ne, P) i32.
void compress_forward(const Context& ctx, Tensor out, const Tensor& store, const Tensor& rows, const Tensor& ape,
                      int ratio, bool overlap);

// Backward: dout (Ne, Dc) -> dstore (N, 2*kappa*Dc) accumulated (+=; each row's
// contributions in (entry, slot) order), dape (c, kappa*Dc) accumulated.
void compress_backward(const Context& ctx, Tensor dstore, Tensor dape, const Tensor& dout, const Tensor& store,
                       const Tensor& rows, const Tensor& ape, int ratio, bool overlap);

// Lightning-indexer selection for T queries. qi (T, HI, DI) (after RoPE),
// w (T, HI) head weights (already scaled), keys (N, DI) the store of indexer
// keys, cand (T, C) i32 the rows of the entries each query may see (in entry
// order, -1 padding after the valid ones).
//   score[t, j] = sum over h (in order, fma chain from 0) of w[t,h] * max(0, canonical_dot(qi[t,h], keys[cand[t,j]], DI))
// selected (T, K) i32 written: the column indices j of the min(K, valid)
// highest scores (ties: lower j), sorted ascending, -1 padding. scores (T, C)
// f32 written when non-empty (-inf for padding), for debugging.
void indexer_select(const Context& ctx, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                    const Tensor& keys, const Tensor& cand);

namespace detail {
// The checks the CPU and GPU entries share (same messages). They read the
// index tensors (rows, cand) through host_readable, so they work on device
// memory too.
struct CompressShape {
  int64_t c;      // ratio
  int64_t kappa;  // 2 when overlapping, else 1
  int64_t P;      // slots per entry, kappa * c
  int64_t Dc;     // compressed width
  int64_t N;      // store rows
  int64_t Ne;     // entries
};
CompressShape check_compress_forward(const Tensor& out, const Tensor& store, const Tensor& rows,
                                     const Tensor& ape, int ratio, bool overlap);
CompressShape check_compress_backward(const Tensor& dstore, const Tensor& dape, const Tensor& dout,
                                      const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio,
                                      bool overlap);
struct IndexerShape {
  int64_t T, HI, DI, N, C, K;
};
IndexerShape check_indexer_select(const Tensor& selected, const Tensor& scores, const Tensor& qi,
                                  const Tensor& w, const Tensor& keys, const Tensor& cand);
}  // namespace detail

}  // namespace lockstep::kernels
