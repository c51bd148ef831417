// AdamW update and gradient-norm clipping over flat buffers: elementwise work
// split into fixed ranges, norms reduced per fixed chunk and summed in order.
#include "lockstep/kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

// Elements per task for elementwise passes: large enough to amortize a task
// hand-off, small enough that two threads share buffers of >= 64K elements.
constexpr int64_t kElemGrain = 32768;

// Sum of double(x[i])^2 over one chunk: 8 lanes in index order, fixed tree.
// Each lane is its own chain, so the compiler may vectorize without reordering.
double chunk_sum_sq(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = n / kLanes * kLanes;
  for (int64_t i = 0; i < full; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double g = x[i + j];
      acc[j] = acc[j] + g * g;
    }
  for (int64_t i = full; i < n; ++i) {
    const double g = x[i];
    acc[i - full] = acc[i - full] + g * g;
  }
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
  return acc[0];
}

std::vector<double> chunk_sums(const Context& ctx, const std::vector<FloatSegment>& segs) {
  // Chunk list: (segment, first element); its order is the summation order.
  std::vector<std::pair<size_t, int64_t>> chunks;
  for (size_t s = 0; s < segs.size(); ++s) {
    LS_CHECK(segs[s].n >= 0 && (segs[s].n == 0 || segs[s].data))
        << "bad gradient segment " << s << " n=" << segs[s].n;
    for (int64_t b = 0; b < segs[s].n; b += kNormChunk) chunks.emplace_back(s, b);
  }
  std::vector<double> part(chunks.size());  // (number of chunks) partial sums
  ctx.parallel_for(
      static_cast<int64_t>(chunks.size()),
      [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const auto [s, b] = chunks[size_t(c)];
          part[size_t(c)] = chunk_sum_sq(segs[s].data + b, std::min(kNormChunk, segs[s].n - b));
        }
      },
      4);
  return part;
}

double norm_of(const Context& ctx, const std::vector<FloatSegment>& segs) {
  return norm_of_chunk_sums(chunk_sums(ctx, segs));
}

void scale_all(const Context& ctx, const std::vector<FloatSegment>& segs, float scale) {
  for (const FloatSegment& seg : segs) {
    ctx.parallel_for(
        seg.n,
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) seg.data[i] = seg.data[i] * scale;
        },
        kElemGrain);
  }
}

}  // namespace

AdamWScalars adamw_scalars(const AdamWParams& hp, int64_t n) {
  if (hp.step < 1) LS_THROW << "adamw_step: step is 1-based, got " << hp.step;
  if (!(hp.beta1 >= 0.0f && hp.beta1 < 1.0f) || !(hp.beta2 >= 0.0f && hp.beta2 < 1.0f))
    LS_THROW << "adamw_step: betas must lie in [0, 1), got beta1=" << hp.beta1 << " beta2=" << hp.beta2;
  if (!(hp.eps > 0.0f)) LS_THROW << "adamw_step: eps must be > 0, got " << hp.eps;
  if (!std::isfinite(hp.lr) || !std::isfinite(hp.weight_decay))
    LS_THROW << "adamw_step: lr and weight_decay must be finite, got lr=" << hp.lr
             << " weight_decay=" << hp.weight_decay;
  LS_CHECK(n >= 0) << "n=" << n;
  const double steps = static_cast<double>(hp.step);
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - double(hp.lr) * double(hp.weight_decay));
  s.step_size = static_cast<float>(double(hp.lr) / (1.0 - std::pow(double(hp.beta1), steps)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(hp.beta2), steps)));
  s.b1 = hp.beta1;
  s.b2 = hp.beta2;
  s.eps = hp.eps;
  s.c1 = 1.0f - s.b1;
  s.c2 = 1.0f - s.b2;
  return s;
}

void adamw_step(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWParams& hp) {
  LS_GPU_DISPATCH(ctx, adamw_step, param, grad, m, v, n, hp);
  const AdamWScalars s = adamw_scalars(hp, n);
  const float decay = s.decay, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt;
  const float b1 = s.b1, b2 = s.b2, eps = s.eps, c1 = s.c1, c2 = s.c2;
  ctx.parallel_for(
      n,
      [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const float g = grad[i];
          const float mi = b1 * m[i] + c1 * g;
          const float vi = b2 * v[i] + c2 * (g * g);
          m[i] = mi;
          v[i] = vi;
          param[i] = param[i] * decay - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
        }
      },
      kElemGrain);
}

std::vector<double> norm_chunk_sums(const Context& ctx, const std::vector<FloatSegment>& segments) {
  return chunk_sums(ctx, segments);
}

double norm_of_chunk_sums(const std::vector<double>& sums) {
  double total = 0;
  for (double p : sums) total = total + p;
  return std::sqrt(total);
}

double global_grad_norm(const Context& ctx, const float* grad, int64_t n) {
  return norm_of(ctx, {FloatSegment{const_cast<float*>(grad), n}});
}

double global_grad_norm(const Context& ctx, const std::vector<FloatSegment>& segments) {
  return norm_of(ctx, segments);
}

double clip_grad_norm(const Context& ctx, const std::vector<FloatSegment>& segments, double max_norm) {
  if (!(max_norm > 0.0)) LS_THROW << "clip_grad_norm: max_norm must be > 0, got " << max_norm;
  const double norm = norm_of(ctx, segments);
  if (std::isfinite(norm) && norm > max_norm) scale_all(ctx, segments, static_cast<float>(max_norm / norm));
  return norm;
}

double clip_grad_norm(const Context& ctx, float* grad, int64_t n, double max_norm) {
  return clip_grad_norm(ctx, {FloatSegment{grad, n}}, max_norm);
}

void scale_grads(const Context& ctx, const std::vector<FloatSegment>& segments, float factor) {
  scale_all(ctx, segments, factor);
}

}  // namespace lockstep::kernels
