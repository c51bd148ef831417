// GPU mHC kernels (kernels/cpu/mhc.h): the CPU's numeric orders exactly.
// Reductions over D or n*D use the canonical lanes (a group of 16 threads per
// reduction, then the fixed tree); the tiny axes (n streams, the M mixing
// values, the Sinkhorn steps) run sequentially in index order on one thread
// per token, with the CPU's operations one by one; the GEMMs are gemm.cu's;
// the token-order sums of dbase and dscale take one thread per output.
#include <algorithm>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/gemm.h"
#include "lockstep/kernels/gpu/mhc.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/row_lanes.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sqrt;
using ::lockstep::gpu::ls_sub;

constexpr int kMaxThreads = 1024;

// A (T, N) operand: base pointer and row stride (unit column stride).
struct Rows {
  float* p;
  int64_t ld;
};
struct ConstRows {
  const float* p;
  int64_t ld;
};

// ---- per-token pieces (one thread) ----------------------------------------------

// fma chain over i = 0..n-1 from 0 (the CPU's small_dot).
LS_DEVICE inline float small_dot(const float* a, const float* b, int64_t n, int64_t sa, int64_t sb) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = ls_fma(a[i * sa], b[i * sb], acc);
  return acc;
}

// max_reduce's scalar definition: a later NaN wins, else a strictly larger value.
LS_DEVICE inline float max_of(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = (x[i] > m || num::is_nan(x[i])) ? x[i] : m;
  return m;
}

LS_DEVICE inline int scale_group(int64_t k, int64_t n) {
  return k < n ? 0 : (k < 2 * n ? 1 : 2);
}

LS_DEVICE inline float rstd_of(float ss, int64_t width, float norm_eps) {
  return ls_div(1.0f, ls_sqrt(ls_add(ls_div(ss, static_cast<float>(width)), norm_eps)));
}

LS_DEVICE inline int64_t sinkhorn_steps(int iters) {
  return 2 * static_cast<int64_t>(iters) - 1;
}

// Every line of m divided by (its sum + eps); divisors into d when not null.
LS_DEVICE void normalise(float* m, float* d, int64_t n, bool columns, float eps) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t start = columns ? j : j * n, step = columns ? n : 1;
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s = ls_add(s, m[start + i * step]);
    const float dj = ls_add(s, eps);
    if (d != nullptr) d[j] = dj;
    for (int64_t i = 0; i < n; ++i) m[start + i * step] = ls_div(m[start + i * step], dj);
  }
}

// The CPU's sinkhorn_forward; the tape (its layout) is kept when not null.
LS_DEVICE void sinkhorn_forward(float* m, int64_t n, int iters, float eps, float* tape) {
  for (int64_t a = 0; a < n; ++a) {
    float* r = m + a * n;
    const float mx = max_of(r, n);
    float s = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      r[c] = num::exp(ls_sub(r[c], mx));
      s = ls_add(s, r[c]);
    }
    for (int64_t c = 0; c < n; ++c) r[c] = ls_div(r[c], s);
  }
  const int64_t nn = n * n;
  if (tape != nullptr)
    for (int64_t i = 0; i < nn; ++i) tape[i] = m[i];
  for (int64_t i = 0; i < nn; ++i) m[i] = ls_add(m[i], eps);
  for (int64_t k = 0; k < sinkhorn_steps(iters); ++k) {
    float* step = tape != nullptr ? tape + nn + k * (nn + n) : nullptr;
    if (step != nullptr)
      for (int64_t i = 0; i < nn; ++i) step[i] = m[i];
    normalise(m, step != nullptr ? step + nn : nullptr, n, k % 2 == 0, eps);
  }
}

// The CPU's sinkhorn_backward: g holds dcomb on entry, dL on exit.
LS_DEVICE void sinkhorn_backward(float* g, const float* tape, int64_t n, int iters) {
  const int64_t nn = n * n;
  for (int64_t k = sinkhorn_steps(iters) - 1; k >= 0; --k) {
    const float* y = tape + nn + k * (nn + n);
    const float* d = y + nn;
    const bool columns = k % 2 == 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t start = columns ? j : j * n, step = columns ? n : 1;
      const float w = ls_div(small_dot(g + start, y + start, n, step, step), d[j]);
      for (int64_t i = 0; i < n; ++i) g[start + i * step] = ls_div(ls_sub(g[start + i * step], w), d[j]);
    }
  }
  for (int64_t a = 0; a < n; ++a) {
    float* r = g + a * n;
    const float* p = tape + a * n;
    const float dot = small_dot(r, p, n, 1, 1);
    for (int64_t c = 0; c < n; ++c) r[c] = ls_mul(p[c], ls_sub(r[c], dot));
  }
}

// Parameters of one site's mix shared by the per-token kernels.
struct MixArgs {
  const float* base;   // (M)
  const float* scale;  // (3), or (1) for the head
  int64_t n, width;
  int iters;
  float eps, norm_eps;
};

LS_DEVICE inline float logit(const MixArgs& a, int s, const float* m, int64_t k) {
  return ls_add(ls_mul(a.scale[s], m[k]), a.base[k]);
}

// The CPU's mix_token: m holds fn·x̂ on entry and r * (fn·x̂) on exit.
LS_DEVICE void mix_token(const MixArgs& a, float* m, float r, float* pre, float* post, float* comb) {
  const int64_t n = a.n, M = 2 * n + n * n;
  for (int64_t k = 0; k < M; ++k) m[k] = ls_mul(r, m[k]);
  for (int64_t i = 0; i < n; ++i) {
    pre[i] = ls_add(num::sigmoid(logit(a, 0, m, i)), a.eps);
    post[i] = ls_mul(2.0f, num::sigmoid(logit(a, 1, m, n + i)));
  }
  for (int64_t k = 0; k < n * n; ++k) comb[k] = logit(a, 2, m, 2 * n + k);
  sinkhorn_forward(comb, n, a.iters, a.eps, nullptr);
}

// The CPU's mix_token_dlogit (dpost, dcomb null: zero). work: (n*n + tape).
LS_DEVICE void mix_token_dlogit(const MixArgs& a, float* dlog, const float* m, const float* dpre,
                                const float* dpost, const float* dcomb, float* work) {
  const int64_t n = a.n;
  for (int64_t i = 0; i < n; ++i) {
    const float g = num::sigmoid(logit(a, 0, m, i));
    dlog[i] = ls_mul(dpre[i], ls_mul(g, ls_sub(1.0f, g)));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (dpost == nullptr) {
      dlog[n + i] = 0.0f;
      continue;
    }
    const float g = num::sigmoid(logit(a, 1, m, n + i));
    dlog[n + i] = ls_mul(dpost[i], ls_mul(ls_mul(2.0f, g), ls_sub(1.0f, g)));
  }
  float* dl = dlog + 2 * n;
  if (dcomb == nullptr) {
    for (int64_t k = 0; k < n * n; ++k) dl[k] = 0.0f;
    return;
  }
  float* tape = work + n * n;
  for (int64_t k = 0; k < n * n; ++k) work[k] = logit(a, 2, m, 2 * n + k);
  sinkhorn_forward(work, n, a.iters, a.eps, tape);
  for (int64_t k = 0; k < n * n; ++k) dl[k] = dcomb[k];
  sinkhorn_backward(dl, tape, n, a.iters);
}

// The CPU's token_param_terms: g = dm * r, the dscale terms, the rstd coefficient.
LS_DEVICE void token_param_terms(const float* dlog, const float* m, float r, const float* scale, int64_t n,
                                 int64_t K, int64_t width, float* g, float* ds, float* c) {
  float dm_dot_m = 0.0f;
  for (int s = 0; s < 3; ++s) ds[s] = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const int s = scale_group(k, n);
    ds[s] = ls_fma(dlog[k], m[k], ds[s]);
    const float dm = ls_mul(dlog[k], scale[s]);
    dm_dot_m = ls_fma(dm, m[k], dm_dot_m);
    g[k] = ls_mul(dm, r);
  }
  *c = ls_div(ls_mul(ls_mul(dm_dot_m, r), r), static_cast<float>(width));
}

// ---- block reductions over D ----------------------------------------------------

// The canonical partial of lane `lane` of sum a[i] * b[i] over len elements.
LS_DEVICE inline float lane_dot(const float* a, const float* b, int64_t len, int lane) {
  float acc = 0.0f;
  for (int64_t i = lane; i < len; i += kLanes) acc = ls_fma(a[i], b[i], acc);
  return acc;
}

// ---- kernels --------------------------------------------------------------------

// One block per token: the RMS over n*D by the first 16 threads, then thread
// 0 scales the raw values and computes pre, post and comb.
LS_GLOBAL void mix_forward_kernel(Rows raw, float* rstd, Rows pre, Rows post, float* comb, int64_t comb_ld,
                                  ConstRows x, MixArgs a) {
  LS_SHARED(float, part, kLanes);  // the 16 lane partials of the sum of squares
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t t = blockIdx.x;
  const float* xr = x.p + t * x.ld;
  if (tid < kLanes) part[tid] = lane_dot(xr, xr, a.width, tid);
  __syncthreads();
  if (tid != 0) return;
  const float r = rstd_of(tree_of(part), a.width, a.norm_eps);
  rstd[t] = r;
  mix_token(a, raw.p + t * raw.ld, r, pre.p + t * pre.ld, post.p + t * post.ld, comb + t * comb_ld);
}

// The per-token part of a site's backward, one thread per token.
struct MixBackArgs {
  const float* raw;
  int64_t raw_ld;
  const float* rstd;
  ConstRows dpre, dpost, dcomb;  // dpost.p, dcomb.p null: zero
  float* dlog;                   // (T, K)
  float* g;                      // (T, K)
  float* ds;                     // (T, 3)
  float* c;                      // (T)
  float* work;                   // (T, work_per_token)
  int64_t work_per_token, T;
};

LS_GLOBAL void mix_backward_token_kernel(MixBackArgs b, MixArgs a) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= b.T) return;
  const int64_t n = a.n, M = 2 * n + n * n;
  const float* m = b.raw + t * b.raw_ld;
  float* dl = b.dlog + t * M;
  mix_token_dlogit(
      a, dl, m, b.dpre.p + t * b.dpre.ld, b.dpost.p != nullptr ? b.dpost.p + t * b.dpost.ld : nullptr,
      b.dcomb.p != nullptr ? b.dcomb.p + t * b.dcomb.ld : nullptr, b.work + t * b.work_per_token);
  token_param_terms(dl, m, b.rstd[t], a.scale, n, M, a.width, b.g + t * M, b.ds + t * 3, b.c + t);
}

// dbase[k] += dlog[t, k] and dscale[s] += ds[t, s], one add per token in
// token order: one thread per output.
LS_GLOBAL void param_sums_kernel(float* dbase, float* dscale, const float* dlog, const float* ds, int64_t T,
                                 int64_t K, int64_t S) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < K) {
    float acc = dbase[k];
    for (int64_t t = 0; t < T; ++t) acc = ls_add(acc, dlog[t * K + k]);
    dbase[k] = acc;
  } else if (k < K + S) {
    const int64_t s = k - K;
    float acc = dscale[s];
    for (int64_t t = 0; t < T; ++t) acc = ls_add(acc, ds[t * 3 + s]);
    dscale[s] = acc;
  }
}

// dx[t, j] -= c[t] * x[t, j] (the product rounded first).
LS_GLOBAL void rstd_term_kernel(Rows dx, ConstRows x, const float* c, int64_t T, int64_t width) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * width) return;
  const int64_t t = k / width, j = k % width;
  dx.p[t * dx.ld + j] = ls_sub(dx.p[t * dx.ld + j], ls_mul(c[t], x.p[t * x.ld + j]));
}

// u[t, d] = fma chain over i from 0 of w[t, i] * X_i[t, d], one thread per element.
LS_GLOBAL void weighted_streams_kernel(Rows u, ConstRows x, ConstRows w, int64_t T, int64_t n, int64_t D) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * D) return;
  const int64_t t = k / D, d = k % D;
  const float* xr = x.p + t * x.ld;
  const float* wr = w.p + t * w.ld;
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc = ls_fma(wr[i], xr[i * D + d], acc);
  u.p[t * u.ld + d] = acc;
}

// One block per token: dw[i] = canonical_dot(du, X_i) (a group of 16 threads
// per stream), then dX_i = fma(w_i, du, dX_i) after every dot has read X.
LS_GLOBAL void weighted_streams_backward_kernel(Rows dx, Rows dw, ConstRows du, ConstRows x, ConstRows w,
                                                int64_t n, int64_t D) {
  LS_SHARED(float, part, kMaxThreads);  // (groups, 16) lane partials
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kLanes, grp = tid / kLanes;
  const int groups = static_cast<int>(blockDim.x) / kLanes;
  const int64_t t = blockIdx.x;
  const float* g = du.p + t * du.ld;
  const float* xr = x.p + t * x.ld;
  for (int64_t i0 = 0; i0 < n; i0 += groups) {
    const int64_t i = i0 + grp;
    part[tid] = i < n ? lane_dot(g, xr + i * D, D, lane) : 0.0f;
    __syncthreads();
    if (i < n && lane == 0) dw.p[t * dw.ld + i] = tree_of(part + grp * kLanes);
    __syncthreads();
  }
  const float* wr = w.p + t * w.ld;
  float* out = dx.p + t * dx.ld;
  for (int64_t k = tid; k < n * D; k += blockDim.x) out[k] = ls_fma(wr[k / D], g[k % D], out[k]);
}

// y_c[t, d] = post_c * f[d], then fma(comb[a][c], X_a[d], .) for a in order.
LS_GLOBAL void post_kernel(Rows y, ConstRows f, ConstRows x, ConstRows post, const float* comb,
                           int64_t comb_ld, int64_t T, int64_t n, int64_t D) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= T * n * D) return;
  const int64_t t = k / (n * D), c = (k / D) % n, d = k % D;
  const float* xr = x.p + t * x.ld;
  const float* cm = comb + t * comb_ld;
  float acc = ls_mul(post.p[t * post.ld + c], f.p[t * f.ld + d]);
  for (int64_t a = 0; a < n; ++a) acc = ls_fma(cm[a * n + c], xr[a * D + d], acc);
  y.p[t * y.ld + c * D + d] = acc;
}

struct PostBackArgs {
  Rows dx, df, dpost;
  float* dcomb;
  int64_t dcomb_ld;
  ConstRows dy, f, x, post;
  const float* comb;
  int64_t comb_ld;
  float* scratch;  // (T, n*D): the token's dx, so dx may alias dy
  int64_t n, D;
};

// One block per token. First every read of dy: dpost_c = <dY_c, f> and
// dcomb[a][c] = <dY_c, X_a> (a group of 16 threads per dot), df and the
// token's dx into scratch; then dx = scratch.
LS_GLOBAL void post_backward_kernel(PostBackArgs b) {
  LS_SHARED(float, part, kMaxThreads);  // (groups, 16) lane partials
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kLanes, grp = tid / kLanes;
  const int groups = static_cast<int>(blockDim.x) / kLanes;
  const int64_t t = blockIdx.x, n = b.n, D = b.D, R = n + n * n;
  const float* g = b.dy.p + t * b.dy.ld;
  const float* xr = b.x.p + t * b.x.ld;
  const float* fr = b.f.p + t * b.f.ld;
  for (int64_t r0 = 0; r0 < R; r0 += groups) {
    const int64_t r = r0 + grp;
    // r < n: dpost_r; else (c, a) = ((r - n) / n, (r - n) % n).
    const int64_t c = r < n ? r : (r - n) / n, a = r < n ? -1 : (r - n) % n;
    part[tid] = r < R ? lane_dot(g + c * D, a < 0 ? fr : xr + a * D, D, lane) : 0.0f;
    __syncthreads();
    if (r < R && lane == 0) {
      const float v = tree_of(part + grp * kLanes);
      if (a < 0)
        b.dpost.p[t * b.dpost.ld + c] = v;
      else
        b.dcomb[t * b.dcomb_ld + a * n + c] = v;
    }
    __syncthreads();
  }
  const float* pr = b.post.p + t * b.post.ld;
  const float* cm = b.comb + t * b.comb_ld;
  float* sc = b.scratch + t * n * D;
  for (int64_t d = tid; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t c = 0; c < n; ++c) acc = ls_fma(pr[c], g[c * D + d], acc);
    b.df.p[t * b.df.ld + d] = acc;
  }
  for (int64_t k = tid; k < n * D; k += blockDim.x) {
    const int64_t a = k / D, d = k % D;
    float acc = 0.0f;
    for (int64_t c = 0; c < n; ++c) acc = ls_fma(cm[a * n + c], g[c * D + d], acc);
    sc[k] = acc;
  }
  __syncthreads();
  float* out = b.dx.p + t * b.dx.ld;
  for (int64_t k = tid; k < n * D; k += blockDim.x) out[k] = sc[k];
}

// One block per token: the RMS over n*D, then thread 0 scales the raw values
// and computes w; then h = sum_i w_i X_i (the pre-mix's chain).
LS_GLOBAL void head_forward_kernel(Rows h, Rows w, Rows raw, float* rstd, ConstRows x, MixArgs a) {
  LS_SHARED(float, part, kLanes);  // the 16 lane partials of the sum of squares
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t t = blockIdx.x, n = a.n, D = a.width / a.n;
  const float* xr = x.p + t * x.ld;
  float* wr = w.p + t * w.ld;
  if (tid < kLanes) part[tid] = lane_dot(xr, xr, a.width, tid);
  __syncthreads();
  if (tid == 0) {
    const float r = rstd_of(tree_of(part), a.width, a.norm_eps);
    rstd[t] = r;
    float* m = raw.p + t * raw.ld;
    for (int64_t i = 0; i < n; ++i) {
      m[i] = ls_mul(r, m[i]);
      wr[i] = ls_add(num::sigmoid(logit(a, 0, m, i)), a.eps);
    }
  }
  __syncthreads();
  for (int64_t d = tid; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc = ls_fma(wr[i], xr[i * D + d], acc);
    h.p[t * h.ld + d] = acc;
  }
}

// The head's per-token backward after the dots (dw in dlog): one thread per
// token turns dw into dlogit and computes the parameter terms.
LS_GLOBAL void head_backward_token_kernel(float* dlog, float* g, float* ds, float* c, const float* raw,
                                          int64_t raw_ld, const float* rstd, int64_t T, MixArgs a) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int64_t n = a.n;
  const float* m = raw + t * raw_ld;
  float* dl = dlog + t * n;
  for (int64_t i = 0; i < n; ++i) {
    const float s = num::sigmoid(logit(a, 0, m, i));
    dl[i] = ls_mul(dl[i], ls_mul(s, ls_sub(1.0f, s)));
  }
  token_param_terms(dl, m, rstd[t], a.scale, n, n, a.width, g + t * n, ds + t * 3, c + t);
}

// ---- host side --------------------------------------------------------------------

// n elements of device memory for one entry call, freed at scope end (the
// free waits for the launches that use it).
template <typename T>
class DeviceArray {
 public:
  DeviceArray(int64_t n, const char* what)
      : bytes_(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)) {
#if defined(LOCKSTEP_GPU_INTERP)
    p_ = static_cast<T*>(::lockstep::gpu::emu::device_alloc(bytes_, what));
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes_) == cudaSuccess) << what;
#else
    LS_CHECK(hipMalloc(reinterpret_cast<void**>(&p_), bytes_) == hipSuccess) << what;
#endif
  }
  ~DeviceArray() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(p_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(p_);
#else
    (void)hipFree(p_);
#endif
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const {
    return p_;
  }

 private:
  size_t bytes_;
  T* p_ = nullptr;
};

Rows rows(const Tensor& t) {
  return {t.f32(), t.stride[0]};
}
ConstRows const_rows(const Tensor& t) {
  return {t.f32(), t.stride[0]};
}
ConstRows optional_rows(const Tensor& t) {
  return t.ndim != 0 ? ConstRows{t.f32(), t.stride[0]} : ConstRows{nullptr, 0};
}

MixArgs mix_args(const Tensor& base, const Tensor& scale, int64_t n, int64_t width, const MhcConfig& cfg) {
  return {base.f32(), scale.f32(), n, width, cfg.sinkhorn_iters, cfg.eps, cfg.norm_eps};
}

dim3 per_token_block(const MhcLaunch& launch) {
  return dim3(static_cast<unsigned>(launch.threads));
}
dim3 grid_over(int64_t n, const MhcLaunch& launch) {
  return dim3(blocks_for(n, launch.threads));
}

// What the per-token phase of a mixing backward leaves for the reductions:
// dlogit and g (T, K), the dscale terms (T, 3), the rstd coefficient (T).
struct MixGrads {
  MixGrads(int64_t T, int64_t K)
      : dlog(T * K, "mhc dlogit"),
        g(T * K, "mhc dm * r"),
        ds(T * 3, "mhc dscale terms"),
        c(T, "mhc rstd term") {}
  DeviceArray<float> dlog, g, ds, c;
};

// The token-order sums, then dfn += gᵀ x̂ and dx += g fn (gemm.cu), then
// dx -= c * x̂: the CPU's param_backward.
void param_backward(const Context& ctx, const Tensor& dx, const Tensor& dfn, const Tensor& dbase,
                    const Tensor& dscale, const MixGrads& mg, const Tensor& x, const Tensor& fn,
                    const MhcLaunch& launch) {
  const int64_t T = x.shape[0], width = x.shape[1], K = fn.shape[0], S = dscale.shape[0];
  LS_LAUNCH(ctx, param_sums_kernel, grid_over(K + S, launch), per_token_block(launch))
  (dbase.f32(), dscale.f32(), mg.dlog.get(), mg.ds.get(), T, K, S);
  const Tensor g(mg.g.get(), DType::F32, {T, K});
  gemm_dytx(ctx, dfn, g, x, /*accumulate=*/true, GemmLaunch{});
  gemm_dyw(ctx, dx, g, fn, /*accumulate=*/true, GemmLaunch{});
  LS_LAUNCH(ctx, rstd_term_kernel, grid_over(T * width, launch), per_token_block(launch))
  (rows(dx), const_rows(x), mg.c.get(), T, width);
}

}  // namespace

void check_mhc_launch(const MhcLaunch& launch) {
  LS_CHECK(launch.threads >= kLanes && launch.threads <= kMaxThreads && launch.threads % kLanes == 0)
      << "MhcLaunch: threads must be a multiple of 16 in [16, 1024], got " << launch.threads;
}

void mhc_mix_forward(const Context& ctx, const MhcMix& out, const Tensor& x, const Tensor& fn,
                     const Tensor& base, const Tensor& scale, const MhcConfig& cfg, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_mix_forward(out, x, fn, base, scale, cfg);
  check_mhc_launch(launch);
  if (T == 0) return;
  gemm_xwt(ctx, out.raw, x, fn, /*accumulate=*/false, GemmLaunch{});  // fn·x̂ per token; r is applied after
  LS_LAUNCH(ctx, mix_forward_kernel, dim3(static_cast<unsigned>(T)), per_token_block(launch))
  (rows(out.raw), out.rstd.f32(), rows(out.pre), rows(out.post), out.comb.f32(), out.comb.stride[0],
   const_rows(x), mix_args(base, scale, cfg.n, x.shape[1], cfg));
}

void mhc_mix_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                      const Tensor& dpre, const Tensor& dpost, const Tensor& dcomb, const Tensor& x,
                      const MhcMix& saved, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const MhcConfig& cfg, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_mix_backward(dx, dfn, dbase, dscale, dpre, dpost, dcomb, x,
                                                              saved, fn, base, scale, cfg);
  check_mhc_launch(launch);
  if (T == 0) return;
  const int64_t n = cfg.n, M = 2 * n + n * n;
  const int64_t per_token = n * n + kernels::detail::mhc_tape_floats(n, cfg.sinkhorn_iters);
  MixGrads mg(T, M);
  DeviceArray<float> work(dcomb.ndim != 0 ? T * per_token : 0, "mhc Sinkhorn tape");
  MixBackArgs b{saved.raw.f32(),
                saved.raw.stride[0],
                saved.rstd.f32(),
                const_rows(dpre),
                optional_rows(dpost),
                optional_rows(dcomb),
                mg.dlog.get(),
                mg.g.get(),
                mg.ds.get(),
                mg.c.get(),
                work.get(),
                per_token,
                T};
  LS_LAUNCH(ctx, mix_backward_token_kernel, grid_over(T, launch), per_token_block(launch))
  (b, mix_args(base, scale, n, x.shape[1], cfg));
  param_backward(ctx, dx, dfn, dbase, dscale, mg, x, fn, launch);
}

void mhc_pre_apply(const Context& ctx, Tensor u, const Tensor& x, const Tensor& pre, int n,
                   const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_pre_apply(u, x, pre, n);
  check_mhc_launch(launch);
  if (T * D == 0) return;
  LS_LAUNCH(ctx, weighted_streams_kernel, grid_over(T * D, launch), per_token_block(launch))
  (rows(u), const_rows(x), const_rows(pre), T, int64_t{n}, D);
}

void mhc_pre_apply_backward(const Context& ctx, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                            const Tensor& pre, int n, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_pre_apply_backward(dx, dpre, du, x, pre, n);
  check_mhc_launch(launch);
  if (T == 0) return;
  LS_LAUNCH(ctx, weighted_streams_backward_kernel, dim3(static_cast<unsigned>(T)), per_token_block(launch))
  (rows(dx), rows(dpre), const_rows(du), const_rows(x), const_rows(pre), int64_t{n}, D);
}

void mhc_post(const Context& ctx, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post,
              const Tensor& comb, int n, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_post(y, f, x, post, comb, n);
  check_mhc_launch(launch);
  if (T * D == 0) return;
  LS_LAUNCH(ctx, post_kernel, grid_over(T * n * D, launch), per_token_block(launch))
  (rows(y), const_rows(f), const_rows(x), const_rows(post), comb.f32(), comb.stride[0], T, int64_t{n}, D);
}

void mhc_post_backward(const Context& ctx, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb, const Tensor& dy,
                       const Tensor& f, const Tensor& x, const Tensor& post, const Tensor& comb, int n,
                       const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_post_backward(dx, df, dpost, dcomb, dy, f, x, post, comb, n);
  check_mhc_launch(launch);
  if (T == 0) return;
  DeviceArray<float> scratch(T * n * D, "mhc_post_backward dx");
  const PostBackArgs b{rows(dx),         rows(df),
                       rows(dpost),      dcomb.f32(),
                       dcomb.stride[0],  const_rows(dy),
                       const_rows(f),    const_rows(x),
                       const_rows(post), comb.f32(),
                       comb.stride[0],   scratch.get(),
                       int64_t{n},       D};
  LS_LAUNCH(ctx, post_backward_kernel, dim3(static_cast<unsigned>(T)), per_token_block(launch))(b);
}

void mhc_head_forward(const Context& ctx, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                      const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg,
                      const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_head_forward(h, w, raw, rstd, x, fn, base, scale, cfg);
  check_mhc_launch(launch);
  if (T == 0) return;
  gemm_xwt(ctx, raw, x, fn, /*accumulate=*/false, GemmLaunch{});
  LS_LAUNCH(ctx, head_forward_kernel, dim3(static_cast<unsigned>(T)), per_token_block(launch))
  (rows(h), rows(w), rows(raw), rstd.f32(), const_rows(x), mix_args(base, scale, cfg.n, x.shape[1], cfg));
}

void mhc_head_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                       const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& raw,
                       const Tensor& rstd, const Tensor& fn, const Tensor& base, const Tensor& scale,
                       const MhcConfig& cfg, const MhcLaunch& launch) {
  const auto [T, D] = kernels::detail::check_mhc_head_backward(dx, dfn, dbase, dscale, dh, x, w, raw, rstd,
                                                               fn, base, scale, cfg);
  check_mhc_launch(launch);
  if (T == 0) return;
  const int64_t n = cfg.n;
  MixGrads mg(T, n);
  // dw lands in dlog (T, n), then becomes dlogit in place.
  const Tensor dw(mg.dlog.get(), DType::F32, {T, n});
  LS_LAUNCH(ctx, weighted_streams_backward_kernel, dim3(static_cast<unsigned>(T)), per_token_block(launch))
  (rows(dx), rows(dw), const_rows(dh), const_rows(x), const_rows(w), n, D);
  LS_LAUNCH(ctx, head_backward_token_kernel, grid_over(T, launch), per_token_block(launch))
  (mg.dlog.get(), mg.g.get(), mg.ds.get(), mg.c.get(), raw.f32(), raw.stride[0], rstd.f32(), T,
   mix_args(base, scale, n, x.shape[1], cfg));
  param_backward(ctx, dx, dfn, dbase, dscale, mg, x, fn, launch);
}

namespace {

// The backend table's forms: the calls above with MhcLaunch{}.
void mix_forward_entry(const Context& ctx, const MhcMix& out, const Tensor& x, const Tensor& fn,
                       const Tensor& base, const Tensor& scale, const MhcConfig& cfg) {
  mhc_mix_forward(ctx, out, x, fn, base, scale, cfg, MhcLaunch{});
}
void mix_backward_entry(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                        const Tensor& dpre, const Tensor& dpost, const Tensor& dcomb, const Tensor& x,
                        const MhcMix& saved, const Tensor& fn, const Tensor& base, const Tensor& scale,
                        const MhcConfig& cfg) {
  mhc_mix_backward(ctx, dx, dfn, dbase, dscale, dpre, dpost, dcomb, x, saved, fn, base, scale, cfg,
                   MhcLaunch{});
}
void pre_apply_entry(const Context& ctx, Tensor u, const Tensor& x, const Tensor& pre, int n) {
  mhc_pre_apply(ctx, u, x, pre, n, MhcLaunch{});
}
void pre_apply_backward_entry(const Context& ctx, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                              const Tensor& pre, int n) {
  mhc_pre_apply_backward(ctx, dx, dpre, du, x, pre, n, MhcLaunch{});
}
void post_entry(const Context& ctx, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post,
                const Tensor& comb, int n) {
  mhc_post(ctx, y, f, x, post, comb, n, MhcLaunch{});
}
void post_backward_entry(const Context& ctx, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb,
                         const Tensor& dy, const Tensor& f, const Tensor& x, const Tensor& post,
                         const Tensor& comb, int n) {
  mhc_post_backward(ctx, dx, df, dpost, dcomb, dy, f, x, post, comb, n, MhcLaunch{});
}
void head_forward_entry(const Context& ctx, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                        const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg) {
  mhc_head_forward(ctx, h, w, raw, rstd, x, fn, base, scale, cfg, MhcLaunch{});
}
void head_backward_entry(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                         const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& raw,
                         const Tensor& rstd, const Tensor& fn, const Tensor& base, const Tensor& scale,
                         const MhcConfig& cfg) {
  mhc_head_backward(ctx, dx, dfn, dbase, dscale, dh, x, w, raw, rstd, fn, base, scale, cfg, MhcLaunch{});
}
void add_to_streams_entry(const Context& ctx, Tensor x, const Tensor& e, int64_t n) {
  add_to_streams(ctx, x, e, n, MhcLaunch{});
}
void repeat_streams_entry(const Context& ctx, Tensor x, const Tensor& e, int64_t n) {
  repeat_streams(ctx, x, e, n, MhcLaunch{});
}
void sum_streams_entry(const Context& ctx, Tensor de, const Tensor& dx, int64_t n) {
  sum_streams(ctx, de, dx, n, MhcLaunch{});
}

}  // namespace

void register_mhc(GpuBackend& b) {
  b.mhc_mix_forward = mix_forward_entry;
  b.mhc_mix_backward = mix_backward_entry;
  b.mhc_pre_apply = pre_apply_entry;
  b.mhc_pre_apply_backward = pre_apply_backward_entry;
  b.mhc_post = post_entry;
  b.mhc_post_backward = post_backward_entry;
  b.mhc_head_forward = head_forward_entry;
  b.mhc_head_backward = head_backward_entry;
  b.add_to_streams = add_to_streams_entry;
  b.repeat_streams = repeat_streams_entry;
  b.sum_streams = sum_streams_entry;
  b.swiglu_clamped_forward = swiglu_clamped_forward;
  b.swiglu_clamped_backward = swiglu_clamped_backward;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
