// GPU forms of DeepSeek-V4's per-element steps (kernels/cpu/v4_rows.h): one
// thread per element; the scale is the CPU's one rounded f32 multiply
// (float_ops.h), the row weights plain copies through the plan's row_of,
// copied into device memory for the call.
#include "lockstep/kernels/cpu/v4_rows.h"

#include <vector>

#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/v4_rows.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_mul;

LS_GLOBAL void scale_values_kernel(float* x, float s, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step)
    x[k] = ls_mul(x[k], s);
}

// For each q = (t, s) = t*K + s: rows[row_of[q]] = topk[t, s] (forward) or
// topk[t, s] = rows[row_of[q]] (backward). row_of is a permutation, so no
// two threads write one element.
LS_GLOBAL void row_weights_kernel(float* rows, int64_t rows_ld, float* topk, int64_t topk_ld, const int32_t* row_of,
                                  int64_t R, int64_t K, int backward) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < R; q += step) {
    float* r = rows + int64_t{row_of[q]} * rows_ld;
    float* w = topk + (q / K) * topk_ld + q % K;
    if (backward != 0)
      *w = *r;
    else
      *r = *w;
  }
}

// The plan's row_of (T*K) in device memory for one call, freed at scope end
// after the launch that reads it (the free synchronises); emulated device
// memory in interpret mode, so its reads are bounds-checked too.
class PlanRowOf {
 public:
  explicit PlanRowOf(const std::vector<int32_t>& row_of) {
    const size_t bytes = row_of.size() * sizeof(int32_t), alloc = bytes > 0 ? bytes : sizeof(int32_t);
#if defined(LOCKSTEP_GPU_INTERP)
    dev_ = ::lockstep::gpu::emu::device_alloc(alloc, "moe_row_weights row_of");
    ::lockstep::gpu::emu::copy_to_device(dev_, row_of.data(), bytes);
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(&dev_, alloc) == cudaSuccess) << "moe_row_weights: cannot allocate row_of on the device";
    LS_CHECK(cudaMemcpy(dev_, row_of.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess)
        << "moe_row_weights: cannot copy row_of to the device";
#else
    LS_CHECK(hipMalloc(&dev_, alloc) == hipSuccess) << "moe_row_weights: cannot allocate row_of on the device";
    LS_CHECK(hipMemcpy(dev_, row_of.data(), bytes, hipMemcpyHostToDevice) == hipSuccess)
        << "moe_row_weights: cannot copy row_of to the device";
#endif
  }
  ~PlanRowOf() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(dev_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(dev_);
#else
    (void)hipFree(dev_);
#endif
  }
  PlanRowOf(const PlanRowOf&) = delete;
  PlanRowOf& operator=(const PlanRowOf&) = delete;
  const int32_t* get() const { return static_cast<const int32_t*>(dev_); }

 private:
  void* dev_ = nullptr;
};

void launch_row_weights(const Context& ctx, const Tensor& rows, const Tensor& topk, const MoeDispatch& plan,
                        bool backward, const RowsLaunch& cfg) {
  check_rows_launch(cfg);
  const int64_t R = plan.num_rows();
  if (R == 0) return;
  const PlanRowOf row_of(plan.row_of);
  LS_LAUNCH(ctx, row_weights_kernel, dim3(rows_grid(R, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (rows.f32(), rows.stride[0], topk.f32(), topk.stride[0], row_of.get(), R, int64_t{plan.top_k},
   backward ? 1 : 0);
}

}  // namespace

void scale_values(const Context& ctx, Tensor x, float s, const RowsLaunch& cfg) {
  const int64_t n = kernels::detail::check_scale_values(x);
  check_rows_launch(cfg);
  if (n == 0) return;
  LS_LAUNCH(ctx, scale_values_kernel, dim3(rows_grid(n, cfg)), dim3(static_cast<unsigned>(cfg.threads)))
  (x.f32(), s, n);
}

void moe_row_weights(const Context& ctx, Tensor w_rows, const Tensor& topk_w, const MoeDispatch& plan,
                     const RowsLaunch& cfg) {
  kernels::detail::check_moe_row_weights(w_rows, topk_w, plan, "moe_row_weights");
  launch_row_weights(ctx, w_rows, topk_w, plan, false, cfg);
}

void moe_row_weights_backward(const Context& ctx, Tensor dtopk_w, const Tensor& dw_rows, const MoeDispatch& plan,
                              const RowsLaunch& cfg) {
  kernels::detail::check_moe_row_weights(dw_rows, dtopk_w, plan, "moe_row_weights_backward");
  launch_row_weights(ctx, dw_rows, dtopk_w, plan, true, cfg);
}

namespace {

void scale_values_entry(const Context& ctx, Tensor x, float s) {
  scale_values(ctx, x, s, RowsLaunch{});
}
void moe_row_weights_entry(const Context& ctx, Tensor w_rows, const Tensor& topk_w, const MoeDispatch& plan) {
  moe_row_weights(ctx, w_rows, topk_w, plan, RowsLaunch{});
}
void moe_row_weights_backward_entry(const Context& ctx, Tensor dtopk_w, const Tensor& dw_rows,
                                    const MoeDispatch& plan) {
  moe_row_weights_backward(ctx, dtopk_w, dw_rows, plan, RowsLaunch{});
}

}  // namespace

void register_v4_rows(GpuBackend& b) {
  b.scale_values = scale_values_entry;
  b.moe_row_weights = moe_row_weights_entry;
  b.moe_row_weights_backward = moe_row_weights_backward_entry;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
