// Bookkeeping of DeepSeek-V4's forward and backward that is not a kernel:
// token slots in the paged cache, which compressed entries a call completes,
// which entries and window positions each query sees, hash routing.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/v4_forward.h"

namespace lockstep::model {

// A zero-filled tensor in the memory ctx's kernels use (host memory on the CPU).
OwnedTensor device_tensor(const Context& ctx, DType dtype, std::vector<int64_t> shape);
// An i32 tensor `shape` in ctx's memory holding v (host-built index data,
// copied in).
OwnedTensor device_i32(const Context& ctx, const std::vector<int32_t>& v, std::vector<int64_t> shape);
// Sets t (contiguous, in ctx's memory) to zero bytes.
void zero_tensor(const Context& ctx, Tensor t);

// The batch's tokens with their sequence, position and cache slot; the
// tensors lie in the memory of the context it was made for.
struct V4Batch {
  V4Batch(const Context& ctx, const RaggedBatch& b, int block_size);
  // Cache slot of position `pos` of batch sequence `seq` (block table lookup).
  int32_t slot(int64_t seq, int64_t pos) const;

  const RaggedBatch& batch;
  int block_size;
  std::vector<int32_t> tokens;         // (T)
  std::vector<int32_t> seq;            // (T) batch sequence of each token
  std::vector<int32_t> positions_vec;  // (T)
  std::vector<int32_t> slots;          // (T)
  OwnedTensor positions;               // (T) i32
  OwnedTensor tokens_t;                // (T) i32
};

// The last dr columns of every head of x (T, H, W): a (T, H, dr) view.
Tensor rope_tail(const Tensor& x, int64_t dr);

// store[slots[i] * per_slot + kind] = src[i] for every row i of src (N, W);
// store (rows, W). Both in ctx's memory: one device copy per row.
void store_rows(const Context& ctx, Tensor store, const Tensor& src, const std::vector<int32_t>& slots,
                int per_slot, int kind);
// dst[i] = store[slots[i] * per_slot + kind].
void load_rows(const Context& ctx, Tensor dst, const Tensor& store, const std::vector<int32_t>& slots,
               int per_slot, int kind);

// The compressed entries whose block (of `ratio` positions) ends among the
// batch's new tokens, in batch order: each entry's store slots (ratio, or
// 2 * ratio when overlapping: the previous block's, -1 for block 0, then
// its own), RoPE position and storage slot.
EntryBatch completed_entries(const RaggedBatch& b, const V4Batch& vb, int64_t ratio, bool overlap);

// For every query, the slots of the entries it may see (entry e is visible at
// position p iff e < floor((p + 1) / ratio)), in entry order, -1 padding.
struct VisibleEntries {
  std::vector<int32_t> rows;  // (T, C)
  int64_t T = 0, C = 0;
};
VisibleEntries visible_entries(const RaggedBatch& b, const V4Batch& vb, int64_t ratio);

// cand (T, C) i32: kv_store rows of each query's candidates: its window
// (positions max(0, p - window + 1) .. p, ascending, rows 2 * slot), then its
// compressed entries, ascending (rows 2 * slot + 1): every visible one at
// ratio 128, `chosen` (T, KI) block indices (-1 padding) at ratio 4, none at 0.
// Built on the host, then copied into ctx's memory.
void build_candidates(const Context& ctx, OwnedTensor& cand, const RaggedBatch& b, const V4Batch& vb,
                      int64_t window, int64_t ratio, const std::vector<int32_t>& chosen, int64_t KI);

// Replayed indexer choices must be ascending visible block indices then -1s.
void check_replayed_entries(const std::vector<int32_t>& chosen, const V4Batch& vb, int64_t ratio, int64_t KI,
                            int64_t layer);

// out (T, K) i32 = tid2eid[tokens[t]] (tid2eid (V, K) i32): gathered on the
// host from a copy of the table, then copied into out (ctx's memory).
void hash_experts(const Context& ctx, Tensor out, const Tensor& tid2eid, const std::vector<int32_t>& tokens,
                  int64_t K);

// SwiGLU clamped at `limit` (0: unclamped).
void swiglu_v4(const Context& ctx, Tensor act, const Tensor& gate, const Tensor& up, double limit);
void swiglu_v4_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dact, const Tensor& gate,
                        const Tensor& up, double limit);

// (T) the token `shift` places after each token in its sequence, 0 past the
// sequence's end (the MTP blocks' inputs).
std::vector<int32_t> shifted_tokens(const RaggedBatch& b, int64_t shift);

// x (T, n*D) += e (T, D) on every stream (one f32 add per element).
void add_to_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n);

// x (T, n*D): n copies of e (T, D). Its backward: de = sum over streams in
// stream order (plain adds from the first).
void repeat_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n);
void sum_streams(const Context& ctx, Tensor de, const Tensor& dx, int64_t n);

// Layer l's LoRA adapters (null: the weights carry none, or l is an MTP
// block, which is never adapted) and their scale s (0 without adapters).
const LoraLayer* v4_lora(const ModelWeights& weights, int64_t l);
float v4_lora_scale(const ModelWeights& weights);

}  // namespace lockstep::model
