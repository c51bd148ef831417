// SwiGLU activation of the gated MLP, out = silu(gate) * up, and its backward.
// Pure elementwise math with simd.h's silu/sigmoid, so bits depend only on the
// element's own inputs (batch- and thread-invariant by construction).
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// out[t, j] = silu(gate[t, j]) * up[t, j], silu from vsilu (x / (1 + exp(-x)))
// evaluated at max(gate, -100): below -100 silu is -0 and sigmoid 0 in f32
// anyway, and the clamp keeps Highway's exp inside its valid range.
// out, gate, up (T, F) f32; rows may be strided, so gate and up can be the two
// halves of a fused (T, 2F) projection. out may alias gate or up.
void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up);

// With s = sigmoid(g) (vsigmoid) and silu(g) (vsilu, the forward's bits),
// both evaluated at max(g, -100) as in the forward:
//   dgate = ((dout * up) * s) * (1 + g * (1 - s))     (written, =)
//   dup   = dout * silu(g)                            (written, =)
// All (T, F) f32, rows may be strided. Each output element is computed after
// reading all inputs at the same index, so dgate/dup may alias gate/up/dout
// element for element (but not with an offset).
void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

// Clamped SwiGLU (DeepSeek-V4's swiglu_limit L > 0): g' = min(gate, L),
// u' = min(max(up, -L), L), out = silu(g') * u' with the same silu as above,
// so out has the bits of swiglu_forward on (g', u'). NaN stays NaN. A limit
// that is not > 0 (or NaN) throws Error; L = +inf is swiglu_forward itself.
// Shapes and aliasing as swiglu_forward.
void swiglu_clamped_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up, float limit);
// Its backward: the unclamped formulas at (g', u') (the bits of swiglu_backward
// on (g', u')), then dgate = +0 where gate > L and dup = +0 where |up| > L (the
// forward's masks). The masks are strict: at gate == L or |up| == L exactly the
// gradient passes, as in PyTorch's clamp backward. Aliasing as swiglu_backward.
void swiglu_clamped_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                             const Tensor& up, float limit);

namespace detail {
// The argument checks of the entries above (fn names the entry in the
// errors), shared with the GPU backend so both raise the same errors. Each
// returns (T, F).
struct SwigluShape {
  int64_t T, F;
};
SwigluShape check_swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up, const char* fn);
SwigluShape check_swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                  const Tensor& gate, const Tensor& up, const char* fn);
}  // namespace detail

}  // namespace lockstep::kernels
