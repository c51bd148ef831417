// mHC (manifold-constrained hyper-connections, DeepSeek-V4): the residual
// stream is n parallel streams X_0..X_{n-1} of width D. Around every sublayer
// a "pre" mix reduces them to the sublayer's input and a "post" mix writes
// the sublayer's output back; the final "head" mix reduces them before the
// last norm. Forward and backward, f32, per token (so a token's bits depend
// only on its own inputs: batch- and thread-invariant).
//
// Dimension letters: T tokens, n streams (hc_mult), D width, M = 2n + n*n
// mixing values per token and site, laid out [pre (n) | post (n) | comb (n*n,
// row-major: comb[a*n + c], a = source stream, c = destination stream)].
// Streams of a token are contiguous: x (T, n*D), stream i = columns [i*D, (i+1)*D).
//
// Numeric order (all f32, -ffp-contract=off, FMA only where written):
// - over D or n*D: canonical_sum_sq / canonical_dot (simd.h);
// - the GEMMs: gemm.h (one fma chain over the reduction index in order);
// - over the tiny axes (n streams, the M mixing values, a Sinkhorn row or
//   column): sequential in index order from 0; a sum uses plain adds
//   (s = s + v), a dot product an fma chain (acc = fma(a, b, acc));
// - reductions over tokens (dbase, dscale): one add per token, in token order.
// Nothing depends on the batch composition or the thread count.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

struct MhcConfig {
  int n = 4;                // hc_mult
  int sinkhorn_iters = 20;  // hc_sinkhorn_iters (>= 1)
  float eps = 1e-6f;        // hc_eps: on pre, in the Sinkhorn steps, on the head weights
  float norm_eps = 1e-6f;   // rms_norm_eps: in the RMS over the n*D values
};

// What one site's mix saves for its backward (per token t).
struct MhcMix {
  Tensor raw;   // (T, M)  m = r * (fn · x̂), before scale and base
  Tensor rstd;  // (T)     r = 1 / sqrt(mean(x̂²) + norm_eps) over the n*D values
  Tensor pre;   // (T, n)  sigmoid(scale[0] * m_i + base_i) + eps
  Tensor post;  // (T, n)  2 * sigmoid(scale[1] * m_{n+i} + base_{n+i})
  Tensor comb;  // (T, n, n) Sinkhorn of L = scale[2] * m_{2n+..} + base_{2n+..}
};

// Forward of the mixing values of one site (hc_attn or hc_ffn):
//   x̂ = x[t] (n*D values), r = rstd, m = r * (x̂ · fnᵀ) (a GEMM, then the scale),
//   pre, post as above; comb: M0 = row-softmax of L, + eps; then a column
//   normalisation (M / (column sum + eps)); then iters-1 times a row
//   normalisation then a column normalisation. All f32.
// Exactly, per token:
//   r      = 1 / sqrt(canonical_sum_sq(x̂, n*D) / (n*D) + norm_eps)
//   m_k    = r * gemm_xwt(x̂, fn)_k
//   pre_i  = sigmoid1(scale[0] * m_i + base_i) + eps
//   post_i = 2 * sigmoid1(scale[1] * m_{n+i} + base_{n+i})
//   L_k    = scale[2] * m_{2n+k} + base_{2n+k}
//   softmax of row a: mx = max_reduce(row), e_c = exp1(L_ac - mx),
//            s = e_0 + e_1 + ... (sequential), P_ac = e_c / s; M = P + eps
//   a column (row) step: s = sum over the column (row) sequential,
//            d = s + eps, M = M / d.
// fn (M, n*D), base (M), scale (3) f32. out: every field written.
void mhc_mix_forward(const Context& ctx, const MhcMix& out, const Tensor& x, const Tensor& fn,
                     const Tensor& base, const Tensor& scale, const MhcConfig& cfg);

// Backward of mhc_mix_forward given the gradients of pre, post and comb
// (dpost or dcomb may be empty Tensor()s, meaning zero). The Sinkhorn steps are
// recomputed from `saved.raw`. dx (T, n*D) accumulated (+=); dfn (M, n*D), dbase (M),
// dscale (3) accumulated (+=), in token order. Per token, with g = sigmoid1(logit)
// recomputed:
//   dlogit pre   = dpre_i * (g * (1 - g)); post = dpost_i * ((2 * g) * (1 - g))
//   Sinkhorn, steps in reverse, per line of a step with divisors d and input Y:
//     w = fma-dot(dZ, Y) / d, dY = (dZ - w) / d; "+ eps" passes through;
//     softmax: dL_c = P_c * (dP_c - fma-dot(dP, P)) per row
//   dscale terms: fma chain of dlogit_k * m_k over each group's k in order;
//   dm_k = dlogit_k * scale[group]; G_k = dm_k * r;
//   c = ((fma-dot(dm, m) * r) * r) / (n*D)
// then dbase += dlogit and dscale += the terms, token by token;
// dfn += gemm_dytx(G, x̂); dx += gemm_dyw(G, fn); dx_j = dx_j - c * x̂_j.
void mhc_mix_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                      const Tensor& dpre, const Tensor& dpost, const Tensor& dcomb, const Tensor& x,
                      const MhcMix& saved, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const MhcConfig& cfg);

// u[t] = sum over i of pre[t, i] * X_i[t]   (u (T, D); fma chain over i = 0..n-1 from 0)
void mhc_pre_apply(const Context& ctx, Tensor u, const Tensor& x, const Tensor& pre, int n);
// dx (T, n*D) accumulated: dX_i = fma(pre_i, du, dX_i) for i in order; dpre (T, n)
// written: canonical_dot(du, X_i). u (forward) and dx must not alias x, du.
void mhc_pre_apply_backward(const Context& ctx, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                            const Tensor& pre, int n);

// y_c[t] = post[t, c] * f[t] + sum over a of comb[t, a, c] * X_a[t]  (note the
// transpose: a is the source stream). y (T, n*D) must not alias x.
// Per element: acc = post_c * f, then acc = fma(comb[a][c], X_a, acc) for a = 0..n-1.
void mhc_post(const Context& ctx, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post,
              const Tensor& comb, int n);
// Gradients of mhc_post, all written: dx (T, n*D): dX_a = sum_c comb[a][c] * dY_c;
// df (T, D) = sum_c post_c * dY_c (both fma chains over c = 0..n-1 from 0);
// dpost (T, n) = canonical_dot(dY_c, f); dcomb (T, n, n) = canonical_dot(dY_c, X_a).
// dx may alias dy (the in-place residual gradient); nothing else may alias.
void mhc_post_backward(const Context& ctx, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb, const Tensor& dy,
                       const Tensor& f, const Tensor& x, const Tensor& post, const Tensor& comb, int n);

// The head mix (hc_head before the final norm): m = r * (x̂ · fnᵀ) with fn (n, n*D),
// w_i = sigmoid(scale[0] * m_i + base_i) + eps, h = sum_i w_i X_i.
// r and m as in mhc_mix_forward; h is the fma chain of mhc_pre_apply with w.
// base (n), scale (1). h (T, D) written; w (T, n), raw (T, n), rstd (T) saved
// for the backward.
void mhc_head_forward(const Context& ctx, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                      const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg);
// dx accumulated (+=); dfn (n, n*D), dbase (n), dscale (1) accumulated in token order.
// First dX_i = fma(w_i, dh, dX_i) and dw_i = canonical_dot(dh, X_i); then
// dlogit_i = dw_i * (g * (1 - g)) and the rest as in mhc_mix_backward.
void mhc_head_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                       const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& raw,
                       const Tensor& rstd, const Tensor& fn, const Tensor& base, const Tensor& scale,
                       const MhcConfig& cfg);

namespace detail {
// The argument checks of the entries above, shared with the GPU backend so
// both raise the same errors. Each returns the token count T and, where the
// entry has one, the stream width D.
struct MhcShape {
  int64_t T, D;
};
MhcShape check_mhc_mix_forward(const MhcMix& out, const Tensor& x, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, const MhcConfig& cfg);
MhcShape check_mhc_mix_backward(const Tensor& dx, const Tensor& dfn, const Tensor& dbase,
                                const Tensor& dscale, const Tensor& dpre, const Tensor& dpost,
                                const Tensor& dcomb, const Tensor& x, const MhcMix& saved, const Tensor& fn,
                                const Tensor& base, const Tensor& scale, const MhcConfig& cfg);
MhcShape check_mhc_pre_apply(const Tensor& u, const Tensor& x, const Tensor& pre, int n);
MhcShape check_mhc_pre_apply_backward(const Tensor& dx, const Tensor& dpre, const Tensor& du, const Tensor& x,
                                      const Tensor& pre, int n);
MhcShape check_mhc_post(const Tensor& y, const Tensor& f, const Tensor& x, const Tensor& post,
                        const Tensor& comb, int n);
MhcShape check_mhc_post_backward(const Tensor& dx, const Tensor& df, const Tensor& dpost, const Tensor& dcomb,
                                 const Tensor& dy, const Tensor& f, const Tensor& x, const Tensor& post,
                                 const Tensor& comb, int n);
MhcShape check_mhc_head_forward(const Tensor& h, const Tensor& w, const Tensor& raw, const Tensor& rstd,
                                const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                                const MhcConfig& cfg);
MhcShape check_mhc_head_backward(const Tensor& dx, const Tensor& dfn, const Tensor& dbase,
                                 const Tensor& dscale, const Tensor& dh, const Tensor& x, const Tensor& w,
                                 const Tensor& raw, const Tensor& rstd, const Tensor& fn, const Tensor& base,
                                 const Tensor& scale, const MhcConfig& cfg);
// Floats of one token's Sinkhorn tape: the softmax, then per normalisation
// step its input (n*n) and divisors (n).
int64_t mhc_tape_floats(int64_t n, int iters);
}  // namespace detail

}  // namespace lockstep::kernels
