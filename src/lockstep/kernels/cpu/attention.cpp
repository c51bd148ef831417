// Paged-cache attention: argument checks, the cache write and the forward.
// The forward follows the per-position contract in attention.h; work is split
// over (token, head) pairs, and the heads of one kv group that land in the
// same range share each loaded key block.
#include "lockstep/kernels/cpu/attention.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/kernels/cpu/attention_impl.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace attn {

namespace {
void check_i32_vector(const char* fn, const Tensor& t, const char* what) {
  if (t.ndim != 1 || t.dtype != DType::I32 || (t.shape[0] > 1 && t.stride[0] != 1))
    LS_THROW << fn << ": batch." << what << ": expected a contiguous (S,) i32 tensor, got " << t.shape_str();
}
}  // namespace

BatchPlan plan_batch(const char* fn, const AttentionBatch& batch, int64_t T, const Tensor& k_cache,
                     const Tensor& v_cache) {
  BatchPlan p;
  if (k_cache.ndim != 4)
    LS_THROW << fn << ": k_cache: expected shape (num_blocks, block_size, Hkv, Dh), got "
             << k_cache.shape_str();
  const std::string v_what = std::string(fn) + ": v_cache (must match k_cache " + k_cache.shape_str() + ")";
  check_shape(v_cache, {k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]},
              v_what.c_str());
  if ((k_cache.dtype != DType::F32 && k_cache.dtype != DType::BF16) || v_cache.dtype != k_cache.dtype)
    LS_THROW << fn << ": k_cache " << k_cache.shape_str() << " and v_cache " << v_cache.shape_str()
             << " must both be f32 or both bf16";
  if (!k_cache.is_contiguous() || !v_cache.is_contiguous())
    LS_THROW << fn << ": k_cache and v_cache must be contiguous";
  p.NB = k_cache.shape[0];
  p.BS = k_cache.shape[1];
  p.Hkv = k_cache.shape[2];
  p.Dh = k_cache.shape[3];
  if (p.Hkv < 1 || p.Dh < 1)
    LS_THROW << fn << ": k_cache " << k_cache.shape_str() << " has no heads or no width";
  if (batch.block_size < 1 || batch.block_size != p.BS)
    LS_THROW << fn << ": batch.block_size = " << batch.block_size << " but the caches " << k_cache.shape_str()
             << " hold " << p.BS << " positions per block";

  check_i32_vector(fn, batch.n_ctx, "n_ctx");
  check_i32_vector(fn, batch.n_new, "n_new");
  p.S = batch.n_ctx.shape[0];
  if (batch.n_new.shape[0] != p.S)
    LS_THROW << fn << ": batch.n_new " << batch.n_new.shape_str() << " and batch.n_ctx "
             << batch.n_ctx.shape_str() << " disagree on the number of sequences";
  const Tensor& bt = batch.block_table;
  if (bt.ndim != 2 || bt.dtype != DType::I32 || bt.shape[0] != p.S ||
      (bt.shape[1] > 1 && bt.stride[1] != 1) || (p.S > 1 && bt.stride[0] < bt.shape[1]))
    LS_THROW << fn << ": batch.block_table: expected an (S=" << p.S
             << ", max_blocks) i32 tensor with contiguous rows, got " << bt.shape_str();
  p.max_blocks = bt.shape[1];
  p.n_ctx = batch.n_ctx.ptr<int32_t>();
  p.n_new = batch.n_new.ptr<int32_t>();
  p.table = bt.ptr<int32_t>();
  p.table_stride = bt.stride[0];

  const int64_t capacity = p.max_blocks * p.BS;
  int64_t total_new = 0;
  for (int64_t s = 0; s < p.S; ++s) {
    const int64_t nc = p.n_ctx[s], nn = p.n_new[s];
    if (nc < 0 || nn < 0)
      LS_THROW << fn << ": sequence " << s << " has n_ctx = " << nc << ", n_new = " << nn
               << " (must be >= 0)";
    if (nc + nn > capacity)
      LS_THROW << fn << ": sequence " << s << ": n_ctx + n_new = " << nc << " + " << nn << " = " << nc + nn
               << " positions exceed the block table's capacity of " << p.max_blocks << " blocks x " << p.BS
               << " = " << capacity;
    const int32_t* row = p.table + s * p.table_stride;
    const int64_t used = (nc + nn + p.BS - 1) / p.BS;
    for (int64_t b = 0; b < used; ++b) {
      if (row[b] < 0 || row[b] >= p.NB)
        LS_THROW << fn << ": sequence " << s << ": block_table[" << s << "][" << b << "] = " << row[b]
                 << " is outside the cache's " << p.NB << " blocks";
    }
    total_new += nn;
  }
  if (total_new != T)
    LS_THROW << fn << ": the token tensors have T = " << T << " rows but the batch's n_new sum to "
             << total_new;

  p.T = T;
  p.seq.resize(static_cast<size_t>(T));
  p.pos.resize(static_cast<size_t>(T));
  p.first.assign(static_cast<size_t>(p.S) + 1, 0);
  int64_t t = 0;
  for (int64_t s = 0; s < p.S; ++s) {
    p.first[s] = t;
    for (int32_t i = 0; i < p.n_new[s]; ++i, ++t) {
      p.seq[t] = static_cast<int32_t>(s);
      p.pos[t] = p.n_ctx[s] + i;
    }
  }
  p.first[p.S] = t;
  return p;
}

void check_rows(const char* fn, const Tensor& t, int64_t T, int64_t heads, int64_t Dh, const char* what) {
  const std::string w = std::string(fn) + ": " + what;
  check_shape(t, {T, heads, Dh}, w.c_str());
  check_dtype(t, DType::F32, w.c_str());
  if ((Dh > 1 && t.stride[2] != 1) || (heads > 1 && t.stride[1] != Dh) || (T > 1 && t.stride[0] < heads * Dh))
    LS_THROW << w << ": rows of " << t.shape_str() << " must be contiguous (strides " << t.stride[0] << ", "
             << t.stride[1] << ", " << t.stride[2] << ")";
}

BatchPlan plan_kv_cache_write(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new,
                              const Tensor& v_new, const AttentionBatch& batch,
                              std::vector<std::pair<int64_t, int64_t>>* slots) {
  constexpr const char* fn = "kv_cache_write";
  if (k_new.ndim != 3) LS_THROW << fn << ": k_new: expected shape (T, Hkv, Dh), got " << k_new.shape_str();
  const int64_t T = k_new.shape[0];
  BatchPlan p = plan_batch(fn, batch, T, k_cache, v_cache);
  check_rows(fn, k_new, T, p.Hkv, p.Dh, "k_new (T, Hkv, Dh)");
  check_rows(fn, v_new, T, p.Hkv, p.Dh, "v_new (T, Hkv, Dh)");

  // Slot (block * BS + offset) of every new token; two tokens on one slot would
  // race and leave the cache depending on thread timing.
  slots->resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* row = p.table + p.seq[t] * p.table_stride;
    (*slots)[t] = {static_cast<int64_t>(row[p.pos[t] / p.BS]) * p.BS + p.pos[t] % p.BS, t};
  }
  std::sort(slots->begin(), slots->end());
  for (size_t i = 1; i < slots->size(); ++i) {
    if ((*slots)[i].first == (*slots)[i - 1].first) {
      const int64_t a = (*slots)[i - 1].second, b = (*slots)[i].second;
      LS_THROW << fn << ": token " << a << " (sequence " << p.seq[a] << ", position " << p.pos[a]
               << ") and token " << b << " (sequence " << p.seq[b] << ", position " << p.pos[b]
               << ") map to the same cache slot " << (*slots)[i].first / p.BS << ":"
               << (*slots)[i].first % p.BS;
    }
  }
  return p;
}

namespace {
void check_lse(const char* fn, const Tensor& lse, int64_t T, int64_t H) {
  const std::string w = std::string(fn) + ": lse (T, H)";
  check_shape(lse, {T, H}, w.c_str());
  check_dtype(lse, DType::F32, w.c_str());
  if ((H > 1 && lse.stride[1] != 1) || (T > 1 && lse.stride[0] < H))
    LS_THROW << w << ": rows of " << lse.shape_str() << " must be contiguous";
}

// The checks the forward and the backward share: q (T, H, Dh) with H a
// multiple of the caches' Hkv, and the batch.
BatchPlan plan_query(const char* fn, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& batch) {
  if (q.ndim != 3) LS_THROW << fn << ": q: expected shape (T, H, Dh), got " << q.shape_str();
  const int64_t T = q.shape[0], H = q.shape[1];
  BatchPlan p = plan_batch(fn, batch, T, k_cache, v_cache);
  if (H < 1 || H % p.Hkv != 0)
    LS_THROW << fn << ": q " << q.shape_str() << " has H = " << H
             << " heads, not a multiple of the cache's Hkv = " << p.Hkv << " (k_cache " << k_cache.shape_str()
             << ")";
  return p;
}
}  // namespace

BatchPlan plan_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                                 const Tensor& v_cache, const AttentionBatch& batch) {
  constexpr const char* fn = "attention_forward";
  BatchPlan p = plan_query(fn, q, k_cache, v_cache, batch);
  const int64_t T = p.T, H = q.shape[1];
  check_rows(fn, q, T, H, p.Dh, "q (T, H, Dh)");
  check_rows(fn, out, T, H, p.Dh, "out (T, H, Dh)");
  if (lse.data != nullptr || lse.ndim != 0) check_lse(fn, lse, T, H);
  return p;
}

BatchPlan plan_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                  const Tensor& out, const Tensor& lse, const Tensor& q,
                                  const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch) {
  constexpr const char* fn = "attention_backward";
  BatchPlan p = plan_query(fn, q, k_cache, v_cache, batch);
  const int64_t T = p.T, H = q.shape[1], Hkv = p.Hkv, Dh = p.Dh;
  for (int64_t s = 0; s < p.S; ++s) {
    if (p.n_ctx[s] != 0)
      LS_THROW << fn << ": sequence " << s << " has n_ctx = " << p.n_ctx[s]
               << "; the backward supports only the training case, every n_ctx == 0";
  }
  check_rows(fn, q, T, H, Dh, "q (T, H, Dh)");
  check_rows(fn, out, T, H, Dh, "out (T, H, Dh)");
  check_rows(fn, dout, T, H, Dh, "dout (T, H, Dh)");
  check_rows(fn, dq, T, H, Dh, "dq (T, H, Dh)");
  check_rows(fn, dk, T, Hkv, Dh, "dk (T, Hkv, Dh)");
  check_rows(fn, dv, T, Hkv, Dh, "dv (T, Hkv, Dh)");
  check_lse(fn, lse, T, H);
  return p;
}

namespace {

// One query head's running online-softmax state over the key blocks seen so far.
struct Running {
  float m = 0.0f;  // running max of the scaled scores
  float l = 0.0f;  // running sum of exp(score - m)
};

// Folds one key block (n keys, rows kp / vp of one kv head) into the states
// st[g] of the nh query rows q[0..nh) that see all n keys (heads of that
// group, of one or several tokens), exactly as the contract in attention.h
// spells it per row. acc[g] (Dh) is row g's unnormalized output. wide:
// 16-wide registers (wide_vectors()), the same bits.
void attend_group(const float* const* q, int nh, const float* const* kp, const float* const* vp, int n,
                  int64_t dh, float scale, bool first, Running* const* st, float* const* acc, bool wide) {
  constexpr int kPass = 4;  // heads per accumulation pass: 8 live partial vectors of 16 registers
  constexpr int kVec = static_cast<int>(hn::MaxLanes(D()));
  // exps are taken over whole vectors (vexp's bits per element depend neither
  // on the count nor on the position, and whole vectors skip its tail copy).
  const int n_exp = (n + kVec - 1) / kVec * kVec;
  for (int g0 = 0; g0 < nh; g0 += kPass) {
    const int m = std::min(kPass, nh - g0);
    float e[kPass][kKeyBlock + kVec] = {};  // per head: scores, then their exps
    float m_new[kPass], alpha[std::max(kPass, kVec)] = {};
    const float* w[kPass];
    float* ep[kPass] = {e[0], e[1], e[2], e[3]};
    scores_rows(q + g0, m, kp, n, dh, scale, ep, wide);  // the pass's heads share each key load
    for (int g = 0; g < m; ++g) {
      float* eg = e[g];
      const Running& sg = *st[g0 + g];
      const float mb = block_max(eg, n);
      // Same NaN behaviour as max_reduce: a NaN anywhere propagates.
      m_new[g] = first ? mb : ((mb > sg.m || std::isnan(mb)) ? mb : sg.m);
      for (int i = 0; i < n; ++i) eg[i] = eg[i] - m_new[g];
      for (int i = n; i < n_exp; ++i) eg[i] = 0.0f;
      vexp(eg, eg, n_exp);
      alpha[g] = first ? 0.0f : sg.m - m_new[g];
      w[g] = eg;
    }
    if (!first) vexp(alpha, alpha, kVec);  // the pass's rescale factors in one call
    for (int g = 0; g < m; ++g) {
      Running& sg = *st[g0 + g];
      const float lb = block_sum(e[g], n);
      sg.l = first ? lb : sg.l * alpha[g] + lb;
      sg.m = m_new[g];
    }
    float* const* a = acc + g0;
    switch (m) {
      case 1: accumulate_heads<1>(a, dh, first, alpha, w, vp, n, wide); break;
      case 2: accumulate_heads<2>(a, dh, first, alpha, w, vp, n, wide); break;
      case 3: accumulate_heads<3>(a, dh, first, alpha, w, vp, n, wide); break;
      default: accumulate_heads<4>(a, dh, first, alpha, w, vp, n, wide); break;
    }
  }
}

// A query tile's rows: (tile, H) online-softmax states, query rows and
// partial outputs, by (token, head), and the batch of one attend_group call.
struct TileRows {
  std::vector<Running> st;
  std::vector<const float*> q;
  std::vector<float*> acc;
  std::vector<const float*> bq;
  std::vector<Running*> bst;
  std::vector<float*> bacc;
  explicit TileRows(size_t n) : st(n), q(n), acc(n), bq(n), bst(n), bacc(n) {}

  // Folds key block (keys from p0: rows kp, vp of one kv head) into heads
  // [hs, he) of the tile's nt tokens (positions pos[0..nt)). Consecutive
  // tokens that see the same number of keys (all of a block below the
  // diagonal) fold it in one call, sharing each key and value load.
  void fold_block(const int32_t* pos, int64_t nt, int64_t H, int64_t hs, int64_t he, int64_t p0, bool first,
                  const float* const* kp, const float* const* vp, int64_t dh, float scale, bool wide) {
    int nb = 0, n_batch = 0;
    auto flush = [&] {
      if (nb > 0)
        attend_group(bq.data(), nb, kp, vp, n_batch, dh, scale, first, bst.data(), bacc.data(), wide);
      nb = 0;
    };
    for (int64_t u = 0; u < nt; ++u) {
      if (pos[u] < p0) continue;  // this token's keys end before the block
      const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, pos[u] + 1 - p0));
      if (n != n_batch) flush();
      n_batch = n;
      for (int64_t h = hs; h < he; ++h, ++nb) {
        bq[size_t(nb)] = q[size_t(u * H + h)];
        bst[size_t(nb)] = &st[size_t(u * H + h)];
        bacc[size_t(nb)] = acc[size_t(u * H + h)];
      }
    }
    flush();
  }
};

// One thread's scratch of the forward: a query tile's states and partial
// outputs, a key block's widened rows, and a run's K and V rows of one kv head.
struct ForwardScratch {
  std::vector<float> acc_buf;  // (tile, H, Dh)
  std::vector<float> tiles;    // (2, kKeyBlock, Dh)
  TileRows rows;
  std::vector<float> ks, vs;  // (positions, Dh)
  ForwardScratch(int64_t tile, int64_t H, int64_t Dh)
      : acc_buf(size_t(tile * H * Dh)), tiles(size_t(2 * kKeyBlock * Dh)), rows(size_t(tile * H)) {}
};

// The forward's operands and the two ways it walks its (token, head) items.
struct ForwardPass {
  const BatchPlan& p;
  const Tensor& q;
  Tensor out, lse;
  CacheView cache;
  int64_t H = 0, G = 0, Dh = 0, tile = 0;
  float scale = 0.0f;
  bool want_lse = false, wide = false;

  // Points the tile's rows (tokens t0.., heads [hs, he)) at q and the scratch.
  void bind(ForwardScratch& w, int64_t t0, int64_t nt, int64_t hs, int64_t he) const {
    for (int64_t u = 0; u < nt; ++u) {
      for (int64_t h = hs; h < he; ++h) {
        w.rows.q[size_t(u * H + h)] = q.ptr<float>() + (t0 + u) * q.stride[0] + h * Dh;
        w.rows.acc[size_t(u * H + h)] = w.acc_buf.data() + (u * H + h) * Dh;
      }
    }
  }
  // The normalized outputs (and log-sum-exps) of the tile's rows.
  void finish(ForwardScratch& w, int64_t t0, int64_t nt, int64_t hs, int64_t he) const {
    for (int64_t u = 0; u < nt; ++u) {
      const int64_t t = t0 + u;
      for (int64_t h = hs; h < he; ++h) {
        const Running& sh = w.rows.st[size_t(u * H + h)];
        scale_row(out.ptr<float>() + t * out.stride[0] + h * Dh, w.rows.acc[size_t(u * H + h)], sh.l,
                  /*divide=*/true, Dh);
        if (want_lse) lse.ptr<float>()[t * lse.stride[0] + h] = sh.m + log1(sh.l);
      }
    }
  }

  // Tokens [t0, t1) of one sequence, every head (prefill and training). Kv
  // head by kv head, the sequence's K and V rows up to the last token's
  // position are copied side by side once (in the cache one head's rows lie
  // Hkv * Dh apart, a multiple of 4 KiB that maps a block's rows to a few L1
  // sets), then query tiles of up to `tile` tokens sweep the key blocks, each
  // block's rows re-read from L1 by every query row of the tile. (A copy per
  // tile and block cost about a tenth of the forward.) Neither changes a bit:
  // each (token, head) state folds the same blocks in the same order.
  void run(ForwardScratch& w, int64_t t0, int64_t t1) const {
    const int32_t* row = p.table + p.seq[size_t(t0)] * p.table_stride;
    const int64_t L = int64_t{p.pos[size_t(t1 - 1)]} + 1;  // positions rise within a sequence
    w.ks.resize(size_t(L * Dh));
    w.vs.resize(w.ks.size());
    const float* kp[kKeyBlock];
    const float* vp[kKeyBlock];
    for (int64_t kvh = 0; kvh < cache.Hkv; ++kvh) {
      for (int64_t p0 = 0; p0 < L; p0 += kKeyBlock) {
        const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, L - p0));
        if (p0 + kKeyBlock < L)
          cache.prefetch(row, p0 + kKeyBlock,
                         static_cast<int>(std::min<int64_t>(kKeyBlock, L - p0 - kKeyBlock)), kvh, kvh + 1);
        cache.gather(row, p0, n, kvh, kp, vp, w.ks.data() + p0 * Dh, w.vs.data() + p0 * Dh, /*copy=*/true);
      }
      const int64_t hs = kvh * G, he = hs + G;
      for (int64_t ta = t0; ta < t1; ta += tile) {
        const int64_t nt = std::min(tile, t1 - ta);
        bind(w, ta, nt, hs, he);
        const int64_t pos_max = p.pos[size_t(ta + nt - 1)];
        for (int64_t p0 = 0; p0 <= pos_max; p0 += kKeyBlock) {
          const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, pos_max + 1 - p0));
          for (int i = 0; i < n; ++i) {
            kp[i] = w.ks.data() + (p0 + i) * Dh;
            vp[i] = w.vs.data() + (p0 + i) * Dh;
          }
          w.rows.fold_block(p.pos.data() + ta, nt, H, hs, he, p0, p0 == 0, kp, vp, Dh, scale, wide);
        }
        finish(w, ta, nt, hs, he);
      }
    }
  }

  // Heads [h0, h1) of token t alone (decode, or a token the range splits):
  // all of a position's kv heads visit each key block together, as they lie
  // side by side in the cache, read in place.
  void token(ForwardScratch& w, int64_t t, int64_t h0, int64_t h1) const {
    const int64_t kv0 = h0 / G, kv1 = (h1 - 1) / G + 1;
    const int64_t pos_max = p.pos[size_t(t)];
    const int32_t* row = p.table + p.seq[size_t(t)] * p.table_stride;
    const float* kp[kKeyBlock];
    const float* vp[kKeyBlock];
    bind(w, t, 1, h0, h1);
    for (int64_t j = 0; j * kKeyBlock <= pos_max; ++j) {
      const int64_t p0 = j * kKeyBlock;
      const int n_max = static_cast<int>(std::min<int64_t>(kKeyBlock, pos_max + 1 - p0));
      if (p0 + kKeyBlock <= pos_max)
        cache.prefetch(row, p0 + kKeyBlock,
                       static_cast<int>(std::min<int64_t>(kKeyBlock, pos_max + 1 - p0 - kKeyBlock)), kv0,
                       kv1);
      for (int64_t kvh = kv0; kvh < kv1; ++kvh) {
        cache.gather(row, p0, n_max, kvh, kp, vp, w.tiles.data(), w.tiles.data() + kKeyBlock * Dh);
        const int64_t hs = std::max(h0, kvh * G), he = std::min(h1, (kvh + 1) * G);
        w.rows.fold_block(p.pos.data() + t, 1, H, hs, he, p0, j == 0, kp, vp, Dh, scale, wide);
      }
    }
    finish(w, t, 1, h0, h1);
  }
};

}  // namespace
}  // namespace attn

void kv_cache_write(const Context& ctx, Tensor k_cache, Tensor v_cache, const Tensor& k_new,
                    const Tensor& v_new, const AttentionBatch& batch) {
  LS_GPU_DISPATCH(ctx, kv_cache_write, k_cache, v_cache, k_new, v_new, batch);
  std::vector<std::pair<int64_t, int64_t>> slots;  // (slot, token), sorted by slot
  const attn::BatchPlan p = attn::plan_kv_cache_write(k_cache, v_cache, k_new, v_new, batch, &slots);
  const int64_t T = p.T;
  if (T == 0) return;

  const bool bf16 = k_cache.dtype == DType::BF16;
  const int64_t row_elems = p.Hkv * p.Dh;  // one token's (Hkv, Dh) slot is contiguous in the cache
  ctx.parallel_for(
      T,
      [&](int64_t tb, int64_t te) {
        for (int64_t t = tb; t < te; ++t) {
          const int64_t slot = slots[t].first, tok = slots[t].second;
          const float* ks = k_new.ptr<float>() + tok * k_new.stride[0];
          const float* vs = v_new.ptr<float>() + tok * v_new.stride[0];
          const int64_t off = slot * row_elems;
          if (bf16) {
            convert_f32_to_bf16(ks, k_cache.ptr<bf16_t>() + off, static_cast<size_t>(row_elems));
            convert_f32_to_bf16(vs, v_cache.ptr<bf16_t>() + off, static_cast<size_t>(row_elems));
          } else {
            std::memcpy(k_cache.ptr<float>() + off, ks, static_cast<size_t>(row_elems) * sizeof(float));
            std::memcpy(v_cache.ptr<float>() + off, vs, static_cast<size_t>(row_elems) * sizeof(float));
          }
        }
      },
      64);
}

void attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q, const Tensor& k_cache,
                       const Tensor& v_cache, const AttentionBatch& batch, float scale) {
  LS_GPU_DISPATCH(ctx, attention_forward, out, lse, q, k_cache, v_cache, batch, scale);
  const attn::BatchPlan p = attn::plan_attention_forward(out, lse, q, k_cache, v_cache, batch);
  const int64_t T = p.T, H = q.shape[1], Dh = p.Dh, Hkv = p.Hkv;
  const bool want_lse = lse.data != nullptr || lse.ndim != 0;
  if (T == 0) return;

  const int64_t G = H / Hkv;  // query heads per kv head
  attn::CacheView cache{k_cache.data, v_cache.data, k_cache.dtype == DType::BF16, p.BS, Hkv, Dh};
  // Item i = (token i / H, head i % H); its cost is the number of keys it visits.
  const std::vector<int64_t> ranges =
      attn::balanced_ranges(T * H, ctx.threads(), [&](int64_t i) { return int64_t{p.pos[i / H]} + 1; });

  // A query tile of up to `tile` consecutive tokens of one sequence sweeps each
  // key block together, kv head by kv head, so prefill loads a block once per
  // tile instead of once per token: 8192 floats keep one kv group's partial
  // outputs (tile, G, Dh) near L1 (32 tokens x 2 heads of 128: each K and V
  // row loaded feeds 64 query rows). Tiling changes no bits: each (token,
  // head) state still folds the same blocks in the same order.
  const int64_t tile = std::clamp<int64_t>(8192 / (G * Dh), 1, 32);
  const bool wide = wide_vectors();

  const attn::ForwardPass pass{p, q, out, lse, cache, H, G, Dh, tile, scale, want_lse, wide};
  ctx.parallel_for(
      static_cast<int64_t>(ranges.size()) - 1,
      [&](int64_t rb, int64_t re) {
        attn::ForwardScratch w(tile, H, Dh);
        const int64_t end = ranges[re];
        for (int64_t i = ranges[rb]; i < end;) {
          // Two or more whole tokens of one sequence in the range go as a run;
          // the rest a token (or the part of one in the range) at a time.
          const int64_t t0 = i / H, h0 = i % H;
          int64_t t1 = t0;
          if (h0 == 0)
            while ((t1 + 1) * H <= end && p.seq[size_t(t1)] == p.seq[size_t(t0)]) ++t1;
          if (t1 - t0 >= 2) {
            pass.run(w, t0, t1);
            i = t1 * H;
          } else {
            const int64_t h1 = std::min(H, h0 + (end - i));
            pass.token(w, t0, h0, h1);
            i += h1 - h0;
          }
        }
      },
      1);
}

}  // namespace lockstep::kernels
