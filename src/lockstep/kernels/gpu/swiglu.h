// The GPU SwiGLU entries (swiglu.cu, kernels/cpu/swiglu.h) with their launch
// geometry, for tests that run several; the backend table holds the
// default-geometry forms.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct SwigluLaunch {
  int threads = 256;   // per block, one (token, column) element each
  int max_blocks = 0;  // 0: one pass over the elements; else a grid-stride loop over at most this many blocks
};

void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up,
                    const SwigluLaunch& cfg);
void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up, const SwigluLaunch& cfg);

// The backend table's entries: the calls above with SwigluLaunch{}.
void swiglu_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up);
void swiglu_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
