// register_elementwise (registry.h): the backend entries of the elementwise
// kernel sources, rope.cu and swiglu.cu.
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/rope.h"
#include "lockstep/kernels/gpu/swiglu.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

void register_elementwise(GpuBackend& b) {
  b.rope_forward = rope_forward;
  b.rope_backward = rope_backward;
  b.rope_interleaved_forward = rope_interleaved_forward;
  b.rope_interleaved_inverse = rope_interleaved_inverse;
  b.swiglu_forward = swiglu_forward;
  b.swiglu_backward = swiglu_backward;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
