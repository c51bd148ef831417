// DeepSeek-V4 KV compressor (per-channel softmax over an entry's slots) and
// the lightning indexer's top-k selection. The forward splits entries across
// threads; the backward splits channels, so every element of dstore and dape
// is owned by one thread and gets its contributions in (entry, slot) order.
#include "lockstep/kernels/cpu/kv_compress.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

// A 2-D view with unit column stride and rows at least `cols` apart.
void check_mat(const Tensor& t, int64_t rows, int64_t cols, DType dtype, const std::string& what) {
  check_dtype(t, dtype, what.c_str());
  check_shape(t, {rows, cols}, what.c_str());
  if ((t.shape[1] > 1 && t.stride[1] != 1) || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

// ---------------------------------------------------------------- compressor

using Layout = detail::CompressShape;

// One valid slot of an entry: its store row and where its channels start.
struct Slot {
  const float* C;    // store row's C, already offset to the slot's channel half
  const float* Z;    // store row's Z, same half
  const float* ape;  // ape row p mod c, same half
  int64_t row;       // store row (for the backward's scatter)
  int64_t col;       // half * Dc: the channel offset inside C, Z and ape
  int64_t ape_row;   // p mod c
};

// Checks store (N, 2*kappa*Dc), rows (Ne, P) and ape (c, kappa*Dc) for a given
// Dc, and every row index: in [-1, N), and at least one valid slot per entry
// (the block's own tokens are always there, so an empty entry is a caller bug).
Layout check_compress(const Tensor& store, const Tensor& rows, const Tensor& ape, int64_t Dc, int ratio,
                      bool overlap, const char* fn) {
  const std::string f(fn);
  if (ratio < 1) LS_THROW << f << ": ratio must be >= 1, got " << ratio;
  if (Dc < 1) LS_THROW << f << ": compressed width Dc must be >= 1, got " << Dc;
  Layout lay{};
  lay.c = ratio;
  lay.kappa = overlap ? 2 : 1;
  lay.P = lay.kappa * lay.c;
  lay.Dc = Dc;
  check_dtype(store, DType::F32, (f + ": store (N, 2*kappa*Dc)").c_str());
  check_shape(store, {-1, 2 * lay.kappa * Dc}, (f + ": store (N, 2*kappa*Dc)").c_str());
  lay.N = store.shape[0];
  check_mat(store, lay.N, 2 * lay.kappa * Dc, DType::F32, f + ": store (N, 2*kappa*Dc)");
  check_dtype(rows, DType::I32, (f + ": rows (Ne, P)").c_str());
  check_shape(rows, {-1, lay.P}, (f + ": rows (Ne, P)").c_str());
  lay.Ne = rows.shape[0];
  check_mat(rows, lay.Ne, lay.P, DType::I32, f + ": rows (Ne, P)");
  check_mat(ape, lay.c, lay.kappa * Dc, DType::F32, f + ": ape (c, kappa*Dc)");
  std::vector<unsigned char> keep;
  const Tensor hrows = host_readable(rows, keep);
  for (int64_t e = 0; e < lay.Ne; ++e) {
    const int32_t* r = hrows.i32() + e * hrows.stride[0];
    int64_t valid = 0;
    for (int64_t p = 0; p < lay.P; ++p) {
      if (r[p] < -1 || r[p] >= lay.N)
        LS_THROW << f << ": rows (Ne, P): entry " << e << " slot " << p << " is " << r[p] << ", outside [-1, "
                 << lay.N << ")";
      valid += r[p] >= 0;
    }
    if (valid == 0) LS_THROW << f << ": rows (Ne, P): entry " << e << " has every slot masked (-1)";
  }
  return lay;
}

// The valid slots of entry e, in slot order; returns how many.
int gather_slots(const Layout& lay, const Tensor& store, const Tensor& rows, const Tensor& ape, int64_t e,
                 Slot* slots) {
  const int32_t* r = rows.i32() + e * rows.stride[0];
  int nv = 0;
  for (int64_t p = 0; p < lay.P; ++p) {
    if (r[p] < 0) continue;  // masked: absent from max, sum and output
    const int64_t col = (p / lay.c) * lay.Dc;
    const float* row = store.f32() + r[p] * store.stride[0];
    slots[nv++] = Slot{
        row + col, row + lay.kappa * lay.Dc + col, ape.f32() + (p % lay.c) * ape.stride[0] + col, r[p], col,
        p % lay.c};
  }
  return nv;
}

// Channels per pass: the (slots x chunk) exponentials of one pass stay in L1/L2.
constexpr int64_t kChunk = 64;

// Per-thread buffers of one pass over a chunk of channels.
struct ChunkScratch {
  std::vector<Slot> slots;  // (P)
  std::vector<float> e;     // (P, kChunk) exp(z_p - mx), valid slots only
  std::vector<float> s;     // (kChunk) sum of e over slots
  std::vector<float> y;     // (kChunk) the entry's output
  explicit ChunkScratch(int64_t P) : slots(sz(P)), e(sz(P * kChunk)), s(sz(kChunk)), y(sz(kChunk)) {}
};

// The forward of one entry over channels [ch0, ch0 + n), exactly as the header
// states it: z = Z + ape, max over the valid slots, e = exp(z - mx), s and the
// fma chain in slot order, y = acc / s. Leaves e, s and y in the scratch.
void entry_chunk(const Slot* slots, int nv, int64_t ch0, int64_t n, ChunkScratch& w) {
  float* e = w.e.data();
  float* s = w.s.data();
  float* y = w.y.data();
  for (int k = 0; k < nv; ++k) {
    const float* z = slots[k].Z + ch0;
    const float* a = slots[k].ape + ch0;
    for (int64_t j = 0; j < n; ++j) e[k * n + j] = z[j] + a[j];
  }
  for (int64_t j = 0; j < n; ++j) y[j] = e[j];  // y holds the running max for now
  for (int k = 1; k < nv; ++k)
    for (int64_t j = 0; j < n; ++j) y[j] = std::max(y[j], e[k * n + j]);
  for (int k = 0; k < nv; ++k)
    for (int64_t j = 0; j < n; ++j) e[k * n + j] = e[k * n + j] - y[j];
  vexp(e, e, nv * n);  // exp1's bits (simd.h), one call for the whole chunk
  for (int64_t j = 0; j < n; ++j) {
    s[j] = 0.0f;
    y[j] = 0.0f;  // now the fma accumulator
  }
  for (int k = 0; k < nv; ++k) {
    const float* cv = slots[k].C + ch0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = s[j] + e[k * n + j];
      y[j] = std::fma(e[k * n + j], cv[j], y[j]);
    }
  }
  for (int64_t j = 0; j < n; ++j) y[j] = y[j] / s[j];
}

// The backward of one entry over channels [ch0, ch0 + n), after entry_chunk:
// with w_p = e_p / s, dC_p += g * w_p and dz_p = g * w_p * (C_p - y), which
// goes to both dZ_p and the slot's ape row. Slots are visited in order.
void entry_chunk_backward(const Slot* slots, int nv, int64_t ch0, int64_t n, const float* dout,
                          Tensor& dstore, Tensor& dape, int64_t kappa_dc, const ChunkScratch& w) {
  const float* e = w.e.data();
  const float* s = w.s.data();
  const float* y = w.y.data();
  for (int k = 0; k < nv; ++k) {
    const Slot& sl = slots[k];
    const float* cv = sl.C + ch0;
    float* dcv = dstore.f32() + sl.row * dstore.stride[0] + sl.col + ch0;
    float* dzv = dcv + kappa_dc;
    float* da = dape.f32() + sl.ape_row * dape.stride[0] + sl.col + ch0;
    for (int64_t j = 0; j < n; ++j) {
      const float gw = dout[j] * (e[k * n + j] / s[j]);
      const float dz = gw * (cv[j] - y[j]);
      dcv[j] = dcv[j] + gw;
      dzv[j] = dzv[j] + dz;
      da[j] = da[j] + dz;
    }
  }
}

// --------------------------------------------------------------- indexer

// Checks the indexer's tensors; returns (T, HI, DI, N, C, K).
using IndexerDims = detail::IndexerShape;

IndexerDims check_indexer(const Tensor& selected, const Tensor& scores, const Tensor& qi, const Tensor& w,
                          const Tensor& keys, const Tensor& cand) {
  const std::string f = "indexer_select";
  check_dtype(qi, DType::F32, "indexer_select: qi (T, HI, DI)");
  check_shape(qi, {-1, -1, -1}, "indexer_select: qi (T, HI, DI)");
  IndexerDims d{qi.shape[0], qi.shape[1], qi.shape[2], 0, 0, 0};
  if (d.HI < 1 || d.DI < 1)
    LS_THROW << "indexer_select: qi (T, HI, DI): needs HI, DI >= 1, got " << qi.shape_str();
  if ((d.DI > 1 && qi.stride[2] != 1) || (d.HI > 1 && qi.stride[1] < d.DI) ||
      (d.T > 1 && qi.stride[0] < d.HI * qi.stride[1]))
    LS_THROW << "indexer_select: qi (T, HI, DI): heads must be contiguous vectors, got " << qi.shape_str();
  check_mat(w, d.T, d.HI, DType::F32, f + ": w (T, HI)");
  check_dtype(keys, DType::F32, "indexer_select: keys (N, DI)");
  check_shape(keys, {-1, d.DI}, "indexer_select: keys (N, DI)");
  d.N = keys.shape[0];
  check_mat(keys, d.N, d.DI, DType::F32, f + ": keys (N, DI)");
  check_dtype(cand, DType::I32, "indexer_select: cand (T, C)");
  check_shape(cand, {d.T, -1}, "indexer_select: cand (T, C)");
  d.C = cand.shape[1];
  check_mat(cand, d.T, d.C, DType::I32, f + ": cand (T, C)");
  check_dtype(selected, DType::I32, "indexer_select: selected (T, K)");
  check_shape(selected, {d.T, -1}, "indexer_select: selected (T, K)");
  d.K = selected.shape[1];
  check_mat(selected, d.T, d.K, DType::I32, f + ": selected (T, K)");
  if (scores.ndim != 0) check_mat(scores, d.T, d.C, DType::F32, f + ": scores (T, C)");
  std::vector<unsigned char> keep;
  const Tensor hcand = host_readable(cand, keep);
  for (int64_t t = 0; t < d.T; ++t) {
    const int32_t* r = hcand.i32() + t * hcand.stride[0];
    bool padding = false;
    for (int64_t j = 0; j < d.C; ++j) {
      if (r[j] < -1 || r[j] >= d.N)
        LS_THROW << "indexer_select: cand (T, C): query " << t << " column " << j << " is " << r[j]
                 << ", outside [-1, " << d.N << ")";
      if (r[j] >= 0 && padding)
        LS_THROW << "indexer_select: cand (T, C): query " << t << " has row " << r[j] << " at column " << j
                 << " after -1 padding";
      padding = padding || r[j] < 0;
    }
  }
  return d;
}

// score of query t against store row `row`: fma chain over heads of w * ReLU(q . k).
float index_score(const IndexerDims& d, const Tensor& qi, const Tensor& w, const Tensor& keys, int64_t t,
                  int64_t row) {
  const float* k = keys.f32() + row * keys.stride[0];
  const float* q = qi.f32() + t * qi.stride[0];
  const float* wt = w.f32() + t * w.stride[0];
  float acc = 0.0f;
  for (int64_t h = 0; h < d.HI; ++h) {
    const float dot = canonical_dot(q + h * qi.stride[1], k, d.DI);
    // std::max(dot, 0) keeps a NaN dot as NaN, so a NaN input shows in the score.
    acc = std::fma(wt[h], std::max(dot, 0.0f), acc);
  }
  return acc;
}

// The selection order: higher score first, ties to the lower column. NaN
// ranks below every number, which keeps the order strict and total.
inline bool ranks_before(const float* score, int32_t a, int32_t b) {
  const float sa = score[a], sb = score[b];
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a < b;
}

}  // namespace

namespace detail {

CompressShape check_compress_forward(const Tensor& out, const Tensor& store, const Tensor& rows,
                                     const Tensor& ape, int ratio, bool overlap) {
  check_dtype(out, DType::F32, "compress_forward: out (Ne, Dc)");
  check_shape(out, {-1, -1}, "compress_forward: out (Ne, Dc)");
  const Layout lay = check_compress(store, rows, ape, out.shape[1], ratio, overlap, "compress_forward");
  check_mat(out, lay.Ne, lay.Dc, DType::F32, "compress_forward: out (Ne, Dc)");
  return lay;
}

CompressShape check_compress_backward(const Tensor& dstore, const Tensor& dape, const Tensor& dout,
                                      const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio,
                                      bool overlap) {
  check_dtype(dout, DType::F32, "compress_backward: dout (Ne, Dc)");
  check_shape(dout, {-1, -1}, "compress_backward: dout (Ne, Dc)");
  const Layout lay = check_compress(store, rows, ape, dout.shape[1], ratio, overlap, "compress_backward");
  check_mat(dout, lay.Ne, lay.Dc, DType::F32, "compress_backward: dout (Ne, Dc)");
  check_mat(dstore, lay.N, 2 * lay.kappa * lay.Dc, DType::F32, "compress_backward: dstore (N, 2*kappa*Dc)");
  check_mat(dape, lay.c, lay.kappa * lay.Dc, DType::F32, "compress_backward: dape (c, kappa*Dc)");
  return lay;
}

IndexerShape check_indexer_select(const Tensor& selected, const Tensor& scores, const Tensor& qi,
                                  const Tensor& w, const Tensor& keys, const Tensor& cand) {
  return check_indexer(selected, scores, qi, w, keys, cand);
}

}  // namespace detail

void compress_forward(const Context& ctx, Tensor out, const Tensor& store, const Tensor& rows,
                      const Tensor& ape, int ratio, bool overlap) {
  LS_GPU_DISPATCH(ctx, compress_forward, out, store, rows, ape, ratio, overlap);
  const Layout lay = detail::check_compress_forward(out, store, rows, ape, ratio, overlap);
  ctx.parallel_for(
      lay.Ne,
      [&](int64_t e0, int64_t e1) {
        ChunkScratch w(lay.P);
        for (int64_t e = e0; e < e1; ++e) {
          const int nv = gather_slots(lay, store, rows, ape, e, w.slots.data());
          float* o = out.f32() + e * out.stride[0];
          for (int64_t ch0 = 0; ch0 < lay.Dc; ch0 += kChunk) {
            const int64_t n = std::min(kChunk, lay.Dc - ch0);
            entry_chunk(w.slots.data(), nv, ch0, n, w);
            std::copy(w.y.begin(), w.y.begin() + n, o + ch0);
          }
        }
      },
      std::max<int64_t>(1, 16384 / (lay.P * lay.Dc)));
}

void compress_backward(const Context& ctx, Tensor dstore, Tensor dape, const Tensor& dout,
                       const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio, bool overlap) {
  LS_GPU_DISPATCH(ctx, compress_backward, dstore, dape, dout, store, rows, ape, ratio, overlap);
  const Layout lay = detail::check_compress_backward(dstore, dape, dout, store, rows, ape, ratio, overlap);
  // Threads own channel ranges: a channel ch of the output touches only
  // channels ch and Dc + ch of dstore's C and Z and of dape, so no element is
  // shared, and each walks the entries in order whatever the split.
  constexpr int64_t kMinChannels = 16;
  ctx.parallel_for(
      lay.Dc,
      [&](int64_t c0, int64_t c1) {
        ChunkScratch w(lay.P);
        for (int64_t e = 0; e < lay.Ne; ++e) {
          const int nv = gather_slots(lay, store, rows, ape, e, w.slots.data());
          const float* g = dout.f32() + e * dout.stride[0];
          for (int64_t ch0 = c0; ch0 < c1; ch0 += kChunk) {
            const int64_t n = std::min(kChunk, c1 - ch0);
            entry_chunk(w.slots.data(), nv, ch0, n, w);
            entry_chunk_backward(w.slots.data(), nv, ch0, n, g + ch0, dstore, dape, lay.kappa * lay.Dc, w);
          }
        }
      },
      kMinChannels);
}

void indexer_select(const Context& ctx, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                    const Tensor& keys, const Tensor& cand) {
  LS_GPU_DISPATCH(ctx, indexer_select, selected, scores, qi, w, keys, cand);
  const IndexerDims d = check_indexer(selected, scores, qi, w, keys, cand);
  const bool want_scores = scores.ndim != 0;
  ctx.parallel_for(d.T, [&](int64_t t0, int64_t t1) {
    std::vector<float> score(sz(d.C));  // (C) this query's scores
    std::vector<int32_t> order(sz(d.C));
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t* r = cand.i32() + t * cand.stride[0];
      int64_t valid = 0;
      while (valid < d.C && r[valid] >= 0) ++valid;
      for (int64_t j = 0; j < valid; ++j) score[sz(j)] = index_score(d, qi, w, keys, t, r[j]);
      const int64_t k = std::min(d.K, valid);
      for (int64_t j = 0; j < valid; ++j) order[sz(j)] = int32_t(j);
      // The order is strict and total, so the chosen set is unique; then ascending columns.
      const auto by_rank = [&](int32_t a, int32_t b) { return ranks_before(score.data(), a, b); };
      std::nth_element(order.begin(), order.begin() + k, order.begin() + valid, by_rank);
      std::sort(order.begin(), order.begin() + k);
      int32_t* out = selected.i32() + t * selected.stride[0];
      for (int64_t i = 0; i < d.K; ++i) out[i] = i < k ? order[sz(i)] : -1;
      if (want_scores) {
        float* so = scores.f32() + t * scores.stride[0];
        for (int64_t j = 0; j < d.C; ++j)
          so[j] = j < valid ? score[sz(j)] : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

}  // namespace lockstep::kernels
