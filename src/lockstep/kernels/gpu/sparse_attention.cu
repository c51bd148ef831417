// DeepSeek-V4's sparse attention with a per-head sink on the GPU
// (kernels/cpu/sparse_attention.h), with the CPU's bits. Forward: one block
// per token; thread 0 lists the token's valid candidates in column order, the
// threads split the candidates for the scaled dot products and the exps and
// the head width for the output's fma chains, and the scalar steps (the max,
// the 16 canonical lanes of the denominator, the tree) run in the CPU's
// order. Backward: the same per-token pass writes dq and each reference's
// p and ds; the dstore scatter then gives each store row a block whose
// threads own its elements and walk the row's references in (token, head,
// column) order, from per-row lists built on the host from a copy of cand
// (the CPU's counting sort), so no float atomics; dsink sums tokens in order.
#include <algorithm>
#include <vector>

#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/call_array.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/gpu/row_lanes.h"
#include "lockstep/kernels/gpu/sparse_attention.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sub;

// A (T, H, Dh) operand: token and head strides, unit last stride.
struct Heads {
  const float* p;
  int64_t st, sh;
  LS_DEVICE const float* row(int64_t t, int64_t h) const { return p + t * st + h * sh; }
};
struct OutHeads {
  float* p;
  int64_t st, sh;
  LS_DEVICE float* row(int64_t t, int64_t h) const { return p + t * st + h * sh; }
};

// The inputs both passes share.
struct SparseArgs {
  Heads q;
  const float* store;   // (N, Dh) contiguous
  const int32_t* cand;  // (T, C), unit column stride
  int64_t ld_cand;
  const float* sink;  // (H)
  int64_t st_sink;
  int64_t T, H, Dh, C;
  float scale;
};

// canonical_dot: element i to lane i mod 16 (fma), then the fixed tree.
LS_DEVICE inline float canonical_dot(const float* x, const float* y, int64_t n) {
  num::Lanes16 acc;
  for (int64_t i = 0; i < n; ++i) acc.fma(i, x[i], y[i]);
  return acc.reduce();
}

// max_reduce's bits: the first of equal maxima, the last NaN.
LS_DEVICE inline float max_scan(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = (x[i] > m || num::is_nan(x[i])) ? x[i] : m;
  return m;
}

// Thread 0: the token's valid candidates in column order (rows, and their
// columns when cols is given); returns how many.
LS_DEVICE int64_t gather_valid(const SparseArgs& a, int64_t t, int32_t* rows, int32_t* cols) {
  const int32_t* c = a.cand + t * a.ld_cand;
  int64_t n = 0;
  for (int64_t j = 0; j < a.C; ++j) {
    if (c[j] < 0) continue;
    rows[n] = c[j];
    if (cols != nullptr) cols[n] = static_cast<int32_t>(j);
    ++n;
  }
  return n;
}

// acc[d] = fma chain over the valid rows in order, from 0, for the block's d.
LS_DEVICE void weighted_rows(float* acc, const float* w, const int32_t* rows, int64_t n,
                             const SparseArgs& a) {
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float s = 0.0f;
    for (int64_t k = 0; k < n; ++k) s = ls_fma(w[k], a.store[rows[k] * a.Dh + d], s);
    acc[d] = s;
  }
}

// One block per token (grid-stride); rows and z are (gridDim.x, C) scratch.
// red holds the 16 lane partials, then m and l.
LS_GLOBAL void sparse_forward_kernel(SparseArgs a, OutHeads out, float* lse, int64_t lse_st, int64_t lse_sh,
                                     int32_t* rows_scratch, float* z_scratch) {
  LS_SHARED(int64_t, nvalid, 1);
  LS_SHARED(float, red, kLanes + 2);
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  int32_t* rows = rows_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  float* z = z_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    if (tid == 0) nvalid[0] = gather_valid(a, t, rows, nullptr);
    __syncthreads();
    const int64_t n = nvalid[0];
    for (int64_t h = 0; h < a.H; ++h) {
      const float sink_h = a.sink[h * a.st_sink];
      for (int64_t k = tid; k < n; k += nt)
        z[k] = ls_mul(canonical_dot(a.q.row(t, h), a.store + rows[k] * a.Dh, a.Dh), a.scale);
      __syncthreads();
      if (tid == 0) {
        float m = sink_h;
        if (n > 0) {
          const float mr = max_scan(z, n);
          m = m < mr ? mr : m;  // std::max(sink, max)
        }
        red[kLanes] = m;
      }
      __syncthreads();
      const float m = red[kLanes];
      for (int64_t k = tid; k < n; k += nt) z[k] = num::exp(ls_sub(z[k], m));
      __syncthreads();
      for (int64_t lane = tid; lane < kLanes; lane += nt) {
        float s = 0.0f;
        for (int64_t k = lane; k < n; k += kLanes) s = ls_add(s, z[k]);
        red[lane] = s;
      }
      __syncthreads();
      if (tid == 0) red[kLanes + 1] = ls_add(tree_of(red), num::exp(ls_sub(sink_h, m)));
      __syncthreads();
      const float l = red[kLanes + 1];
      for (int64_t k = tid; k < n; k += nt) z[k] = ls_div(z[k], l);
      __syncthreads();
      weighted_rows(out.row(t, h), z, rows, n, a);
      if (tid == 0 && lse != nullptr) lse[t * lse_st + h * lse_sh] = ls_add(m, num::log(l));
      __syncthreads();  // z and red are the next head's
    }
  }
}

// The backward's per-token outputs for the chunk of tokens [t0, t0 + n).
struct ChunkOut {
  int64_t t0;
  float* p;          // (n, H, C) p_j at the reference's column
  float* ds;         // (n, H, C) dz_j * scale
  float* sink_term;  // (n, H) p_sink * Dt
};

// Pass 1, one block per chunk token (grid-stride): recompute p = exp1(z - lse),
// write dq[t] and the token's coefficients. rows, cols, dsk: (gridDim.x, C)
// scratch. red[0] holds Dt.
LS_GLOBAL void sparse_backward_token_kernel(SparseArgs a, Heads dout, Heads out, const float* lse,
                                            int64_t lse_st, int64_t lse_sh, OutHeads dq, ChunkOut ch,
                                            int64_t n_tokens, int32_t* rows_scratch, int32_t* cols_scratch,
                                            float* dsk_scratch) {
  LS_SHARED(int64_t, nvalid, 1);
  LS_SHARED(float, red, 1);
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  int32_t* rows = rows_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  int32_t* cols = cols_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  float* dsk = dsk_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  for (int64_t tt = blockIdx.x; tt < n_tokens; tt += gridDim.x) {
    const int64_t t = ch.t0 + tt;
    if (tid == 0) nvalid[0] = gather_valid(a, t, rows, cols);
    __syncthreads();
    const int64_t n = nvalid[0];
    for (int64_t h = 0; h < a.H; ++h) {
      if (tid == 0) red[0] = canonical_dot(dout.row(t, h), out.row(t, h), a.Dh);
      __syncthreads();
      const float Dt = red[0];
      const float l = lse[t * lse_st + h * lse_sh];
      float* pc = ch.p + (tt * a.H + h) * a.C;
      float* dsc = ch.ds + (tt * a.H + h) * a.C;
      for (int64_t k = tid; k < n; k += nt) {
        const float* v = a.store + rows[k] * a.Dh;
        const float z = ls_mul(canonical_dot(a.q.row(t, h), v, a.Dh), a.scale);
        const float p = num::exp(ls_sub(z, l));
        const float dp = ls_mul(canonical_dot(dout.row(t, h), v, a.Dh), 1.0f);  // the CPU's scores(.., 1.0f)
        const float ds = ls_mul(ls_mul(p, ls_sub(dp, Dt)), a.scale);
        pc[cols[k]] = p;
        dsc[cols[k]] = ds;
        dsk[k] = ds;
      }
      __syncthreads();
      weighted_rows(dq.row(t, h), dsk, rows, n, a);
      if (tid == 0) ch.sink_term[tt * a.H + h] = ls_mul(num::exp(ls_sub(a.sink[h * a.st_sink], l)), Dt);
      __syncthreads();  // dsk and red are the next head's
    }
  }
}

// Pass 2, one block per store row (grid-stride), a thread per element:
// dstore[r] = fma(p, dout, fma(ds, q, dstore[r])) for each reference in
// (token, head, column) order. first (N + 1) and ref (references, tt * C +
// column) are the row-sorted reference lists.
LS_GLOBAL void sparse_backward_scatter_kernel(SparseArgs a, Heads dout, ChunkOut ch, const int64_t* first,
                                              const int64_t* ref, float* dstore, int64_t N) {
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const int64_t end = first[r + 1];
    for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
      float acc = dstore[r * a.Dh + d];
      for (int64_t i = first[r]; i < end;) {
        const int64_t tt = ref[i] / a.C;
        int64_t run_end = i;  // [i, run_end): this token's columns
        while (run_end < end && ref[run_end] / a.C == tt) ++run_end;
        const int64_t t = ch.t0 + tt;
        for (int64_t h = 0; h < a.H; ++h) {
          const float qd = a.q.row(t, h)[d];
          const float dod = dout.row(t, h)[d];
          for (int64_t k = i; k < run_end; ++k) {
            const int64_t at = (tt * a.H + h) * a.C + ref[k] % a.C;
            acc = ls_fma(ch.p[at], dod, ls_fma(ch.ds[at], qd, acc));
          }
        }
        i = run_end;
      }
      dstore[r * a.Dh + d] = acc;
    }
  }
}

// Pass 3: dsink[h] -= p_sink * Dt over the chunk's tokens in order.
LS_GLOBAL void sparse_backward_sink_kernel(ChunkOut ch, int64_t n_tokens, int64_t H, float* dsink,
                                           int64_t st_dsink) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; h < H; h += step)
    for (int64_t tt = 0; tt < n_tokens; ++tt)
      dsink[h * st_dsink] = ls_sub(dsink[h * st_dsink], ch.sink_term[tt * H + h]);
}

// ---------------------------------------------------------------- host side

void check_launch_cfg(const SparseAttentionLaunch& cfg) {
  LS_CHECK(cfg.threads >= 1 && cfg.threads <= 1024)
      << "SparseAttentionLaunch: threads must be in [1, 1024], got " << cfg.threads;
  LS_CHECK(cfg.max_blocks >= 0) << "SparseAttentionLaunch: max_blocks must be >= 0, got " << cfg.max_blocks;
}

unsigned grid_of(int64_t blocks, const SparseAttentionLaunch& cfg) {
  if (cfg.max_blocks > 0 && blocks > cfg.max_blocks) return static_cast<unsigned>(cfg.max_blocks);
  return static_cast<unsigned>(blocks);
}

// Token blocks at most: each holds (C) rows of candidates and scores in
// scratch, so 2048 rows bound it to 2048 * C * 12 bytes (192 MiB at C =
// 8192) and still fill a device's SMs many times over; more tokens loop.
constexpr int64_t kMaxScratchBlocks = 2048;

SparseArgs sparse_args(const detail::SparseShape& s, const Tensor& q, const Tensor& store, const Tensor& cand,
                       const Tensor& sink, float scale) {
  return {Heads{q.f32(), q.stride[0], q.stride[1]},
          store.f32(),
          cand.i32(),
          cand.stride[0],
          sink.f32(),
          sink.stride[0],
          s.T,
          s.H,
          s.Dh,
          s.C,
          scale};
}

Heads heads(const Tensor& t) {
  return {t.f32(), t.stride[0], t.stride[1]};
}
OutHeads out_heads(const Tensor& t) {
  return {t.f32(), t.stride[0], t.stride[1]};
}

// The chunk's references sorted by store row (the CPU's build_inverse_index):
// first (N + 1) offsets, ref (references) tt * C + column, each row's list in
// (token, column) order. cand is a host-readable (T, C) view.
void inverse_index(const Tensor& cand, int64_t t0, int64_t n, int64_t N, int64_t C,
                   std::vector<int64_t>& first, std::vector<int64_t>& ref) {
  first.assign(static_cast<size_t>(N + 1), 0);
  for (int64_t tt = 0; tt < n; ++tt) {
    const int32_t* c = cand.i32() + (t0 + tt) * cand.stride[0];
    for (int64_t j = 0; j < C; ++j)
      if (c[j] >= 0) ++first[static_cast<size_t>(c[j] + 1)];
  }
  for (int64_t r = 0; r < N; ++r) first[static_cast<size_t>(r + 1)] += first[static_cast<size_t>(r)];
  ref.resize(static_cast<size_t>(first[static_cast<size_t>(N)]));
  std::vector<int64_t> next(first.begin(), first.end() - 1);  // (N) fill cursor per row
  for (int64_t tt = 0; tt < n; ++tt) {
    const int32_t* c = cand.i32() + (t0 + tt) * cand.stride[0];
    for (int64_t j = 0; j < C; ++j)
      if (c[j] >= 0) ref[static_cast<size_t>(next[static_cast<size_t>(c[j])]++)] = tt * C + j;
  }
}

}  // namespace

void sparse_attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q,
                              const Tensor& store, const Tensor& cand, const Tensor& sink, float scale,
                              const SparseAttentionLaunch& cfg) {
  bool want_lse = false;
  const detail::SparseShape s = detail::check_sparse_forward(out, lse, q, store, cand, sink, want_lse);
  check_launch_cfg(cfg);
  if (s.T == 0) return;
  const unsigned grid = grid_of(std::min(s.T, kMaxScratchBlocks), cfg);
  CallArray<int32_t> rows(int64_t{grid} * s.C, "sparse_attention_forward rows");  // (grid, C)
  CallArray<float> z(int64_t{grid} * s.C, "sparse_attention_forward scores");     // (grid, C)
  LS_LAUNCH(ctx, sparse_forward_kernel, dim3(grid), dim3(static_cast<unsigned>(cfg.threads)))
  (sparse_args(s, q, store, cand, sink, scale), out_heads(out), want_lse ? lse.f32() : nullptr,
   want_lse ? lse.stride[0] : 0, want_lse ? lse.stride[1] : 0, rows.get(), z.get());
}

void sparse_attention_backward(const Context& ctx, Tensor dq, Tensor dstore, Tensor dsink, const Tensor& dout,
                               const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                               const Tensor& cand, const Tensor& sink, float scale,
                               const SparseAttentionLaunch& cfg) {
  const detail::SparseShape s =
      detail::check_sparse_backward(dq, dstore, dsink, dout, out, lse, q, store, cand, sink);
  check_launch_cfg(cfg);
  if (s.T == 0) return;
  std::vector<unsigned char> keep;
  const Tensor hcand = host_readable(cand, keep);
  const SparseArgs a = sparse_args(s, q, store, cand, sink, scale);
  const dim3 block(static_cast<unsigned>(cfg.threads));
  const int64_t chunk_tokens = std::min(s.T, detail::sparse_backward_chunk_tokens(s));
  const unsigned token_grid = grid_of(std::min(chunk_tokens, kMaxScratchBlocks), cfg);
  CallArray<float> p(chunk_tokens * s.H * s.C, "sparse_attention_backward p");              // (chunk, H, C)
  CallArray<float> ds(chunk_tokens * s.H * s.C, "sparse_attention_backward ds");            // (chunk, H, C)
  CallArray<float> sink_term(chunk_tokens * s.H, "sparse_attention_backward sink terms");   // (chunk, H)
  CallArray<int32_t> rows(int64_t{token_grid} * s.C, "sparse_attention_backward rows");     // (grid, C)
  CallArray<int32_t> cols(int64_t{token_grid} * s.C, "sparse_attention_backward columns");  // (grid, C)
  CallArray<float> dsk(int64_t{token_grid} * s.C, "sparse_attention_backward dq weights");  // (grid, C)
  std::vector<int64_t> first, ref;
  for (int64_t t0 = 0; t0 < s.T; t0 += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, s.T - t0);
    const ChunkOut ch{t0, p.get(), ds.get(), sink_term.get()};
    LS_LAUNCH(ctx, sparse_backward_token_kernel, dim3(grid_of(std::min(n, kMaxScratchBlocks), cfg)), block)
    (a, heads(dout), heads(out), lse.f32(), lse.stride[0], lse.stride[1], out_heads(dq), ch, n, rows.get(),
     cols.get(), dsk.get());
    inverse_index(hcand, t0, n, s.N, s.C, first, ref);
    if (!ref.empty()) {
      const CallArray<int64_t> dfirst(first, "sparse_attention_backward row offsets");
      const CallArray<int64_t> dref(ref, "sparse_attention_backward references");
      LS_LAUNCH(ctx, sparse_backward_scatter_kernel, dim3(grid_of(s.N, cfg)), block)
      (a, heads(dout), ch, dfirst.get(), dref.get(), dstore.f32(), s.N);
    }
    LS_LAUNCH(ctx, sparse_backward_sink_kernel, dim3(::lockstep::gpu::blocks_for(s.H, cfg.threads)), block)
    (ch, n, s.H, dsink.f32(), dsink.stride[0]);
  }
}

void sparse_attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q,
                              const Tensor& store, const Tensor& cand, const Tensor& sink, float scale) {
  sparse_attention_forward(ctx, out, lse, q, store, cand, sink, scale, SparseAttentionLaunch{});
}
void sparse_attention_backward(const Context& ctx, Tensor dq, Tensor dstore, Tensor dsink, const Tensor& dout,
                               const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                               const Tensor& cand, const Tensor& sink, float scale) {
  sparse_attention_backward(ctx, dq, dstore, dsink, dout, out, lse, q, store, cand, sink, scale,
                            SparseAttentionLaunch{});
}

void register_sparse_attention(GpuBackend& b) {
  b.sparse_attention_forward = sparse_attention_forward;
  b.sparse_attention_backward = sparse_attention_backward;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
