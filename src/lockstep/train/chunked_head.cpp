// The training pass's LM head in row and column blocks (chunked_head.h).
#include "lockstep/train/chunked_head.h"

#include <algorithm>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/model/workspace.h"

namespace lockstep::train {

namespace {

// The scratch as a (rows, cols) matrix; rows * cols <= its size.
Tensor block(OwnedTensor& scratch, int64_t rows, int64_t cols) {
  LS_CHECK(rows * cols <= int64_t(scratch.view().numel())) << "chunked head: a block past its scratch";
  return Tensor(scratch.view().data, DType::F32, {rows, cols});
}

// Columns per column block: as many (R, Vc) logits as the (chunk, V) row
// blocks hold (at least one column).
int64_t column_block(int64_t R, int64_t V, int64_t chunk) {
  return std::clamp<int64_t>(std::min(chunk, R) * V / std::max<int64_t>(R, 1), 1, V);
}

// The scratch's floats: a (chunk, V) row block or an (R, Vc) column block.
int64_t scratch_size(int64_t R, int64_t V, int64_t chunk) {
  return std::max(std::min(chunk, R) * V, R * column_block(R, V, chunk));
}

}  // namespace

bool chunked_head_trains(const model::ModelWeights& weights) {
  return weights.lm_head().storage != DType::FP8E4M3;
}

void chunked_head_forward(const Context& ctx, const model::ModelWeights& weights, ChunkedHeadBuffers& b,
                          const Tensor& head_input, const Tensor& targets, Tensor logp, Tensor entropy,
                          int64_t chunk, float temperature) {
  const int64_t R = head_input.dim(0), V = weights.config().vocab_size;
  LS_CHECK(chunk >= 1) << "chunked head: chunk " << chunk;
  model::reuse(ctx, b.logits, DType::F32, {scratch_size(R, V, chunk)});
  const Tensor stats = model::reuse(ctx, b.stats, DType::F32, {R, 4});
  const bool want_h = entropy.ndim != 0;
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r1 = std::min(R, r0 + chunk);
    const Tensor logits = block(b.logits, r1 - r0, V);  // (r1 - r0, V)
    model::lm_head_forward(ctx, weights, logits, head_input.slice_rows(r0, r1));
    kernels::token_logprob_forward(ctx, logp.slice_rows(r0, r1),
                                   want_h ? entropy.slice_rows(r0, r1) : Tensor(), Tensor(), logits,
                                   targets.slice_rows(r0, r1), temperature);
    kernels::token_logprob_stats(ctx, stats.slice_rows(r0, r1), logits, temperature, want_h);
  }
}

Tensor chunked_head_backward(const Context& ctx, const model::ModelWeights& weights, const ModelParams& grads,
                             ChunkedHeadBuffers& b, const Tensor& head_input, const Tensor& targets,
                             const Tensor& dlogp, const Tensor& dentropy, int64_t chunk, float temperature) {
  const int64_t R = head_input.dim(0), D = head_input.dim(1), V = weights.config().vocab_size;
  const Tensor dhead = model::reuse(ctx, b.dhead, DType::F32, {R, D});
  const bool have_ge = dentropy.ndim != 0;
  model::reuse(ctx, b.logits, DType::F32, {scratch_size(R, V, chunk)});
  // d head_input by row blocks: each row's dlogits whole, as the unchunked
  // pass computes them (the logits again, then the full-row kernel in place).
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r1 = std::min(R, r0 + chunk);
    const Tensor dlogits = block(b.logits, r1 - r0, V);  // (r1 - r0, V)
    model::lm_head_forward(ctx, weights, dlogits, head_input.slice_rows(r0, r1));
    kernels::token_logprob_backward(ctx, dlogits, dlogp.slice_rows(r0, r1),
                                    have_ge ? dentropy.slice_rows(r0, r1) : Tensor(), dlogits,
                                    targets.slice_rows(r0, r1), temperature);
    model::lm_head_backward_dx(ctx, weights, dhead.slice_rows(r0, r1), dlogits);
  }
  if (grads.lm_head.data == nullptr) return dhead;  // a frozen head (LoRA): no weight gradient
  // lm_head's gradient by column blocks over every row: dlogits[:, v0:v1]
  // from the saved row statistics, element by element.
  const int64_t vc = column_block(R, V, chunk);
  for (int64_t v0 = 0; v0 < V; v0 += vc) {
    const int64_t v1 = std::min(V, v0 + vc);
    const Tensor dlogits = block(b.logits, R, v1 - v0);  // (R, v1 - v0)
    model::lm_head_forward_cols(ctx, weights, dlogits, head_input, v0);
    kernels::token_logprob_backward_cols(ctx, dlogits, dlogp, have_ge ? dentropy : Tensor(), dlogits, targets,
                                         b.stats.view(), v0, temperature);
    model::lm_head_backward_dw(ctx, weights, grads, dlogits, head_input, v0);
  }
  return dhead;
}

}  // namespace lockstep::train
