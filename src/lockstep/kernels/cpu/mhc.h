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
// fn (M, n*D), base (M), scale (3) f32. out: every field written.
void mhc_mix_forward(const Context& ctx, const MhcMix& out, const Tensor& x, const Tensor& fn, const Tensor& base,
                     const Tensor& scale, const MhcConfig& cfg);

// Backward of mhc_mix_forward given the gradients of pre, post and comb
// (dpost or dcomb may be empty Tensor()s, meaning zero). The Sinkhorn steps are
// recomputed from `saved.raw`. dx (T, n*D) accumulated (+=); dfn (M, n*D), dbase (M),
// dscale (3) accumulated (+=), in token order.
void mhc_mix_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale, const Tensor& dpre,
                      const Tensor& dpost, const Tensor& dcomb, const Tensor& x, const MhcMix& saved,
                      const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg);

// u[t] = sum over i of pre[t, i] * X_i[t]   (u (T, D); fma chain over i = 0..n-1 from 0)
void mhc_pre_apply(const Context& ctx, Tensor u, const Tensor& x, const Tensor& pre, int n);
// dx (T, n*D) accumulated: dX_i += pre_i * du; dpre (T, n) written: canonical_dot(du, X_i).
void mhc_pre_apply_backward(const Context& ctx, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                            const Tensor& pre, int n);

// y_c[t] = post[t, c] * f[t] + sum over a of comb[t, a, c] * X_a[t]  (note the
// transpose: a is the source stream). y (T, n*D) must not alias x.
// Per element: acc = post_c * f, then acc = fma(comb[a][c], X_a, acc) for a = 0..n-1.
void mhc_post(const Context& ctx, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post, const Tensor& comb,
              int n);
// Gradients of mhc_post, all written: dx (T, n*D): dX_a = sum_c comb[a][c] * dY_c;
// df (T, D) = sum_c post_c * dY_c; dpost (T, n) = <dY_c, f>; dcomb (T, n, n) = <dY_c, X_a>.
void mhc_post_backward(const Context& ctx, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb, const Tensor& dy,
                       const Tensor& f, const Tensor& x, const Tensor& post, const Tensor& comb, int n);

// The head mix (hc_head before the final norm): m = r * (x̂ · fnᵀ) with fn (n, n*D),
// w_i = sigmoid(scale[0] * m_i + base_i) + eps, h = sum_i w_i X_i.
// h (T, D) written; w (T, n), raw (T, n), rstd (T) saved for the backward.
void mhc_head_forward(const Context& ctx, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                      const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg);
// dx accumulated (+=); dfn, dbase, dscale accumulated.
void mhc_head_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale, const Tensor& dh,
                       const Tensor& x, const Tensor& w, const Tensor& raw, const Tensor& rstd, const Tensor& fn,
                       const Tensor& base, const Tensor& scale, const MhcConfig& cfg);

}  // namespace lockstep::kernels
