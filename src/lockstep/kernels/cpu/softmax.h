// Softmax, log-softmax and per-token log-probability/entropy over rows of
// logits with a temperature. token_logprob_forward is THE logprob function:
// the rollout sampler and the trainer both call it, so their logprobs agree
// bit for bit (docs/architecture.md section 4).
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// Numerics, shared by every function below. For one row of V logits:
//   z_i   = logits_i / temperature                 (one IEEE f32 division; exact when temperature == 1)
//   m     = max_reduce(z)
//   d_i   = max(z_i - m, -128)                      (f32 exp underflows to 0 below -104, so the clamp
//                                                    changes no e_i; it keeps d_i finite for -inf logits)
//   e_i   = vexp(d_i)                               (in [0, 1])
//   s     = canonical_sum(e)                        (>= 1: the max element contributes exp(0) = 1)
//   ls    = log1(s)
//   p_i   = e_i / s
//   logp_i = (z_i - m) - ls                         (z_i - m unclamped: a -inf logit gives -inf)
//   H     = ls - canonical_dot(e, d) / s            (= -sum p log p; both terms >= 0, so H >= 0)
// Logits may hold -inf (masked entries, probability 0) but not +inf or NaN
// (NaN propagates; a row of only -inf gives NaN). A row's bits depend only on
// that row: no batch or thread-count dependence. temperature must be > 0 and
// finite. Rows of every (T, V) operand may be strided (stride[0] >= V).

// probs[t, i] = p_i of row t.  probs, logits (T, V) f32.
void softmax_forward(const Context& ctx, Tensor probs, const Tensor& logits, float temperature);

// logp[t, i] = logp_i of row t (bit-identical to token_logprob_forward's logp
// for the same target).  logp, logits (T, V) f32.
void log_softmax_forward(const Context& ctx, Tensor logp, const Tensor& logits, float temperature);

// For each row t with target y = targets[t]:
//   logp[t]    = (z_y - m) - ls
//   entropy[t] = H                  (skipped when entropy is an empty Tensor())
//   lse[t]     = m + ls             (log-sum-exp of z = logits / temperature; skipped when empty)
// logp, entropy, lse (T,) f32 contiguous; logits (T, V) f32; targets (T,) i32
// contiguous, each in [0, V) (else Error naming the row, id and V, before any write).
void token_logprob_forward(const Context& ctx, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                           const Tensor& targets, float temperature);

// Gradient with respect to the logits of  sum_t dlogp[t] * logp[t] + dentropy[t] * entropy[t],
// written (=) to dlogits (T, V). Everything is recomputed from the logits
// (nothing saved), with p_j, logp_j (clamped d_j) and H as above:
//   g_j           = -(p_j * (dlogp[t] + dentropy[t] * (logp_j + H)))
//   g_y           = g_y + dlogp[t]
//   dlogits[t, j] = g_j / temperature
// dlogp and dentropy (T,) f32 contiguous; either may be an empty Tensor(),
// meaning zero. dlogits may alias logits (in place, to save a (T, V) buffer).
void token_logprob_backward(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                            const Tensor& logits, const Tensor& targets, float temperature);

// Column blocks of token_logprob_backward, for a caller that never holds a
// whole (T, V) row (the trainer's chunked LM head). Per row t, the row pass's
// statistics of the full row of V logits:
//   stats[t] = (m, s, ls, H)        (T, 4) f32 contiguous; H only with `entropy`, else 0
void token_logprob_stats(const Context& ctx, Tensor stats, const Tensor& logits, float temperature,
                         bool entropy);
// Columns [col0, col0 + W) of token_logprob_backward's dlogits from the same
// columns of the logits (T, W) and the full rows' stats: every element is
// computed from its own logit and its row's (m, s, ls, H), as the full-row
// kernel computes it, so the bits are the same. stats must hold H when
// dentropy is given. dlogits may alias logits.
void token_logprob_backward_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp,
                                 const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                 const Tensor& stats, int64_t col0, float temperature);

namespace detail {
// The argument checks of token_logprob_forward / _backward (shapes, strides,
// temperature, target ids), shared with the GPU backend so both raise the
// same errors. Each returns (T, V).
struct LogitsShape {
  int64_t T, V;
};
LogitsShape check_token_logprob_forward(const Tensor& logp, const Tensor& entropy, const Tensor& lse,
                                        const Tensor& logits, const Tensor& targets, float temperature);
LogitsShape check_token_logprob_backward(const Tensor& dlogits, const Tensor& dlogp, const Tensor& dentropy,
                                         const Tensor& logits, const Tensor& targets, float temperature);
// The chunked head's pair; the second returns (T, W).
LogitsShape check_token_logprob_stats(const Tensor& stats, const Tensor& logits, float temperature);
LogitsShape check_token_logprob_backward_cols(const Tensor& dlogits, const Tensor& dlogp,
                                              const Tensor& dentropy, const Tensor& logits,
                                              const Tensor& targets, const Tensor& stats, int64_t col0,
                                              float temperature);
}  // namespace detail

}  // namespace lockstep::kernels
