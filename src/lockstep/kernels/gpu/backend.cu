// The backend table of this build (interpret, CUDA or HIP), and the list of
// what it covers.
#include "lockstep/kernels/gpu/registry.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

GpuBackend make_backend() {
  GpuBackend b;
#if defined(LOCKSTEP_GPU_INTERP)
  b.name = "interpret";
#elif defined(LOCKSTEP_GPU_HIP)
  b.name = "hip";
#else
  b.name = "cuda";
#endif
  register_memory(b);
  register_gemm(b);
  register_embedding(b);
  register_attention(b);
  register_rmsnorm(b);
  register_elementwise(b);
  register_rows(b);
  register_v4_rows(b);
  register_softmax(b);
  register_moe(b);
  register_adamw(b);
  register_sampling(b);
  register_mhc(b);
  // kv_compress.h, sparse_attention.h
  register_kv_compress(b);
  register_sparse_attention(b);
  return b;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS

#if defined(LOCKSTEP_GPU_INTERP)
namespace lockstep::kernels {

const GpuBackend& interpret_backend() {
  static const GpuBackend b = gpu::interp::make_backend();
  return b;
}

}  // namespace lockstep::kernels
#endif
