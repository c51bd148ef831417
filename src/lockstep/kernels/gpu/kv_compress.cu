// DeepSeek-V4's KV compressor and lightning-indexer selection on the GPU
// (kernels/cpu/kv_compress.h), with the CPU's bits. The compressor gives each
// (entry, channel) one thread that walks the entry's slots in order exactly as
// the CPU does (max, exp, the plain-add sum and the fma chain); its backward
// gives each channel one thread that walks the entries in order, so every
// element of dstore and dape gets its contributions in (entry, slot) order
// with no atomics. The indexer gives each query a block: threads score the
// candidates (a canonical dot per head, an fma chain over heads), rank each
// candidate against all others by the CPU's strict order (higher score, NaN
// last, ties to the lower column), and one thread lists the chosen columns
// in ascending order. Ranking costs C^2 comparisons a query: fine at the
// candidate counts of a few thousand compressed entries, a selection
// algorithm would be the next step for longer contexts.
#include <algorithm>
#include <vector>

#include "lockstep/kernels/gpu/call_array.h"
#include "lockstep/kernels/gpu/kv_compress.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_div;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;
using ::lockstep::gpu::ls_sub;

// ---------------------------------------------------------------- compressor

// The compressor's inputs as the kernels read them (unit column strides).
struct CompressArgs {
  const float* store;   // (N, 2*kappa*Dc) [C | Z]
  int64_t ld_store;     // row stride
  const int32_t* rows;  // (Ne, P) store rows of each entry's slots, -1 masked
  int64_t ld_rows;
  const float* ape;  // (c, kappa*Dc)
  int64_t ld_ape;
  int64_t c, kappa, P, Dc, Ne;
};

// Slot p's channel offset inside C, Z and ape: the channel half it reads.
LS_DEVICE inline int64_t slot_col(const CompressArgs& a, int64_t p) {
  return (p / a.c) * a.Dc;
}

// z_p = Z[row][half*Dc + ch] + ape[p mod c][half*Dc + ch].
LS_DEVICE inline float slot_z(const CompressArgs& a, int32_t row, int64_t p, int64_t ch) {
  const int64_t col = slot_col(a, p) + ch;
  const float z = a.store[row * a.ld_store + a.kappa * a.Dc + col];
  return ls_add(z, a.ape[(p % a.c) * a.ld_ape + col]);
}

// One (entry, channel) of the forward: the max over the valid slots, the sum
// of their exps and the output, as entry_chunk on the CPU computes them.
struct EntryChannel {
  float mx, s, y;
};

LS_DEVICE EntryChannel entry_channel(const CompressArgs& a, int64_t e, int64_t ch) {
  const int32_t* r = a.rows + e * a.ld_rows;
  float mx = 0.0f;
  bool first = true;
  for (int64_t p = 0; p < a.P; ++p) {
    if (r[p] < 0) continue;
    const float z = slot_z(a, r[p], p, ch);
    mx = first ? z : (mx < z ? z : mx);  // std::max(mx, z): the first of equals, NaN only from the first
    first = false;
  }
  float s = 0.0f, acc = 0.0f;
  for (int64_t p = 0; p < a.P; ++p) {
    if (r[p] < 0) continue;
    const float ex = num::exp(ls_sub(slot_z(a, r[p], p, ch), mx));
    s = ls_add(s, ex);
    acc = ls_fma(ex, a.store[r[p] * a.ld_store + slot_col(a, p) + ch], acc);
  }
  return {mx, s, ls_div(acc, s)};
}

LS_GLOBAL void compress_forward_kernel(CompressArgs a, float* out, int64_t ld_out) {
  const int64_t n = a.Ne * a.Dc;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t e = k / a.Dc, ch = k % a.Dc;
    out[e * ld_out + ch] = entry_channel(a, e, ch).y;
  }
}

// Channel ch of the backward: dout[e][ch] reaches channel ch (and Dc + ch) of
// dstore's C and Z and of dape only, so one thread owns those elements and
// adds to them in (entry, slot) order, as the CPU's channel ranges do.
LS_GLOBAL void compress_backward_kernel(CompressArgs a, const float* dout, int64_t ld_dout, float* dstore,
                                        int64_t ld_dstore, float* dape, int64_t ld_dape) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; ch < a.Dc; ch += step) {
    for (int64_t e = 0; e < a.Ne; ++e) {
      const EntryChannel f = entry_channel(a, e, ch);
      const float g = dout[e * ld_dout + ch];
      const int32_t* r = a.rows + e * a.ld_rows;
      for (int64_t p = 0; p < a.P; ++p) {
        if (r[p] < 0) continue;
        const int64_t col = slot_col(a, p) + ch;
        const float ex = num::exp(ls_sub(slot_z(a, r[p], p, ch), f.mx));
        const float gw = ls_mul(g, ls_div(ex, f.s));
        const float dz = ls_mul(gw, ls_sub(a.store[r[p] * a.ld_store + col], f.y));
        float* dc = dstore + r[p] * ld_dstore + col;
        dc[0] = ls_add(dc[0], gw);
        dc[a.kappa * a.Dc] = ls_add(dc[a.kappa * a.Dc], dz);
        float* da = dape + (p % a.c) * ld_dape + col;
        da[0] = ls_add(da[0], dz);
      }
    }
  }
}

CompressArgs compress_args(const detail::CompressShape& lay, const Tensor& store, const Tensor& rows,
                           const Tensor& ape) {
  return {store.f32(), store.stride[0], rows.i32(), rows.stride[0], ape.f32(), ape.stride[0],
          lay.c,       lay.kappa,       lay.P,      lay.Dc,         lay.Ne};
}

// ---------------------------------------------------------------- indexer

struct IndexerArgs {
  const float* qi;  // (T, HI, DI) heads contiguous vectors
  int64_t q_st, q_sh;
  const float* w;  // (T, HI)
  int64_t ld_w;
  const float* keys;  // (N, DI)
  int64_t ld_keys;
  const int32_t* cand;  // (T, C)
  int64_t ld_cand;
  int64_t T, HI, DI, C, K;
};

// canonical_dot: element i to lane i mod 16 (fma), then the fixed tree.
LS_DEVICE inline float canonical_dot(const float* x, const float* y, int64_t n) {
  num::Lanes16 acc;
  for (int64_t i = 0; i < n; ++i) acc.fma(i, x[i], y[i]);
  return acc.reduce();
}

// score of query t against store row `row`: fma chain over heads of w * ReLU(q . k).
LS_DEVICE float index_score(const IndexerArgs& a, int64_t t, int32_t row) {
  const float* k = a.keys + row * a.ld_keys;
  const float* q = a.qi + t * a.q_st;
  const float* wt = a.w + t * a.ld_w;
  float acc = 0.0f;
  for (int64_t h = 0; h < a.HI; ++h) {
    const float dot = canonical_dot(q + h * a.q_sh, k, a.DI);
    acc = ls_fma(wt[h], dot < 0.0f ? 0.0f : dot, acc);  // std::max(dot, 0): NaN stays NaN
  }
  return acc;
}

// The CPU's selection order: higher score first, NaN below every number, ties
// to the lower column.
LS_DEVICE inline bool ranks_before(const float* score, int64_t a, int64_t b) {
  const float sa = score[a], sb = score[b];
  const bool na = num::is_nan(sa), nb = num::is_nan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a < b;
}

// One block per query (grid-stride). score and chosen are (gridDim.x, C)
// scratch, a row per block.
LS_GLOBAL void indexer_select_kernel(IndexerArgs a, int32_t* selected, int64_t ld_sel, float* scores,
                                     int64_t ld_scores, float* score_scratch, int32_t* chosen_scratch) {
  LS_SHARED(int64_t, nvalid, 1);
  const int64_t tid = threadIdx.x, nt = blockDim.x;
  float* score = score_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  int32_t* chosen = chosen_scratch + static_cast<int64_t>(blockIdx.x) * a.C;
  for (int64_t t = blockIdx.x; t < a.T; t += gridDim.x) {
    const int32_t* r = a.cand + t * a.ld_cand;
    if (tid == 0) {
      int64_t v = 0;
      while (v < a.C && r[v] >= 0) ++v;
      nvalid[0] = v;
    }
    __syncthreads();
    const int64_t valid = nvalid[0];
    const int64_t k = a.K < valid ? a.K : valid;
    for (int64_t j = tid; j < valid; j += nt) score[j] = index_score(a, t, r[j]);
    __syncthreads();
    // Chosen when fewer than k candidates rank before it: the strict total
    // order makes the chosen set the CPU's nth_element set.
    for (int64_t j = tid; j < valid; j += nt) {
      int64_t rank = 0;
      for (int64_t i = 0; i < valid; ++i) rank += ranks_before(score, i, j) ? 1 : 0;
      chosen[j] = rank < k ? 1 : 0;
    }
    __syncthreads();
    if (tid == 0) {
      int32_t* out = selected + t * ld_sel;
      int64_t n = 0;
      for (int64_t j = 0; j < valid; ++j)
        if (chosen[j] != 0) out[n++] = static_cast<int32_t>(j);
      for (; n < a.K; ++n) out[n] = -1;
    }
    if (scores != nullptr) {
      float* so = scores + t * ld_scores;
      for (int64_t j = tid; j < a.C; j += nt) so[j] = j < valid ? score[j] : num::from_bits(0xff800000u);
    }
    __syncthreads();  // score, chosen and nvalid are the next query's
  }
}

// ---------------------------------------------------------------- host side

void check_launch_cfg(const KvCompressLaunch& cfg) {
  LS_CHECK(cfg.threads >= 1 && cfg.threads <= 1024)
      << "KvCompressLaunch: threads must be in [1, 1024], got " << cfg.threads;
  LS_CHECK(cfg.max_blocks >= 0) << "KvCompressLaunch: max_blocks must be >= 0, got " << cfg.max_blocks;
}

unsigned grid_of(int64_t blocks, const KvCompressLaunch& cfg) {
  if (cfg.max_blocks > 0 && blocks > cfg.max_blocks) return static_cast<unsigned>(cfg.max_blocks);
  return static_cast<unsigned>(blocks);
}

// The indexer's blocks at most: each holds a (C) row of scores and flags in
// scratch, so 2048 rows bound it to 2048 * C * 8 bytes (128 MiB at C = 8192)
// and still fill a device's SMs many times over; more queries loop.
constexpr int64_t kMaxScratchBlocks = 2048;

}  // namespace

void compress_forward(const Context& ctx, Tensor out, const Tensor& store, const Tensor& rows,
                      const Tensor& ape, int ratio, bool overlap, const KvCompressLaunch& cfg) {
  const detail::CompressShape lay = detail::check_compress_forward(out, store, rows, ape, ratio, overlap);
  check_launch_cfg(cfg);
  if (lay.Ne == 0) return;
  const unsigned grid = grid_of(::lockstep::gpu::blocks_for(lay.Ne * lay.Dc, cfg.threads), cfg);
  LS_LAUNCH(ctx, compress_forward_kernel, dim3(grid), dim3(static_cast<unsigned>(cfg.threads)))
  (compress_args(lay, store, rows, ape), out.f32(), out.stride[0]);
}

void compress_backward(const Context& ctx, Tensor dstore, Tensor dape, const Tensor& dout,
                       const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio, bool overlap,
                       const KvCompressLaunch& cfg) {
  const detail::CompressShape lay =
      detail::check_compress_backward(dstore, dape, dout, store, rows, ape, ratio, overlap);
  check_launch_cfg(cfg);
  if (lay.Ne == 0) return;
  const unsigned grid = grid_of(::lockstep::gpu::blocks_for(lay.Dc, cfg.threads), cfg);
  LS_LAUNCH(ctx, compress_backward_kernel, dim3(grid), dim3(static_cast<unsigned>(cfg.threads)))
  (compress_args(lay, store, rows, ape), dout.f32(), dout.stride[0], dstore.f32(), dstore.stride[0],
   dape.f32(), dape.stride[0]);
}

void indexer_select(const Context& ctx, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                    const Tensor& keys, const Tensor& cand, const KvCompressLaunch& cfg) {
  const detail::IndexerShape d = detail::check_indexer_select(selected, scores, qi, w, keys, cand);
  check_launch_cfg(cfg);
  if (d.T == 0) return;
  const unsigned grid = grid_of(std::min(d.T, kMaxScratchBlocks), cfg);
  CallArray<float> score(int64_t{grid} * d.C, "indexer_select scores");     // (grid, C)
  CallArray<int32_t> chosen(int64_t{grid} * d.C, "indexer_select chosen");  // (grid, C)
  const IndexerArgs a{
      qi.f32(),   qi.stride[0],   qi.stride[1], w.f32(), w.stride[0], keys.f32(), keys.stride[0],
      cand.i32(), cand.stride[0], d.T,          d.HI,    d.DI,        d.C,        d.K};
  const bool want_scores = scores.ndim != 0;
  LS_LAUNCH(ctx, indexer_select_kernel, dim3(grid), dim3(static_cast<unsigned>(cfg.threads)))
  (a, selected.i32(), selected.stride[0], want_scores ? scores.f32() : nullptr,
   want_scores ? scores.stride[0] : 0, score.get(), chosen.get());
}

void compress_forward(const Context& ctx, Tensor out, const Tensor& store, const Tensor& rows,
                      const Tensor& ape, int ratio, bool overlap) {
  compress_forward(ctx, out, store, rows, ape, ratio, overlap, KvCompressLaunch{});
}
void compress_backward(const Context& ctx, Tensor dstore, Tensor dape, const Tensor& dout,
                       const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio, bool overlap) {
  compress_backward(ctx, dstore, dape, dout, store, rows, ape, ratio, overlap, KvCompressLaunch{});
}
void indexer_select(const Context& ctx, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                    const Tensor& keys, const Tensor& cand) {
  indexer_select(ctx, selected, scores, qi, w, keys, cand, KvCompressLaunch{});
}

void register_kv_compress(GpuBackend& b) {
  b.compress_forward = compress_forward;
  b.compress_backward = compress_backward;
  b.indexer_select = indexer_select;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
