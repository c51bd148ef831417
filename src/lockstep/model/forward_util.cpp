// Implementations of the forward/backward helpers; each output row depends on
// its own input row only, so all of them are batch-invariant.
#include "lockstep/model/forward_util.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/cpu/rows.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::model {

namespace {
// Rows per thread task for a row-wise pass over rows of `width` floats: a
// task should move at least ~256 KB, else waking a second thread (tens of
// microseconds) costs more than it saves (decode batches are a few rows).
int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, width));
}
}  // namespace

BatchTensors::BatchTensors(const RaggedBatch& b, int bs, const Allocator& memory) : block_size(bs) {
  const int64_t T = b.num_tokens(), S = b.num_seqs();
  tokens = OwnedTensor(DType::I32, {T}, memory, Fill::Undefined, "batch tokens");
  memory.copy_in(tokens.view().data, b.tokens.data(), static_cast<size_t>(T) * 4);
  positions.resize(static_cast<size_t>(T));
  size_t t = 0;
  for (int64_t i = 0; i < S; ++i)
    for (int32_t j = 0; j < b.n_new[size_t(i)]; ++j) positions[t++] = b.n_ctx[size_t(i)] + j;
  positions_t = OwnedTensor(DType::I32, {T}, memory, Fill::Undefined, "batch positions");
  memory.copy_in(positions_t.view().data, positions.data(), static_cast<size_t>(T) * 4);
  n_ctx = OwnedTensor(DType::I32, {S});
  n_new = OwnedTensor(DType::I32, {S});
  if (S > 0) {  // an empty batch (an expert-parallel rank without tokens) has no arrays
    std::memcpy(n_ctx.view().data, b.n_ctx.data(), static_cast<size_t>(S) * 4);
    std::memcpy(n_new.view().data, b.n_new.data(), static_cast<size_t>(S) * 4);
  }
  block_table = OwnedTensor(DType::I32, {S, b.max_blocks});
  if (!b.block_table.empty())
    std::memcpy(block_table.view().data, b.block_table.data(), b.block_table.size() * 4);
}

kernels::AttentionBatch BatchTensors::attention_batch() const {
  kernels::AttentionBatch ab;
  ab.n_ctx = n_ctx.view();
  ab.n_new = n_new.view();
  ab.block_table = block_table.view();
  ab.block_size = block_size;
  return ab;
}

namespace {
// Whole experts per thread only when the busiest thread gets at most this
// much more than an even share of the rows; past it, the idle thread costs
// more than the wake-ups saved.
constexpr double kExpertImbalance = 1.15;
}  // namespace

void for_each_expert(const Context& ctx, const kernels::MoeDispatch& plan,
                     const std::function<void(int64_t, const Context&)>& fn) {
  const int64_t E = plan.num_experts;
  std::vector<int64_t> active;
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e)
    if (plan.expert_rows(int(e)) > 0) {
      active.push_back(e);
      total += plan.expert_rows(int(e));
    }
  const int P = ctx.threads();
  // On a device the experts run one after another, each kernel on the whole
  // device (and ctx keeps its backend: the host cannot read device memory).
  if (P > 1 && ctx.pool != nullptr && ctx.gpu == nullptr && int64_t(active.size()) >= P) {
    // Longest rows first onto the least loaded thread (ties: lower expert,
    // lower thread): a pure function of the plan.
    std::vector<int64_t> order = active;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return plan.expert_rows(int(a)) > plan.expert_rows(int(b));
    });
    std::vector<std::vector<int64_t>> bins(static_cast<size_t>(P));
    std::vector<int64_t> load(static_cast<size_t>(P), 0);
    for (int64_t e : order) {
      const size_t t = size_t(std::min_element(load.begin(), load.end()) - load.begin());
      bins[t].push_back(e);
      load[t] += plan.expert_rows(int(e));
    }
    const int64_t busiest = *std::max_element(load.begin(), load.end());
    if (double(busiest) <= kExpertImbalance * double(total) / double(P)) {
      const Context solo{nullptr, ctx.seed};
      ctx.pool->run_on_workers(P, [&](int t) {
        for (int64_t e : bins[size_t(t)]) fn(e, solo);
      });
      return;
    }
  }
  for (int64_t e : active) fn(e, ctx);
}

kernels::RouterConfig router_config(const ModelConfig& c) {
  kernels::RouterConfig r;
  r.num_experts = static_cast<int>(c.num_experts);
  r.top_k = static_cast<int>(c.num_experts_per_tok);
  switch (c.router_scoring) {
    case RouterScoring::Softmax: r.scoring = kernels::RouterScoring::Softmax; break;
    case RouterScoring::Sigmoid: r.scoring = kernels::RouterScoring::Sigmoid; break;
    case RouterScoring::SqrtSoftplus: r.scoring = kernels::RouterScoring::SqrtSoftplus; break;
  }
  r.normalize = c.norm_topk_prob;
  r.routed_scaling = static_cast<float>(c.routed_scaling_factor);
  r.n_group = static_cast<int>(c.n_group);
  r.topk_group = static_cast<int>(c.topk_group);
  return r;
}

OwnedTensor copy_of(const Tensor& t) {
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  OwnedTensor o(t.dtype, shape);
  if (t.is_contiguous()) {
    std::memcpy(o.view().data, t.data, t.nbytes());
  } else {
    LS_CHECK(t.ndim == 2 && t.stride[1] == 1)
        << "copy_of supports contiguous or row-strided 2-D, got " << t.shape_str();
    const size_t row = static_cast<size_t>(t.shape[1]) * dtype_size(t.dtype);
    for (int64_t r = 0; r < t.shape[0]; ++r)
      std::memcpy(
          static_cast<char*>(o.view().data) + r * row,
          static_cast<const char*>(t.data) + static_cast<size_t>(r * t.stride[0]) * dtype_size(t.dtype), row);
  }
  return o;
}

void add_row_bias(const Context& ctx, Tensor y, const Tensor& b) {
  kernels::add_row_bias(ctx, y, b);
}

void add_column_sums(const Context& ctx, Tensor db, const Tensor& dy) {
  const int64_t T = dy.dim(0), N = dy.dim(1);
  check_shape(db, {N}, "bias gradient");
  const float* g = dy.f32();
  float* out = db.f32();
  const int64_t gs = dy.stride[0];
  // Columns in blocks of 64, rows in order inside a block: each column is
  // still one sum over t = 0..T-1 in order, but every row of dy is read as a
  // contiguous run instead of one float per cache line.
  constexpr int64_t kBlock = 64;
  ctx.parallel_for((N + kBlock - 1) / kBlock, [&](int64_t b0, int64_t b1) {
    float acc[kBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlock, w = std::min(kBlock, N - n0);
      std::fill(acc, acc + w, 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const float* row = g + t * gs + n0;
        for (int64_t j = 0; j < w; ++j) acc[j] = acc[j] + row[j];
      }
      for (int64_t j = 0; j < w; ++j) out[n0 + j] = out[n0 + j] + acc[j];
    }
  });
}

void split_qkv(const Context& ctx, Tensor q, Tensor k, Tensor v, const Tensor& qkv) {
  if (qkv.dim(0) == 0) return;  // an empty batch (expert parallelism runs them)
  const int64_t T = qkv.dim(0), nq = q.numel() / T, nk = k.numel() / T;
  check_shape(qkv, {T, nq + 2 * nk}, "qkv");
  const float* src = qkv.f32();
  float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  const int64_t s = qkv.stride[0];
  const Allocator& memory = kernels::device_memory(ctx);
  if (!memory.host_visible()) {  // device memory: three strided copies on the device
    const size_t pitch = size_t(s) * 4, T_ = size_t(T);
    memory.copy_2d(qp, size_t(nq) * 4, src, pitch, size_t(nq) * 4, T_);
    memory.copy_2d(kp, size_t(nk) * 4, src + nq, pitch, size_t(nk) * 4, T_);
    memory.copy_2d(vp, size_t(nk) * 4, src + nq + nk, pitch, size_t(nk) * 4, T_);
    return;
  }
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          std::memcpy(qp + t * nq, src + t * s, size_t(nq) * 4);
          std::memcpy(kp + t * nk, src + t * s + nq, size_t(nk) * 4);
          std::memcpy(vp + t * nk, src + t * s + nq + nk, size_t(nk) * 4);
        }
      },
      row_grain(nq + 2 * nk));
}

void join_qkv(const Context& ctx, Tensor qkv, const Tensor& q, const Tensor& k, const Tensor& v) {
  if (qkv.dim(0) == 0) return;  // an empty batch (expert parallelism runs them)
  const int64_t T = qkv.dim(0), nq = q.numel() / T, nk = k.numel() / T;
  check_shape(qkv, {T, nq + 2 * nk}, "qkv");
  float* dst = qkv.f32();
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  const int64_t s = qkv.stride[0];
  const Allocator& memory = kernels::device_memory(ctx);
  if (!memory.host_visible()) {  // device memory: three strided copies on the device
    const size_t pitch = size_t(s) * 4, T_ = size_t(T);
    memory.copy_2d(dst, pitch, qp, size_t(nq) * 4, size_t(nq) * 4, T_);
    memory.copy_2d(dst + nq, pitch, kp, size_t(nk) * 4, size_t(nk) * 4, T_);
    memory.copy_2d(dst + nq + nk, pitch, vp, size_t(nk) * 4, size_t(nk) * 4, T_);
    return;
  }
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          std::memcpy(dst + t * s, qp + t * nq, size_t(nq) * 4);
          std::memcpy(dst + t * s + nq, kp + t * nk, size_t(nk) * 4);
          std::memcpy(dst + t * s + nq + nk, vp + t * nk, size_t(nk) * 4);
        }
      },
      row_grain(nq + 2 * nk));
}

void add_into(const Context& ctx, Tensor out, const Tensor& a, const Tensor& b) {
  kernels::add_rows(ctx, out, a, b);
}

void gather_rows(Tensor out, const Tensor& x, const std::vector<int32_t>& rows) {
  gather_rows(Context{}, out, x, rows);
}

void gather_rows(const Context& ctx, Tensor out, const Tensor& x, const std::vector<int32_t>& rows) {
  const int64_t D = x.dim(1);
  check_shape(out, {static_cast<int64_t>(rows.size()), D}, "gathered rows");
  const Allocator& memory = kernels::device_memory(ctx);
  if (!memory.host_visible()) {  // device memory: a copy on the device per row
    for (size_t r = 0; r < rows.size(); ++r)
      memory.copy(out.f32() + int64_t(r) * out.stride[0], x.f32() + rows[r] * x.stride[0], size_t(D) * 4);
    return;
  }
  ctx.parallel_for(
      static_cast<int64_t>(rows.size()),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          std::memcpy(out.f32() + r * out.stride[0], x.f32() + rows[size_t(r)] * x.stride[0], size_t(D) * 4);
      },
      row_grain(D));
}

void scatter_rows(const Context& ctx, Tensor out, const Tensor& src, const std::vector<int32_t>& rows) {
  const int64_t T = out.dim(0), D = out.dim(1);
  check_shape(src, {static_cast<int64_t>(rows.size()), D}, "scattered rows");
  const Allocator& memory = kernels::device_memory(ctx);
  if (!memory.host_visible()) {  // device memory: zeros, then a device copy per row
    if (T == 0 || D == 0) return;
    const OwnedTensor zeros(DType::F32, {T, D}, memory, Fill::Zero, "scatter_rows zeros");  // (T, D)
    memory.copy_2d(out.f32(), size_t(out.stride[0]) * 4, zeros.view().data, size_t(D) * 4, size_t(D) * 4,
                   size_t(T));
    for (size_t r = 0; r < rows.size(); ++r)
      memory.copy(out.f32() + rows[r] * out.stride[0], src.f32() + int64_t(r) * src.stride[0], size_t(D) * 4);
    return;
  }
  // Rows are ascending: walk out's rows once, copying or zeroing each.
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        size_t r = size_t(std::lower_bound(rows.begin(), rows.end(), int32_t(t0)) - rows.begin());
        for (int64_t t = t0; t < t1; ++t) {
          float* dst = out.f32() + t * out.stride[0];
          if (r < rows.size() && rows[r] == t) {
            std::memcpy(dst, src.f32() + int64_t(r) * src.stride[0], size_t(D) * 4);
            ++r;
          } else {
            std::memset(dst, 0, size_t(D) * 4);
          }
        }
      },
      row_grain(D));
}

void gather_layer_experts(Tensor out, const std::vector<int32_t>& all, int64_t layer, int64_t n_moe,
                          int64_t k) {
  const int64_t T = out.dim(0);
  int32_t* o = out.i32();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s) o[t * k + s] = all[size_t((t * n_moe + layer) * k + s)];
}

void gather_layer_experts(const Context& ctx, Tensor out, const std::vector<int32_t>& all, int64_t layer,
                          int64_t n_moe, int64_t k) {
  const Allocator& memory = kernels::device_memory(ctx);
  if (memory.host_visible()) {
    gather_layer_experts(out, all, layer, n_moe, k);
    return;
  }
  // Device memory: gathered on the host, then one copy in.
  const int64_t T = out.dim(0);
  LS_CHECK(out.is_contiguous()) << "gather_layer_experts: out must be contiguous";
  std::vector<int32_t> host(static_cast<size_t>(T * k));  // (T, K)
  gather_layer_experts(Tensor(host.data(), DType::I32, {T, k}), all, layer, n_moe, k);
  if (!host.empty()) memory.copy_in(out.data, host.data(), host.size() * sizeof(int32_t));
}

void scatter_layer_experts(std::vector<int32_t>& all, const Tensor& layer_idx, int64_t layer, int64_t n_moe,
                           int64_t k) {
  const int64_t T = layer_idx.dim(0);
  std::vector<unsigned char> keep;  // a copy of layer_idx when it lies in device memory
  const int32_t* src = kernels::host_readable(layer_idx, keep).i32();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < k; ++s) all[size_t((t * n_moe + layer) * k + s)] = src[t * k + s];
}

void shared_gate_forward(const Context& ctx, Tensor sgate, const Tensor& x, const kernels::PackedWeight& w) {
  const int64_t T = x.dim(0);
  OwnedTensor logit(DType::F32, {T, 1}, kernels::device_memory(ctx), Fill::Undefined,
                    "shared gate logit");  // (T, 1)
  kernels::gemm_xwt(ctx, logit.view(), x, w);
  kernels::sigmoid_forward(ctx, sgate, logit.view());
}

void add_shared_expert(const Context& ctx, Tensor ffn, const Tensor& ys, const Tensor& sgate) {
  kernels::add_scaled_rows(ctx, ffn, ys, sgate);
}

// Group width of the fp8 activation scales (DeepSeek's 1 x 128 tiles).
constexpr int64_t kFp8ActivationGroup = 128;

namespace {
// x (M, K) quantized as an FP8 forward quantizes a projection's input, on a copy.
OwnedTensor fp8_quantized_input(const Context& ctx, const Tensor& x) {
  const int64_t M = x.dim(0), K = x.dim(1);
  const Allocator& memory = kernels::device_memory(ctx);
  OwnedTensor xq(DType::F32, {M, K}, memory, Fill::Undefined, "fp8 quantized input");  // (M, K)
  if (M > 0 && K > 0)
    memory.copy_2d(xq.f32(), size_t(K) * sizeof(float), x.data, size_t(x.stride[0]) * sizeof(float),
                   size_t(K) * sizeof(float), size_t(M));
  kernels::fp8_quantize_rows(ctx, xq.view(), kFp8ActivationGroup);
  return xq;
}
}  // namespace

void project(const Context& ctx, Tensor y, const Tensor& x, const kernels::PackedWeight& w, bool accumulate) {
  if (w.storage != DType::FP8E4M3 || x.dim(0) == 0) {
    kernels::gemm_xwt(ctx, y, x, w, accumulate);
    return;
  }
  kernels::gemm_xwt(ctx, y, fp8_quantized_input(ctx, x).view(), w, accumulate);
}

void project_dw(const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x,
                const kernels::PackedWeight& w) {
  if (w.storage != DType::FP8E4M3 || x.dim(0) == 0) {
    kernels::gemm_dytx(ctx, dw, dy, x);
    return;
  }
  kernels::gemm_dytx(ctx, dw, dy, fp8_quantized_input(ctx, x).view());
}

void keep_head_input(const Context& ctx, ForwardResult& result, const Tensor& rows) {
  const int64_t R = rows.dim(0), D = rows.dim(1);
  LS_CHECK(rows.stride[0] == D) << "keep_head_input: rows must be contiguous";
  Tensor out = reuse(ctx, result.head_input, DType::F32, {R, D});
  if (R > 0) kernels::device_memory(ctx).copy(out.data, rows.data, size_t(R * D) * sizeof(float));
}

CapturePoints::CapturePoints(const ForwardOptions& o, const RaggedBatch& b,
                             const std::vector<int32_t>& positions)
    : fn_(o.capture), ids_(o.capture_ids) {
  if (fn_ == nullptr) return;
  LS_CHECK(ids_ == nullptr || static_cast<int64_t>(ids_->size()) == b.num_seqs())
      << "capture_ids has " << ids_->size() << " entries, the batch " << b.num_seqs() << " sequences";
  seq_.reserve(positions.size());
  for (int64_t i = 0; i < b.num_seqs(); ++i) seq_.insert(seq_.end(), size_t(b.n_new[size_t(i)]), int32_t(i));
  pos_ = positions;
  for (int32_t r : b.logit_rows) {
    logit_seq_.push_back(seq_[size_t(r)]);
    logit_pos_.push_back(pos_[size_t(r)]);
  }
}

void CapturePoints::emit(const char* name, int64_t layer, const Tensor& t, bool logit_rows) const {
  int64_t cols = 1;
  for (int i = 1; i < t.ndim; ++i) cols *= t.shape[i];
  Captured c;
  c.name = name;
  c.layer = layer;
  c.data = Tensor(t.data, t.dtype, {t.dim(0), cols});
  c.seq = logit_rows ? logit_seq_.data() : seq_.data();
  c.pos = logit_rows ? logit_pos_.data() : pos_.data();
  c.seq_ids = ids_ ? ids_->data() : nullptr;
  (*fn_)(c);
}

}  // namespace lockstep::model
