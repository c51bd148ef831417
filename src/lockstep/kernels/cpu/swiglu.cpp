// SwiGLU kernels, plain and clamped: rows split across threads; within a row,
// silu/sigmoid are evaluated into a small stack chunk before the products are
// formed.
#include "lockstep/kernels/cpu/swiglu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

void check_mat(const Tensor& t, int64_t T, int64_t F, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, {T, F}, what);
  if (t.stride[1] != 1 || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

// Elements per stack chunk: small enough for L1 next to the row data, a
// multiple of every SIMD width so only a row's last chunk has a tail.
constexpr int64_t kChunk = 256;

// Gates below this are clamped before silu/sigmoid. Highway's Exp is only
// valid up to +104 (exp(-g) for g < about -176 comes back as garbage, making
// silu(g) = g instead of -0); at -100, exp(100) is already +inf in f32, so
// silu = -0 and sigmoid = 0 exactly, the values a correct exp gives for any
// g below -100. The clamp therefore changes no correct result.
constexpr float kMinGate = -100.0f;

// clamped[j] = max(g[j], kMinGate); NaN stays NaN.
inline void clamp_gates(const float* g, float* clamped, int64_t n) {
  for (int64_t j = 0; j < n; ++j) clamped[j] = std::max(g[j], kMinGate);
}

int64_t row_grain(int64_t F) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(F, 1));
}

// The unclamped kernels are the clamped ones at an infinite limit: min(g, inf)
// and min(max(u, -inf), inf) return their input bit for bit (NaN included) and
// the masks never fire, so both share one set of numerics.
constexpr float kNoLimit = std::numeric_limits<float>::infinity();

inline float clamp_up(float u, float limit) { return std::min(std::max(u, -limit), limit); }

// One row: o = silu(min(g, L)) * clamp(u, -L, L). o may alias g or u.
void forward_row(const float* g, const float* u, float* o, int64_t F, float limit) {
  float gc[kChunk], uc[kChunk], si[kChunk];  // clamped gate, clamped up, silu(gate) of one chunk
  for (int64_t j0 = 0; j0 < F; j0 += kChunk) {
    const int64_t n = std::min(kChunk, F - j0);
    for (int64_t j = 0; j < n; ++j) {
      gc[j] = std::min(g[j0 + j], limit);
      uc[j] = clamp_up(u[j0 + j], limit);
    }
    clamp_gates(gc, gc, n);
    vsilu(gc, si, n);
    for (int64_t j = 0; j < n; ++j) o[j0 + j] = si[j] * uc[j];
  }
}

// One row of the backward; every output element is written after its index's
// inputs are read, so outputs may alias inputs element for element.
void backward_row(const float* g, const float* u, const float* d, float* dg, float* du, int64_t F, float limit) {
  float gc[kChunk], sg[kChunk], si[kChunk];  // clamped gate, sigmoid(gate), silu(gate) of one chunk
  for (int64_t j0 = 0; j0 < F; j0 += kChunk) {
    const int64_t n = std::min(kChunk, F - j0);
    for (int64_t j = 0; j < n; ++j) gc[j] = std::min(g[j0 + j], limit);
    clamp_gates(gc, gc, n);
    vsigmoid(gc, sg, n);
    vsilu(gc, si, n);
    for (int64_t j = 0; j < n; ++j) {
      const float graw = g[j0 + j], uraw = u[j0 + j], dj = d[j0 + j], s = sg[j];
      // The -100 floor is left out of gj: there s == 0, so the factor is 0 anyway.
      const float gj = std::min(graw, limit), uj = clamp_up(uraw, limit);
      const float dgj = ((dj * uj) * s) * (1.0f + gj * (1.0f - s));
      const float duj = dj * si[j];
      dg[j0 + j] = graw > limit ? 0.0f : dgj;
      du[j0 + j] = std::fabs(uraw) > limit ? 0.0f : duj;
    }
  }
}

void check_limit(float limit, const char* what) {
  if (!(limit > 0.0f)) LS_THROW << what << ": limit must be > 0, got " << limit;
}

void forward_impl(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up, float limit,
                  const char* name) {
  const auto [T, F] = detail::check_swiglu_forward(out, gate, up, name);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          forward_row(gate.f32() + t * gate.stride[0], up.f32() + t * up.stride[0], out.f32() + t * out.stride[0], F,
                      limit);
      },
      row_grain(F));
}

void backward_impl(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                   const Tensor& up, float limit, const char* name) {
  const auto [T, F] = detail::check_swiglu_backward(dgate, dup, dout, gate, up, name);
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          backward_row(gate.f32() + t * gate.stride[0], up.f32() + t * up.stride[0], dout.f32() + t * dout.stride[0],
                       dgate.f32() + t * dgate.stride[0], dup.f32() + t * dup.stride[0], F, limit);
      },
      row_grain(F));
}

}  // namespace

namespace detail {

SwigluShape check_swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, const char* fn) {
  const std::string n(fn);
  check_dtype(gate, DType::F32, (n + ": gate (T, F)").c_str());
  check_shape(gate, {-1, -1}, (n + ": gate (T, F)").c_str());
  const int64_t T = gate.shape[0], F = gate.shape[1];
  check_mat(gate, T, F, (n + ": gate (T, F)").c_str());
  check_mat(up, T, F, (n + ": up (T, F)").c_str());
  check_mat(out, T, F, (n + ": out (T, F)").c_str());
  return {T, F};
}

SwigluShape check_swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                  const Tensor& gate, const Tensor& up, const char* fn) {
  const std::string n(fn);
  check_dtype(gate, DType::F32, (n + ": gate (T, F)").c_str());
  check_shape(gate, {-1, -1}, (n + ": gate (T, F)").c_str());
  const int64_t T = gate.shape[0], F = gate.shape[1];
  check_mat(gate, T, F, (n + ": gate (T, F)").c_str());
  check_mat(up, T, F, (n + ": up (T, F)").c_str());
  check_mat(dout, T, F, (n + ": dout (T, F)").c_str());
  check_mat(dgate, T, F, (n + ": dgate (T, F)").c_str());
  check_mat(dup, T, F, (n + ": dup (T, F)").c_str());
  return {T, F};
}

}  // namespace detail

void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up) {
  LS_GPU_DISPATCH(ctx, swiglu_forward, out, gate, up);
  forward_impl(ctx, out, gate, up, kNoLimit, "swiglu_forward");
}

void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  LS_GPU_DISPATCH(ctx, swiglu_backward, dgate, dup, dout, gate, up);
  backward_impl(ctx, dgate, dup, dout, gate, up, kNoLimit, "swiglu_backward");
}

void swiglu_clamped_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up, float limit) {
  LS_GPU_DISPATCH(ctx, swiglu_clamped_forward, out, gate, up, limit);
  check_limit(limit, "swiglu_clamped_forward");
  forward_impl(ctx, out, gate, up, limit, "swiglu_clamped_forward");
}

void swiglu_clamped_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                             const Tensor& up, float limit) {
  LS_GPU_DISPATCH(ctx, swiglu_clamped_backward, dgate, dup, dout, gate, up, limit);
  check_limit(limit, "swiglu_clamped_backward");
  backward_impl(ctx, dgate, dup, dout, gate, up, limit, "swiglu_clamped_backward");
}

}  // namespace lockstep::kernels
