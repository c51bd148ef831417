// DeepSeek-V4 batch bookkeeping (v4_util.h).
#include "lockstep/model/v4_util.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/streams.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::model {

OwnedTensor device_tensor(const Context& ctx, DType dtype, std::vector<int64_t> shape) {
  return OwnedTensor(dtype, std::move(shape), kernels::device_memory(ctx), Fill::Zero, "v4 tensor");
}

OwnedTensor device_i32(const Context& ctx, const std::vector<int32_t>& v, std::vector<int64_t> shape) {
  const Allocator& memory = kernels::device_memory(ctx);
  OwnedTensor t(DType::I32, std::move(shape), memory, Fill::Undefined, "v4 index data");
  LS_CHECK(t.numel() == int64_t(v.size())) << "device_i32: " << v.size() << " values for " << t.numel();
  if (!v.empty()) memory.copy_in(t.view().data, v.data(), v.size() * sizeof(int32_t));
  return t;
}

void zero_tensor(const Context& ctx, Tensor t) {
  LS_CHECK(t.is_contiguous()) << "zero_tensor: the tensor must be contiguous";
  if (t.nbytes() > 0) kernels::device_memory(ctx).fill(t.data, 0, t.nbytes());
}

V4Batch::V4Batch(const Context& ctx, const RaggedBatch& b, int bs) : batch(b), block_size(bs) {
  const int64_t T = b.num_tokens();
  tokens = b.tokens;
  seq.reserve(size_t(T));
  positions_vec.reserve(size_t(T));
  slots.reserve(size_t(T));
  for (int64_t i = 0; i < b.num_seqs(); ++i)
    for (int32_t j = 0; j < b.n_new[size_t(i)]; ++j) {
      const int32_t pos = b.n_ctx[size_t(i)] + j;
      seq.push_back(int32_t(i));
      positions_vec.push_back(pos);
      slots.push_back(slot(i, pos));
    }
  positions = device_i32(ctx, positions_vec, {T});
  tokens_t = device_i32(ctx, tokens, {T});
}

int32_t V4Batch::slot(int64_t s, int64_t pos) const {
  const int32_t block = batch.block_table[size_t(s * batch.max_blocks + pos / block_size)];
  return block * block_size + int32_t(pos % block_size);
}

Tensor rope_tail(const Tensor& x, int64_t dr) {
  Tensor t = x;
  const int64_t W = x.shape[2];
  t.data = static_cast<float*>(x.data) + (W - dr);
  t.shape[2] = dr;
  return t;
}

void store_rows(const Context& ctx, Tensor store, const Tensor& src, const std::vector<int32_t>& slots,
                int per_slot, int kind) {
  const int64_t W = src.dim(1);
  LS_CHECK(store.dim(1) == W) << "store_rows: width " << store.dim(1) << " vs " << W;
  const Allocator& memory = kernels::device_memory(ctx);
  for (int64_t i = 0; i < src.dim(0); ++i) {
    const int64_t row = int64_t(slots[size_t(i)]) * per_slot + kind;
    LS_CHECK(row >= 0 && row < store.dim(0)) << "store_rows: row " << row << " outside the store";
    memory.copy(store.f32() + row * store.stride[0], src.f32() + i * src.stride[0],
                size_t(W) * sizeof(float));
  }
}

void load_rows(const Context& ctx, Tensor dst, const Tensor& store, const std::vector<int32_t>& slots,
               int per_slot, int kind) {
  const int64_t W = dst.dim(1);
  const Allocator& memory = kernels::device_memory(ctx);
  for (int64_t i = 0; i < dst.dim(0); ++i) {
    const int64_t row = int64_t(slots[size_t(i)]) * per_slot + kind;
    memory.copy(dst.f32() + i * dst.stride[0], store.f32() + row * store.stride[0],
                size_t(W) * sizeof(float));
  }
}

EntryBatch completed_entries(const RaggedBatch& b, const V4Batch& vb, int64_t ratio, bool overlap) {
  EntryBatch e;
  for (int64_t s = 0; s < b.num_seqs(); ++s) {
    const int64_t lo = b.n_ctx[size_t(s)], hi = lo + b.n_new[size_t(s)];
    // Blocks whose last position (t + 1) * ratio - 1 lies in [lo, hi).
    for (int64_t t = lo / ratio; (t + 1) * ratio - 1 < hi; ++t) {
      if ((t + 1) * ratio - 1 < lo) continue;
      if (overlap)
        for (int64_t p = 0; p < ratio; ++p) e.rows.push_back(t == 0 ? -1 : vb.slot(s, (t - 1) * ratio + p));
      for (int64_t p = 0; p < ratio; ++p) e.rows.push_back(vb.slot(s, t * ratio + p));
      e.pos.push_back(int32_t(t * ratio));
      e.slot.push_back(vb.slot(s, (t + 1) * ratio - 1));
    }
  }
  return e;
}

VisibleEntries visible_entries(const RaggedBatch&, const V4Batch& vb, int64_t ratio) {
  VisibleEntries v;
  v.T = int64_t(vb.tokens.size());
  for (int32_t p : vb.positions_vec) v.C = std::max<int64_t>(v.C, (p + 1) / ratio);
  v.rows.assign(size_t(v.T * v.C), -1);
  for (int64_t t = 0; t < v.T; ++t) {
    const int64_t n = (vb.positions_vec[size_t(t)] + 1) / ratio;
    for (int64_t e = 0; e < n; ++e) v.rows[size_t(t * v.C + e)] = vb.slot(vb.seq[size_t(t)], (e + 1) * ratio - 1);
  }
  return v;
}

void build_candidates(const Context& ctx, OwnedTensor& cand, const RaggedBatch&, const V4Batch& vb,
                      int64_t window, int64_t ratio, const std::vector<int32_t>& chosen, int64_t KI) {
  const int64_t T = int64_t(vb.tokens.size());
  int64_t extra = 0;
  if (ratio == 4) extra = KI;
  if (ratio == 128)
    for (int32_t p : vb.positions_vec) extra = std::max<int64_t>(extra, (p + 1) / ratio);
  const int64_t C = window + extra;
  std::vector<int32_t> host(size_t(T * C), -1);  // (T, C), copied in below
  int32_t* out = host.data();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = vb.seq[size_t(t)], p = vb.positions_vec[size_t(t)];
    int32_t* row = out + t * C;
    int64_t j = 0;
    for (int64_t q = std::max<int64_t>(0, p - window + 1); q <= p; ++q) row[j++] = 2 * vb.slot(s, q);
    auto entry_row = [&](int64_t e) { return 2 * vb.slot(s, (e + 1) * ratio - 1) + 1; };
    if (ratio == 128)
      for (int64_t e = 0; e < (p + 1) / ratio; ++e) row[j++] = entry_row(e);
    if (ratio == 4)
      for (int64_t k = 0; k < KI; ++k)
        if (chosen[size_t(t * KI + k)] >= 0) row[j++] = entry_row(chosen[size_t(t * KI + k)]);
  }
  reuse(ctx, cand, DType::I32, {T, C});
  if (!host.empty())
    kernels::device_memory(ctx).copy_in(cand.view().data, host.data(), host.size() * sizeof(int32_t));
}

void check_replayed_entries(const std::vector<int32_t>& chosen, const V4Batch& vb, int64_t ratio, int64_t KI,
                            int64_t layer) {
  for (size_t t = 0; t < vb.positions_vec.size(); ++t) {
    const int64_t visible = (vb.positions_vec[t] + 1) / ratio;
    int32_t prev = -1;
    bool padding = false;
    for (int64_t k = 0; k < KI; ++k) {
      const int32_t e = chosen[t * size_t(KI) + size_t(k)];
      if (e < 0) {
        padding = true;
        continue;
      }
      LS_CHECK(!padding && e > prev && e < visible)
          << "replay_indexer: layer " << layer << ", token " << t << ", slot " << k << ": block " << e
          << " (entries must be ascending, visible (< " << visible << "), then -1 padding)";
      prev = e;
    }
  }
}

void hash_experts(const Context& ctx, Tensor out, const Tensor& tid2eid, const std::vector<int32_t>& tokens,
                  int64_t K) {
  LS_CHECK(tid2eid.data != nullptr && tid2eid.dim(1) == K) << "hash routing: no tid2eid table of width " << K;
  LS_CHECK(out.is_contiguous()) << "hash_experts: out must be contiguous";
  std::vector<unsigned char> keep;  // a copy of the table when it lies in device memory
  const int32_t* table = kernels::host_readable(tid2eid, keep).i32();
  std::vector<int32_t> host(tokens.size() * size_t(K));  // (T, K)
  for (size_t t = 0; t < tokens.size(); ++t)
    std::memcpy(host.data() + t * size_t(K), table + int64_t(tokens[t]) * tid2eid.stride[0],
                size_t(K) * sizeof(int32_t));
  if (!host.empty())
    kernels::device_memory(ctx).copy_in(out.data, host.data(), host.size() * sizeof(int32_t));
}

void swiglu_v4(const Context& ctx, Tensor act, const Tensor& gate, const Tensor& up, double limit) {
  if (limit > 0)
    kernels::swiglu_clamped_forward(ctx, act, gate, up, float(limit));
  else
    kernels::swiglu_forward(ctx, act, gate, up);
}

void swiglu_v4_backward(const Context& ctx, Tensor dgate, Tensor dup, const Tensor& dact, const Tensor& gate,
                        const Tensor& up, double limit) {
  if (limit > 0)
    kernels::swiglu_clamped_backward(ctx, dgate, dup, dact, gate, up, float(limit));
  else
    kernels::swiglu_backward(ctx, dgate, dup, dact, gate, up);
}

std::vector<int32_t> shifted_tokens(const RaggedBatch& b, int64_t shift) {
  std::vector<int32_t> out(b.tokens.size(), 0);
  int64_t row = 0;
  for (int64_t i = 0; i < b.num_seqs(); ++i) {
    const int64_t n = b.n_new[size_t(i)];
    for (int64_t j = 0; j + shift < n; ++j) out[size_t(row + j)] = b.tokens[size_t(row + j + shift)];
    row += n;
  }
  return out;
}

void add_to_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n) {
  kernels::add_to_streams(ctx, x, e, n);
}

void repeat_streams(const Context& ctx, Tensor x, const Tensor& e, int64_t n) {
  kernels::repeat_streams(ctx, x, e, n);
}

void sum_streams(const Context& ctx, Tensor de, const Tensor& dx, int64_t n) {
  kernels::sum_streams(ctx, de, dx, n);
}

const LoraLayer* v4_lora(const ModelWeights& weights, int64_t l) {
  const LoraWeights* lora = weights.lora();
  if (lora == nullptr || size_t(l) >= lora->params.layers.size()) return nullptr;
  return &lora->params.layers[size_t(l)];
}

float v4_lora_scale(const ModelWeights& weights) {
  return weights.lora() ? weights.lora()->scale() : 0.0f;
}

}  // namespace lockstep::model
