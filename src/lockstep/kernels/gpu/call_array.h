// Device memory for one GPU entry call: the plan arrays it copies in from host
// vectors and its scratch, freed at scope end (on a device the free waits for
// the kernels that read it). For the DeepSeek-V4 entries (kv_compress.cu,
// sparse_attention.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

template <typename T>
class CallArray {
 public:
  // n elements, uninitialised (interpret mode poisons them).
  CallArray(int64_t n, const char* what) : bytes_(static_cast<size_t>(n > 0 ? n : 1) * sizeof(T)) {
#if defined(LOCKSTEP_GPU_INTERP)
    p_ = static_cast<T*>(::lockstep::gpu::emu::device_alloc(bytes_, what));
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes_) == cudaSuccess) << what;
#else
    LS_CHECK(hipMalloc(reinterpret_cast<void**>(&p_), bytes_) == hipSuccess) << what;
#endif
  }
  // A copy of a host vector.
  CallArray(const std::vector<T>& host, const char* what)
      : CallArray(static_cast<int64_t>(host.size()), what) {
    const size_t b = host.size() * sizeof(T);
    if (b == 0) return;
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::copy_to_device(p_, host.data(), b);
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMemcpy(p_, host.data(), b, cudaMemcpyHostToDevice) == cudaSuccess) << what;
#else
    LS_CHECK(hipMemcpy(p_, host.data(), b, hipMemcpyHostToDevice) == hipSuccess) << what;
#endif
  }
  ~CallArray() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(p_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(p_);
#else
    (void)hipFree(p_);
#endif
  }
  CallArray(const CallArray&) = delete;
  CallArray& operator=(const CallArray&) = delete;
  T* get() const {
    return p_;
  }

 private:
  size_t bytes_;
  T* p_ = nullptr;
};

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
