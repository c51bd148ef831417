// The GPU mHC entries (mhc.cu, kernels/cpu/mhc.h), the stream helpers
// (streams.cu, kernels/cpu/streams.h) and the clamped SwiGLU (swiglu.cu) with
// their launch geometry, for tests that run several; the backend table holds
// the default-geometry forms.
#pragma once

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/mhc.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct MhcLaunch {
  // Threads per block, a multiple of 16 in [16, 1024]. The per-token kernels
  // run one block per token: each group of 16 threads owns the canonical
  // lanes of one reduction over D at a time, and every thread takes
  // elements of the token's streams. The elementwise kernels take one
  // element per thread.
  int threads = 64;
};

void mhc_mix_forward(const Context& ctx, const MhcMix& out, const Tensor& x, const Tensor& fn,
                     const Tensor& base, const Tensor& scale, const MhcConfig& cfg, const MhcLaunch& launch);
void mhc_mix_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                      const Tensor& dpre, const Tensor& dpost, const Tensor& dcomb, const Tensor& x,
                      const MhcMix& saved, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const MhcConfig& cfg, const MhcLaunch& launch);
void mhc_pre_apply(const Context& ctx, Tensor u, const Tensor& x, const Tensor& pre, int n,
                   const MhcLaunch& launch);
void mhc_pre_apply_backward(const Context& ctx, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                            const Tensor& pre, int n, const MhcLaunch& launch);
void mhc_post(const Context& ctx, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post,
              const Tensor& comb, int n, const MhcLaunch& launch);
void mhc_post_backward(const Context& ctx, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb, const Tensor& dy,
                       const Tensor& f, const Tensor& x, const Tensor& post, const Tensor& comb, int n,
                       const MhcLaunch& launch);
void mhc_head_forward(const Context& ctx, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                      const Tensor& fn, const Tensor& base, const Tensor& scale, const MhcConfig& cfg,
                      const MhcLaunch& launch);
void mhc_head_backward(const Context& ctx, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                       const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& raw,
                       const Tensor& rstd, const Tensor& fn, const Tensor& base, const Tensor& scale,
                       const MhcConfig& cfg, const MhcLaunch& launch);

void add_to_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n, const MhcLaunch& launch);
void repeat_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n, const MhcLaunch& launch);
void sum_streams(const Context& ctx, Tensor de, const Tensor& dx, int64_t n, const MhcLaunch& launch);

// swiglu.cu: the clamped forms (the plain ones at an infinite limit).
void swiglu_clamped_forward(const Context& ctx, Tensor out, const Tensor& gate, const Tensor& up,
                            float limit);
void swiglu_clamped_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dout,
                             const Tensor& gate, const Tensor& up, float limit);

// Throws Error when `launch` breaks the limits above.
void check_mhc_launch(const MhcLaunch& launch);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
