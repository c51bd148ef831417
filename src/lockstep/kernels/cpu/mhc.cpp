// mHC kernels (DeepSeek-V4 hyper-connections): a site's mixing values (RMS
// over n*D, one GEMM, sigmoid splits, Sinkhorn), the pre-mix, the post-mix
// with the transposed comb and the head mix, forward and backward. Every
// per-token value depends only on that token; the numeric orders are in mhc.h.
#include "lockstep/kernels/cpu/mhc.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

// Tokens per task: a token touches about n*D values, so batch tokens until a
// task touches roughly 16K of them.
int64_t token_grain(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}

template <typename T = float>
T* row(const Tensor& t, int64_t r) {
  return static_cast<T*>(t.data) + r * t.stride[0];
}

// ---- argument checks ------------------------------------------------------

void check_rows(const Tensor& t, const char* what) {
  if ((t.shape[1] > 1 && t.stride[1] != 1) || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

void check_mat(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {rows, cols}, what);
  check_rows(t, what);
}

void check_vec(const Tensor& t, int64_t n, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {n}, what);
  if (n > 1 && t.stride[0] != 1) LS_THROW << what << ": must be contiguous, got " << t.shape_str();
}

// (T, n, n): each token's n*n block dense and row-major.
void check_comb(const Tensor& t, int64_t T, int64_t n, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {T, n, n}, what);
  if ((n > 1 && (t.stride[2] != 1 || t.stride[1] != n)) || (T > 1 && t.stride[0] < n * n))
    LS_THROW << what << ": each token's (n, n) block must be dense row-major, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ", " << t.stride[2] << ")";
}

void check_n(int n, const char* fn) {
  if (n < 1) LS_THROW << fn << ": n (hc_mult) must be >= 1, got " << n;
}

void check_cfg(const MhcConfig& cfg, const char* fn) {
  check_n(cfg.n, fn);
  if (cfg.sinkhorn_iters < 1)
    LS_THROW << fn << ": cfg.sinkhorn_iters must be >= 1, got " << cfg.sinkhorn_iters;
}

// x (T, n*D) f32 with n*D >= 1 and a multiple of n; returns D.
int64_t check_streams(const Tensor& x, int64_t n, const char* what) {
  check_dtype(x, DType::F32, what);
  check_shape(x, {-1, -1}, what);
  check_rows(x, what);
  if (x.shape[1] < 1 || x.shape[1] % n != 0)
    LS_THROW << what << ": width must be a positive multiple of n = " << n << ", got " << x.shape_str();
  return x.shape[1] / n;
}

// Byte range of a view, for the aliasing checks.
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const Tensor& t, const char** lo, const char** hi) {
    int64_t last = 0;
    for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.stride[i];
    *lo = static_cast<const char*>(t.data);
    *hi = *lo + sz(last + 1) * dtype_size(t.dtype);
  };
  const char *alo, *ahi, *blo, *bhi;
  span(a, &alo, &ahi);
  span(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

// ---- small per-token pieces -------------------------------------------------

// fma chain over i = 0..n-1 from 0: the one dot product over the tiny axes.
float small_dot(const float* a, const float* b, int64_t n, int64_t sa = 1, int64_t sb = 1) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = std::fma(a[i * sa], b[i * sb], acc);
  return acc;
}

// Which scale a mixing value uses: 0 pre (and head), 1 post, 2 comb.
int scale_group(int64_t k, int64_t n) {
  return k < n ? 0 : (k < 2 * n ? 1 : 2);
}

float rstd_of(const float* x, int64_t width, float norm_eps) {
  return 1.0f / std::sqrt(canonical_sum_sq(x, width) / static_cast<float>(width) + norm_eps);
}

// u = sum_i w_i X_i: per element an fma chain over i from 0.
void weighted_streams(float* u, const float* x, const float* w, int64_t n, int64_t D) {
  for (int64_t d = 0; d < D; ++d) u[d] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float wi = w[i];
    const float* xi = x + i * D;
    for (int64_t d = 0; d < D; ++d) u[d] = std::fma(wi, xi[d], u[d]);
  }
}

// Backward of weighted_streams: dX_i = fma(w_i, du, dX_i); dw_i = <du, X_i>.
void weighted_streams_backward(float* dx, float* dw, const float* du, const float* x, const float* w,
                               int64_t n, int64_t D) {
  for (int64_t i = 0; i < n; ++i) {
    dw[i] = canonical_dot(du, x + i * D, D);
    const float wi = w[i];
    float* dxi = dx + i * D;
    for (int64_t d = 0; d < D; ++d) dxi[d] = std::fma(wi, du[d], dxi[d]);
  }
}

// ---- Sinkhorn ---------------------------------------------------------------
// After the softmax come 2*iters - 1 normalisations: even steps divide each
// column by (its sum + eps), odd steps each row. The tape keeps what the
// backward needs: P (n*n, the softmax before + eps), then per step k its
// input Y_k (n*n) and divisors d_k (n).

int64_t sinkhorn_steps(int iters) {
  return 2 * int64_t{iters} - 1;
}

int64_t tape_floats(int64_t n, int iters) {
  return n * n + sinkhorn_steps(iters) * (n * n + n);
}

// One line of the matrix: `len` values at stride `step` from `p`.
struct Line {
  int64_t start, step;
};
Line line_of(int64_t j, int64_t n, bool columns) {
  return columns ? Line{j, n} : Line{j * n, 1};
}

// z = y / (sum along the line + eps) for every line; y may alias z.
void normalise(const float* y, float* z, float* d, int64_t n, bool columns, float eps) {
  for (int64_t j = 0; j < n; ++j) {
    const Line l = line_of(j, n, columns);
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s = s + y[l.start + i * l.step];
    d[j] = s + eps;
    for (int64_t i = 0; i < n; ++i) z[l.start + i * l.step] = y[l.start + i * l.step] / d[j];
  }
}

// m (n, n) holds the logits L on entry and the Sinkhorn result on exit.
void sinkhorn_forward(float* m, int64_t n, int iters, float eps, float* tape) {
  for (int64_t a = 0; a < n; ++a) {
    float* r = m + a * n;
    const float mx = max_reduce(r, n);
    float s = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      r[c] = exp1(r[c] - mx);
      s = s + r[c];
    }
    for (int64_t c = 0; c < n; ++c) r[c] = r[c] / s;
  }
  const int64_t nn = n * n;
  std::memcpy(tape, m, sz(nn) * sizeof(float));
  for (int64_t i = 0; i < nn; ++i) m[i] = m[i] + eps;
  float* step = tape + nn;
  for (int64_t k = 0; k < sinkhorn_steps(iters); ++k, step += nn + n) {
    std::memcpy(step, m, sz(nn) * sizeof(float));
    normalise(m, m, step + nn, n, k % 2 == 0, eps);
  }
}

// g (n, n) holds dcomb on entry and dL on exit. For Z = Y / d along a line:
// dY = (dZ - <dZ, Y> / d) / d; "+ eps" passes the gradient through; the
// softmax: dL = P * (dP - <dP, P>).
void sinkhorn_backward(float* g, const float* tape, int64_t n, int iters) {
  const int64_t nn = n * n;
  for (int64_t k = sinkhorn_steps(iters) - 1; k >= 0; --k) {
    const float* y = tape + nn + k * (nn + n);
    const float* d = y + nn;
    for (int64_t j = 0; j < n; ++j) {
      const Line l = line_of(j, n, k % 2 == 0);
      const float w = small_dot(g + l.start, y + l.start, n, l.step, l.step) / d[j];
      for (int64_t i = 0; i < n; ++i) {
        float& gi = g[l.start + i * l.step];
        gi = (gi - w) / d[j];
      }
    }
  }
  for (int64_t a = 0; a < n; ++a) {
    float* r = g + a * n;
    const float* p = tape + a * n;
    const float dot = small_dot(r, p, n);
    for (int64_t c = 0; c < n; ++c) r[c] = p[c] * (r[c] - dot);
  }
}

// ---- the mixing values of one token -----------------------------------------

// m holds fn·x̂ on entry and r * (fn·x̂) on exit; writes the splits.
void mix_token(float* m, float r, float* pre, float* post, float* comb, const float* base, const float* scale,
               const MhcConfig& cfg, float* tape) {
  const int64_t n = cfg.n, M = 2 * n + n * n;
  for (int64_t k = 0; k < M; ++k) m[k] = r * m[k];
  for (int64_t i = 0; i < n; ++i) {
    pre[i] = sigmoid1(scale[0] * m[i] + base[i]) + cfg.eps;
    post[i] = 2.0f * sigmoid1(scale[1] * m[n + i] + base[n + i]);
  }
  for (int64_t k = 0; k < n * n; ++k) comb[k] = scale[2] * m[2 * n + k] + base[2 * n + k];
  sinkhorn_forward(comb, n, cfg.sinkhorn_iters, cfg.eps, tape);
}

// dlogit of one token's mixing values from dpre, dpost, dcomb (null = zero).
// The sigmoids and the Sinkhorn are recomputed from m with the forward's code.
void mix_token_dlogit(float* dlog, const float* m, const float* dpre, const float* dpost, const float* dcomb,
                      const float* base, const float* scale, const MhcConfig& cfg, float* tape, float* work) {
  const int64_t n = cfg.n;
  for (int64_t i = 0; i < n; ++i) {
    const float g = sigmoid1(scale[0] * m[i] + base[i]);
    dlog[i] = dpre[i] * (g * (1.0f - g));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!dpost) {
      dlog[n + i] = 0.0f;
      continue;
    }
    const float g = sigmoid1(scale[1] * m[n + i] + base[n + i]);
    dlog[n + i] = dpost[i] * ((2.0f * g) * (1.0f - g));
  }
  float* dl = dlog + 2 * n;
  if (!dcomb) {
    for (int64_t k = 0; k < n * n; ++k) dl[k] = 0.0f;
    return;
  }
  for (int64_t k = 0; k < n * n; ++k) work[k] = scale[2] * m[2 * n + k] + base[2 * n + k];
  sinkhorn_forward(work, n, cfg.sinkhorn_iters, cfg.eps, tape);
  std::memcpy(dl, dcomb, sz(n * n) * sizeof(float));
  sinkhorn_backward(dl, tape, n, cfg.sinkhorn_iters);
}

// What the per-token phase of a mixing backward leaves for the reductions.
struct MixGrads {
  OwnedTensor dlog;  // (T, K) dlogit
  OwnedTensor g;     // (T, K) dm * r, the GEMM operand
  OwnedTensor ds;    // (T, 3) per-token dscale terms
  OwnedTensor c;     // (T)    the rstd term's coefficient
};

// From one token's dlogit: g = dm * r with dm = dlogit * scale[group], the
// dscale terms (fma chain over each group's values in index order) and
// c = ((<dm, m> * r) * r) / (n*D), <dm, m> an fma chain over k from 0.
void token_param_terms(const float* dlog, const float* m, float r, const float* scale, int64_t n, int64_t K,
                       int64_t width, float* g, float* ds, float* c) {
  float dm_dot_m = 0.0f;
  for (int s = 0; s < 3; ++s) ds[s] = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const int s = scale_group(k, n);
    ds[s] = std::fma(dlog[k], m[k], ds[s]);
    const float dm = dlog[k] * scale[s];
    dm_dot_m = std::fma(dm, m[k], dm_dot_m);
    g[k] = dm * r;
  }
  *c = ((dm_dot_m * r) * r) / static_cast<float>(width);
}

// The token-order reductions and GEMMs shared by the site and head backward:
// dbase += dlog, dscale += ds (token order), dfn += gᵀ x̂, dx += g fn, then
// dx -= c * x̂ per token.
void param_backward(const Context& ctx, const Tensor& dx, const Tensor& dfn, const Tensor& dbase,
                    const Tensor& dscale, const MixGrads& mg, const Tensor& x, const Tensor& fn) {
  const int64_t T = x.shape[0], width = x.shape[1], K = fn.shape[0], S = dscale.shape[0];
  float* db = dbase.f32();
  float* dsc = dscale.f32();
  for (int64_t t = 0; t < T; ++t) {
    const float* dl = mg.dlog.f32() + t * K;
    const float* ds = mg.ds.f32() + t * 3;
    for (int64_t k = 0; k < K; ++k) db[k] = db[k] + dl[k];
    for (int64_t s = 0; s < S; ++s) dsc[s] = dsc[s] + ds[s];
  }
  gemm_dytx(ctx, dfn, mg.g.view(), x, /*accumulate=*/true);
  gemm_dyw(ctx, dx, mg.g.view(), fn, /*accumulate=*/true);
  const float* cp = mg.c.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* xr = row<const float>(x, t);
          float* out = row(dx, t);
          for (int64_t j = 0; j < width; ++j) out[j] = out[j] - cp[t] * xr[j];
        }
      },
      token_grain(width));
}

void check_mix_params(const Tensor& fn, const Tensor& base, const Tensor& scale, int64_t M, int64_t width,
                      const char* fn_what, const char* base_what, const char* scale_what, int64_t n_scale) {
  check_mat(fn, M, width, fn_what);
  check_vec(base, M, base_what);
  check_vec(scale, n_scale, scale_what);
}

}  // namespace

// ---- site mixing values ---------------------------------------------------------

namespace detail {

MhcShape check_mhc_mix_forward(const MhcMix& out, const Tensor& x, const Tensor& fn, const Tensor& base,
                               const Tensor& scale, const MhcConfig& cfg) {
  check_cfg(cfg, "mhc_mix_forward");
  const int64_t n = cfg.n, M = 2 * n + n * n;
  const int64_t D = check_streams(x, n, "mhc_mix_forward: x (T, n*D)");
  const int64_t T = x.shape[0], width = x.shape[1];
  check_mix_params(fn, base, scale, M, width, "mhc_mix_forward: fn (M, n*D)", "mhc_mix_forward: base (M)",
                   "mhc_mix_forward: scale (3)", 3);
  check_mat(out.raw, T, M, "mhc_mix_forward: out.raw (T, M)");
  check_vec(out.rstd, T, "mhc_mix_forward: out.rstd (T)");
  check_mat(out.pre, T, n, "mhc_mix_forward: out.pre (T, n)");
  check_mat(out.post, T, n, "mhc_mix_forward: out.post (T, n)");
  check_comb(out.comb, T, n, "mhc_mix_forward: out.comb (T, n, n)");
  return {T, D};
}

MhcShape check_mhc_mix_backward(const Tensor& dx, const Tensor& dfn, const Tensor& dbase,
                                const Tensor& dscale, const Tensor& dpre, const Tensor& dpost,
                                const Tensor& dcomb, const Tensor& x, const MhcMix& saved, const Tensor& fn,
                                const Tensor& base, const Tensor& scale, const MhcConfig& cfg) {
  check_cfg(cfg, "mhc_mix_backward");
  const int64_t n = cfg.n, M = 2 * n + n * n;
  const int64_t D = check_streams(x, n, "mhc_mix_backward: x (T, n*D)");
  const int64_t T = x.shape[0], width = x.shape[1];
  check_mix_params(fn, base, scale, M, width, "mhc_mix_backward: fn (M, n*D)", "mhc_mix_backward: base (M)",
                   "mhc_mix_backward: scale (3)", 3);
  check_mat(dx, T, width, "mhc_mix_backward: dx (T, n*D)");
  check_mat(dfn, M, width, "mhc_mix_backward: dfn (M, n*D)");
  check_vec(dbase, M, "mhc_mix_backward: dbase (M)");
  check_vec(dscale, 3, "mhc_mix_backward: dscale (3)");
  check_mat(dpre, T, n, "mhc_mix_backward: dpre (T, n)");
  if (dpost.ndim != 0) check_mat(dpost, T, n, "mhc_mix_backward: dpost (T, n)");
  if (dcomb.ndim != 0) check_comb(dcomb, T, n, "mhc_mix_backward: dcomb (T, n, n)");
  check_mat(saved.raw, T, M, "mhc_mix_backward: saved.raw (T, M)");
  check_vec(saved.rstd, T, "mhc_mix_backward: saved.rstd (T)");
  return {T, D};
}

MhcShape check_mhc_pre_apply(const Tensor& u, const Tensor& x, const Tensor& pre, int n) {
  check_n(n, "mhc_pre_apply");
  const int64_t D = check_streams(x, n, "mhc_pre_apply: x (T, n*D)");
  const int64_t T = x.shape[0];
  check_mat(u, T, D, "mhc_pre_apply: u (T, D)");
  check_mat(pre, T, n, "mhc_pre_apply: pre (T, n)");
  if (overlaps(u, x)) LS_THROW << "mhc_pre_apply: u must not alias x";
  return {T, D};
}

MhcShape check_mhc_pre_apply_backward(const Tensor& dx, const Tensor& dpre, const Tensor& du, const Tensor& x,
                                      const Tensor& pre, int n) {
  check_n(n, "mhc_pre_apply_backward");
  const int64_t D = check_streams(x, n, "mhc_pre_apply_backward: x (T, n*D)");
  const int64_t T = x.shape[0];
  check_mat(dx, T, n * D, "mhc_pre_apply_backward: dx (T, n*D)");
  check_mat(dpre, T, n, "mhc_pre_apply_backward: dpre (T, n)");
  check_mat(du, T, D, "mhc_pre_apply_backward: du (T, D)");
  check_mat(pre, T, n, "mhc_pre_apply_backward: pre (T, n)");
  if (overlaps(dx, du)) LS_THROW << "mhc_pre_apply_backward: dx must not alias du";
  return {T, D};
}

MhcShape check_mhc_post(const Tensor& y, const Tensor& f, const Tensor& x, const Tensor& post,
                        const Tensor& comb, int n) {
  check_n(n, "mhc_post");
  const int64_t D = check_streams(x, n, "mhc_post: x (T, n*D)");
  const int64_t T = x.shape[0];
  check_mat(y, T, n * D, "mhc_post: y (T, n*D)");
  check_mat(f, T, D, "mhc_post: f (T, D)");
  check_mat(post, T, n, "mhc_post: post (T, n)");
  check_comb(comb, T, n, "mhc_post: comb (T, n, n)");
  if (overlaps(y, x)) LS_THROW << "mhc_post: y must not alias x";
  return {T, D};
}

MhcShape check_mhc_post_backward(const Tensor& dx, const Tensor& df, const Tensor& dpost, const Tensor& dcomb,
                                 const Tensor& dy, const Tensor& f, const Tensor& x, const Tensor& post,
                                 const Tensor& comb, int n) {
  check_n(n, "mhc_post_backward");
  const int64_t D = check_streams(x, n, "mhc_post_backward: x (T, n*D)");
  const int64_t T = x.shape[0];
  check_mat(dx, T, n * D, "mhc_post_backward: dx (T, n*D)");
  check_mat(df, T, D, "mhc_post_backward: df (T, D)");
  check_mat(dpost, T, n, "mhc_post_backward: dpost (T, n)");
  check_comb(dcomb, T, n, "mhc_post_backward: dcomb (T, n, n)");
  check_mat(dy, T, n * D, "mhc_post_backward: dy (T, n*D)");
  check_mat(f, T, D, "mhc_post_backward: f (T, D)");
  check_mat(post, T, n, "mhc_post_backward: post (T, n)");
  check_comb(comb, T, n, "mhc_post_backward: comb (T, n, n)");
  if (overlaps(dx, x)) LS_THROW << "mhc_post_backward: dx must not alias x";
  if (overlaps(df, dy)) LS_THROW << "mhc_post_backward: df must not alias dy";
  return {T, D};
}

MhcShape check_mhc_head_forward(const Tensor& h, const Tensor& w, const Tensor& raw, const Tensor& rstd,
                                const Tensor& x, const Tensor& fn, const Tensor& base, const Tensor& scale,
                                const MhcConfig& cfg) {
  check_n(cfg.n, "mhc_head_forward");
  const int64_t n = cfg.n;
  const int64_t D = check_streams(x, n, "mhc_head_forward: x (T, n*D)");
  const int64_t T = x.shape[0], width = x.shape[1];
  check_mix_params(fn, base, scale, n, width, "mhc_head_forward: fn (n, n*D)", "mhc_head_forward: base (n)",
                   "mhc_head_forward: scale (1)", 1);
  check_mat(h, T, D, "mhc_head_forward: h (T, D)");
  check_mat(w, T, n, "mhc_head_forward: w (T, n)");
  check_mat(raw, T, n, "mhc_head_forward: raw (T, n)");
  check_vec(rstd, T, "mhc_head_forward: rstd (T)");
  if (overlaps(h, x)) LS_THROW << "mhc_head_forward: h must not alias x";
  return {T, D};
}

MhcShape check_mhc_head_backward(const Tensor& dx, const Tensor& dfn, const Tensor& dbase,
                                 const Tensor& dscale, const Tensor& dh, const Tensor& x, const Tensor& w,
                                 const Tensor& raw, const Tensor& rstd, const Tensor& fn, const Tensor& base,
                                 const Tensor& scale, const MhcConfig& cfg) {
  check_n(cfg.n, "mhc_head_backward");
  const int64_t n = cfg.n;
  const int64_t D = check_streams(x, n, "mhc_head_backward: x (T, n*D)");
  const int64_t T = x.shape[0], width = x.shape[1];
  check_mix_params(fn, base, scale, n, width, "mhc_head_backward: fn (n, n*D)", "mhc_head_backward: base (n)",
                   "mhc_head_backward: scale (1)", 1);
  check_mat(dx, T, width, "mhc_head_backward: dx (T, n*D)");
  check_mat(dfn, n, width, "mhc_head_backward: dfn (n, n*D)");
  check_vec(dbase, n, "mhc_head_backward: dbase (n)");
  check_vec(dscale, 1, "mhc_head_backward: dscale (1)");
  check_mat(dh, T, D, "mhc_head_backward: dh (T, D)");
  check_mat(w, T, n, "mhc_head_backward: w (T, n)");
  check_mat(raw, T, n, "mhc_head_backward: raw (T, n)");
  check_vec(rstd, T, "mhc_head_backward: rstd (T)");
  if (overlaps(dx, dh)) LS_THROW << "mhc_head_backward: dx must not alias dh";
  return {T, D};
}

int64_t mhc_tape_floats(int64_t n, int iters) {
  return tape_floats(n, iters);
}

}  // namespace detail

void mhc_mix_forward(const Context& ctx, const MhcMix& out, const Tensor& x, const Tensor& fn,
                     const Tensor& base, const Tensor& scale, const MhcConfig& cfg) {
  LS_GPU_DISPATCH(ctx, mhc_mix_forward, out, x, fn, base, scale, cfg);
  detail::check_mhc_mix_forward(out, x, fn, base, scale, cfg);
  const int64_t n = cfg.n;
  const int64_t T = x.shape[0], width = x.shape[1];

  gemm_xwt(ctx, out.raw, x, fn);  // fn·x̂ per token; r is applied after
  const float* bp = base.f32();
  const float* sp = scale.f32();
  float* rp = out.rstd.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> tape(sz(tape_floats(n, cfg.sinkhorn_iters)));  // Sinkhorn intermediates of a token
        for (int64_t t = t0; t < t1; ++t) {
          rp[t] = rstd_of(row<const float>(x, t), width, cfg.norm_eps);
          mix_token(row(out.raw, t), rp[t], row(out.pre, t), row(out.post, t), row(out.comb, t), bp, sp, cfg,
                    tape.data());
        }
      },
      token_grain(width));
}

void mhc_mix_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                      const Tensor& dpre, const Tensor& dpost, const Tensor& dcomb, const Tensor& x,
                      const MhcMix& saved, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const MhcConfig& cfg) {
  LS_GPU_DISPATCH(ctx, mhc_mix_backward, dx, dfn, dbase, dscale, dpre, dpost, dcomb, x, saved, fn, base,
                  scale, cfg);
  detail::check_mhc_mix_backward(dx, dfn, dbase, dscale, dpre, dpost, dcomb, x, saved, fn, base, scale, cfg);
  const int64_t n = cfg.n, M = 2 * n + n * n;
  const int64_t T = x.shape[0], width = x.shape[1];
  const bool has_post = dpost.ndim != 0, has_comb = dcomb.ndim != 0;

  MixGrads mg{OwnedTensor(DType::F32, {T, M}), OwnedTensor(DType::F32, {T, M}),
              OwnedTensor(DType::F32, {T, 3}), OwnedTensor(DType::F32, {T})};
  const float* bp = base.f32();
  const float* sp = scale.f32();
  const float* rp = saved.rstd.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> tape(sz(tape_floats(n, cfg.sinkhorn_iters)));  // recomputed Sinkhorn steps
        std::vector<float> work(sz(n * n));                               // (n, n) recomputed comb
        for (int64_t t = t0; t < t1; ++t) {
          const float* m = row<const float>(saved.raw, t);
          float* dl = mg.dlog.f32() + t * M;
          mix_token_dlogit(dl, m, row<const float>(dpre, t), has_post ? row<const float>(dpost, t) : nullptr,
                           has_comb ? row<const float>(dcomb, t) : nullptr, bp, sp, cfg, tape.data(),
                           work.data());
          token_param_terms(dl, m, rp[t], sp, n, M, width, mg.g.f32() + t * M, mg.ds.f32() + t * 3,
                            mg.c.f32() + t);
        }
      },
      token_grain(width));
  param_backward(ctx, dx, dfn, dbase, dscale, mg, x, fn);
}

// ---- pre-mix --------------------------------------------------------------------

void mhc_pre_apply(const Context& ctx, Tensor u, const Tensor& x, const Tensor& pre, int n) {
  LS_GPU_DISPATCH(ctx, mhc_pre_apply, u, x, pre, n);
  const auto [T, D] = detail::check_mhc_pre_apply(u, x, pre, n);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          weighted_streams(row(u, t), row<const float>(x, t), row<const float>(pre, t), n, D);
      },
      token_grain(n * D));
}

void mhc_pre_apply_backward(const Context& ctx, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                            const Tensor& pre, int n) {
  LS_GPU_DISPATCH(ctx, mhc_pre_apply_backward, dx, dpre, du, x, pre, n);
  const auto [T, D] = detail::check_mhc_pre_apply_backward(dx, dpre, du, x, pre, n);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          weighted_streams_backward(row(dx, t), row(dpre, t), row<const float>(du, t), row<const float>(x, t),
                                    row<const float>(pre, t), n, D);
      },
      token_grain(n * D));
}

// ---- post-mix -------------------------------------------------------------------

void mhc_post(const Context& ctx, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post,
              const Tensor& comb, int n) {
  LS_GPU_DISPATCH(ctx, mhc_post, y, f, x, post, comb, n);
  const auto [T, D] = detail::check_mhc_post(y, f, x, post, comb, n);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* xr = row<const float>(x, t);
          const float* fr = row<const float>(f, t);
          const float* pr = row<const float>(post, t);
          const float* cm = row<const float>(comb, t);
          float* yr = row(y, t);
          for (int64_t c = 0; c < n; ++c) {
            float* yc = yr + c * D;
            for (int64_t d = 0; d < D; ++d) yc[d] = pr[c] * fr[d];
            for (int64_t a = 0; a < n; ++a) {
              const float w = cm[a * n + c];  // source a feeds destination c: comb transposed
              const float* xa = xr + a * D;
              for (int64_t d = 0; d < D; ++d) yc[d] = std::fma(w, xa[d], yc[d]);
            }
          }
        }
      },
      token_grain(n * D));
}

void mhc_post_backward(const Context& ctx, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb, const Tensor& dy,
                       const Tensor& f, const Tensor& x, const Tensor& post, const Tensor& comb, int n) {
  LS_GPU_DISPATCH(ctx, mhc_post_backward, dx, df, dpost, dcomb, dy, f, x, post, comb, n);
  const auto [T, D] = detail::check_mhc_post_backward(dx, df, dpost, dcomb, dy, f, x, post, comb, n);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> dxs(sz(n * D));  // (n*D) the token's dx, so dx may alias dy
        for (int64_t t = t0; t < t1; ++t) {
          const float* g = row<const float>(dy, t);
          const float* xr = row<const float>(x, t);
          const float* fr = row<const float>(f, t);
          const float* pr = row<const float>(post, t);
          const float* cm = row<const float>(comb, t);
          float* dcm = row(dcomb, t);
          for (int64_t c = 0; c < n; ++c) {
            row(dpost, t)[c] = canonical_dot(g + c * D, fr, D);
            for (int64_t a = 0; a < n; ++a) dcm[a * n + c] = canonical_dot(g + c * D, xr + a * D, D);
          }
          weighted_streams(row(df, t), g, pr, n, D);
          for (int64_t a = 0; a < n; ++a) {
            float* da = dxs.data() + a * D;
            for (int64_t d = 0; d < D; ++d) da[d] = 0.0f;
            for (int64_t c = 0; c < n; ++c) {
              const float w = cm[a * n + c];
              const float* gc = g + c * D;
              for (int64_t d = 0; d < D; ++d) da[d] = std::fma(w, gc[d], da[d]);
            }
          }
          std::memcpy(row(dx, t), dxs.data(), sz(n * D) * sizeof(float));
        }
      },
      token_grain(n * D));
}

// ---- head mix -------------------------------------------------------------------

void mhc_head_forward(const Context& ctx, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                      const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg) {
  LS_GPU_DISPATCH(ctx, mhc_head_forward, h, w, raw, rstd, x, fn, base, scale, cfg);
  const auto [T, D] = detail::check_mhc_head_forward(h, w, raw, rstd, x, fn, base, scale, cfg);
  const int64_t n = cfg.n, width = x.shape[1];

  gemm_xwt(ctx, raw, x, fn);
  const float* bp = base.f32();
  const float s0 = scale.f32()[0];
  float* rp = rstd.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* xr = row<const float>(x, t);
          float* m = row(raw, t);
          float* wr = row(w, t);
          rp[t] = rstd_of(xr, width, cfg.norm_eps);
          for (int64_t i = 0; i < n; ++i) {
            m[i] = rp[t] * m[i];
            wr[i] = sigmoid1(s0 * m[i] + bp[i]) + cfg.eps;
          }
          weighted_streams(row(h, t), xr, wr, n, D);
        }
      },
      token_grain(width));
}

void mhc_head_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                       const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& raw,
                       const Tensor& rstd, const Tensor& fn, const Tensor& base, const Tensor& scale,
                       const MhcConfig& cfg) {
  LS_GPU_DISPATCH(ctx, mhc_head_backward, dx, dfn, dbase, dscale, dh, x, w, raw, rstd, fn, base, scale, cfg);
  const auto [T, D] =
      detail::check_mhc_head_backward(dx, dfn, dbase, dscale, dh, x, w, raw, rstd, fn, base, scale, cfg);
  const int64_t n = cfg.n, width = x.shape[1];

  MixGrads mg{OwnedTensor(DType::F32, {T, n}), OwnedTensor(DType::F32, {T, n}),
              OwnedTensor(DType::F32, {T, 3}), OwnedTensor(DType::F32, {T})};
  const float* bp = base.f32();
  const float* sp = scale.f32();
  const float* rp = rstd.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* m = row<const float>(raw, t);
          float* dl = mg.dlog.f32() + t * n;
          // dw first lands in dl, then becomes dlogit in place.
          weighted_streams_backward(row(dx, t), dl, row<const float>(dh, t), row<const float>(x, t),
                                    row<const float>(w, t), n, D);
          for (int64_t i = 0; i < n; ++i) {
            const float g = sigmoid1(sp[0] * m[i] + bp[i]);
            dl[i] = dl[i] * (g * (1.0f - g));
          }
          token_param_terms(dl, m, rp[t], sp, n, n, width, mg.g.f32() + t * n, mg.ds.f32() + t * 3,
                            mg.c.f32() + t);
        }
      },
      token_grain(width));
  param_backward(ctx, dx, dfn, dbase, dscale, mg, x, fn);
}

}  // namespace lockstep::kernels
