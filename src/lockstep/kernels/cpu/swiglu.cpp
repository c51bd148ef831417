// SwiGLU kernels: rows split across threads; within a row, silu/sigmoid are
// evaluated into a small stack chunk before the products are formed.
#include "lockstep/kernels/cpu/swiglu.h"

#include <algorithm>

#include "lockstep/kernels/cpu/simd.h"

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

}  // namespace

void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up) {
  check_dtype(gate, DType::F32, "swiglu_forward: gate (T, F)");
  check_shape(gate, {-1, -1}, "swiglu_forward: gate (T, F)");
  const int64_t T = gate.shape[0], F = gate.shape[1];
  check_mat(gate, T, F, "swiglu_forward: gate (T, F)");
  check_mat(up, T, F, "swiglu_forward: up (T, F)");
  check_mat(out, T, F, "swiglu_forward: out (T, F)");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        float gc[kChunk], si[kChunk];  // clamped gate, silu(gate) of one chunk
        for (int64_t t = t0; t < t1; ++t) {
          const float* g = gate.f32() + t * gate.stride[0];
          const float* u = up.f32() + t * up.stride[0];
          float* o = out.f32() + t * out.stride[0];
          for (int64_t j0 = 0; j0 < F; j0 += kChunk) {
            const int64_t n = std::min(kChunk, F - j0);
            clamp_gates(g + j0, gc, n);
            vsilu(gc, si, n);
            for (int64_t j = 0; j < n; ++j) o[j0 + j] = si[j] * u[j0 + j];
          }
        }
      },
      row_grain(F));
}

void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  check_dtype(gate, DType::F32, "swiglu_backward: gate (T, F)");
  check_shape(gate, {-1, -1}, "swiglu_backward: gate (T, F)");
  const int64_t T = gate.shape[0], F = gate.shape[1];
  check_mat(gate, T, F, "swiglu_backward: gate (T, F)");
  check_mat(up, T, F, "swiglu_backward: up (T, F)");
  check_mat(dout, T, F, "swiglu_backward: dout (T, F)");
  check_mat(dgate, T, F, "swiglu_backward: dgate (T, F)");
  check_mat(dup, T, F, "swiglu_backward: dup (T, F)");
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        float gc[kChunk], sg[kChunk], si[kChunk];  // clamped gate, sigmoid(gate), silu(gate) of one chunk
        for (int64_t t = t0; t < t1; ++t) {
          const float* g = gate.f32() + t * gate.stride[0];
          const float* u = up.f32() + t * up.stride[0];
          const float* d = dout.f32() + t * dout.stride[0];
          float* dg = dgate.f32() + t * dgate.stride[0];
          float* du = dup.f32() + t * dup.stride[0];
          for (int64_t j0 = 0; j0 < F; j0 += kChunk) {
            const int64_t n = std::min(kChunk, F - j0);
            clamp_gates(g + j0, gc, n);
            vsigmoid(gc, sg, n);
            vsilu(gc, si, n);
            for (int64_t j = 0; j < n; ++j) {
              const float gj = g[j0 + j], uj = u[j0 + j], dj = d[j0 + j], s = sg[j];
              dg[j0 + j] = ((dj * uj) * s) * (1.0f + gj * (1.0f - s));
              du[j0 + j] = dj * si[j];
            }
          }
        }
      },
      row_grain(F));
}

}  // namespace lockstep::kernels
