// Causal grouped-query attention over a paged KV cache: the cache write, the
// forward (decode, chunked prefill and the trainer are the same call) and the
// backward of the training case. Numerics contract: docs/architecture.md section 4 and below.
#pragma once

#include <cstdint>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// Dimension letters: S sequences, T new tokens (all sequences concatenated),
// H query heads, Hkv kv heads (H % Hkv == 0; head h reads kv head h / (H / Hkv)),
// Dh head width, NB physical cache blocks, BS positions per block.
//
// The numerics contract. The output for a query at absolute position p is a
// pure function of (its q row, the keys and values at positions 0..p, scale):
//   keys are visited in position order in key blocks of kKeyBlock positions
//   aligned to absolute position: block j covers [j*kKeyBlock, (j+1)*kKeyBlock)
//   intersected with [0, p]. For each block, with n its key count:
//     s_i   = canonical_dot(q, k_i, Dh) * scale                 (i in the block)
//     m_new = first block ? max_i s_i : max(m, max_i s_i)
//     e_i   = vexp(s_i - m_new);  alpha = vexp(m - m_new)      (not for the first block)
//     l     = first block ? canonical_sum(e, n) : l * alpha + canonical_sum(e, n)
//     acc_d = first block ? 0 : acc_d * alpha;  then acc_d = fma(e_i, v_i[d], acc_d) for i in order
//     m     = m_new
//   out_d = acc_d / l;  lse = m + vlog(l).
// Nothing in this depends on how queries are chunked or batched, the cache's
// block size or block order, the cache dtype (bf16 widens exactly), or threads,
// so decode, chunked prefill and the trainer give the same bits for a position.
// 32 rather than 16: half the per-block rescale work, and a decode step still
// touches at most one partial block. Changing it changes every output's bits.
constexpr int kKeyBlock = 32;

// A ragged batch over one layer's paged cache. Sequence i has n_ctx[i] tokens
// already cached (positions [0, n_ctx[i])) and n_new[i] new query tokens at
// positions [n_ctx[i], n_ctx[i] + n_new[i]); the new tokens of all sequences are
// concatenated in sequence order into the T rows of q / k_new / out.
struct AttentionBatch {
  Tensor n_ctx;        // (S) i32
  Tensor n_new;        // (S) i32
  Tensor block_table;  // (S, max_blocks) i32: entry b holds positions [b*BS, (b+1)*BS)
  int block_size = 0;  // BS, must equal the caches' dim 1
};

// Caches: (NB, BS, Hkv, Dh), contiguous, both f32 or both bf16 (bf16 stores
// round to nearest even; loads widen exactly). Token tensors (T, *, Dh) are f32
// with contiguous rows; their row stride (stride[0]) may exceed the row width,
// so q, k_new, v_new can be column views of a fused QKV projection.
// Every shape, dtype and batch entry (counts, capacities, block indices) is
// checked before any memory is touched; a bad one throws lockstep::Error.

// Writes the new tokens' K and V rows (T, Hkv, Dh) into their cache slots
// (positions n_ctx[i] .. n_ctx[i] + n_new[i] - 1 of each sequence). Two tokens
// mapped to the same slot are an error. Run it before attention_forward.
void kv_cache_write(const Context& ctx, Tensor k_cache, Tensor v_cache, const Tensor& k_new,
                    const Tensor& v_new, const AttentionBatch& batch);

// out (T, H, Dh) = causal softmax(q k^T * scale) v per sequence, keys read from
// the cache (the new tokens' own keys included). lse (T, H) f32 receives the
// log-sum-exp of each row's scaled scores for the backward; pass Tensor() to skip.
void attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q, const Tensor& k_cache,
                       const Tensor& v_cache, const AttentionBatch& batch, float scale);

// Training case: every n_ctx must be 0 (checked), so the T new tokens are all the
// keys. Given dout (T, H, Dh) and the forward's out and lse, writes dq (T, H, Dh)
// and dk, dv (T, Hkv, Dh) for the new tokens' rows of the cache (activation
// gradients: written, not accumulated). Deterministic: each output element is
// one fixed-order sum, whatever the thread count.
void attention_backward(const Context& ctx, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const AttentionBatch& batch, float scale);

}  // namespace lockstep::kernels
