// The LM head of a training pass in chunks (TrainerConfig::logits_chunk): the
// vocabulary projection, the token logprobs and the head's backward without
// ever holding the whole (R, V) logits or their gradient. Every result has
// the bits of the unchunked pass (docs/configuration.md, logits_chunk).
#pragma once

#include <cstdint>

#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::train {

// Scratch kept between micro-batches.
struct ChunkedHeadBuffers {
  OwnedTensor logits;  // (chunk * V) f32: (chunk, V) row blocks or (R, Vc) column blocks, Vc = chunk*V/R
  OwnedTensor stats;   // (R, 4) each full row's (m, s, ls, H), kernels::token_logprob_stats
  OwnedTensor dhead;   // (R, D) the gradient of the head input
};

// Whether the chunked head can train this model (on any device; not an fp8
// head, whose column blocks would need its quantized product).
bool chunked_head_trains(const model::ModelWeights& weights);

// logp (and entropy when non-empty) (R) of the head input rows (R, D) for
// targets (R), chunk rows at a time, and the row statistics backward needs.
void chunked_head_forward(const Context& ctx, const model::ModelWeights& weights, ChunkedHeadBuffers& b,
                          const Tensor& head_input, const Tensor& targets, Tensor logp, Tensor entropy,
                          int64_t chunk, float temperature);

// The head's backward from dlogp and dentropy (R; dentropy may be empty):
// returns d head_input (R, D) (in b.dhead) and adds lm_head's gradient to
// grads. d head_input takes row blocks (each row's chain over V whole), the
// weight gradient column blocks (each vocabulary row's chain over R whole).
Tensor chunked_head_backward(const Context& ctx, const model::ModelWeights& weights, const ModelParams& grads,
                             ChunkedHeadBuffers& b, const Tensor& head_input, const Tensor& targets,
                             const Tensor& dlogp, const Tensor& dentropy, int64_t chunk, float temperature);

}  // namespace lockstep::train
