// Backward of paged-cache attention for the training case (every token new),
// recomputing P = exp(s - lse) instead of storing (T, T) matrices. Two
// schedules with the same bits:
// - fused (the usual one): a work item is one sequence and kv head; it visits
//   each (query tile, key tile) of the causal triangle once, head by head, and
//   uses P and dS of the tile for dq, dk and dv alike;
// - two passes, when there are too few items to keep the threads busy (one
//   long sequence on many threads): pass 1 owns dq rows (and D = dout . out),
//   pass 2 owns dk/dv rows, each recomputing P and dS.
#include <algorithm>
#include <string>
#include <vector>

#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/attention_impl.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

// With s_tj = scale * q_t . k_j, P = softmax_j(s), out_t = Σ_j P_tj v_j:
//   dP_tj = dout_t . v_j,  dS_tj = P_tj (dP_tj - D_t),  D_t = dout_t . out_t
//   dq_t = scale Σ_j dS_tj k_j,  dk_j = scale Σ_{h in group} Σ_t dS_tj q_t,
//   dv_j = Σ_{h in group} Σ_t P_tj dout_t.
// Each sum is one fma chain per element in a fixed order (keys ascending;
// heads, then queries ascending), so neither schedule nor the thread count
// changes a bit: s, P and dS of a (query, key) pair do not depend on where
// they are computed, and the schedules add the same terms in the same order.
namespace {

// The operands of one call, with row accessors.
struct Operands {
  const attn::BatchPlan& p;
  attn::CacheView cache;
  const Tensor &dq, &dk, &dv, &dout, &out, &lse, &q;
  int64_t H, G, Dh;
  float scale;
  bool wide;  // 16-wide registers (wide_vectors()), the same bits

  const float* q_row(int64_t t, int64_t h) const { return q.ptr<float>() + t * q.stride[0] + h * Dh; }
  const float* do_row(int64_t t, int64_t h) const { return dout.ptr<float>() + t * dout.stride[0] + h * Dh; }
  const float* out_row(int64_t t, int64_t h) const { return out.ptr<float>() + t * out.stride[0] + h * Dh; }
  float lse_at(int64_t t, int64_t h) const { return lse.ptr<float>()[t * lse.stride[0] + h]; }
  float* dq_row(int64_t t, int64_t h) const { return dq.ptr<float>() + t * dq.stride[0] + h * Dh; }
  float* dk_row(int64_t t, int64_t kvh) const { return dk.ptr<float>() + t * dk.stride[0] + kvh * Dh; }
  float* dv_row(int64_t t, int64_t kvh) const { return dv.ptr<float>() + t * dv.stride[0] + kvh * Dh; }
};

// P and dS of query row u against n keys: pr = exp(s - lse), ds = pr (dp - D).
// pr and dp may be written up to 8 past n (scores()).
HWY_INLINE void p_and_ds(const float* qu, const float* dou, float l, float D, const float* const* kp,
                         const float* const* vp, int n, int64_t Dh, float scale, float* pr, float* dp,
                         float* ds, bool wide) {
  attn::scores(qu, kp, n, Dh, scale, pr, wide);
  for (int k = 0; k < n; ++k) pr[k] = pr[k] - l;
  vexp(pr, pr, n);
  attn::scores(dou, vp, n, Dh, 1.0f, dp, wide);
  for (int k = 0; k < n; ++k) ds[k] = pr[k] * (dp[k] - D);
}

// p_and_ds for the nr query rows qu[r], dou[r] of a tile at once (each key and
// value row loaded once for all of them), row r against n[r] keys (the
// largest last: the scores run over n[nr - 1] keys, a row's extra ones unused).
HWY_INLINE void p_and_ds_rows(const float* const* qu, const float* const* dou, const float* l, const float* D,
                              const float* const* kp, const float* const* vp, const int* n, int nr,
                              int64_t Dh, float scale, float* const* pr, float* const* dp, float* const* ds,
                              bool wide) {
  const int n_max = n[nr - 1];
  attn::scores_rows(qu, nr, kp, n_max, Dh, scale, pr, wide);
  attn::scores_rows(dou, nr, vp, n_max, Dh, 1.0f, dp, wide);
  for (int r = 0; r < nr; ++r) {
    for (int k = 0; k < n[r]; ++k) pr[r][k] = pr[r][k] - l[r];
    vexp(pr[r], pr[r], n[r]);
    for (int k = 0; k < n[r]; ++k) ds[r][k] = pr[r][k] * (dp[r][k] - D[r]);
  }
}

// One thread's scratch for the fused schedule; tiles are kKeyBlock queries by
// kKeyBlock keys, aligned to the sequence's start (the key blocks of the contract).
// The item's K and V rows (all its positions, one kv head) and the query
// tile's q and dout rows are copied side by side: in place, rows of one head
// lie a multiple of 4 KiB apart and a tile's 32 rows would share a few L1
// sets. Each copy is read by many tiles.
struct TileScratch {
  static constexpr int kRow = kKeyBlock + 8;  // scores() may write 8 past a row's n
  std::vector<float> ks, vs;                  // (L, Dh): the sequence's K and V rows of the kv head
  std::vector<float> qt, dot;                 // (kKeyBlock, Dh): the query tile's q and dout rows
  std::vector<float> pr, ds, dp;              // (kKeyBlock, kRow): P, dS and dP of the tile, by query
  std::vector<float> dq;                      // (kKeyBlock, Dh): the query tile's dq sums
  explicit TileScratch(const Operands& o)
      : qt(size_t(kKeyBlock * o.Dh)),
        dot(qt.size()),
        pr(size_t(kKeyBlock * kRow)),
        ds(pr.size()),
        dp(pr.size()),
        dq(size_t(kKeyBlock * o.Dh)) {}
};

// accumulate_heads for 1 <= m <= 4 rows sharing `rows`.
HWY_INLINE void accumulate_rows(float* const* acc, int m, int64_t dh, bool zero, const float* const* w,
                                const float* const* rows, int n, bool wide) {
  static constexpr float kOnes[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  switch (m) {
    case 1: return attn::accumulate_heads<1>(acc, dh, zero, kOnes, w, rows, n, wide);
    case 2: return attn::accumulate_heads<2>(acc, dh, zero, kOnes, w, rows, n, wide);
    case 3: return attn::accumulate_heads<3>(acc, dh, zero, kOnes, w, rows, n, wide);
    default: return attn::accumulate_heads<4>(acc, dh, zero, kOnes, w, rows, n, wide);
  }
}

// dk and dv of the keys of tile (ui, ji) (sequence rows from f0), from the
// tile's P and dS: key b is seen by the tile's queries a >= a0(b). Off the
// diagonal every key sees all nu queries, so keys go in groups of 4 that
// share each query row's load (the same chain per key).
void accumulate_key_tile(const Operands& o, TileScratch& w, int64_t f0, int64_t kvh, int64_t j0, int nk,
                         int nu, bool diagonal, bool zero, const float* const* qp, const float* const* dop) {
  constexpr int kGroup = 4;
  float cp[kGroup][kKeyBlock], cs[kGroup][kKeyBlock];
  const int group = diagonal ? 1 : kGroup;
  for (int b0 = 0; b0 < nk; b0 += group) {
    const int nb = std::min(group, nk - b0);
    const int a0 = diagonal ? b0 : 0, m = nu - a0;
    const float *cpp[kGroup], *csp[kGroup];
    float *dvp[kGroup], *dkp[kGroup];
    for (int g = 0; g < nb; ++g) {
      for (int a = a0; a < nu; ++a) {
        cp[g][a - a0] = w.pr[size_t(a * TileScratch::kRow + b0 + g)];
        cs[g][a - a0] = w.ds[size_t(a * TileScratch::kRow + b0 + g)];
      }
      cpp[g] = cp[g];
      csp[g] = cs[g];
      dvp[g] = o.dv_row(f0 + j0 + b0 + g, kvh);
      dkp[g] = o.dk_row(f0 + j0 + b0 + g, kvh);
    }
    accumulate_rows(dvp, nb, o.Dh, zero, cpp, dop + a0, m, o.wide);
    accumulate_rows(dkp, nb, o.Dh, zero, csp, qp + a0, m, o.wide);
  }
}

// Key tiles a band of the fused schedule holds: their K, V, dk and dv rows
// (4 x 32 x Dh floats each) in about 1 MiB, half of L2, so that every query
// tile of the band finds them there.
int64_t band_tiles(int64_t Dh) {
  constexpr int64_t kBandBytes = int64_t{1} << 20;
  return std::max<int64_t>(1, kBandBytes / (4 * kKeyBlock * Dh * int64_t(sizeof(float))));
}

// Query tile (u0, nu) of head h in the scratch: its q and dout rows copied,
// D = dout . out and the log-sum-exps.
void load_query_tile(const Operands& o, TileScratch& w, int64_t f0, int64_t h, int64_t u0, int nu,
                     const float** qp, const float** dop, float* D, float* lse) {
  const int64_t Dh = o.Dh;
  for (int a = 0; a < nu; ++a) {
    float* qa = w.qt.data() + a * Dh;
    float* da = w.dot.data() + a * Dh;
    std::copy_n(o.q_row(f0 + u0 + a, h), Dh, qa);
    std::copy_n(o.do_row(f0 + u0 + a, h), Dh, da);
    qp[a] = qa;
    dop[a] = da;
    D[a] = attn::dot(da, o.out_row(f0 + u0 + a, h), Dh);
    lse[a] = o.lse_at(f0 + u0 + a, h);
  }
}

// Query tile (u0, nu) against key tile ji of head h: P and dS, the tile's
// terms of dq (into w.dq), dk and dv.
void tile_pair(const Operands& o, TileScratch& w, int64_t f0, int64_t kvh, int64_t h, int64_t ui, int64_t ji,
               int nu, const float* const* qp, const float* const* dop, const float* D, const float* lse) {
  const int64_t Dh = o.Dh, j0 = ji * kKeyBlock;
  const bool diagonal = ji == ui;
  const int nk = diagonal ? nu : kKeyBlock;
  const float* kp[kKeyBlock];
  const float* vp[kKeyBlock];
  for (int i = 0; i < nk; ++i) {
    kp[i] = w.ks.data() + (j0 + i) * Dh;
    vp[i] = w.vs.data() + (j0 + i) * Dh;
  }
  // Query rows in groups of kRows, which share each key and value load.
  constexpr int kRows = 4;
  for (int a0 = 0; a0 < nu; a0 += kRows) {
    const int nr = std::min(kRows, nu - a0);
    int n[kRows];
    float *pr[kRows], *dp[kRows], *ds[kRows];
    for (int r = 0; r < nr; ++r) {
      const int a = a0 + r;
      n[r] = diagonal ? a + 1 : kKeyBlock;  // the keys query u0 + a sees in this tile
      pr[r] = &w.pr[size_t(a * TileScratch::kRow)];
      dp[r] = &w.dp[size_t(a * TileScratch::kRow)];
      ds[r] = &w.ds[size_t(a * TileScratch::kRow)];
    }
    p_and_ds_rows(qp + a0, dop + a0, lse + a0, D + a0, kp, vp, n, nr, Dh, o.scale, pr, dp, ds, o.wide);
    if (diagonal) {  // row r sees n[r] keys
      for (int r = 0; r < nr; ++r)
        attn::scale_and_accumulate(&w.dq[size_t((a0 + r) * Dh)], Dh, ji == 0, 1.0f, ds[r], kp, n[r], o.wide);
    } else {  // every row sees the whole key tile: the rows share each key load
      float* dqp[kRows];
      for (int r = 0; r < nr; ++r) dqp[r] = &w.dq[size_t((a0 + r) * Dh)];
      accumulate_rows(dqp, nr, Dh, ji == 0, ds, kp, nk, o.wide);
    }
  }
  accumulate_key_tile(o, w, f0, kvh, j0, nk, nu, diagonal, h == kvh * o.G && diagonal, qp, dop);
}

// Sequence s, kv head kvh: dq of the group's heads, dk and dv of kvh. dk and
// dv rows hold the running sums (each starts at the first term: its key's
// diagonal tile of the group's first head) and are scaled at the end.
// Head by head, the key tiles go in bands (band_tiles) and each band meets
// every query tile at or below it: the band's dk and dv stay in L2, and a
// query tile's dq sum is carried from band to band in its dq rows (the
// plain sum, scaled once its diagonal tile is in). Every chain keeps its
// order: a dq row's keys ascending, a dk or dv row's heads then queries
// ascending.
void fused_item(const Operands& o, TileScratch& w, int64_t s, int64_t kvh) {
  const attn::BatchPlan& p = o.p;
  const int64_t f0 = p.first[size_t(s)], L = p.first[size_t(s) + 1] - f0, Dh = o.Dh;
  const int32_t* row = p.table + s * p.table_stride;
  const float* qp[kKeyBlock];
  const float* dop[kKeyBlock];
  const float* kp[kKeyBlock];
  const float* vp[kKeyBlock];
  float D[kKeyBlock], lse[kKeyBlock];
  w.ks.resize(size_t(L * Dh));
  w.vs.resize(w.ks.size());
  for (int64_t j0 = 0; j0 < L; j0 += kKeyBlock)
    o.cache.gather(row, j0, static_cast<int>(std::min<int64_t>(kKeyBlock, L - j0)), kvh, kp, vp,
                   w.ks.data() + j0 * Dh, w.vs.data() + j0 * Dh, /*copy=*/true);
  const int64_t tiles = (L + kKeyBlock - 1) / kKeyBlock, band = band_tiles(Dh);
  for (int64_t h = kvh * o.G; h < (kvh + 1) * o.G; ++h) {
    for (int64_t b0 = 0; b0 < tiles; b0 += band) {
      const int64_t b1 = std::min(tiles, b0 + band);
      for (int64_t ui = b0; ui < tiles; ++ui) {
        const int64_t u0 = ui * kKeyBlock;
        const int nu = static_cast<int>(std::min<int64_t>(kKeyBlock, L - u0));
        load_query_tile(o, w, f0, h, u0, nu, qp, dop, D, lse);
        if (b0 > 0)  // the sum of the earlier bands' key tiles
          for (int a = 0; a < nu; ++a) std::copy_n(o.dq_row(f0 + u0 + a, h), Dh, &w.dq[size_t(a * Dh)]);
        for (int64_t ji = b0; ji < std::min(b1, ui + 1); ++ji)
          tile_pair(o, w, f0, kvh, h, ui, ji, nu, qp, dop, D, lse);
        const bool done = ui < b1;  // the diagonal tile was this band's
        for (int a = 0; a < nu; ++a) {
          if (done)
            attn::scale_row(o.dq_row(f0 + u0 + a, h), &w.dq[size_t(a * Dh)], o.scale, /*divide=*/false, Dh);
          else
            std::copy_n(&w.dq[size_t(a * Dh)], Dh, o.dq_row(f0 + u0 + a, h));
        }
      }
    }
  }
  for (int64_t t = f0; t < f0 + L; ++t)
    attn::scale_row(o.dk_row(t, kvh), o.dk_row(t, kvh), o.scale, false, Dh);
}

// The fused schedule: items (sequence, kv head), balanced by their (query, key) visits.
void fused(const Context& ctx, const Operands& o, const std::vector<int64_t>& ranges) {
  const int64_t Hkv = o.p.Hkv;
  ctx.parallel_for(
      static_cast<int64_t>(ranges.size()) - 1,
      [&](int64_t rb, int64_t re) {
        TileScratch w(o);
        for (int64_t i = ranges[size_t(rb)]; i < ranges[size_t(re)]; ++i) fused_item(o, w, i / Hkv, i % Hkv);
      },
      1);
}

// Pass 1 of two: item (t, h) visits keys 0..pos(t) and writes dq[t, h] and D[t, h].
void dq_pass(const Context& ctx, const Operands& o, std::vector<float>& dsum) {
  const attn::BatchPlan& p = o.p;
  const int64_t H = o.H, Dh = o.Dh;
  const std::vector<int64_t> r1 =
      attn::balanced_ranges(p.T * H, ctx.threads(), [&](int64_t i) { return int64_t{p.pos[i / H]} + 1; });
  ctx.parallel_for(
      static_cast<int64_t>(r1.size()) - 1,
      [&](int64_t rb, int64_t re) {
        std::vector<float> acc(static_cast<size_t>(Dh));  // (Dh)
        std::vector<float> tiles(o.cache.bf16 ? static_cast<size_t>(2 * kKeyBlock * Dh)
                                              : 0);  // (2, kKeyBlock, Dh)
        const float* kp[kKeyBlock];
        const float* vp[kKeyBlock];
        float pr[kKeyBlock + 8], dp[kKeyBlock + 8], ds[kKeyBlock];
        for (int64_t i = r1[rb]; i < r1[re]; ++i) {
          const int64_t t = i / H, h = i % H, kvh = h / o.G, pos = p.pos[t];
          const int32_t* row = p.table + p.seq[t] * p.table_stride;
          const float D = attn::dot(o.do_row(t, h), o.out_row(t, h), Dh);
          dsum[t * H + h] = D;
          for (int64_t j = 0; j * kKeyBlock <= pos; ++j) {
            const int64_t p0 = j * kKeyBlock;
            const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, pos + 1 - p0));
            o.cache.gather(row, p0, n, kvh, kp, vp, tiles.data(), tiles.data() + kKeyBlock * Dh);
            p_and_ds(o.q_row(t, h), o.do_row(t, h), o.lse_at(t, h), D, kp, vp, n, Dh, o.scale, pr, dp, ds,
                     o.wide);
            attn::scale_and_accumulate(acc.data(), Dh, j == 0, 1.0f, ds, kp, n, o.wide);
          }
          attn::scale_row(o.dq_row(t, h), acc.data(), o.scale, /*divide=*/false, Dh);
        }
      },
      1);
}

// Pass 2 of two: item (t, kvh) is key row t; it visits the queries t..end of
// its sequence for each head of the group and writes dk[t, kvh], dv[t, kvh].
void dkv_pass(const Context& ctx, const Operands& o, const std::vector<float>& dsum) {
  const attn::BatchPlan& p = o.p;
  const int64_t H = o.H, Dh = o.Dh, Hkv = p.Hkv, G = o.G;
  const std::vector<int64_t> r2 = attn::balanced_ranges(p.T * Hkv, ctx.threads(), [&](int64_t i) {
    const int64_t t = i / Hkv;
    return (p.first[p.seq[t] + 1] - t) * G;
  });
  ctx.parallel_for(
      static_cast<int64_t>(r2.size()) - 1,
      [&](int64_t rb, int64_t re) {
        std::vector<float> kacc(static_cast<size_t>(Dh)), vacc(static_cast<size_t>(Dh));  // (Dh) each
        std::vector<float> tiles(o.cache.bf16 ? static_cast<size_t>(2 * Dh) : 0);         // (2, Dh)
        const float* qp[kKeyBlock];
        const float* dop[kKeyBlock];
        float pr[kKeyBlock + 8], dpv[kKeyBlock + 8], ds[kKeyBlock];  // scores() may write 8 past n
        for (int64_t i = r2[rb]; i < r2[re]; ++i) {
          const int64_t t = i / Hkv, kvh = i % Hkv, end = p.first[p.seq[t] + 1];
          const int32_t* row = p.table + p.seq[t] * p.table_stride;
          const float* kj;
          const float* vj;
          o.cache.gather(row, p.pos[t], 1, kvh, &kj, &vj, tiles.data(), tiles.data() + Dh);
          bool first = true;
          for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
            for (int64_t u0 = t; u0 < end; u0 += kKeyBlock) {
              const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, end - u0));
              for (int k = 0; k < n; ++k) {
                qp[k] = o.q_row(u0 + k, h);
                dop[k] = o.do_row(u0 + k, h);
              }
              // k_j . q_u has the bits of q_u . k_j: fma's product is symmetric.
              attn::scores(kj, qp, n, Dh, o.scale, pr, o.wide);
              for (int k = 0; k < n; ++k) pr[k] = pr[k] - o.lse_at(u0 + k, h);
              vexp(pr, pr, n);
              attn::scores(vj, dop, n, Dh, 1.0f, dpv, o.wide);
              for (int k = 0; k < n; ++k) ds[k] = pr[k] * (dpv[k] - dsum[(u0 + k) * H + h]);
              attn::scale_and_accumulate(vacc.data(), Dh, first, 1.0f, pr, dop, n, o.wide);
              attn::scale_and_accumulate(kacc.data(), Dh, first, 1.0f, ds, qp, n, o.wide);
              first = false;
            }
          }
          attn::scale_row(o.dk_row(t, kvh), kacc.data(), o.scale, /*divide=*/false, Dh);
          std::copy(vacc.begin(), vacc.end(), o.dv_row(t, kvh));
        }
      },
      1);
}

}  // namespace

void attention_backward(const Context& ctx, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const AttentionBatch& batch, float scale) {
  LS_GPU_DISPATCH(ctx, attention_backward, dq, dk, dv, dout, out, lse, q, k_cache, v_cache, batch, scale);
  const attn::BatchPlan p =
      attn::plan_attention_backward(dq, dk, dv, dout, out, lse, q, k_cache, v_cache, batch);
  if (p.T == 0) return;
  const int64_t H = q.shape[1], Hkv = p.Hkv;
  const Operands o{p,       {k_cache.data, v_cache.data, k_cache.dtype == DType::BF16, p.BS, Hkv, p.Dh},
                   dq,      dk,
                   dv,      dout,
                   out,     lse,
                   q,       H,
                   H / Hkv, p.Dh,
                   scale,   wide_vectors()};

  // The fused schedule unless its busiest thread would have over twice a
  // thread's share of the (query, key) visits: two passes cost about twice
  // as much per visit (bench/attention_bench.cpp), but split any batch evenly.
  const auto item_cost = [&](int64_t i) {
    const int64_t L = p.first[size_t(i / Hkv) + 1] - p.first[size_t(i / Hkv)];
    return L * (L + 1) / 2 * o.G;
  };
  const int threads = ctx.threads();
  const std::vector<int64_t> ranges = attn::balanced_ranges(p.S * Hkv, threads, item_cost);
  int64_t total = 0, busiest = 0;
  for (size_t r = 0; r + 1 < ranges.size(); ++r) {
    int64_t cost = 0;
    for (int64_t i = ranges[r]; i < ranges[r + 1]; ++i) cost += item_cost(i);
    total += cost;
    busiest = std::max(busiest, cost);
  }
  if (busiest * threads <= 2 * total) {
    fused(ctx, o, ranges);
    return;
  }
  std::vector<float> dsum(static_cast<size_t>(p.T * H));  // (T, H): D = dout . out
  dq_pass(ctx, o, dsum);
  dkv_pass(ctx, o, dsum);
}

}  // namespace lockstep::kernels
