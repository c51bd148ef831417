// GPU SwiGLU (kernels/cpu/swiglu.h), forward and backward, plain and clamped
// (DeepSeek-V4's limit L; the plain forms are L = +inf, as on the CPU): one
// thread per element, silu/sigmoid from kernels/numerics.h (the bits of
// vsilu/vsigmoid) at the CPU's clamped gate max(min(g, L), -100).
#include <limits>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/gpu/mhc.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/swiglu.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sub;

// The CPU's kMinGate floor, as std::max(g, -100.0f): (g < -100) ? -100 : g, so
// a NaN gate stays NaN.
LS_DEVICE inline float clamp_gate(float g) {
  return g < -100.0f ? -100.0f : g;
}

// std::min(v, L) and std::min(std::max(u, -L), L) as the CPU writes them:
// (L < v) ? L : v keeps a NaN, and at L = +inf both return their input.
LS_DEVICE inline float min_limit(float v, float limit) {
  return limit < v ? limit : v;
}
LS_DEVICE inline float clamp_up(float u, float limit) {
  const float lo = u < -limit ? -limit : u;
  return limit < lo ? limit : lo;
}

// A (T, F) operand: base pointer and row stride (unit column stride).
struct Rows {
  float* p;
  int64_t ld;
};
struct ConstRows {
  const float* p;
  int64_t ld;
};

// out = silu(max(min(g, L), -100)) * clamp(up, -L, L). out may alias gate or
// up (element for element).
LS_GLOBAL void swiglu_forward_kernel(Rows out, ConstRows gate, ConstRows up, int64_t T, int64_t F,
                                     float limit) {
  const int64_t n = T * F;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / F, j = k % F;
    const float g = min_limit(gate.p[t * gate.ld + j], limit), u = clamp_up(up.p[t * up.ld + j], limit);
    out.p[t * out.ld + j] = ls_mul(num::silu(clamp_gate(g)), u);
  }
}

// With g = min(gate, L), u = clamp(up, -L, L), s = sigmoid(max(g, -100)):
// dgate = ((dout * u) * s) * (1 + g * (1 - s)), dup = dout * silu(max(g, -100)),
// then +0 where gate > L, resp. |up| > L. Every input of an element is read
// before its outputs are written, so outputs may alias inputs element for element.
LS_GLOBAL void swiglu_backward_kernel(Rows dgate, Rows dup, ConstRows dout, ConstRows gate, ConstRows up,
                                      int64_t T, int64_t F, float limit) {
  const int64_t n = T * F;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / F, j = k % F;
    const float graw = gate.p[t * gate.ld + j], uraw = up.p[t * up.ld + j], d = dout.p[t * dout.ld + j];
    const float g = min_limit(graw, limit), u = clamp_up(uraw, limit);
    const float gc = clamp_gate(g);
    const float s = num::sigmoid(gc), si = num::silu(gc);
    const float dg = ls_mul(ls_mul(ls_mul(d, u), s), ls_add(1.0f, ls_mul(g, ls_sub(1.0f, s))));
    const float du = ls_mul(d, si);
    dgate.p[t * dgate.ld + j] = graw > limit ? 0.0f : dg;
    dup.p[t * dup.ld + j] = (uraw > limit || uraw < -limit) ? 0.0f : du;
  }
}

void check_launch(const SwigluLaunch& cfg) {
  LS_CHECK(cfg.threads >= 1 && cfg.threads <= 1024)
      << "SwigluLaunch: threads must be in [1, 1024], got " << cfg.threads;
  LS_CHECK(cfg.max_blocks >= 0) << "SwigluLaunch: max_blocks must be >= 0, got " << cfg.max_blocks;
}

constexpr float kNoLimit = std::numeric_limits<float>::infinity();

void check_limit(float limit, const char* what) {
  if (!(limit > 0.0f)) LS_THROW << what << ": limit must be > 0, got " << limit;
}

unsigned grid_for(int64_t n, const SwigluLaunch& cfg) {
  const unsigned blocks = blocks_for(n, cfg.threads);
  return cfg.max_blocks > 0 && blocks > static_cast<unsigned>(cfg.max_blocks)
             ? static_cast<unsigned>(cfg.max_blocks)
             : blocks;
}

Rows rows(const Tensor& t) {
  return {t.f32(), t.stride[0]};
}
ConstRows const_rows(const Tensor& t) {
  return {t.f32(), t.stride[0]};
}

}  // namespace

void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up,
                    const SwigluLaunch& cfg) {
  const auto [T, F] = kernels::detail::check_swiglu_forward(out, gate, up, "swiglu_forward");
  check_launch(cfg);
  if (T * F == 0) return;
  LS_LAUNCH(ctx, swiglu_forward_kernel, dim3(grid_for(T * F, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (rows(out), const_rows(gate), const_rows(up), T, F, kNoLimit);
}

void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, const SwigluLaunch& cfg) {
  const auto [T, F] = kernels::detail::check_swiglu_backward(dgate, dup, dout, gate, up, "swiglu_backward");
  check_launch(cfg);
  if (T * F == 0) return;
  LS_LAUNCH(ctx, swiglu_backward_kernel, dim3(grid_for(T * F, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (rows(dgate), rows(dup), const_rows(dout), const_rows(gate), const_rows(up), T, F, kNoLimit);
}

void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up) {
  swiglu_forward(ctx, out, gate, up, SwigluLaunch{});
}
void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  swiglu_backward(ctx, dgate, dup, dout, gate, up, SwigluLaunch{});
}

void swiglu_clamped_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up,
                            float limit) {
  check_limit(limit, "swiglu_clamped_forward");
  const auto [T, F] = kernels::detail::check_swiglu_forward(out, gate, up, "swiglu_clamped_forward");
  const SwigluLaunch cfg;
  if (T * F == 0) return;
  LS_LAUNCH(ctx, swiglu_forward_kernel, dim3(grid_for(T * F, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (rows(out), const_rows(gate), const_rows(up), T, F, limit);
}

void swiglu_clamped_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout,
                             const Tensor& gate, const Tensor& up, float limit) {
  check_limit(limit, "swiglu_clamped_backward");
  const auto [T, F] =
      kernels::detail::check_swiglu_backward(dgate, dup, dout, gate, up, "swiglu_clamped_backward");
  const SwigluLaunch cfg;
  if (T * F == 0) return;
  LS_LAUNCH(ctx, swiglu_backward_kernel, dim3(grid_for(T * F, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (rows(dgate), rows(dup), const_rows(dout), const_rows(gate), const_rows(up), T, F, limit);
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
