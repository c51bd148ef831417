// GPU rotate-half RoPE from a RopeTable (kernels/cpu/rope.h): one thread per
// (token, head, pair), the CPU's f32 products and one add or subtract, no FMA.
// The table's cos/sin are read through their std::vector pointers: fine in
// interpret mode, where host memory is device memory; a device backend needs
// the table in device-visible memory (and the positions readable by the host
// for the CPU's argument checks).
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/rope.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sub;

// x (T, H, Dh) with strides (ldt, ldh, 1); cos, sin (max_positions, half).
// Pair i of a head: a = x[i], b = x[i + half]; forward: a c - b s, b c + a s;
// kInverse (the backward) rotates by -angle: a c + b s, b c - a s.
// kInterleaved (DeepSeek-V4's form): pair i is a = x[2i], b = x[2i + 1], with
// the same products.
template <bool kInverse, bool kInterleaved = false>
LS_GLOBAL void rope_kernel(float* x, int64_t ldt, int64_t ldh, const int32_t* pos, const float* cos,
                           const float* sin, int64_t T, int64_t H, int64_t half) {
  const int64_t n = T * H * half;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t i = k % half, h = (k / half) % H, t = k / (half * H);
    const int64_t off = static_cast<int64_t>(pos[t]) * half + i;
    const float c = cos[off], s = sin[off];
    float* lo = x + t * ldt + h * ldh + (kInterleaved ? 2 * i : i);
    float* hi = kInterleaved ? lo + 1 : lo + half;
    const float a = *lo, b = *hi;
    if constexpr (kInverse) {
      *lo = ls_add(ls_mul(a, c), ls_mul(b, s));
      *hi = ls_sub(ls_mul(b, c), ls_mul(a, s));
    } else {
      *lo = ls_sub(ls_mul(a, c), ls_mul(b, s));
      *hi = ls_add(ls_mul(b, c), ls_mul(a, s));
    }
  }
}

template <bool kInverse, bool kInterleaved = false>
void launch_rope(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                 const RopeLaunch& cfg, const char* fn) {
  const kernels::detail::RopeShape sh = kernels::detail::check_rope_table(x, positions, table, fn);
  LS_CHECK(cfg.threads >= 1 && cfg.threads <= 1024)
      << "RopeLaunch: threads must be in [1, 1024], got " << cfg.threads;
  LS_CHECK(cfg.max_blocks >= 0) << "RopeLaunch: max_blocks must be >= 0, got " << cfg.max_blocks;
  const int64_t n = sh.T * sh.H * sh.half;
  if (n == 0) return;
  unsigned blocks = blocks_for(n, cfg.threads);
  if (cfg.max_blocks > 0 && blocks > static_cast<unsigned>(cfg.max_blocks))
    blocks = static_cast<unsigned>(cfg.max_blocks);
  LS_LAUNCH(ctx, (rope_kernel<kInverse, kInterleaved>), dim3(blocks),
            dim3(static_cast<unsigned>(cfg.threads)))
  (x.f32(), x.stride[0], x.stride[1], positions.i32(), table.cos.data(), table.sin.data(), sh.T, sh.H,
   sh.half);
}

}  // namespace

void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                  const RopeLaunch& cfg) {
  launch_rope<false>(ctx, x, positions, table, cfg, "rope_forward");
}
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, const RopeTable& table,
                   const RopeLaunch& cfg) {
  launch_rope<true>(ctx, dx, positions, table, cfg, "rope_backward");
}

void rope_interleaved_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                              const RopeLaunch& cfg) {
  launch_rope<false, true>(ctx, x, positions, table, cfg, "rope_interleaved_forward");
}
void rope_interleaved_inverse(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                              const RopeLaunch& cfg) {
  launch_rope<true, true>(ctx, x, positions, table, cfg, "rope_interleaved_inverse");
}

void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table) {
  rope_forward(ctx, x, positions, table, RopeLaunch{});
}
void rope_interleaved_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table) {
  rope_interleaved_forward(ctx, x, positions, table, RopeLaunch{});
}
void rope_interleaved_inverse(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table) {
  rope_interleaved_inverse(ctx, x, positions, table, RopeLaunch{});
}
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, const RopeTable& table) {
  rope_backward(ctx, dx, positions, table, RopeLaunch{});
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
