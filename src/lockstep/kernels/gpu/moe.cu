// The MoE router, gather and combine (kernels/cpu/moe.h) as GPU kernels, each
// giving the CPU's bits: the router repeats score_token / select_token /
// the weight loop of kernels/cpu/moe_route.cpp operation for operation, the
// gather copies bits, the combine runs the CPU's fma chain in slot order; the
// backward passes repeat moe_route_backward and the CPU's slot-order sums.
#include "lockstep/kernels/gpu/moe.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sqrt;
using ::lockstep::gpu::ls_sub;

namespace {

// The CPU's constants (kernels/cpu/moe_route.cpp): the normalizer's epsilon
// and the logit past which softplus(x) is x.
constexpr float kNormEps = 1e-20f;
constexpr float kSoftplusLinear = 20.0f;

// ---- router -----------------------------------------------------------------

// One routing call's operands: device pointers, row strides in elements.
struct RouteArgs {
  int32_t* idx;  // (T, K) topk_idx
  int64_t idx_stride;
  float* w;  // (T, K) topk_w
  int64_t w_stride;
  float* p;  // (T, E) scores
  int64_t p_stride;
  const float* z;  // (T, E) router_logits
  int64_t z_stride;
  const float* bias;      // (E) or null
  const int32_t* replay;  // (T, K) or null
  int64_t replay_stride;
  int64_t T;
  int E, K;
  RouterScoring scoring;
  bool normalize;
  float scaling;
  int n_group, topk_group;
};

// The CPU's ranks_before: larger first, lower index on ties, NaN after every
// number (NaNs among themselves by index). A strict total order on distinct
// indices, so the k best are one set in one order however they are found.
LS_DEVICE inline bool ranks_before(float va, int32_t a, float vb, int32_t b) {
  const bool na = num::is_nan(va), nb = num::is_nan(vb);
  if (na || nb) return (!na && nb) || (na && nb && a < b);
  return va > vb || (va == vb && a < b);
}

// The candidate max_reduce's scalar loop keeps: m = (x > m || isnan(x)) ? x : m
// from m = x[0] ends at the last NaN if there is one, else at the first
// element equal to the maximum (+0 and -0 compare equal). This order picks the
// same element from any partition of the indices.
LS_DEVICE inline bool max_wins(float va, int32_t a, float vb, int32_t b) {
  const bool na = num::is_nan(va), nb = num::is_nan(vb);
  if (na || nb) return na && (!nb || a > b);
  return va > vb || (va == vb && a < b);
}

// The selection value p + bias (the CPU's Scratch::choice), recomputed where
// needed: the same single add each time.
LS_DEVICE inline float choice(const RouteArgs& a, const float* p, int32_t e) {
  return a.bias ? ls_add(p[e], a.bias[e]) : p[e];
}

// Canonical sum of x[0..n) (kernels/cpu/simd.h): lane j, one thread's chain
// over elements j, j+16, ... from 0, then the fixed tree by thread 0, result
// in out[0]. Ends with a barrier, so every thread may read out[0].
LS_DEVICE void block_canonical_sum(const float* x, int n, float* lanes, float* out, float add_after) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (int j = tid; j < num::kLanes; j += nt) {
    float acc = 0.0f;
    for (int i = j; i < n; i += num::kLanes) acc = ls_add(acc, x[i]);
    lanes[j] = acc;
  }
  __syncthreads();
  if (tid == 0) out[0] = ls_add(num::tree16(lanes), add_after);
  __syncthreads();
}

// p = softmax(z) as the CPU's score_token: m = max_reduce(z), p = exp(z - m),
// p / canonical_sum(p). part_v / part_i: one max candidate per thread.
LS_DEVICE void softmax_row(const RouteArgs& a, const float* z, float* p, float* part_v, int32_t* part_i,
                           float* lanes, float* bcast) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float bv = 0.0f;
  int32_t bi = -1;  // no element yet
  for (int e = tid; e < a.E; e += nt)
    if (bi < 0 || max_wins(z[e], e, bv, bi)) bv = z[e], bi = e;
  part_v[tid] = bv;
  part_i[tid] = bi;
  __syncthreads();
  if (tid == 0) {
    float m = part_v[0];
    int32_t mi = part_i[0];  // thread 0 holds element 0 (E >= 1)
    for (int j = 1; j < nt; ++j)
      if (part_i[j] >= 0 && max_wins(part_v[j], part_i[j], m, mi)) m = part_v[j], mi = part_i[j];
    bcast[0] = m;
  }
  __syncthreads();
  const float m = bcast[0];
  for (int e = tid; e < a.E; e += nt) p[e] = num::exp(ls_sub(z[e], m));
  __syncthreads();
  block_canonical_sum(p, a.E, lanes, bcast, 0.0f);
  const float sum = bcast[0];
  for (int e = tid; e < a.E; e += nt) p[e] = ls_div(p[e], sum);
  __syncthreads();
}

// p = scores of one token (scores row), as score_token.
LS_DEVICE void score_row(const RouteArgs& a, const float* z, float* p, float* part_v, int32_t* part_i,
                         float* lanes, float* bcast) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  if (a.scoring == RouterScoring::Softmax) {
    softmax_row(a, z, p, part_v, part_i, lanes, bcast);
    return;
  }
  for (int e = tid; e < a.E; e += nt) {
    const float x = z[e];
    if (a.scoring == RouterScoring::Sigmoid) {
      p[e] = num::sigmoid(x);
    } else {
      // sqrt(softplus(x)): x past 20, else log(1 + exp(x)).
      const float sp = x > kSoftplusLinear ? x : num::log(ls_add(1.0f, num::exp(x)));
      p[e] = ls_sqrt(sp);
    }
  }
  __syncthreads();
}

// Writes idx[rank] = e for every expert among the K best allowed ones (rank:
// how many allowed experts rank before e). group_ok: null, or per group.
LS_DEVICE void select_ranked(const RouteArgs& a, const float* p, const int32_t* group_ok, int group_size,
                             int32_t* idx) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (int32_t e = tid; e < a.E; e += nt) {
    if (group_ok && !group_ok[e / group_size]) continue;
    const float ve = choice(a, p, e);
    int rank = 0;
    for (int32_t f = 0; f < a.E && rank < a.K; ++f) {
      if (f == e || (group_ok && !group_ok[f / group_size])) continue;
      if (ranks_before(choice(a, p, f), f, ve, e)) ++rank;
    }
    if (rank < a.K) idx[rank] = e;
  }
}

// select_token's group-limited path: a group's score is the sum of its two
// best selection values (best first; its best alone for one-expert groups),
// the topk_group best groups are allowed. Fills group_ok (G).
LS_DEVICE void allow_groups(const RouteArgs& a, const float* p, float* group_score, int32_t* group_ok) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const int G = a.n_group, size = a.E / G;
  for (int g = tid; g < G; g += nt) {
    int32_t b0 = -1, b1 = -1;
    float v0 = 0.0f, v1 = 0.0f;
    for (int32_t e = g * size; e < (g + 1) * size; ++e) {
      const float ve = choice(a, p, e);
      if (b0 < 0 || ranks_before(ve, e, v0, b0)) {
        b1 = b0, v1 = v0;
        b0 = e, v0 = ve;
      } else if (b1 < 0 || ranks_before(ve, e, v1, b1)) {
        b1 = e, v1 = ve;
      }
    }
    group_score[g] = size >= 2 ? ls_add(v0, v1) : v0;
  }
  __syncthreads();
  for (int g = tid; g < G; g += nt) {
    int rank = 0;
    for (int h = 0; h < G && rank < a.topk_group; ++h)
      if (h != g && ranks_before(group_score[h], h, group_score[g], g)) ++rank;
    group_ok[g] = rank < a.topk_group ? 1 : 0;
  }
  __syncthreads();
}

// topk_w row: w[s] = p[idx[s]], / (canonical_sum(w) + 1e-20) if normalize,
// * routed_scaling.
LS_DEVICE void weights_row(const RouteArgs& a, const float* p, const int32_t* idx, float* w, float* lanes,
                           float* bcast) {
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (int s = tid; s < a.K; s += nt) w[s] = p[idx[s]];
  __syncthreads();
  if (a.normalize) {
    block_canonical_sum(w, a.K, lanes, bcast, kNormEps);
    const float denom = bcast[0];
    for (int s = tid; s < a.K; s += nt) w[s] = ls_mul(ls_div(w[s], denom), a.scaling);
  } else {
    for (int s = tid; s < a.K; s += nt) w[s] = ls_mul(w[s], a.scaling);
  }
}

// One block per token at a time; every branch below depends only on the
// arguments, so all threads of a block meet the same barriers.
LS_GLOBAL void moe_route_kernel(RouteArgs a) {
  LS_SHARED(float, lanes, num::kLanes);            // canonical-sum lanes
  LS_SHARED(float, bcast, 1);                      // max / sum / normalizer for every thread
  LS_SHARED(float, part_v, kRouteMaxThreads);      // per-thread max candidate
  LS_SHARED(int32_t, part_i, kRouteMaxThreads);    // its index (-1: none)
  LS_SHARED(float, group_score, kRouteMaxGroups);  // (G)
  LS_SHARED(int32_t, group_ok, kRouteMaxGroups);   // (G) 1 where allowed
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    float* p = a.p + t * a.p_stride;          // (E)
    int32_t* idx = a.idx + t * a.idx_stride;  // (K)
    score_row(a, a.z + t * a.z_stride, p, part_v, part_i, lanes, bcast);
    if (a.replay) {
      for (int s = tid; s < a.K; s += nt) idx[s] = a.replay[t * a.replay_stride + s];
    } else if (a.n_group <= 1) {
      select_ranked(a, p, nullptr, 1, idx);
    } else {
      allow_groups(a, p, group_score, group_ok);
      select_ranked(a, p, group_ok, a.E / a.n_group, idx);
    }
    __syncthreads();
    weights_row(a, p, idx, a.w + t * a.w_stride, lanes, bcast);
    __syncthreads();  // shared arrays are reused by the next token
  }
}

// ---- the dispatch plan on the device ------------------------------------------

// The plan's row_of (T*K) in device memory for one entry call (emulated device
// memory in interpret mode, so its reads are bounds-checked too), freed at
// scope end, after the launch that reads it (the free synchronises).
class DeviceRowOf {
 public:
  explicit DeviceRowOf(const std::vector<int32_t>& row_of) {
    const size_t bytes = std::max<size_t>(row_of.size(), 1) * sizeof(int32_t);
#if defined(LOCKSTEP_GPU_INTERP)
    dev_ = ::lockstep::gpu::emu::device_alloc(bytes, "moe dispatch plan row_of");
    ::lockstep::gpu::emu::copy_to_device(dev_, row_of.data(), row_of.size() * sizeof(int32_t));
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(&dev_, bytes) == cudaSuccess) << "moe: cannot allocate the dispatch plan on the device";
    LS_CHECK(cudaMemcpy(dev_, row_of.data(), row_of.size() * sizeof(int32_t), cudaMemcpyHostToDevice) ==
             cudaSuccess)
        << "moe: cannot copy the dispatch plan to the device";
#else
    LS_CHECK(hipMalloc(&dev_, bytes) == hipSuccess) << "moe: cannot allocate the dispatch plan on the device";
    LS_CHECK(hipMemcpy(dev_, row_of.data(), row_of.size() * sizeof(int32_t), hipMemcpyHostToDevice) == hipSuccess)
        << "moe: cannot copy the dispatch plan to the device";
#endif
  }
  ~DeviceRowOf() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(dev_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(dev_);
#else
    (void)hipFree(dev_);
#endif
  }
  DeviceRowOf(const DeviceRowOf&) = delete;
  DeviceRowOf& operator=(const DeviceRowOf&) = delete;
  const int32_t* get() const { return static_cast<const int32_t*>(dev_); }

 private:
  void* dev_ = nullptr;
};

// ---- gather and combine -------------------------------------------------------

// xe[row_of[q]] = x[q / K] for the rows q = (t, s) of this block; U is an
// unsigned type of the element's size, so the copy is bit for bit.
template <typename U>
LS_GLOBAL void moe_gather_kernel(U* xe, int64_t xe_stride, const U* x, int64_t x_stride, const int32_t* row_of,
                                 int64_t R, int K, int64_t D, int rows_per_block) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  for (int j = 0; j < rows_per_block; ++j) {
    const int64_t q = first + j;
    if (q >= R) return;
    const U* src = x + (q / K) * x_stride;         // (D)
    U* dst = xe + int64_t{row_of[q]} * xe_stride;  // (D)
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = src[d];
  }
}

// y[t, d] = fma chain over the slots s = 0..K-1 of w[t, s] * ye[row_of(t, s), d]
// from 0, one chain per output (the CPU's loop, slot order).
LS_GLOBAL void moe_combine_kernel(float* y, int64_t y_stride, const float* ye, int64_t ye_stride,
                                  const float* w, int64_t w_stride, const int32_t* row_of, int64_t T, int K,
                                  int64_t D, int rows_per_block) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  for (int j = 0; j < rows_per_block; ++j) {
    const int64_t t = first + j;
    if (t >= T) return;
    const float* wt = w + t * w_stride;    // (K)
    const int32_t* rows = row_of + t * K;  // (K)
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
      for (int s = 0; s < K; ++s) acc = ls_fma(wt[s], ye[int64_t{rows[s]} * ye_stride + d], acc);
      y[t * y_stride + d] = acc;
    }
  }
}

// ---- backward -------------------------------------------------------------------

// One moe_route_backward call's operands: device pointers, row strides in elements.
struct RouteBackwardArgs {
  float* dz;  // (T, E) dlogits
  int64_t dz_stride;
  const float* g;  // (T, K) dtopk_w
  int64_t g_stride;
  const float* p;  // (T, E) scores
  int64_t p_stride;
  const int32_t* idx;  // (T, K) topk_idx, validated on the host
  int64_t idx_stride;
  int64_t T;
  int E, K;
  RouterScoring scoring;
  bool normalize;
  float scaling;
};

// The CPU's sqrt_softplus_grad: dp/dx of p = sqrt(softplus(x)) from p alone,
// sigmoid(x) / (2p) with sigmoid(x) = 1 - exp(-p^2), small sigmoids through
// (1 - u) * (s / -log(u)); 0 where p == 0.
LS_DEVICE inline float sqrt_softplus_grad(float p) {
  if (p == 0.0f) return 0.0f;
  const float s = ls_mul(p, p);
  const float u = num::exp(-s);
  float sig;
  if (u <= 0.5f) {
    sig = ls_sub(1.0f, u);
  } else if (u == 1.0f) {
    sig = s;
  } else {
    sig = ls_mul(ls_sub(1.0f, u), ls_div(s, -num::log(u)));
  }
  return ls_div(sig, ls_mul(2.0f, p));
}

// dL/dp of expert e for one token: the CPU fills dp with 0 and adds each
// slot's term into dp[idx[s]] in slot order, so an expert listed twice gets
// (0 + t_a) + t_b, and an unselected one +0. term: scale * (g - q) when
// normalizing, else routed_scaling * g.
LS_DEVICE inline float dp_of(const RouteBackwardArgs& a, const int32_t* idx, const float* g, int32_t e, float scale,
                             float q) {
  float acc = 0.0f;
  for (int s = 0; s < a.K; ++s) {
    if (idx[s] != e) continue;
    const float term = a.normalize ? ls_mul(scale, ls_sub(g[s], q)) : ls_mul(a.scaling, g[s]);
    acc = ls_add(acc, term);
  }
  return acc;
}

// One block per token at a time, its threads splitting the experts. Every
// thread recomputes the normalizer terms (O(K), the CPU's canonical sum and
// dot over the selected scores) instead of sharing them; the softmax's
// canonical_dot(p, dp, E) is one lane chain per thread j < 16, then the tree.
LS_GLOBAL void moe_route_backward_kernel(RouteBackwardArgs a) {
  LS_SHARED(float, lanes, num::kLanes);  // canonical-dot lanes
  LS_SHARED(float, bcast, 1);            // the softmax's dot for every thread
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    const float* p = a.p + t * a.p_stride;          // (E)
    const int32_t* idx = a.idx + t * a.idx_stride;  // (K)
    const float* g = a.g + t * a.g_stride;          // (K)
    float* dz = a.dz + t * a.dz_stride;             // (E)
    float scale = 0.0f, q = 0.0f;
    if (a.normalize) {
      num::Lanes16 sum, dot;
      for (int s = 0; s < a.K; ++s) sum.add(s, p[idx[s]]);
      for (int s = 0; s < a.K; ++s) dot.fma(s, g[s], p[idx[s]]);
      const float denom = ls_add(sum.reduce(), kNormEps);
      q = ls_div(dot.reduce(), denom);
      scale = ls_div(a.scaling, denom);
    }
    if (a.scoring == RouterScoring::Softmax) {
      // dz_j = p_j (dp_j - sum_k p_k dp_k)
      for (int j = tid; j < num::kLanes; j += nt) {
        float acc = 0.0f;
        for (int32_t e = j; e < a.E; e += num::kLanes) acc = ls_fma(p[e], dp_of(a, idx, g, e, scale, q), acc);
        lanes[j] = acc;
      }
      __syncthreads();
      if (tid == 0) bcast[0] = num::tree16(lanes);
      __syncthreads();
      const float dot = bcast[0];
      for (int32_t e = tid; e < a.E; e += nt) dz[e] = ls_mul(p[e], ls_sub(dp_of(a, idx, g, e, scale, q), dot));
      __syncthreads();  // lanes and bcast are reused by the next token
    } else if (a.scoring == RouterScoring::Sigmoid) {
      // dz_j = dp_j p_j (1 - p_j)
      for (int32_t e = tid; e < a.E; e += nt)
        dz[e] = ls_mul(dp_of(a, idx, g, e, scale, q), ls_mul(p[e], ls_sub(1.0f, p[e])));
    } else {
      // dz_j = dp_j sigmoid(z_j) / (2 p_j)
      for (int32_t e = tid; e < a.E; e += nt)
        dz[e] = ls_mul(dp_of(a, idx, g, e, scale, q), sqrt_softplus_grad(p[e]));
    }
  }
}

// dx[t, d] += (0 + dxe[row_of(t, 0), d] + ... + dxe[row_of(t, K-1), d]): the
// slots summed first, in slot order, then added once (the CPU's loop).
LS_GLOBAL void moe_gather_backward_kernel(float* dx, int64_t dx_stride, const float* dxe, int64_t dxe_stride,
                                          const int32_t* row_of, int64_t T, int K, int64_t D, int rows_per_block) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  for (int j = 0; j < rows_per_block; ++j) {
    const int64_t t = first + j;
    if (t >= T) return;
    const int32_t* rows = row_of + t * K;  // (K)
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float acc = 0.0f;
      for (int s = 0; s < K; ++s) acc = ls_add(acc, dxe[int64_t{rows[s]} * dxe_stride + d]);
      dx[t * dx_stride + d] = ls_add(dx[t * dx_stride + d], acc);
    }
  }
}

// For the gathered rows q = (t, s) of this block, r = row_of[q]:
// dye[r] = w[t, s] * dy[t] (one multiply), dtopk_w[t, s] = canonical_dot(dy[t], ye[r], D)
// (lane chains by threads j < 16, the tree by thread 0). The row index
// depends on the block only, so the whole block leaves the loop together.
LS_GLOBAL void moe_combine_backward_kernel(float* dye, int64_t dye_stride, float* dw, int64_t dw_stride,
                                           const float* dy, int64_t dy_stride, const float* ye, int64_t ye_stride,
                                           const float* w, int64_t w_stride, const int32_t* row_of, int64_t R,
                                           int K, int64_t D, int rows_per_block) {
  LS_SHARED(float, lanes, num::kLanes);  // canonical-dot lanes
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  for (int j = 0; j < rows_per_block; ++j) {
    const int64_t q = first + j;
    if (q >= R) return;
    const int64_t t = q / K, s = q % K, r = row_of[q];
    const float ws = w[t * w_stride + s];
    const float* g = dy + t * dy_stride;    // (D)
    const float* src = ye + r * ye_stride;  // (D)
    float* dst = dye + r * dye_stride;      // (D)
    for (int64_t d = tid; d < D; d += nt) dst[d] = ls_mul(ws, g[d]);
    for (int l = tid; l < num::kLanes; l += nt) {
      float acc = 0.0f;
      for (int64_t d = l; d < D; d += num::kLanes) acc = ls_fma(g[d], src[d], acc);
      lanes[l] = acc;
    }
    __syncthreads();
    if (tid == 0) dw[t * dw_stride + s] = num::tree16(lanes);
    __syncthreads();  // lanes are reused by the next row
  }
}

void check_rows_launch(const MoeRowsLaunch& launch, const char* what) {
  LS_CHECK(launch.threads >= 1 && launch.rows_per_block >= 1)
      << what << ": bad launch (" << launch.threads << " threads, " << launch.rows_per_block << " rows per block)";
}

template <typename U>
void launch_gather(const Context& ctx, Tensor xe, const Tensor& x, const int32_t* row_of, int64_t R, int K,
                   int64_t D, const MoeRowsLaunch& launch) {
  LS_LAUNCH(ctx, moe_gather_kernel<U>, dim3(blocks_for(R, launch.rows_per_block)),
            dim3(static_cast<unsigned>(launch.threads)))
  (static_cast<U*>(xe.data), xe.stride[0], static_cast<const U*>(x.data), x.stride[0], row_of, R, K, D,
   launch.rows_per_block);
}

}  // namespace

void moe_route(const Context& ctx, Tensor topk_idx, Tensor topk_w, Tensor scores, const Tensor& router_logits,
               const Tensor& bias, const Tensor& replay_idx, const RouterConfig& cfg, const MoeRouteLaunch& launch) {
  check_moe_route_args(topk_idx, topk_w, scores, router_logits, bias, replay_idx, cfg);
  LS_CHECK(launch.threads >= 1 && launch.threads <= kRouteMaxThreads && launch.max_blocks >= 0)
      << "moe_route: bad launch (" << launch.threads << " threads, max " << kRouteMaxThreads << "; max_blocks "
      << launch.max_blocks << ")";
  if (cfg.n_group > kRouteMaxGroups)
    LS_THROW << "moe_route: n_group=" << cfg.n_group << " exceeds the GPU router's " << kRouteMaxGroups << " groups";
  const int64_t T = router_logits.shape[0];
  if (T == 0) return;
  const bool replay = replay_idx.ndim != 0;
  RouteArgs a{};
  a.idx = topk_idx.i32();
  a.idx_stride = topk_idx.stride[0];
  a.w = topk_w.f32();
  a.w_stride = topk_w.stride[0];
  a.p = scores.f32();
  a.p_stride = scores.stride[0];
  a.z = router_logits.f32();
  a.z_stride = router_logits.stride[0];
  a.bias = bias.ndim != 0 ? bias.f32() : nullptr;
  a.replay = replay ? replay_idx.i32() : nullptr;
  a.replay_stride = replay ? replay_idx.stride[0] : 0;
  a.T = T;
  a.E = cfg.num_experts;
  a.K = cfg.top_k;
  a.scoring = cfg.scoring;
  a.normalize = cfg.normalize;
  a.scaling = cfg.routed_scaling;
  a.n_group = cfg.n_group;
  a.topk_group = cfg.topk_group;
  const int64_t blocks = launch.max_blocks > 0 && launch.max_blocks < T ? launch.max_blocks : T;
  LS_LAUNCH(ctx, moe_route_kernel, dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(launch.threads)))
  (a);
}

void moe_gather(const Context& ctx, Tensor xe, const Tensor& x, const MoeDispatch& plan,
                const MoeRowsLaunch& launch) {
  check_moe_gather_args(xe, x, plan);
  check_rows_launch(launch, "moe_gather");
  const int64_t R = plan.num_rows(), D = x.shape[1];
  if (R == 0 || D == 0) return;
  const DeviceRowOf row_of(plan.row_of);
  switch (dtype_size(x.dtype)) {
    case 1:
      launch_gather<uint8_t>(ctx, xe, x, row_of.get(), R, plan.top_k, D, launch);
      break;
    case 2:
      launch_gather<uint16_t>(ctx, xe, x, row_of.get(), R, plan.top_k, D, launch);
      break;
    case 4:
      launch_gather<uint32_t>(ctx, xe, x, row_of.get(), R, plan.top_k, D, launch);
      break;
    default:
      LS_THROW << "moe_gather: no GPU copy for " << dtype_name(x.dtype) << " elements";
  }
}

void moe_combine(const Context& ctx, Tensor y, const Tensor& ye, const Tensor& topk_w, const MoeDispatch& plan,
                 const MoeRowsLaunch& launch) {
  check_moe_combine_args(y, ye, topk_w, plan);
  check_rows_launch(launch, "moe_combine");
  const int64_t T = plan.num_tokens, D = ye.shape[1];
  if (T == 0 || D == 0) return;
  const DeviceRowOf row_of(plan.row_of);
  LS_LAUNCH(ctx, moe_combine_kernel, dim3(blocks_for(T, launch.rows_per_block)),
            dim3(static_cast<unsigned>(launch.threads)))
  (y.f32(), y.stride[0], ye.f32(), ye.stride[0], topk_w.f32(), topk_w.stride[0], row_of.get(), T, plan.top_k, D,
   launch.rows_per_block);
}

void moe_route_backward(const Context& ctx, Tensor dlogits, const Tensor& dtopk_w, const Tensor& scores,
                        const Tensor& topk_idx, const RouterConfig& cfg, const MoeRouteLaunch& launch) {
  check_moe_route_backward_args(dlogits, dtopk_w, scores, topk_idx, cfg);
  LS_CHECK(launch.threads >= 1 && launch.threads <= kRouteMaxThreads && launch.max_blocks >= 0)
      << "moe_route_backward: bad launch (" << launch.threads << " threads, max " << kRouteMaxThreads
      << "; max_blocks " << launch.max_blocks << ")";
  const int64_t T = scores.shape[0];
  if (T == 0) return;
  RouteBackwardArgs a{};
  a.dz = dlogits.f32();
  a.dz_stride = dlogits.stride[0];
  a.g = dtopk_w.f32();
  a.g_stride = dtopk_w.stride[0];
  a.p = scores.f32();
  a.p_stride = scores.stride[0];
  a.idx = topk_idx.i32();
  a.idx_stride = topk_idx.stride[0];
  a.T = T;
  a.E = cfg.num_experts;
  a.K = cfg.top_k;
  a.scoring = cfg.scoring;
  a.normalize = cfg.normalize;
  a.scaling = cfg.routed_scaling;
  const int64_t blocks = launch.max_blocks > 0 && launch.max_blocks < T ? launch.max_blocks : T;
  LS_LAUNCH(ctx, moe_route_backward_kernel, dim3(static_cast<unsigned>(blocks)),
            dim3(static_cast<unsigned>(launch.threads)))
  (a);
}

void moe_gather_backward(const Context& ctx, Tensor dx, const Tensor& dxe, const MoeDispatch& plan,
                         const MoeRowsLaunch& launch) {
  check_moe_gather_backward_args(dx, dxe, plan);
  check_rows_launch(launch, "moe_gather_backward");
  const int64_t T = plan.num_tokens, D = dxe.shape[1];
  if (T == 0 || D == 0) return;
  const DeviceRowOf row_of(plan.row_of);
  LS_LAUNCH(ctx, moe_gather_backward_kernel, dim3(blocks_for(T, launch.rows_per_block)),
            dim3(static_cast<unsigned>(launch.threads)))
  (dx.f32(), dx.stride[0], dxe.f32(), dxe.stride[0], row_of.get(), T, plan.top_k, D, launch.rows_per_block);
}

void moe_combine_backward(const Context& ctx, Tensor dye, Tensor dtopk_w, const Tensor& dy, const Tensor& ye,
                          const Tensor& topk_w, const MoeDispatch& plan, const MoeRowsLaunch& launch) {
  check_moe_combine_backward_args(dye, dtopk_w, dy, ye, topk_w, plan);
  check_rows_launch(launch, "moe_combine_backward");
  const int64_t R = plan.num_rows(), D = ye.shape[1];
  if (R == 0) return;  // D == 0 still writes dtopk_w = 0, as the CPU does
  const DeviceRowOf row_of(plan.row_of);
  LS_LAUNCH(ctx, moe_combine_backward_kernel, dim3(blocks_for(R, launch.rows_per_block)),
            dim3(static_cast<unsigned>(launch.threads)))
  (dye.f32(), dye.stride[0], dtopk_w.f32(), dtopk_w.stride[0], dy.f32(), dy.stride[0], ye.f32(), ye.stride[0],
   topk_w.f32(), topk_w.stride[0], row_of.get(), R, plan.top_k, D, launch.rows_per_block);
}

namespace {

void moe_route_entry(const Context& ctx, Tensor topk_idx, Tensor topk_w, Tensor scores, const Tensor& router_logits,
                     const Tensor& bias, const Tensor& replay_idx, const RouterConfig& cfg) {
  moe_route(ctx, topk_idx, topk_w, scores, router_logits, bias, replay_idx, cfg, MoeRouteLaunch{});
}

void moe_gather_entry(const Context& ctx, Tensor xe, const Tensor& x, const MoeDispatch& plan) {
  moe_gather(ctx, xe, x, plan, MoeRowsLaunch{});
}

void moe_combine_entry(const Context& ctx, Tensor y, const Tensor& ye, const Tensor& topk_w,
                       const MoeDispatch& plan) {
  moe_combine(ctx, y, ye, topk_w, plan, MoeRowsLaunch{});
}

void moe_route_backward_entry(const Context& ctx, Tensor dlogits, const Tensor& dtopk_w, const Tensor& scores,
                              const Tensor& topk_idx, const RouterConfig& cfg) {
  moe_route_backward(ctx, dlogits, dtopk_w, scores, topk_idx, cfg, MoeRouteLaunch{});
}

void moe_gather_backward_entry(const Context& ctx, Tensor dx, const Tensor& dxe, const MoeDispatch& plan) {
  moe_gather_backward(ctx, dx, dxe, plan, MoeRowsLaunch{});
}

void moe_combine_backward_entry(const Context& ctx, Tensor dye, Tensor dtopk_w, const Tensor& dy, const Tensor& ye,
                                const Tensor& topk_w, const MoeDispatch& plan) {
  moe_combine_backward(ctx, dye, dtopk_w, dy, ye, topk_w, plan, MoeRowsLaunch{});
}

}  // namespace

void register_moe(GpuBackend& b) {
  b.moe_route = moe_route_entry;
  b.moe_gather = moe_gather_entry;
  b.moe_combine = moe_combine_entry;
  b.moe_route_backward = moe_route_backward_entry;
  b.moe_gather_backward = moe_gather_backward_entry;
  b.moe_combine_backward = moe_combine_backward_entry;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
