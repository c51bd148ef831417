// MoE dispatch and combine: the dispatch handle (rows grouped by expert, in
// token order), gather of token rows to expert rows, the weighted combine back
// to tokens, their backward passes, the DeepSeek-V4 pair (routing weight on
// the expert rows, then an unweighted sum), and the top-k disagreement metric.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

// Tokens per thread range: each token moves K rows of D values.
constexpr int64_t kTokenGrain = 4;
// Rows per thread range for the row-wise kernels (a row is one (token, slot)).
constexpr int64_t kRowGrain = 16;

// 2-D operands: unit column stride, row stride at least the width.
void check_rows(const Tensor& t, const char* what) {
  if ((t.shape[1] > 1 && t.stride[1] != 1) || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must be dense with row stride >= width, got " << t.shape_str() << " strides ("
             << t.stride[0] << ", " << t.stride[1] << ")";
}

void check_f32_rows(const Tensor& t, std::initializer_list<int64_t> shape, const char* what) {
  check_dtype(t, DType::F32, what);
  check_shape(t, shape, what);
  check_rows(t, what);
}

template <typename T>
T* row(const Tensor& t, int64_t r) {
  return static_cast<T*>(t.data) + r * t.stride[0];
}

void check_plan(const MoeDispatch& plan, const char* what) {
  const int64_t R = plan.num_rows();
  LS_CHECK(plan.num_experts >= 1 && plan.top_k >= 1 && plan.offsets.size() == static_cast<size_t>(plan.num_experts) + 1 &&
           plan.row_of.size() == static_cast<size_t>(R) && plan.token.size() == static_cast<size_t>(R))
      << what << ": dispatch handle is not from moe_plan (E=" << plan.num_experts << ", K=" << plan.top_k
      << ", T=" << plan.num_tokens << ")";
}

}  // namespace

MoeDispatch moe_plan(const Tensor& topk_idx_in, int num_experts) {
  check_dtype(topk_idx_in, DType::I32, "moe_plan: topk_idx");
  check_shape(topk_idx_in, {-1, -1}, "moe_plan: topk_idx");
  check_rows(topk_idx_in, "moe_plan: topk_idx");
  // The plan is host code: the routing's indices come out of device memory
  // by a copy (T x K int32, small) where the host cannot read them.
  std::vector<unsigned char> keep;
  const Tensor topk_idx = host_readable(topk_idx_in, keep);
  if (num_experts < 1) LS_THROW << "moe_plan: num_experts must be >= 1, got " << num_experts;
  const int64_t T = topk_idx.shape[0], K = topk_idx.shape[1];
  if (K < 1) LS_THROW << "moe_plan: topk_idx must have at least one slot, got " << topk_idx.shape_str();
  if (T * K > std::numeric_limits<int32_t>::max())
    LS_THROW << "moe_plan: " << T << " tokens x " << K << " slots exceed the i32 row index";

  MoeDispatch plan;
  plan.num_experts = num_experts;
  plan.top_k = static_cast<int>(K);
  plan.num_tokens = T;
  const size_t R = static_cast<size_t>(T * K);
  plan.offsets.assign(static_cast<size_t>(num_experts) + 1, 0);
  plan.token.resize(R);
  plan.slot.resize(R);
  plan.expert.resize(R);
  plan.row_of.resize(R);

  // Counting sort by expert; visiting (t, s) in order keeps each expert's rows
  // in token order, so the handle is a pure function of topk_idx.
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* r = row<const int32_t>(topk_idx, t);
    for (int64_t s = 0; s < K; ++s) {
      if (r[s] < 0 || r[s] >= num_experts)
        LS_THROW << "moe_plan: token " << t << " slot " << s << " has expert index " << r[s] << ", not in [0, "
                 << num_experts << ")";
      ++plan.offsets[static_cast<size_t>(r[s]) + 1];
    }
  }
  for (int e = 0; e < num_experts; ++e) plan.offsets[static_cast<size_t>(e) + 1] += plan.offsets[static_cast<size_t>(e)];
  std::vector<int64_t> next(plan.offsets.begin(), plan.offsets.end() - 1);  // (E) next free row per expert
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* r = row<const int32_t>(topk_idx, t);
    for (int64_t s = 0; s < K; ++s) {
      const int64_t dst = next[static_cast<size_t>(r[s])]++;
      plan.token[static_cast<size_t>(dst)] = static_cast<int32_t>(t);
      plan.slot[static_cast<size_t>(dst)] = static_cast<int32_t>(s);
      plan.expert[static_cast<size_t>(dst)] = r[s];
      plan.row_of[static_cast<size_t>(t * K + s)] = static_cast<int32_t>(dst);
    }
  }
  return plan;
}

void check_moe_gather_args(const Tensor& xe, const Tensor& x, const MoeDispatch& plan) {
  check_plan(plan, "moe_gather");
  const int64_t T = plan.num_tokens, K = plan.top_k;
  check_shape(x, {T, -1}, "moe_gather: x");
  check_rows(x, "moe_gather: x");
  const int64_t D = x.shape[1];
  check_dtype(xe, x.dtype, "moe_gather: xe");
  check_shape(xe, {T * K, D}, "moe_gather: xe");
  check_rows(xe, "moe_gather: xe");
}

void moe_gather(const Context& ctx, Tensor xe, const Tensor& x, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_gather, xe, x, plan);
  check_moe_gather_args(xe, x, plan);
  const int64_t T = plan.num_tokens, K = plan.top_k;
  const int64_t D = x.shape[1];
  const size_t esize = dtype_size(x.dtype);
  const size_t row_bytes = static_cast<size_t>(D) * esize;
  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const char* src = static_cast<const char*>(x.data) + static_cast<size_t>(t * x.stride[0]) * esize;
          for (int64_t s = 0; s < K; ++s) {
            const int64_t r = plan.row_of[static_cast<size_t>(t * K + s)];
            std::memcpy(static_cast<char*>(xe.data) + static_cast<size_t>(r * xe.stride[0]) * esize, src, row_bytes);
          }
        }
      },
      kTokenGrain);
}

void check_moe_combine_args(const Tensor& y, const Tensor& ye, const Tensor& topk_w, const MoeDispatch& plan) {
  check_plan(plan, "moe_combine");
  const int64_t T = plan.num_tokens, K = plan.top_k;
  check_f32_rows(ye, {T * K, -1}, "moe_combine: ye");
  const int64_t D = ye.shape[1];
  check_f32_rows(y, {T, D}, "moe_combine: y");
  check_f32_rows(topk_w, {T, K}, "moe_combine: topk_w");
}

void moe_combine(const Context& ctx, Tensor y, const Tensor& ye, const Tensor& topk_w, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_combine, y, ye, topk_w, plan);
  check_moe_combine_args(y, ye, topk_w, plan);
  const int64_t T = plan.num_tokens, K = plan.top_k;
  const int64_t D = ye.shape[1];
  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* out = row<float>(y, t);  // (D)
          const float* w = row<const float>(topk_w, t);
          std::fill(out, out + D, 0.0f);
          for (int64_t s = 0; s < K; ++s) {
            const float* src = row<const float>(ye, plan.row_of[static_cast<size_t>(t * K + s)]);  // (D)
            const float ws = w[s];
            for (int64_t d = 0; d < D; ++d) out[d] = std::fma(ws, src[d], out[d]);
          }
        }
      },
      kTokenGrain);
}

void check_moe_combine_backward_args(const Tensor& dye, const Tensor& dtopk_w, const Tensor& dy, const Tensor& ye,
                                     const Tensor& topk_w, const MoeDispatch& plan) {
  check_plan(plan, "moe_combine_backward");
  const int64_t T = plan.num_tokens, K = plan.top_k;
  check_f32_rows(ye, {T * K, -1}, "moe_combine_backward: ye");
  const int64_t D = ye.shape[1];
  check_f32_rows(dye, {T * K, D}, "moe_combine_backward: dye");
  check_f32_rows(dtopk_w, {T, K}, "moe_combine_backward: dtopk_w");
  check_f32_rows(dy, {T, D}, "moe_combine_backward: dy");
  check_f32_rows(topk_w, {T, K}, "moe_combine_backward: topk_w");
}

void moe_combine_backward(const Context& ctx, Tensor dye, Tensor dtopk_w, const Tensor& dy, const Tensor& ye,
                          const Tensor& topk_w, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_combine_backward, dye, dtopk_w, dy, ye, topk_w, plan);
  check_moe_combine_backward_args(dye, dtopk_w, dy, ye, topk_w, plan);
  const int64_t T = plan.num_tokens, K = plan.top_k;
  const int64_t D = ye.shape[1];
  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const float* g = row<const float>(dy, t);  // (D)
          const float* w = row<const float>(topk_w, t);
          float* dw = row<float>(dtopk_w, t);
          for (int64_t s = 0; s < K; ++s) {
            const int64_t r = plan.row_of[static_cast<size_t>(t * K + s)];
            float* dst = row<float>(dye, r);  // (D)
            const float ws = w[s];
            for (int64_t d = 0; d < D; ++d) dst[d] = ws * g[d];
            dw[s] = canonical_dot(g, row<const float>(ye, r), D);
          }
        }
      },
      kTokenGrain);
}

void check_moe_gather_backward_args(const Tensor& dx, const Tensor& dxe, const MoeDispatch& plan) {
  check_plan(plan, "moe_gather_backward");
  const int64_t T = plan.num_tokens, K = plan.top_k;
  check_f32_rows(dxe, {T * K, -1}, "moe_gather_backward: dxe");
  check_f32_rows(dx, {T, dxe.shape[1]}, "moe_gather_backward: dx");
}

void moe_gather_backward(const Context& ctx, Tensor dx, const Tensor& dxe, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_gather_backward, dx, dxe, plan);
  check_moe_gather_backward_args(dx, dxe, plan);
  const int64_t T = plan.num_tokens, K = plan.top_k;
  const int64_t D = dxe.shape[1];
  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        std::vector<float> acc(static_cast<size_t>(D));  // (D) the K slots' sum for one token
        for (int64_t t = begin; t < end; ++t) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t s = 0; s < K; ++s) {
            const float* src = row<const float>(dxe, plan.row_of[static_cast<size_t>(t * K + s)]);
            for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] = acc[static_cast<size_t>(d)] + src[d];
          }
          float* out = row<float>(dx, t);
          for (int64_t d = 0; d < D; ++d) out[d] = out[d] + acc[static_cast<size_t>(d)];
        }
      },
      kTokenGrain);
}

int64_t check_moe_scale_rows_args(const Tensor& y, const Tensor& x, const Tensor& topk_w,
                                  const MoeDispatch& plan) {
  check_plan(plan, "moe_scale_rows");
  const int64_t T = plan.num_tokens, K = plan.top_k, R = plan.num_rows();
  check_f32_rows(x, {R, -1}, "moe_scale_rows: x");
  const int64_t F = x.shape[1];
  check_f32_rows(y, {R, F}, "moe_scale_rows: y");
  check_f32_rows(topk_w, {T, K}, "moe_scale_rows: topk_w");
  return F;
}

void moe_scale_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& topk_w,
                    const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_scale_rows, y, x, topk_w, plan);
  const int64_t F = check_moe_scale_rows_args(y, x, topk_w, plan), R = plan.num_rows();
  // Rows, not tokens, split across threads: an expert's rows are contiguous.
  ctx.parallel_for(
      R,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const size_t i = static_cast<size_t>(r);
          const float w = row<const float>(topk_w, plan.token[i])[plan.slot[i]];
          const float* src = row<const float>(x, r);  // (F)
          float* dst = row<float>(y, r);              // (F), may be src
          for (int64_t f = 0; f < F; ++f) dst[f] = w * src[f];
        }
      },
      kRowGrain);
}

int64_t check_moe_scale_rows_backward_args(const Tensor& dx, const Tensor& dtopk_w, const Tensor& dy,
                                           const Tensor& x, const Tensor& topk_w, const MoeDispatch& plan) {
  check_plan(plan, "moe_scale_rows_backward");
  const int64_t T = plan.num_tokens, K = plan.top_k, R = plan.num_rows();
  check_f32_rows(x, {R, -1}, "moe_scale_rows_backward: x");
  const int64_t F = x.shape[1];
  check_f32_rows(dy, {R, F}, "moe_scale_rows_backward: dy");
  check_f32_rows(dx, {R, F}, "moe_scale_rows_backward: dx");
  check_f32_rows(topk_w, {T, K}, "moe_scale_rows_backward: topk_w");
  check_f32_rows(dtopk_w, {T, K}, "moe_scale_rows_backward: dtopk_w");
  return F;
}

void moe_scale_rows_backward(const Context& ctx, Tensor dx, Tensor dtopk_w, const Tensor& dy, const Tensor& x,
                             const Tensor& topk_w, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_scale_rows_backward, dx, dtopk_w, dy, x, topk_w, plan);
  const int64_t F = check_moe_scale_rows_backward_args(dx, dtopk_w, dy, x, topk_w, plan), R = plan.num_rows();
  // Each row is one (token, slot), so threads write distinct dtopk_w elements.
  ctx.parallel_for(
      R,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const size_t i = static_cast<size_t>(r);
          const float w = row<const float>(topk_w, plan.token[i])[plan.slot[i]];
          const float* g = row<const float>(dy, r);  // (F)
          // The dot reads dy before dx (which may be dy) is written.
          row<float>(dtopk_w, plan.token[i])[plan.slot[i]] = canonical_dot(g, row<const float>(x, r), F);
          float* dst = row<float>(dx, r);  // (F)
          for (int64_t f = 0; f < F; ++f) dst[f] = w * g[f];
        }
      },
      kRowGrain);
}

int64_t check_moe_sum_args(const Tensor& y, const Tensor& ye, const MoeDispatch& plan) {
  check_plan(plan, "moe_sum");
  const int64_t T = plan.num_tokens, K = plan.top_k;
  check_f32_rows(ye, {T * K, -1}, "moe_sum: ye");
  const int64_t D = ye.shape[1];
  check_f32_rows(y, {T, D}, "moe_sum: y");
  return D;
}

void moe_sum(const Context& ctx, Tensor y, const Tensor& ye, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_sum, y, ye, plan);
  const int64_t D = check_moe_sum_args(y, ye, plan), T = plan.num_tokens, K = plan.top_k;
  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* out = row<float>(y, t);  // (D)
          std::fill(out, out + D, 0.0f);
          for (int64_t s = 0; s < K; ++s) {
            const float* src = row<const float>(ye, plan.row_of[static_cast<size_t>(t * K + s)]);  // (D)
            for (int64_t d = 0; d < D; ++d) out[d] = out[d] + src[d];
          }
        }
      },
      kTokenGrain);
}

int64_t check_moe_sum_backward_args(const Tensor& dye, const Tensor& dy, const MoeDispatch& plan) {
  check_plan(plan, "moe_sum_backward");
  const int64_t T = plan.num_tokens, K = plan.top_k;
  check_f32_rows(dy, {T, -1}, "moe_sum_backward: dy");
  const int64_t D = dy.shape[1];
  check_f32_rows(dye, {T * K, D}, "moe_sum_backward: dye");
  return D;
}

void moe_sum_backward(const Context& ctx, Tensor dye, const Tensor& dy, const MoeDispatch& plan) {
  LS_GPU_DISPATCH(ctx, moe_sum_backward, dye, dy, plan);
  const int64_t D = check_moe_sum_backward_args(dye, dy, plan), T = plan.num_tokens, K = plan.top_k;
  const size_t row_bytes = static_cast<size_t>(D) * sizeof(float);
  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const float* src = row<const float>(dy, t);
          for (int64_t s = 0; s < K; ++s) {
            if (D > 0) std::memcpy(row<float>(dye, plan.row_of[static_cast<size_t>(t * K + s)]), src, row_bytes);
          }
        }
      },
      kTokenGrain);
}

double topk_disagreement(const Tensor& a, const Tensor& b) {
  check_dtype(a, DType::I32, "topk_disagreement: a");
  check_shape(a, {-1, -1}, "topk_disagreement: a");
  check_rows(a, "topk_disagreement: a");
  check_dtype(b, DType::I32, "topk_disagreement: b");
  check_shape(b, {a.shape[0], a.shape[1]}, "topk_disagreement: b");
  check_rows(b, "topk_disagreement: b");
  const int64_t T = a.shape[0], K = a.shape[1];
  if (T == 0) return 0.0;
  std::vector<int32_t> sa(static_cast<size_t>(K)), sb(static_cast<size_t>(K));
  int64_t differ = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* ra = row<const int32_t>(a, t);
    const int32_t* rb = row<const int32_t>(b, t);
    sa.assign(ra, ra + K);
    sb.assign(rb, rb + K);
    std::sort(sa.begin(), sa.end());
    std::sort(sb.begin(), sb.end());
    if (sa != sb) ++differ;
  }
  return static_cast<double>(differ) / static_cast<double>(T);
}

}  // namespace lockstep::kernels
