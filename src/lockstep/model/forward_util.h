// Small pieces of the model forward/backward that are not kernels of their
// own: batch bookkeeping, workspace slots, the expert loop, copies, bias and
// residual adds, routing tables.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/model/forward.h"

namespace lockstep::model {

// The batch as i32 tensors for the kernels. Tokens and positions, which the
// kernels read, are copied into `memory` (the device memory of the forward's
// context); the sequence lengths and block table stay on the host, where the
// attention entry reads them to plan its launch.
struct BatchTensors {
  BatchTensors(const RaggedBatch& b, int block_size, const Allocator& memory = host_allocator());
  kernels::AttentionBatch attention_batch() const;

  std::vector<int32_t> positions;  // (T)
  OwnedTensor tokens;              // (T) i32, in memory
  OwnedTensor positions_t;         // (T) i32, in memory
  OwnedTensor n_ctx, n_new;        // (S) i32, host
  OwnedTensor block_table;         // (S, max_blocks) i32, host
  int block_size;
};

// Workspace slots of forward and backward. Both use the same numbers:
// nothing forward leaves in the workspace is read after it returns (backward
// reads only the saved Activations and the KV cache).
enum WorkspaceSlot : size_t {
  kSlotX,        // (T, D) residual stream
  kSlotNormed,   // (T, D)
  kSlotRstd,     // (T)
  kSlotQkv,      // (T, (H+2Hkv)*Dh)
  kSlotQ,        // (T, H, Dh)
  kSlotQPre,     // (T, H, Dh)
  kSlotK,        // (T, Hkv, Dh)
  kSlotKPre,     // (T, Hkv, Dh)
  kSlotV,        // (T, Hkv, Dh)
  kSlotRstdQ,    // (T*H)
  kSlotRstdK,    // (T*Hkv)
  kSlotAttn,     // (T, H*Dh)
  kSlotH,        // (T, D)
  kSlotFfn,      // (T, D)
  kSlotGu,       // (T, 2F) or (T*K, 2Fe)
  kSlotAct,      // (T, F) or (T*K, Fe)
  kSlotRouter,   // (T, E) router logits
  kSlotScores,   // (T, E)
  kSlotTopkIdx,  // (T, K) i32
  kSlotTopkW,    // (T, K)
  kSlotReplay,   // (T, K) i32
  kSlotXe,       // (T*K, D)
  kSlotYe,       // (T*K, D)
  kSlotGuS,      // (T, 2Fs)
  kSlotActS,     // (T, Fs)
  kSlotYs,       // (T, D)
  kSlotSgate,    // (T) / (T, 1)
  kSlotRows,     // (R, D)
  kSlotRowsNormed,
  kSlotRstdF,
  kSlotXr,       // (N, D) expert parallelism: rows received for this rank's experts
  kSlotYr,       // (N, D) their outputs
  kSlotEpStage,  // (N, D) all-to-all staging
  // Backward only. Its other buffers take forward slots dead by then
  // (backward.cpp: dx kSlotX, the layer's dtmp kSlotFfn, dk, dv, dqkv
  // kSlotK, kSlotV, kSlotQkv; the attention's dattn, dq_pre kSlotDact and dq,
  // dk_pre kSlotDgu once the FFN backward is done with them).
  kSlotDh,       // (T, D)
  kSlotDnormed,  // (T, D)
  kSlotDact,     // (N, F) per FFN
  kSlotDgu,      // (N, 2F)
  kSlotDye,      // (T*K, D)
  kSlotDxe,      // (T*K, D)
  kSlotDtopkW,   // (T, K)
  kSlotDlog,     // (T, E)
  kSlotDys,      // (T, D)
  kSlotDglogit,  // (T, 1)
  kSlotDyr,      // (N, D) expert parallelism
  kSlotDxr,      // (N, D)
};

// Runs fn(e, ectx) for every expert e with rows in the dispatch plan. When
// the pool has several threads and the experts' rows can be shared out
// evenly, whole experts go to threads (fn then gets a single-threaded ectx:
// one wake-up per layer instead of one per GEMM, and each expert's rows stay
// in one core's cache); otherwise experts run one after another with ctx's
// threads inside each kernel. Kernel results do not depend on the thread
// count, so both ways give the same bits.
void for_each_expert(const Context& ctx, const kernels::MoeDispatch& plan,
                     const std::function<void(int64_t e, const Context& ectx)>& fn);

kernels::RouterConfig router_config(const ModelConfig& c);

// y (M, N) (+)= x (M, K) · Wᵀ for a packed projection. With fp8 weights the
// input is first quantized as an FP8 forward quantizes it: per token, per 128
// channels, power-of-two scales (kernels::fp8_quantize_rows), on a copy, so
// the caller's x (saved for backward, read by the router) stays f32. Both
// engines call this, so they multiply the same quantized activations.
void project(const Context& ctx, Tensor y, const Tensor& x, const kernels::PackedWeight& w,
             bool accumulate = false);
// dw (N, K) += dy (M, N)ᵀ · x (M, K) for a projection the forward ran through
// project(w): with fp8 weights x is quantized first exactly as project()
// quantized it, so dw is the weight gradient of the product the forward
// computed (the weight quantizer itself is straight-through: dw lands on the
// f32 master). Otherwise kernels::gemm_dytx.
void project_dw(const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x,
                const kernels::PackedWeight& w);

// ForwardOptions::lm_head == false: copies the final-normed rows (R, D) into
// result.head_input (through the allocator: they may be device memory).
void keep_head_input(const Context& ctx, ForwardResult& result, const Tensor& rows);

// The capture hook of one forward call (ForwardOptions::capture). Without a
// hook it holds nothing and each capture point is one pointer test.
class CapturePoints {
 public:
  CapturePoints(const ForwardOptions& o, const RaggedBatch& b, const std::vector<int32_t>& positions);
  // Hands t (rows first, the other dims flattened) to the hook; `logit_rows`:
  // t's rows are the batch's logit rows, else all T tokens.
  void operator()(const char* name, int64_t layer, const Tensor& t, bool logit_rows = false) const {
    if (fn_ != nullptr) emit(name, layer, t, logit_rows);
  }

 private:
  void emit(const char* name, int64_t layer, const Tensor& t, bool logit_rows) const;

  const CaptureFn* fn_;
  const std::vector<uint64_t>* ids_;
  std::vector<int32_t> seq_, pos_;              // (T)
  std::vector<int32_t> logit_seq_, logit_pos_;  // (R)
};

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
void gather_rows(const Context& ctx, Tensor out, const Tensor& x, const std::vector<int32_t>& rows);
// out (T, D): rows[r] = src[r], every other row 0.
void scatter_rows(const Context& ctx, Tensor out, const Tensor& src, const std::vector<int32_t>& rows);
// Routing tables (T, L_moe, K) <-> one layer's (T, K).
void gather_layer_experts(Tensor out, const std::vector<int32_t>& all, int64_t layer, int64_t n_moe,
                          int64_t k);
// The same into `out` in the context's device memory (a copy in).
void gather_layer_experts(const Context& ctx, Tensor out, const std::vector<int32_t>& all, int64_t layer,
                          int64_t n_moe, int64_t k);
// Reads layer_idx through a copy when it lies in device memory.
void scatter_layer_experts(std::vector<int32_t>& all, const Tensor& layer_idx, int64_t layer, int64_t n_moe,
                           int64_t k);
// Qwen2-MoE shared-expert gate: sgate (T) = sigmoid(x · w), w packed (1, D).
void shared_gate_forward(const Context& ctx, Tensor sgate, const Tensor& x, const kernels::PackedWeight& w);
// ffn (T, D) += ys * sgate[t] (or += ys when sgate is empty).
void add_shared_expert(const Context& ctx, Tensor ffn, const Tensor& ys, const Tensor& sgate);

// Activation recompute (ForwardOptions::recompute), defined in forward.cpp:
// drop_layer frees a layer's saved activations except its input x_in;
// recompute_layer refills layer l's from that input, with opt's routing
// replay; its keys and values are already in the cache, or, when every layer
// shares one K/V array (KvCache::shared_layers), written there again.
void drop_layer(LayerActivations& a);
// Moves `from`'s recomputed buffers (all but x_in) into `to`, for reuse.
void pass_layer_buffers(LayerActivations& from, LayerActivations& to);
void recompute_layer(const Context& ctx, const ModelWeights& weights, const KvCache& kv, Workspace& ws,
                     const RaggedBatch& batch, const BatchTensors& bt, const ForwardOptions& opt,
                     ForwardResult* result, int64_t l, int64_t moe_index, Activations& saved);

}  // namespace lockstep::model
