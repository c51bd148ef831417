// GPU per-token logprob, entropy and log-sum-exp, and their gradient
// (kernels/cpu/softmax.h). A row is handled by 16 threads, thread l owning the
// CPU's canonical lane l (elements l, l + 16, ... in index order); the sum and
// the dot of the row pass are combined by the fixed tree, the max by a rule
// that gives max_reduce's bits.
//
// Speed: 16 threads per row is what the bits allow without more work (each
// lane's sum is a serial chain in index order), and the row is read two times
// (forward) or three (backward: max, sums, gradient) instead of keeping d and
// e, since a (T, V) scratch would be as large as the logits. With V ~ 150K a
// lane walks ~9K elements serially and a half-warp reads 64 contiguous bytes
// per step, so a batch of few rows leaves most of the GPU idle. Splitting a
// lane's chain is not allowed; more rows per launch (T in the thousands during
// training) is what fills the device.
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/row_lanes.h"
#include "lockstep/kernels/gpu/softmax.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sub;


// max_reduce's scalar rule over a whole row: m = x[0], then x[i] replaces m
// when x[i] > m or x[i] is NaN. So the result is the last NaN if there is one,
// else the first element equal to the maximum (which decides the sign of a
// zero maximum). Each lane applies the rule to its own elements, reporting the
// value and its index (-1: no elements); the lanes combine to the same choice.
LS_DEVICE inline float combine_max(const float* val, const int64_t* idx) {
  float m = 0.0f;
  int64_t at = -1;
  for (int j = 0; j < kLanes; ++j) {
    const float v = val[j];
    const int64_t i = idx[j];
    if (i < 0) continue;
    bool take;
    if (at < 0) {
      take = true;
    } else if (num::is_nan(m)) {
      take = num::is_nan(v) && i > at;
    } else {
      take = num::is_nan(v) || v > m || (v == m && i < at);
    }
    if (take) {
      m = v;
      at = i;
    }
  }
  return m;
}

// d = max(z - m, -128) (the CPU's kMinShift; std::max keeps a NaN), z = logit / temperature.
LS_DEVICE inline float shift_clamped(float logit, float temperature, float m) {
  const float d = ls_sub(ls_div(logit, temperature), m);
  return d < -128.0f ? -128.0f : d;
}

struct RowStats {
  float m;    // max of z
  float s;    // canonical sum of e = exp(d)
  float ls;   // log(s)
  float dot;  // canonical dot of e and d
};

// The CPU's row pass for the row z (V) of this thread's lane, through shared
// memory: lane maxima, then lane sums of e and e * d. Every thread of the
// block calls it (it holds two barriers); live = false for rows past T. The
// four arrays are this row's 16 slots.
LS_DEVICE RowStats row_pass(const float* z, int64_t V, float temperature, bool live, int lane, float* mval,
                            int64_t* midx, float* psum, float* pdot) {
  float m = 0.0f;
  int64_t at = -1;
  if (live) {
    for (int64_t i = lane; i < V; i += kLanes) {
      const float v = ls_div(z[i], temperature);
      if (at < 0 || v > m || num::is_nan(v)) {
        m = v;
        at = i;
      }
    }
  }
  mval[lane] = m;
  midx[lane] = at;
  __syncthreads();
  m = combine_max(mval, midx);
  float s = 0.0f, dot = 0.0f;
  if (live) {
    for (int64_t i = lane; i < V; i += kLanes) {
      const float d = shift_clamped(z[i], temperature, m);
      const float e = num::exp(d);
      s = ls_add(s, e);
      dot = ls_fma(e, d, dot);
    }
  }
  psum[lane] = s;
  pdot[lane] = dot;
  __syncthreads();
  const float sum = tree_of(psum);
  return {m, sum, num::log(sum), tree_of(pdot)};
}

// Block (16, R) over R rows: threadIdx.x is the lane, threadIdx.y the row in
// the block. Lane 0 writes the row's outputs; entropy and lse may be null.
LS_GLOBAL void token_logprob_forward_kernel(float* logp, float* entropy, float* lse, const float* logits,
                                            int64_t ld, const int32_t* targets, int64_t T, int64_t V,
                                            float temperature) {
  LS_SHARED(float, mval, kSlots);    // (R, 16) lane maxima
  LS_SHARED(int64_t, midx, kSlots);  // (R, 16) their indices
  LS_SHARED(float, psum, kSlots);    // (R, 16) lane sums of e
  LS_SHARED(float, pdot, kSlots);    // (R, 16) lane sums of e * d
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  const bool live = t < T;
  const float* z = live ? logits + t * ld : logits;
  const int o = r * kLanes;
  const RowStats st = row_pass(z, V, temperature, live, lane, mval + o, midx + o, psum + o, pdot + o);
  if (!live || lane != 0) return;
  logp[t] = ls_sub(ls_sub(ls_div(z[targets[t]], temperature), st.m), st.ls);
  if (entropy != nullptr) entropy[t] = ls_sub(st.ls, ls_div(st.dot, st.s));
  if (lse != nullptr) lse[t] = ls_add(st.m, st.ls);
}

// g_j = -(p_j * (dlogp + dentropy * ((d_j - ls) + H))), g_y += dlogp,
// dlogits = g / temperature; d_j and e_j recomputed from the logits. dlogp and
// dentropy may be null (zero). dlogits may alias logits: the row pass's reads
// end at its last barrier, and then each thread reads and writes only its own
// elements.
LS_GLOBAL void token_logprob_backward_kernel(float* dlogits, int64_t ldo, const float* dlogp,
                                             const float* dentropy, const float* logits, int64_t ld,
                                             const int32_t* targets, int64_t T, int64_t V,
                                             float temperature) {
  LS_SHARED(float, mval, kSlots);    // (R, 16) lane maxima
  LS_SHARED(int64_t, midx, kSlots);  // (R, 16) their indices
  LS_SHARED(float, psum, kSlots);    // (R, 16) lane sums of e
  LS_SHARED(float, pdot, kSlots);    // (R, 16) lane sums of e * d
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  const bool live = t < T;
  const float* z = live ? logits + t * ld : logits;
  const int o = r * kLanes;
  const RowStats st = row_pass(z, V, temperature, live, lane, mval + o, midx + o, psum + o, pdot + o);
  if (!live) return;
  const float gl = dlogp != nullptr ? dlogp[t] : 0.0f;
  const float ge = dentropy != nullptr ? dentropy[t] : 0.0f;
  // Without an entropy gradient H is not needed: ge * (...) is then exactly 0.
  const float H = dentropy != nullptr ? ls_sub(st.ls, ls_div(st.dot, st.s)) : 0.0f;
  const int64_t y = targets[t];
  float* out = dlogits + t * ldo;
  for (int64_t j = lane; j < V; j += kLanes) {
    const float d = shift_clamped(z[j], temperature, st.m);
    const float p = ls_div(num::exp(d), st.s);
    const float g = num::neg(ls_mul(p, ls_add(gl, ls_mul(ge, ls_add(ls_sub(d, st.ls), H)))));
    out[j] = ls_div(j == y ? ls_add(g, gl) : g, temperature);
  }
}

// The chunked head's row statistics (token_logprob_stats): stats[t] =
// (m, s, ls, H) of the full row, H = 0 without `entropy`; the row pass as the
// forward kernel runs it, so H has the forward's bits.
LS_GLOBAL void token_logprob_stats_kernel(float* stats, int64_t lds, const float* logits, int64_t ld,
                                          int64_t T, int64_t V, float temperature, bool entropy) {
  LS_SHARED(float, mval, kSlots);    // (R, 16) lane maxima
  LS_SHARED(int64_t, midx, kSlots);  // (R, 16) their indices
  LS_SHARED(float, psum, kSlots);    // (R, 16) lane sums of e
  LS_SHARED(float, pdot, kSlots);    // (R, 16) lane sums of e * d
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  const bool live = t < T;
  const float* z = live ? logits + t * ld : logits;
  const int o = r * kLanes;
  const RowStats st = row_pass(z, V, temperature, live, lane, mval + o, midx + o, psum + o, pdot + o);
  if (!live || lane != 0) return;
  float* out = stats + t * lds;
  out[0] = st.m;
  out[1] = st.s;
  out[2] = st.ls;
  out[3] = entropy ? ls_sub(st.ls, ls_div(st.dot, st.s)) : 0.0f;
}

// Columns [col0, col0 + W) of the backward kernel's dlogits from the saved
// row statistics: every element from its own logit alone, so no reduction
// and the same expression as the full-row kernel. Block (16, R) over R rows,
// lane l taking the columns l, l + 16, ... dlogits may alias logits (each
// thread reads an element before writing it, and no other thread touches it).
LS_GLOBAL void token_logprob_backward_cols_kernel(float* dlogits, int64_t ldo, const float* dlogp,
                                                  const float* dentropy, const float* logits, int64_t ld,
                                                  const int32_t* targets, const float* stats, int64_t lds,
                                                  int64_t col0, int64_t T, int64_t W, float temperature) {
  const int lane = static_cast<int>(threadIdx.x), r = static_cast<int>(threadIdx.y);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + r;
  if (t >= T) return;
  const float* z = logits + t * ld;
  const float* st = stats + t * lds;
  const float m = st[0], s = st[1], ls = st[2];
  const float gl = dlogp != nullptr ? dlogp[t] : 0.0f;
  const float ge = dentropy != nullptr ? dentropy[t] : 0.0f;
  const float H = dentropy != nullptr ? st[3] : 0.0f;
  const int64_t y = targets[t];
  float* out = dlogits + t * ldo;
  for (int64_t j = lane; j < W; j += kLanes) {
    const float d = shift_clamped(z[j], temperature, m);
    const float p = ls_div(num::exp(d), s);
    const float g = num::neg(ls_mul(p, ls_add(gl, ls_mul(ge, ls_add(ls_sub(d, ls), H)))));
    out[j] = ls_div(col0 + j == y ? ls_add(g, gl) : g, temperature);
  }
}

void check_launch(const SoftmaxLaunch& cfg) {
  LS_CHECK(cfg.rows_per_block >= 1 && cfg.rows_per_block <= kMaxRows)
      << "SoftmaxLaunch: rows_per_block must be in [1, " << kMaxRows << "], got " << cfg.rows_per_block;
}

dim3 row_grid(int64_t T, const SoftmaxLaunch& cfg) {
  return dim3(::lockstep::gpu::blocks_for(T, cfg.rows_per_block));
}
dim3 row_block(const SoftmaxLaunch& cfg) {
  return dim3(kLanes, static_cast<unsigned>(cfg.rows_per_block));
}

float* or_null(const Tensor& t) {
  return t.ndim != 0 ? t.f32() : nullptr;
}

}  // namespace

void token_logprob_forward(const Context& ctx, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                           const Tensor& targets, float temperature, const SoftmaxLaunch& cfg) {
  const auto [T, V] =
      kernels::detail::check_token_logprob_forward(logp, entropy, lse, logits, targets, temperature);
  check_launch(cfg);
  if (T == 0) return;
  LS_LAUNCH(ctx, token_logprob_forward_kernel, row_grid(T, cfg), row_block(cfg))
  (logp.f32(), or_null(entropy), or_null(lse), logits.f32(), logits.stride[0], targets.i32(), T, V,
   temperature);
}

void token_logprob_backward(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                            const Tensor& logits, const Tensor& targets, float temperature,
                            const SoftmaxLaunch& cfg) {
  const auto [T, V] =
      kernels::detail::check_token_logprob_backward(dlogits, dlogp, dentropy, logits, targets, temperature);
  check_launch(cfg);
  if (T == 0) return;
  LS_LAUNCH(ctx, token_logprob_backward_kernel, row_grid(T, cfg), row_block(cfg))
  (dlogits.f32(), dlogits.stride[0], or_null(dlogp), or_null(dentropy), logits.f32(), logits.stride[0],
   targets.i32(), T, V, temperature);
}

void token_logprob_stats(const Context& ctx, Tensor stats, const Tensor& logits, float temperature,
                         bool entropy, const SoftmaxLaunch& cfg) {
  const auto [T, V] = kernels::detail::check_token_logprob_stats(stats, logits, temperature);
  check_launch(cfg);
  if (T == 0) return;
  LS_LAUNCH(ctx, token_logprob_stats_kernel, row_grid(T, cfg), row_block(cfg))
  (stats.f32(), stats.stride[0], logits.f32(), logits.stride[0], T, V, temperature, entropy);
}

void token_logprob_backward_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp,
                                 const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                 const Tensor& stats, int64_t col0, float temperature,
                                 const SoftmaxLaunch& cfg) {
  const auto [T, W] = kernels::detail::check_token_logprob_backward_cols(dlogits, dlogp, dentropy, logits,
                                                                         targets, stats, col0, temperature);
  check_launch(cfg);
  if (T == 0) return;
  LS_LAUNCH(ctx, token_logprob_backward_cols_kernel, row_grid(T, cfg), row_block(cfg))
  (dlogits.f32(), dlogits.stride[0], or_null(dlogp), or_null(dentropy), logits.f32(), logits.stride[0],
   targets.i32(), stats.f32(), stats.stride[0], col0, T, W, temperature);
}

void token_logprob_forward(const Context& ctx, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                           const Tensor& targets, float temperature) {
  token_logprob_forward(ctx, logp, entropy, lse, logits, targets, temperature, SoftmaxLaunch{});
}
void token_logprob_backward(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                            const Tensor& logits, const Tensor& targets, float temperature) {
  token_logprob_backward(ctx, dlogits, dlogp, dentropy, logits, targets, temperature, SoftmaxLaunch{});
}
void token_logprob_stats(const Context& ctx, Tensor stats, const Tensor& logits, float temperature,
                         bool entropy) {
  token_logprob_stats(ctx, stats, logits, temperature, entropy, SoftmaxLaunch{});
}
void token_logprob_backward_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp,
                                 const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                 const Tensor& stats, int64_t col0, float temperature) {
  token_logprob_backward_cols(ctx, dlogits, dlogp, dentropy, logits, targets, stats, col0, temperature,
                              SoftmaxLaunch{});
}

void register_softmax(GpuBackend& b) {
  b.token_logprob_forward = token_logprob_forward;
  b.token_logprob_backward = token_logprob_backward;
  b.token_logprob_stats = token_logprob_stats;
  b.token_logprob_backward_cols = token_logprob_backward_cols;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
