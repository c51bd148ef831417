// AdamW on flat f32 buffers, the global gradient norm and norm clipping.
// Everything is elementwise or reduced in fixed chunks, so results do not
// depend on the thread count (docs/architecture.md section 4, "Flat buffers").
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"

namespace lockstep::kernels {

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled (AdamW), applied as p *= 1 - lr * weight_decay
  int64_t step = 1;           // 1-based count of this update, for the bias corrections
};

// One AdamW update of n elements, in the PyTorch order. Scalars, in double then
// rounded once to f32:
//   decay     = 1 - lr * weight_decay
//   step_size = lr / (1 - beta1^step)
//   bc2_sqrt  = sqrt(1 - beta2^step)
// Per element, in f32 (no FMA):
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * (g * g)
//   p = p * decay - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
// param, m, v are updated in place; grad is read only. Throws Error for
// step < 1, betas outside [0, 1), eps <= 0 or a non-finite lr.
void adamw_step(const Context& ctx, float* param, const float* grad, float* m, float* v, int64_t n,
                const AdamWParams& hp);

// The per-step scalars of adamw_step, checked and rounded to f32 as above
// (the GPU backends take these floats, so both paths see the same bits).
// Throws the errors adamw_step documents.
struct AdamWScalars {
  float decay = 1.0f;      // 1 - lr * weight_decay
  float step_size = 0.0f;  // lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;   // sqrt(1 - beta2^step)
  float b1 = 0.0f, b2 = 0.0f, eps = 0.0f;
  float c1 = 1.0f, c2 = 1.0f;  // 1 - beta1, 1 - beta2 (f32)
};
AdamWScalars adamw_scalars(const AdamWParams& hp, int64_t n);

// A contiguous range of a flat buffer (e.g. one parameter group's gradients).
struct FloatSegment {
  float* data = nullptr;
  int64_t n = 0;
};

// Chunk length of the norm reduction: fixed, so the sum is the same for any
// thread count.
constexpr int64_t kNormChunk = 4096;

// sqrt(sum g^2) in double. Each segment is cut into kNormChunk-element chunks;
// a chunk sums double(g)^2 (exact products) in 8 lanes (element i in lane
// i mod 8) combined by a fixed tree; chunk sums are added in order (segment by
// segment). Depends on the segmentation, never on the thread count.
double global_grad_norm(const Context& ctx, const float* grad, int64_t n);
double global_grad_norm(const Context& ctx, const std::vector<FloatSegment>& segments);
// The chunk sums global_grad_norm adds, in its order (segment by segment,
// kNormChunk elements each), and their sum's square root. A norm split over
// ranks (expert parallelism) gathers the chunk sums of every rank's segments
// and adds them in one canonical order, so it has the bits of the one-rank norm
// over the same segments.
std::vector<double> norm_chunk_sums(const Context& ctx, const std::vector<FloatSegment>& segments);
double norm_of_chunk_sums(const std::vector<double>& sums);

// Returns the pre-clip norm (as global_grad_norm). When it is finite and
// greater than max_norm, every gradient is multiplied by
// float(max_norm / norm); otherwise nothing is written (a NaN/inf norm is
// left for the caller to report and skip the step). max_norm must be > 0.
double clip_grad_norm(const Context& ctx, float* grad, int64_t n, double max_norm);
// Every element times `factor` (one f32 multiply), as clipping does.
void scale_grads(const Context& ctx, const std::vector<FloatSegment>& segments, float factor);
double clip_grad_norm(const Context& ctx, const std::vector<FloatSegment>& segments, double max_norm);

}  // namespace lockstep::kernels
