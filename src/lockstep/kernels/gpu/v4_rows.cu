// GPU forms of DeepSeek-V4's per-element steps (kernels/cpu/v4_rows.h) and
// of its routed experts' row scaling and sum (moe_scale_rows, moe_sum and
// their backwards, kernels/cpu/moe.h): one thread per element (per row for
// the backward's dot); the CPU's one rounded f32 operation per element
// (float_ops.h), its slot-order adds, its 16-lane dot (num::Lanes16); the
// plan's arrays copied into device memory for the call.
#include <vector>

#include "lockstep/kernels/cpu/v4_rows.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/v4_rows.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_mul;

LS_GLOBAL void scale_values_kernel(float* x, float s, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step)
    x[k] = ls_mul(x[k], s);
}

// For each q = (t, s) = t*K + s: rows[row_of[q]] = topk[t, s] (forward) or
// topk[t, s] = rows[row_of[q]] (backward). row_of is a permutation, so no
// two threads write one element.
LS_GLOBAL void row_weights_kernel(float* rows, int64_t rows_ld, float* topk, int64_t topk_ld,
                                  const int32_t* row_of, int64_t R, int64_t K, int backward) {
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

// One of the plan's arrays (row_of, token, slot) in device memory for one
// call, freed at scope end after the launches that read it (the free
// synchronises); emulated device memory in interpret mode, so its reads are
// bounds-checked too.
class PlanArray {
 public:
  explicit PlanArray(const std::vector<int32_t>& host, const char* what) {
    const size_t bytes = host.size() * sizeof(int32_t), alloc = bytes > 0 ? bytes : sizeof(int32_t);
#if defined(LOCKSTEP_GPU_INTERP)
    dev_ = ::lockstep::gpu::emu::device_alloc(alloc, what);
    ::lockstep::gpu::emu::copy_to_device(dev_, host.data(), bytes);
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(&dev_, alloc) == cudaSuccess) << what << ": cannot allocate it on the device";
    LS_CHECK(cudaMemcpy(dev_, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess)
        << what << ": cannot copy it to the device";
#else
    LS_CHECK(hipMalloc(&dev_, alloc) == hipSuccess) << what << ": cannot allocate it on the device";
    LS_CHECK(hipMemcpy(dev_, host.data(), bytes, hipMemcpyHostToDevice) == hipSuccess)
        << what << ": cannot copy it to the device";
#endif
  }
  ~PlanArray() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(dev_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(dev_);
#else
    (void)hipFree(dev_);
#endif
  }
  PlanArray(const PlanArray&) = delete;
  PlanArray& operator=(const PlanArray&) = delete;
  const int32_t* get() const {
    return static_cast<const int32_t*>(dev_);
  }

 private:
  void* dev_ = nullptr;
};

// y[r, f] = w * x[r, f] with w = topk_w[token[r], slot[r]], one thread per
// element (the CPU's one multiply; y may be x element for element).
LS_GLOBAL void scale_rows_kernel(float* y, int64_t y_ld, const float* x, int64_t x_ld, const float* w,
                                 int64_t w_ld, const int32_t* token, const int32_t* slot, int64_t R,
                                 int64_t F) {
  const int64_t n = R * F, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t r = k / F, f = k % F;
    const float wr = w[int64_t{token[r]} * w_ld + slot[r]];
    y[r * y_ld + f] = ls_mul(wr, x[r * x_ld + f]);
  }
}

// dtopk_w[token[r], slot[r]] = canonical_dot(dy[r], x[r], F): one thread per
// row, the CPU's 16 lanes in index order and its tree (num::Lanes16).
LS_GLOBAL void scale_rows_dot_kernel(float* dw, int64_t dw_ld, const float* dy, int64_t dy_ld, const float* x,
                                     int64_t x_ld, const int32_t* token, const int32_t* slot, int64_t R,
                                     int64_t F) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < R; r += step) {
    num::Lanes16 acc;
    for (int64_t f = 0; f < F; ++f) acc.fma(f, dy[r * dy_ld + f], x[r * x_ld + f]);
    dw[int64_t{token[r]} * dw_ld + slot[r]] = acc.reduce();
  }
}

// y[t, d] = sum over s of ye[row_of[t*K + s], d], plain adds in slot order
// from +0 (the CPU's zero fill then adds), one thread per element.
LS_GLOBAL void sum_rows_kernel(float* y, int64_t y_ld, const float* ye, int64_t ye_ld, const int32_t* row_of,
                               int64_t T, int64_t K, int64_t D) {
  const int64_t n = T * D, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t t = k / D, d = k % D;
    float acc = 0.0f;
    for (int64_t s = 0; s < K; ++s) acc = ls_add(acc, ye[int64_t{row_of[t * K + s]} * ye_ld + d]);
    y[t * y_ld + d] = acc;
  }
}

// dye[row_of[q], d] = dy[q / K, d]: copies, one thread per element.
LS_GLOBAL void sum_rows_backward_kernel(float* dye, int64_t dye_ld, const float* dy, int64_t dy_ld,
                                        const int32_t* row_of, int64_t R, int64_t K, int64_t D) {
  const int64_t n = R * D, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t q = k / D, d = k % D;
    dye[int64_t{row_of[q]} * dye_ld + d] = dy[(q / K) * dy_ld + d];
  }
}

dim3 threads_of(const RowsLaunch& cfg) {
  return dim3(static_cast<unsigned>(cfg.threads));
}

void launch_row_weights(const Context& ctx, const Tensor& rows, const Tensor& topk, const MoeDispatch& plan,
                        bool backward, const RowsLaunch& cfg) {
  check_rows_launch(cfg);
  const int64_t R = plan.num_rows();
  if (R == 0) return;
  const PlanArray row_of(plan.row_of, "moe_row_weights row_of");
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

void moe_row_weights_backward(const Context& ctx, Tensor dtopk_w, const Tensor& dw_rows,
                              const MoeDispatch& plan, const RowsLaunch& cfg) {
  kernels::detail::check_moe_row_weights(dw_rows, dtopk_w, plan, "moe_row_weights_backward");
  launch_row_weights(ctx, dw_rows, dtopk_w, plan, true, cfg);
}

void moe_scale_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& topk_w,
                    const MoeDispatch& plan, const RowsLaunch& cfg) {
  const int64_t F = kernels::check_moe_scale_rows_args(y, x, topk_w, plan), R = plan.num_rows();
  check_rows_launch(cfg);
  if (R * F == 0) return;
  const PlanArray token(plan.token, "moe_scale_rows token"), slot(plan.slot, "moe_scale_rows slot");
  LS_LAUNCH(ctx, scale_rows_kernel, dim3(rows_grid(R * F, cfg)), threads_of(cfg))
  (y.f32(), y.stride[0], x.f32(), x.stride[0], topk_w.f32(), topk_w.stride[0], token.get(), slot.get(), R, F);
}

// The dots first (they read dy), then dx = w * dy (dx may be dy).
void moe_scale_rows_backward(const Context& ctx, Tensor dx, Tensor dtopk_w, const Tensor& dy, const Tensor& x,
                             const Tensor& topk_w, const MoeDispatch& plan, const RowsLaunch& cfg) {
  const int64_t F = kernels::check_moe_scale_rows_backward_args(dx, dtopk_w, dy, x, topk_w, plan);
  const int64_t R = plan.num_rows();
  check_rows_launch(cfg);
  if (R == 0) return;
  const PlanArray token(plan.token, "moe_scale_rows_backward token"),
      slot(plan.slot, "moe_scale_rows_backward slot");
  LS_LAUNCH(ctx, scale_rows_dot_kernel, dim3(rows_grid(R, cfg)), threads_of(cfg))
  (dtopk_w.f32(), dtopk_w.stride[0], dy.f32(), dy.stride[0], x.f32(), x.stride[0], token.get(), slot.get(), R,
   F);
  if (F == 0) return;
  LS_LAUNCH(ctx, scale_rows_kernel, dim3(rows_grid(R * F, cfg)), threads_of(cfg))
  (dx.f32(), dx.stride[0], dy.f32(), dy.stride[0], topk_w.f32(), topk_w.stride[0], token.get(), slot.get(), R,
   F);
}

void moe_sum(const Context& ctx, Tensor y, const Tensor& ye, const MoeDispatch& plan, const RowsLaunch& cfg) {
  const int64_t D = kernels::check_moe_sum_args(y, ye, plan), T = plan.num_tokens;
  check_rows_launch(cfg);
  if (T * D == 0) return;
  const PlanArray row_of(plan.row_of, "moe_sum row_of");
  LS_LAUNCH(ctx, sum_rows_kernel, dim3(rows_grid(T * D, cfg)), threads_of(cfg))
  (y.f32(), y.stride[0], ye.f32(), ye.stride[0], row_of.get(), T, int64_t{plan.top_k}, D);
}

void moe_sum_backward(const Context& ctx, Tensor dye, const Tensor& dy, const MoeDispatch& plan,
                      const RowsLaunch& cfg) {
  const int64_t D = kernels::check_moe_sum_backward_args(dye, dy, plan), R = plan.num_rows();
  check_rows_launch(cfg);
  if (R * D == 0) return;
  const PlanArray row_of(plan.row_of, "moe_sum_backward row_of");
  LS_LAUNCH(ctx, sum_rows_backward_kernel, dim3(rows_grid(R * D, cfg)), threads_of(cfg))
  (dye.f32(), dye.stride[0], dy.f32(), dy.stride[0], row_of.get(), R, int64_t{plan.top_k}, D);
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

void moe_scale_rows_entry(const Context& ctx, Tensor y, const Tensor& x, const Tensor& topk_w,
                          const MoeDispatch& plan) {
  moe_scale_rows(ctx, y, x, topk_w, plan, RowsLaunch{});
}
void moe_scale_rows_backward_entry(const Context& ctx, Tensor dx, Tensor dtopk_w, const Tensor& dy,
                                   const Tensor& x, const Tensor& topk_w, const MoeDispatch& plan) {
  moe_scale_rows_backward(ctx, dx, dtopk_w, dy, x, topk_w, plan, RowsLaunch{});
}
void moe_sum_entry(const Context& ctx, Tensor y, const Tensor& ye, const MoeDispatch& plan) {
  moe_sum(ctx, y, ye, plan, RowsLaunch{});
}
void moe_sum_backward_entry(const Context& ctx, Tensor dye, const Tensor& dy, const MoeDispatch& plan) {
  moe_sum_backward(ctx, dye, dy, plan, RowsLaunch{});
}

}  // namespace

void register_v4_rows(GpuBackend& b) {
  b.scale_values = scale_values_entry;
  b.moe_row_weights = moe_row_weights_entry;
  b.moe_row_weights_backward = moe_row_weights_backward_entry;
  b.moe_scale_rows = moe_scale_rows_entry;
  b.moe_scale_rows_backward = moe_scale_rows_backward_entry;
  b.moe_sum = moe_sum_entry;
  b.moe_sum_backward = moe_sum_backward_entry;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
