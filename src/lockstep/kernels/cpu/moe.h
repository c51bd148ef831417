// Mixture-of-Experts routing, dispatch and combine, forward and backward: the
// router (softmax or sigmoid scores, biased top-k selection, normalized and
// scaled weights, routing replay) as in Hugging Face Qwen3-MoE and DeepSeek-V3,
// and a DeepEP-style dispatch handle that gather and combine share.
//
// Numerics (docs/architecture.md section 4): the router runs in fp32; top-k ties break to
// the lower expert index; everything is computed per token, so a token's
// routing, weights and combined output do not depend on the other tokens in
// the batch or on the thread count.
//
// Dimension letters: T tokens, E experts, K top-k slots, D row width,
// R = T*K gathered rows.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

enum class RouterScoring {
  Softmax,  // p = softmax(logits) over E (Qwen3-MoE, Mixtral)
  Sigmoid,  // p = sigmoid(logit) per expert (DeepSeek-V3)
  SqrtSoftplus,  // p = sqrt(softplus(logit)) per expert (DeepSeek-V4); softplus(x) = x for x > 20,
                 // else log1(1 + exp1(x)); dp/dlogit = sigmoid(x) / (2 p) (0 where p == 0). The
                 // backward sees only p, so it uses sigmoid(x) = 1 - exp1(-p^2), evaluated near
                 // p = 0 as (1 - u) p^2 / -log1(u), u = exp1(-p^2), to keep small gradients exact
};

// The router's hyper-parameters, named after their Hugging Face config keys.
struct RouterConfig {
  int num_experts = 0;  // E (n_routed_experts / num_experts)
  int top_k = 0;        // K (num_experts_per_tok)
  RouterScoring scoring = RouterScoring::Softmax;
  bool normalize = false;       // norm_topk_prob: weights divided by their sum (+1e-20)
  float routed_scaling = 1.0f;  // routed_scaling_factor, applied after normalization
  // DeepSeek-V3 group-limited routing: experts form n_group equal groups; a
  // group's score is the sum of its two largest selection values (its largest
  // when a group has one expert); only experts of the topk_group best groups
  // (ties: lower group) may be selected. n_group == 1 turns it off. Experts of
  // other groups are excluded outright (DeepSeek's reference code fills them
  // with -inf; Hugging Face fills 0.0, which differs only when every allowed
  // selection value is negative).
  int n_group = 1;
  int topk_group = 1;

  // Throws Error naming the bad field (E >= 1, 1 <= K <= E, finite scaling,
  // E % n_group == 0, 1 <= topk_group <= n_group, topk_group * E/n_group >= K).
  void validate() const;
};

// Routes T tokens.
//   scores  (T, E) f32, written: p, saved for moe_route_backward.
//   topk_idx (T, K) i32, written: the selected experts, in descending order of
//           the selection value p + bias (ties: lower index first).
//   topk_w  (T, K) f32, written: w[s] = p[topk_idx[s]] (/ (sum_s w[s] + 1e-20) if
//           normalize; the sum is canonical_sum over the K slots) * routed_scaling.
//   router_logits (T, E) f32.
//   bias    (E) f32 score-correction bias (e_score_correction_bias), used for
//           selection only; pass Tensor{} for none.
//   replay_idx (T, K) i32 experts decided elsewhere (routing replay): selection
//           is skipped, topk_idx = replay_idx and the weights are recomputed from
//           these scores, so the router still gets gradients. Tensor{} for none.
//           An index out of [0, E) or an expert listed twice for one token
//           throws an Error naming the token, the slot and the index.
// NaN selection values rank below every number (so indices stay valid).
// 2-D tensors may have a row stride larger than their width.
void moe_route(const Context& ctx, Tensor topk_idx, Tensor topk_w, Tensor scores, const Tensor& router_logits,
               const Tensor& bias, const Tensor& replay_idx, const RouterConfig& cfg);

// Gradient of the router logits given the gradient of the weights.
//   dlogits (T, E) f32, written (every element; bias gets no gradient).
//   dtopk_w (T, K) f32; scores (T, E) and topk_idx (T, K) as moe_route wrote them.
// Selection is piecewise constant and contributes nothing. An expert listed
// twice for one token receives both slots' gradients.
void moe_route_backward(const Context& ctx, Tensor dlogits, const Tensor& dtopk_w, const Tensor& scores,
                        const Tensor& topk_idx, const RouterConfig& cfg);

// The dispatch handle: which gathered row holds which (token, slot). Expert e
// owns rows [offsets[e], offsets[e+1]), listed in token order (slot order
// within a token), so an expert's FFN runs on one contiguous block of rows.
struct MoeDispatch {
  int num_experts = 0;         // E
  int top_k = 0;               // K
  int64_t num_tokens = 0;      // T
  std::vector<int64_t> offsets;  // (E+1) first row of each expert; offsets[E] == T*K
  std::vector<int32_t> token;    // (R) token of gathered row r
  std::vector<int32_t> slot;     // (R) top-k slot of gathered row r
  std::vector<int32_t> expert;   // (R) expert of gathered row r
  std::vector<int32_t> row_of;   // (T*K) gathered row of (t, s), at t*K + s

  int64_t num_rows() const { return num_tokens * top_k; }
  int64_t expert_rows(int e) const { return offsets[static_cast<size_t>(e) + 1] - offsets[static_cast<size_t>(e)]; }
};

// Builds the handle from topk_idx (T, K) i32. An index out of [0, E) throws an
// Error naming the token, the slot and the index. Deterministic (counting sort).
MoeDispatch moe_plan(const Tensor& topk_idx, int num_experts);

// xe[row_of(t, s)] = x[t] for every slot: xe (R, D), x (T, D), any dtype (the
// same for both); rows copied bit for bit.
void moe_gather(const Context& ctx, Tensor xe, const Tensor& x, const MoeDispatch& plan);

// y[t] = sum over s = 0..K-1 of topk_w[t, s] * ye[row_of(t, s)], in fp32, in
// slot order, starting from 0; each term is one fused multiply-add
// acc = fma(w, ye, acc) (the same convention as the GEMM chains).
//   y (T, D) f32, written; ye (R, D) f32; topk_w (T, K) f32. y must not alias ye.
void moe_combine(const Context& ctx, Tensor y, const Tensor& ye, const Tensor& topk_w, const MoeDispatch& plan);

// Gradients of moe_combine, both written:
//   dye[row_of(t, s)] = topk_w[t, s] * dy[t]   (one f32 multiply)   (R, D)
//   dtopk_w[t, s] = canonical_dot(dy[t], ye[row_of(t, s)], D)        (T, K)
void moe_combine_backward(const Context& ctx, Tensor dye, Tensor dtopk_w, const Tensor& dy, const Tensor& ye,
                          const Tensor& topk_w, const MoeDispatch& plan);

// Gradient of moe_gather, accumulated: dx[t] += (0 + dxe[row_of(t,0)] + ... +
// dxe[row_of(t,K-1)]), the K slots summed first in slot order, then added once.
//   dx (T, D) f32, accumulated (+=) because x also feeds the router and any
//   shared experts; dxe (R, D) f32.
void moe_gather_backward(const Context& ctx, Tensor dx, const Tensor& dxe, const MoeDispatch& plan);

// Fraction of tokens whose top-k expert sets differ between two routings of
// the same tokens (one layer): a (T, K) i32, b (T, K) i32; slot order is
// ignored (sets compared as multisets). 0 when T == 0.
double topk_disagreement(const Tensor& a, const Tensor& b);

// Routing weight before the down projection (DeepSeek-V4): rows of an
// expert's activations scaled by their token's weight.
//   y[r] = topk_w[token(r), slot(r)] * x[r]   (one f32 multiply), y, x (R, F), may alias.
void moe_scale_rows(const Context& ctx, Tensor y, const Tensor& x, const Tensor& topk_w, const MoeDispatch& plan);
// Backward of moe_scale_rows: dx[r] = w * dy[r] (written, may alias dy);
// dtopk_w[t, s] = canonical_dot(dy[row_of(t,s)], x[row_of(t,s)], F) (written).
void moe_scale_rows_backward(const Context& ctx, Tensor dx, Tensor dtopk_w, const Tensor& dy, const Tensor& x,
                             const Tensor& topk_w, const MoeDispatch& plan);
// y[t] = sum over s of ye[row_of(t, s)], slot order from 0 (plain adds): the
// combine of rows already weighted. y (T, D) written; ye (R, D); y must not alias ye.
void moe_sum(const Context& ctx, Tensor y, const Tensor& ye, const MoeDispatch& plan);
// dye[row_of(t, s)] = dy[t] (a copy), (R, D) written.
void moe_sum_backward(const Context& ctx, Tensor dye, const Tensor& dy, const MoeDispatch& plan);

// The argument checks of moe_route, moe_gather and moe_combine, throwing the
// errors those entries document; the GPU backends call them so that a bad
// call fails the same way on either path. check_moe_route_args also reads
// replay_idx (host memory) to validate its indices.
void check_moe_route_args(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& scores,
                          const Tensor& router_logits, const Tensor& bias, const Tensor& replay_idx,
                          const RouterConfig& cfg);
void check_moe_gather_args(const Tensor& xe, const Tensor& x, const MoeDispatch& plan);
void check_moe_combine_args(const Tensor& y, const Tensor& ye, const Tensor& topk_w, const MoeDispatch& plan);
// The same for the three backward entries; check_moe_route_backward_args reads
// topk_idx (host memory) to validate its indices.
void check_moe_route_backward_args(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& scores,
                                   const Tensor& topk_idx, const RouterConfig& cfg);
void check_moe_gather_backward_args(const Tensor& dx, const Tensor& dxe, const MoeDispatch& plan);
void check_moe_combine_backward_args(const Tensor& dye, const Tensor& dtopk_w, const Tensor& dy, const Tensor& ye,
                                     const Tensor& topk_w, const MoeDispatch& plan);
// The same for DeepSeek-V4's moe_scale_rows, moe_sum and their backwards;
// each returns the row width (F or D).
int64_t check_moe_scale_rows_args(const Tensor& y, const Tensor& x, const Tensor& topk_w,
                                  const MoeDispatch& plan);
int64_t check_moe_scale_rows_backward_args(const Tensor& dx, const Tensor& dtopk_w, const Tensor& dy,
                                           const Tensor& x, const Tensor& topk_w, const MoeDispatch& plan);
int64_t check_moe_sum_args(const Tensor& y, const Tensor& ye, const MoeDispatch& plan);
int64_t check_moe_sum_backward_args(const Tensor& dye, const Tensor& dy, const MoeDispatch& plan);

}  // namespace lockstep::kernels
