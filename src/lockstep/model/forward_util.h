// Small pieces of the model forward/backward that are not kernels of their
// own: batch bookkeeping, copies, bias and residual adds, routing tables.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/model/forward.h"

namespace lockstep::model {

// The batch as i32 tensors for the kernels.
struct BatchTensors {
  BatchTensors(const RaggedBatch& b, int block_size);
  kernels::AttentionBatch attention_batch() const;

  std::vector<int32_t> positions;  // (T)
  OwnedTensor tokens;              // (T) i32
  OwnedTensor positions_t;         // (T) i32
  OwnedTensor n_ctx, n_new;        // (S) i32
  OwnedTensor block_table;         // (S, max_blocks) i32
  int block_size;
};

int64_t count_moe_layers(const ModelConfig& c);
kernels::RouterConfig router_config(const ModelConfig& c);

OwnedTensor copy_of(const Tensor& t);  // contiguous copy
// y (T, N) += b (N) on every row (one f32 add per element).
void add_row_bias(const Context& ctx, Tensor y, const Tensor& b);
// db (N) += column sums of dy (T, N), rows in order.
void add_column_sums(const Context& ctx, Tensor db, const Tensor& dy);
// qkv (T, (H+2Hkv)*Dh) -> q (T,H,Dh), k (T,Hkv,Dh), v (T,Hkv,Dh), and back.
void split_qkv(const Context& ctx, Tensor q, Tensor k, Tensor v, const Tensor& qkv);
void join_qkv(const Context& ctx, Tensor qkv, const Tensor& q, const Tensor& k, const Tensor& v);
// out = a + b elementwise (2-D, same shape; out may alias a).
void add_into(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b);
// out (R, D) = x[rows].
void gather_rows(Tensor out, const Tensor& x, const std::vector<int32_t>& rows);
// Routing tables (T, L_moe, K) <-> one layer's (T, K).
void gather_layer_experts(Tensor out, const std::vector<int32_t>& all, int64_t layer, int64_t n_moe, int64_t k);
void scatter_layer_experts(std::vector<int32_t>& all, const Tensor& layer_idx, int64_t layer, int64_t n_moe,
                           int64_t k);
// Qwen2-MoE shared-expert gate: sgate (T) = sigmoid(x · w), w packed (1, D).
void shared_gate_forward(const Context& ctx, Tensor sgate, const Tensor& x, const kernels::PackedWeight& w);
// ffn (T, D) += ys * sgate[t] (or += ys when sgate is empty).
void add_shared_expert(const Context& ctx, Tensor ffn, const Tensor& ys, const Tensor& sgate);

}  // namespace lockstep::model
