// Paged-cache attention on the GPU: the cache write, the forward and the
// backward of kernels/cpu/attention.h, with the CPU's bits. Each (token, head)
// folds the key blocks of the contract in position order, exactly as the CPU
// does; threads only split independent dot products and independent fma
// chains, so the block shape changes no bits.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "lockstep/kernels/cpu/attention_plan.h"
#include "lockstep/kernels/gpu/attention.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sub;

// ---- host side: small plan arrays in device memory ---------------------------

// n elements of device memory for one entry call, freed at scope end; from a
// host vector (copied in) or uninitialised (scratch).
template <typename T>
class DeviceArray {
 public:
  DeviceArray(int64_t n, const char* what) : n_(std::max<int64_t>(n, 1)) {
#if defined(LOCKSTEP_GPU_INTERP)
    p_ = static_cast<T*>(::lockstep::gpu::emu::device_alloc(bytes(), what));
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()) == cudaSuccess) << what;
#else
    LS_CHECK(hipMalloc(reinterpret_cast<void**>(&p_), bytes()) == hipSuccess) << what;
#endif
  }
  DeviceArray(const std::vector<T>& host, const char* what)
      : DeviceArray(static_cast<int64_t>(host.size()), what) {
    const size_t b = host.size() * sizeof(T);
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::copy_to_device(p_, host.data(), b);
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMemcpy(p_, host.data(), b, cudaMemcpyHostToDevice) == cudaSuccess) << what;
#else
    LS_CHECK(hipMemcpy(p_, host.data(), b, hipMemcpyHostToDevice) == hipSuccess) << what;
#endif
  }
  ~DeviceArray() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(p_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(p_);  // waits for the kernels that read it
#else
    (void)hipFree(p_);
#endif
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const {
    return p_;
  }

 private:
  size_t bytes() const {
    return static_cast<size_t>(n_) * sizeof(T);
  }
  int64_t n_;
  T* p_ = nullptr;
};

// The batch as the kernels read it: per-token sequence and position, the
// sequences' first rows, and the block table packed to rows of max_blocks.
struct DevicePlan {
  DeviceArray<int32_t> seq, pos, table;
  DeviceArray<int64_t> first;
  explicit DevicePlan(const attn::BatchPlan& p)
      : seq(p.seq, "attention plan seq"),
        pos(p.pos, "attention plan pos"),
        table(packed_table(p), "attention block table"),
        first(p.first, "attention plan first") {}

 private:
  static std::vector<int32_t> packed_table(const attn::BatchPlan& p) {
    std::vector<int32_t> t(static_cast<size_t>(p.S * p.max_blocks));
    for (int64_t s = 0; s < p.S; ++s)
      std::copy_n(p.table + s * p.table_stride, p.max_blocks, t.begin() + s * p.max_blocks);
    return t;
  }
};

void check_launch(const char* kernel) {
#if defined(LOCKSTEP_GPU_CUDA)
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess) << kernel << ": " << cudaGetErrorString(e);
#elif defined(LOCKSTEP_GPU_HIP)
  const hipError_t e = hipGetLastError();
  LS_CHECK(e == hipSuccess) << kernel << ": " << hipGetErrorString(e);
#else
  (void)kernel;
#endif
}

void check_threads(const char* fn, int threads) {
  LS_CHECK(threads >= 1 && threads <= 1024) << fn << ": launch with " << threads << " threads per block";
}

void check_head_dim(const char* fn, int64_t Dh) {
  if (Dh > kMaxHeadDim)
    LS_THROW << fn << ": head width Dh = " << Dh << " exceeds the GPU kernels' " << kMaxHeadDim;
}

// ---- device side ----------------------------------------------------------------

// One layer's paged cache as a kernel reads it: rows of Dh elements, f32 or
// bf16 (widened exactly), addressed through one sequence's block-table row.
struct CacheRef {
  const void* k = nullptr;
  const void* v = nullptr;
  bool bf16 = false;
  int64_t BS = 0, Hkv = 0, Dh = 0;

  // Element offset of the row of absolute position `p` (block-table row `row`), kv head kvh.
  LS_DEVICE int64_t offset(const int32_t* row, int64_t p, int64_t kvh) const {
    return ((static_cast<int64_t>(row[p / BS]) * BS + p % BS) * Hkv + kvh) * Dh;
  }
  LS_DEVICE float load(const void* base, int64_t off) const {
    return bf16 ? num::bf16_to_f32(static_cast<const uint16_t*>(base)[off])
                : static_cast<const float*>(base)[off];
  }
};

// canonical_dot(a, b, n) of simd.h: element i into lane i % 16 by fma, then the tree.
LS_DEVICE float dot(const float* a, const float* b, int64_t n) {
  num::Lanes16 acc;
  for (int64_t i = 0; i < n; ++i) acc.fma(i, a[i], b[i]);
  return acc.reduce();
}

// The same with b a cache row (widened element by element).
LS_DEVICE float dot_cache(const float* a, const CacheRef& c, const void* base, int64_t off, int64_t n) {
  num::Lanes16 acc;
  for (int64_t i = 0; i < n; ++i) acc.fma(i, a[i], c.load(base, off + i));
  return acc.reduce();
}

// canonical_sum(x, n).
LS_DEVICE float sum(const float* x, int n) {
  num::Lanes16 acc;
  for (int i = 0; i < n; ++i) acc.add(i, x[i]);
  return acc.reduce();
}

// max_reduce(x, n) (n >= 1): the first of equal maxima (so +0 before -0 keeps
// +0), and a NaN anywhere wins (the last one).
LS_DEVICE float max_of(const float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = (x[i] > m || num::is_nan(x[i])) ? x[i] : m;
  return m;
}

LS_DEVICE int min_int(int64_t a, int64_t b) {
  return static_cast<int>(a < b ? a : b);
}

// ---- kv_cache_write -------------------------------------------------------------

// Block b copies token b's K and V rows (row_elems = Hkv * Dh, contiguous in
// the cache slot) to slot[b]; bf16 caches round to nearest even.
LS_GLOBAL void kv_cache_write_kernel(void* k_cache, void* v_cache, bool bf16, const float* k_new,
                                     int64_t k_stride, const float* v_new, int64_t v_stride,
                                     const int64_t* slot, int64_t row_elems) {
  const int64_t t = blockIdx.x;
  const int64_t dst = slot[t] * row_elems;
  const float* ks = k_new + t * k_stride;
  const float* vs = v_new + t * v_stride;
  for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) {
    if (bf16) {
      static_cast<uint16_t*>(k_cache)[dst + e] = num::f32_to_bf16(ks[e]);
      static_cast<uint16_t*>(v_cache)[dst + e] = num::f32_to_bf16(vs[e]);
    } else {
      static_cast<float*>(k_cache)[dst + e] = ks[e];
      static_cast<float*>(v_cache)[dst + e] = vs[e];
    }
  }
}

// ---- forward --------------------------------------------------------------------

struct ForwardArgs {
  float* out;      // (T, H, Dh), row stride out_stride
  float* lse;      // (T, H), row stride lse_stride; null: not wanted
  const float* q;  // (T, H, Dh), row stride q_stride
  int64_t out_stride, lse_stride, q_stride;
  CacheRef cache;
  const int32_t* table;  // (S, max_blocks)
  int64_t max_blocks;
  const int32_t* seq;  // (T)
  const int32_t* pos;  // (T)
  int64_t H, G;        // query heads, query heads per kv head
  float scale;
};

// Block (t * H + h): the query of token t, head h, over the keys 0..pos(t) in
// key blocks of kKeyBlock, each folded by the contract of attention.h. The
// running max and sum are computed by every thread alike from shared scores
// (no broadcast needed); thread i % blockDim owns key i's score and output
// element i's fma chain.
LS_GLOBAL void attention_forward_kernel(ForwardArgs a) {
  LS_SHARED(float, qs, kMaxHeadDim);    // (Dh) the query row
  LS_SHARED(float, acc, kMaxHeadDim);   // (Dh) unnormalized output, element d owned by thread d % blockDim
  LS_SHARED(float, s, kKeyBlock);       // (n) this block's scaled scores
  LS_SHARED(float, e, kKeyBlock);       // (n) their exps
  LS_SHARED(int64_t, voff, kKeyBlock);  // (n) cache offsets of their value rows
  const int tid = static_cast<int>(threadIdx.x), nth = static_cast<int>(blockDim.x);
  const int64_t item = blockIdx.x, t = item / a.H, h = item % a.H, kvh = h / a.G;
  const CacheRef& c = a.cache;
  const int64_t Dh = c.Dh, pos = a.pos[t];
  const int32_t* row = a.table + a.seq[t] * a.max_blocks;
  const float* qt = a.q + t * a.q_stride + h * Dh;
  for (int64_t d = tid; d < Dh; d += nth) qs[d] = qt[d];
  __syncthreads();

  float m = 0.0f, l = 0.0f;  // running max and sum, the same in every thread
  for (int64_t j = 0; j * kKeyBlock <= pos; ++j) {
    const int64_t p0 = j * kKeyBlock;
    const int n = min_int(kKeyBlock, pos + 1 - p0);
    const bool first = j == 0;
    for (int i = tid; i < n; i += nth)
      s[i] = ls_mul(dot_cache(qs, c, c.k, c.offset(row, p0 + i, kvh), Dh), a.scale);
    __syncthreads();
    const float mb = max_of(s, n);
    const float m_new = first ? mb : ((mb > m || num::is_nan(mb)) ? mb : m);
    for (int i = tid; i < n; i += nth) {
      e[i] = num::exp(ls_sub(s[i], m_new));
      voff[i] = c.offset(row, p0 + i, kvh);
    }
    const float alpha = first ? 0.0f : num::exp(ls_sub(m, m_new));
    __syncthreads();  // e, voff complete; s free for the next block
    const float lb = sum(e, n);
    l = first ? lb : ls_add(ls_mul(l, alpha), lb);
    m = m_new;
    for (int64_t d = tid; d < Dh; d += nth) {
      float x = first ? 0.0f : ls_mul(acc[d], alpha);
      for (int i = 0; i < n; ++i) x = ls_fma(e[i], c.load(c.v, voff[i] + d), x);
      acc[d] = x;
    }
    // e and voff are rewritten only after the next block's first barrier: no barrier here.
  }
  float* o = a.out + t * a.out_stride + h * Dh;
  for (int64_t d = tid; d < Dh; d += nth) o[d] = ls_div(acc[d], l);
  if (a.lse != nullptr && tid == 0) a.lse[t * a.lse_stride + h] = ls_add(m, num::log(l));
}

// ---- backward -------------------------------------------------------------------

struct BackwardArgs {
  float* dq;          // (T, H, Dh)
  float* dk;          // (T, Hkv, Dh)
  float* dv;          // (T, Hkv, Dh)
  const float* dout;  // (T, H, Dh)
  const float* out;   // (T, H, Dh)
  const float* lse;   // (T, H)
  const float* q;     // (T, H, Dh)
  int64_t dq_stride, dk_stride, dv_stride, dout_stride, out_stride, lse_stride, q_stride;
  float* dsum;  // (T, H) D = dout . out, written by the dq pass
  CacheRef cache;
  const int32_t* table;  // (S, max_blocks)
  int64_t max_blocks;
  const int32_t* seq;    // (T)
  const int32_t* pos;    // (T)
  const int64_t* first;  // (S + 1)
  int64_t H, G;
  float scale;
};

// Pass 1, block (t * H + h): D = dout . out and dq = scale Σ_j dS_j k_j over
// the keys 0..pos(t) in position order, one fma chain per element (the CPU's
// pass 1).
LS_GLOBAL void attention_dq_kernel(BackwardArgs a) {
  LS_SHARED(float, qs, kMaxHeadDim);    // (Dh) q row
  LS_SHARED(float, dos, kMaxHeadDim);   // (Dh) dout row
  LS_SHARED(float, acc, kMaxHeadDim);   // (Dh) Σ dS k, element d owned by thread d % blockDim
  LS_SHARED(float, ds, kKeyBlock);      // (n) dS of this key block
  LS_SHARED(int64_t, koff, kKeyBlock);  // (n) cache offsets of its rows
  const int tid = static_cast<int>(threadIdx.x), nth = static_cast<int>(blockDim.x);
  const int64_t item = blockIdx.x, t = item / a.H, h = item % a.H, kvh = h / a.G;
  const CacheRef& c = a.cache;
  const int64_t Dh = c.Dh, pos = a.pos[t];
  const int32_t* row = a.table + a.seq[t] * a.max_blocks;
  const float* qt = a.q + t * a.q_stride + h * Dh;
  const float* dot_row = a.dout + t * a.dout_stride + h * Dh;
  for (int64_t d = tid; d < Dh; d += nth) {
    qs[d] = qt[d];
    dos[d] = dot_row[d];
  }
  __syncthreads();
  const float D = dot(dos, a.out + t * a.out_stride + h * Dh, Dh);
  if (tid == 0) a.dsum[t * a.H + h] = D;
  const float l = a.lse[t * a.lse_stride + h];
  for (int64_t j = 0; j * kKeyBlock <= pos; ++j) {
    const int64_t p0 = j * kKeyBlock;
    const int n = min_int(kKeyBlock, pos + 1 - p0);
    for (int i = tid; i < n; i += nth) {
      const int64_t off = c.offset(row, p0 + i, kvh);
      const float pr = num::exp(ls_sub(ls_mul(dot_cache(qs, c, c.k, off, Dh), a.scale), l));
      const float dp = dot_cache(dos, c, c.v, off, Dh);  // the CPU's "* 1.0f" is exact
      ds[i] = ls_mul(pr, ls_sub(dp, D));
      koff[i] = off;
    }
    __syncthreads();
    for (int64_t d = tid; d < Dh; d += nth) {
      float x = j == 0 ? 0.0f : acc[d];
      for (int i = 0; i < n; ++i) x = ls_fma(ds[i], c.load(c.k, koff[i] + d), x);
      acc[d] = x;
    }
    __syncthreads();  // ds, koff are rewritten by the next block
  }
  float* o = a.dq + t * a.dq_stride + h * Dh;
  for (int64_t d = tid; d < Dh; d += nth) o[d] = ls_mul(acc[d], a.scale);
}

// Pass 2, block (t * Hkv + kvh): key row t. dv = Σ P dout and dk = scale Σ dS q
// over the heads of the group, then the queries t..end of the sequence, both
// ascending: one fma chain per element across all of them (the CPU's pass 2;
// its chunks of kKeyBlock queries change nothing in a plain chain).
LS_GLOBAL void attention_dkv_kernel(BackwardArgs a) {
  LS_SHARED(float, ks, kMaxHeadDim);    // (Dh) key row t
  LS_SHARED(float, vs, kMaxHeadDim);    // (Dh) value row t
  LS_SHARED(float, kacc, kMaxHeadDim);  // (Dh) element d owned by thread d % blockDim
  LS_SHARED(float, vacc, kMaxHeadDim);  // (Dh)
  LS_SHARED(float, pr, kKeyBlock);      // (n) P of this chunk of queries
  LS_SHARED(float, ds, kKeyBlock);      // (n) dS
  const int tid = static_cast<int>(threadIdx.x), nth = static_cast<int>(blockDim.x);
  const CacheRef& c = a.cache;
  const int64_t Hkv = c.Hkv, Dh = c.Dh;
  const int64_t item = blockIdx.x, t = item / Hkv, kvh = item % Hkv;
  const int64_t end = a.first[a.seq[t] + 1];
  const int32_t* row = a.table + a.seq[t] * a.max_blocks;
  const int64_t off = c.offset(row, a.pos[t], kvh);
  for (int64_t d = tid; d < Dh; d += nth) {
    ks[d] = c.load(c.k, off + d);
    vs[d] = c.load(c.v, off + d);
  }
  __syncthreads();
  bool first = true;
  for (int64_t h = kvh * a.G; h < (kvh + 1) * a.G; ++h) {
    for (int64_t u0 = t; u0 < end; u0 += kKeyBlock) {
      const int n = min_int(kKeyBlock, end - u0);
      for (int i = tid; i < n; i += nth) {
        const int64_t u = u0 + i;
        // k_t . q_u has the bits of q_u . k_t: fma's product is symmetric.
        const float p = num::exp(
            ls_sub(ls_mul(dot(ks, a.q + u * a.q_stride + h * Dh, Dh), a.scale), a.lse[u * a.lse_stride + h]));
        const float dp = dot(vs, a.dout + u * a.dout_stride + h * Dh, Dh);
        pr[i] = p;
        ds[i] = ls_mul(p, ls_sub(dp, a.dsum[u * a.H + h]));
      }
      __syncthreads();
      for (int64_t d = tid; d < Dh; d += nth) {
        float xv = first ? 0.0f : vacc[d];
        float xk = first ? 0.0f : kacc[d];
        for (int i = 0; i < n; ++i) {
          const int64_t u = u0 + i;
          xv = ls_fma(pr[i], a.dout[u * a.dout_stride + h * Dh + d], xv);
          xk = ls_fma(ds[i], a.q[u * a.q_stride + h * Dh + d], xk);
        }
        vacc[d] = xv;
        kacc[d] = xk;
      }
      first = false;
      __syncthreads();  // pr, ds are rewritten by the next chunk
    }
  }
  float* dko = a.dk + t * a.dk_stride + kvh * Dh;
  float* dvo = a.dv + t * a.dv_stride + kvh * Dh;
  for (int64_t d = tid; d < Dh; d += nth) {
    dko[d] = ls_mul(kacc[d], a.scale);
    dvo[d] = vacc[d];
  }
}

CacheRef cache_ref(const Tensor& k_cache, const Tensor& v_cache, const attn::BatchPlan& p) {
  return CacheRef{k_cache.data, v_cache.data, k_cache.dtype == DType::BF16, p.BS, p.Hkv, p.Dh};
}

}  // namespace

// ---- host entries -----------------------------------------------------------------

void kv_cache_write(const Context& ctx, Tensor k_cache, Tensor v_cache, const Tensor& k_new,
                    const Tensor& v_new, const AttentionBatch& batch, const KvWriteLaunch& launch) {
  check_threads("kv_cache_write", launch.threads);
  std::vector<std::pair<int64_t, int64_t>> slots;  // (slot, token), sorted by slot
  const attn::BatchPlan p = attn::plan_kv_cache_write(k_cache, v_cache, k_new, v_new, batch, &slots);
  if (p.T == 0) return;
  std::vector<int64_t> slot_of(static_cast<size_t>(p.T));  // (T)
  for (const auto& [slot, tok] : slots) slot_of[tok] = slot;
  const DeviceArray<int64_t> dslot(slot_of, "kv_cache_write slots");
  LS_LAUNCH(ctx, kv_cache_write_kernel, dim3(static_cast<unsigned>(p.T)), dim3(launch.threads))
  (k_cache.data, v_cache.data, k_cache.dtype == DType::BF16, k_new.ptr<const float>(), k_new.stride[0],
   v_new.ptr<const float>(), v_new.stride[0], dslot.get(), p.Hkv * p.Dh);
  check_launch("kv_cache_write_kernel");
}

void attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q, const Tensor& k_cache,
                       const Tensor& v_cache, const AttentionBatch& batch, float scale,
                       const AttentionLaunch& launch) {
  check_threads("attention_forward", launch.threads);
  const attn::BatchPlan p = attn::plan_attention_forward(out, lse, q, k_cache, v_cache, batch);
  const int64_t H = q.shape[1];
  check_head_dim("attention_forward", p.Dh);
  if (p.T == 0) return;
  const bool want_lse = lse.data != nullptr || lse.ndim != 0;
  const DevicePlan dp(p);
  ForwardArgs a{out.ptr<float>(),
                want_lse ? lse.ptr<float>() : nullptr,
                q.ptr<const float>(),
                out.stride[0],
                want_lse ? lse.stride[0] : 0,
                q.stride[0],
                cache_ref(k_cache, v_cache, p),
                dp.table.get(),
                p.max_blocks,
                dp.seq.get(),
                dp.pos.get(),
                H,
                H / p.Hkv,
                scale};
  LS_LAUNCH(ctx, attention_forward_kernel, dim3(static_cast<unsigned>(p.T * H)), dim3(launch.threads))(a);
  check_launch("attention_forward_kernel");
}

void attention_backward(const Context& ctx, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const AttentionBatch& batch, float scale,
                        const AttentionLaunch& launch) {
  check_threads("attention_backward", launch.threads);
  const attn::BatchPlan p =
      attn::plan_attention_backward(dq, dk, dv, dout, out, lse, q, k_cache, v_cache, batch);
  const int64_t H = q.shape[1];
  check_head_dim("attention_backward", p.Dh);
  if (p.T == 0) return;
  const DevicePlan dp(p);
  const DeviceArray<float> dsum(p.T * H, "attention_backward D");  // (T, H)
  BackwardArgs a{dq.ptr<float>(),
                 dk.ptr<float>(),
                 dv.ptr<float>(),
                 dout.ptr<const float>(),
                 out.ptr<const float>(),
                 lse.ptr<const float>(),
                 q.ptr<const float>(),
                 dq.stride[0],
                 dk.stride[0],
                 dv.stride[0],
                 dout.stride[0],
                 out.stride[0],
                 lse.stride[0],
                 q.stride[0],
                 dsum.get(),
                 cache_ref(k_cache, v_cache, p),
                 dp.table.get(),
                 p.max_blocks,
                 dp.seq.get(),
                 dp.pos.get(),
                 dp.first.get(),
                 H,
                 H / p.Hkv,
                 scale};
  LS_LAUNCH(ctx, attention_dq_kernel, dim3(static_cast<unsigned>(p.T * H)), dim3(launch.threads))(a);
  check_launch("attention_dq_kernel");
  LS_LAUNCH(ctx, attention_dkv_kernel, dim3(static_cast<unsigned>(p.T * p.Hkv)), dim3(launch.threads))(a);
  check_launch("attention_dkv_kernel");
}

namespace {
void kv_cache_write_entry(const Context& ctx, Tensor k_cache, Tensor v_cache, const Tensor& k_new,
                          const Tensor& v_new, const AttentionBatch& batch) {
  kv_cache_write(ctx, k_cache, v_cache, k_new, v_new, batch, KvWriteLaunch{});
}
void attention_forward_entry(const Context& ctx, Tensor out, Tensor lse, const Tensor& q,
                             const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                             float scale) {
  attention_forward(ctx, out, lse, q, k_cache, v_cache, batch, scale, AttentionLaunch{});
}
void attention_backward_entry(const Context& ctx, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                              const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const AttentionBatch& batch, float scale) {
  attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k_cache, v_cache, batch, scale, AttentionLaunch{});
}
}  // namespace

void register_attention(GpuBackend& b) {
  b.kv_cache_write = kv_cache_write_entry;
  b.attention_forward = attention_forward_entry;
  b.attention_backward = attention_backward_entry;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
