// DeepSeek-V4's attention core over explicit candidate rows of a K = V store,
// with a per-head sink in the softmax denominator: the forward, and the
// backward whose dstore scatter is ordered (t, h, column) per store row.
#include "lockstep/kernels/cpu/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

using detail::SparseShape;

// (T, H, Dh) f32 with unit last stride; tokens and heads may be strided.
void check_heads(const char* fn, const Tensor& t, const SparseShape& s, const char* name) {
  const std::string w = std::string(fn) + ": " + name + " (T, H, Dh)";
  check_dtype(t, DType::F32, w.c_str());
  check_shape(t, {s.T, s.H, s.Dh}, w.c_str());
  if (s.Dh > 1 && t.stride[2] != 1)
    LS_THROW << w << ": last dimension must be contiguous, got " << t.shape_str();
}

void check_vector(const char* fn, const Tensor& t, int64_t n, const char* name) {
  const std::string w = std::string(fn) + ": " + name;
  check_dtype(t, DType::F32, w.c_str());
  check_shape(t, {n}, w.c_str());
}

void check_token_heads(const char* fn, const Tensor& t, const SparseShape& s, const char* name) {
  const std::string w = std::string(fn) + ": " + name + " (T, H)";
  check_dtype(t, DType::F32, w.c_str());
  check_shape(t, {s.T, s.H}, w.c_str());
}

void check_store(const char* fn, const Tensor& t, int64_t N, int64_t Dh, const char* name) {
  const std::string w = std::string(fn) + ": " + name + " (N, Dh)";
  check_dtype(t, DType::F32, w.c_str());
  check_shape(t, {N, Dh}, w.c_str());
  if (!t.is_contiguous()) LS_THROW << w << ": must be contiguous, got " << t.shape_str();
}

// Checks q, store, cand and sink (the inputs both passes share) and every
// candidate's range; returns the sizes.
SparseShape check_inputs(const char* fn, const Tensor& q, const Tensor& store, const Tensor& cand,
                         const Tensor& sink) {
  if (q.ndim != 3) LS_THROW << fn << ": q: expected shape (T, H, Dh), got " << q.shape_str();
  if (store.ndim != 2) LS_THROW << fn << ": store: expected shape (N, Dh), got " << store.shape_str();
  if (cand.ndim != 2) LS_THROW << fn << ": cand: expected shape (T, C), got " << cand.shape_str();
  const SparseShape s{q.shape[0], q.shape[1], q.shape[2], store.shape[0], cand.shape[1]};
  if (s.H < 1 || s.Dh < 1) LS_THROW << fn << ": q " << q.shape_str() << " has no heads or no width";
  check_heads(fn, q, s, "q");
  check_store(fn, store, s.N, s.Dh, "store");
  const std::string cw = std::string(fn) + ": cand (T, C)";
  check_dtype(cand, DType::I32, cw.c_str());
  check_shape(cand, {s.T, s.C}, cw.c_str());
  if (s.C > 1 && cand.stride[1] != 1) LS_THROW << cw << ": rows must be contiguous, got " << cand.shape_str();
  check_vector(fn, sink, s.H, "sink (H)");
  std::vector<unsigned char> keep;
  const Tensor hcand = host_readable(cand, keep);
  for (int64_t t = 0; t < s.T; ++t) {
    const int32_t* row = hcand.ptr<int32_t>() + t * hcand.stride[0];
    for (int64_t c = 0; c < s.C; ++c)
      if (row[c] < -1 || row[c] >= s.N)
        LS_THROW << cw << ": cand[" << t << "][" << c << "] = " << row[c] << " is outside [-1, N = " << s.N
                 << ")";
  }
  return s;
}

// The valid candidates of one token, in column order: their store rows and columns.
struct TokenRows {
  std::vector<const float*> row;  // (n) store rows
  std::vector<int64_t> col;       // (n) their columns in cand
  int64_t n = 0;

  explicit TokenRows(int64_t C) : row(sz(C)), col(sz(C)) {}
  void gather(const Tensor& cand, const Tensor& store, int64_t t, int64_t C, int64_t Dh) {
    const int32_t* c = cand.ptr<int32_t>() + t * cand.stride[0];
    n = 0;
    for (int64_t j = 0; j < C; ++j) {
      if (c[j] < 0) continue;
      row[sz(n)] = store.ptr<float>() + int64_t{c[j]} * Dh;
      col[sz(n)] = j;
      ++n;
    }
  }
};

// acc (Dh) = fma chain over the rows in order, from 0: acc = fma(w[k], rows[k], acc).
void weighted_rows(float* acc, const float* w, const TokenRows& r, int64_t Dh) {
  std::fill(acc, acc + Dh, 0.0f);
  for (int64_t k = 0; k < r.n; ++k) {
    const float wk = w[k];
    const float* v = r.row[sz(k)];
    for (int64_t d = 0; d < Dh; ++d) acc[d] = std::fma(wk, v[d], acc[d]);
  }
}

// z[k] = canonical_dot(q, rows[k], Dh) * scale for the token's valid rows.
void scores(float* z, const float* q, const TokenRows& r, int64_t Dh, float scale) {
  for (int64_t k = 0; k < r.n; ++k) z[k] = canonical_dot(q, r.row[sz(k)], Dh) * scale;
}

// Tokens per forward range: enough (t, h, candidate, d) work to be worth a thread hand-off.
int64_t token_grain(const SparseShape& s) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, s.H * std::max<int64_t>(1, s.C) * s.Dh));
}

// Coefficients held per chunk: (tokens, H, C) floats twice. 2^20 entries keep
// the scratch at 8 MB; a chunk is never smaller than one token.
constexpr int64_t kChunkEntries = int64_t{1} << 20;

}  // namespace

namespace detail {

SparseShape check_sparse_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                                 const Tensor& cand, const Tensor& sink, bool& want_lse) {
  constexpr const char* kFn = "sparse_attention_forward";
  const SparseShape s = check_inputs(kFn, q, store, cand, sink);
  check_heads(kFn, out, s, "out");
  want_lse = lse.data != nullptr || lse.ndim != 0;
  if (want_lse) check_token_heads(kFn, lse, s, "lse");
  return s;
}

SparseShape check_sparse_backward(const Tensor& dq, const Tensor& dstore, const Tensor& dsink,
                                  const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& q,
                                  const Tensor& store, const Tensor& cand, const Tensor& sink) {
  constexpr const char* kFn = "sparse_attention_backward";
  const SparseShape s = check_inputs(kFn, q, store, cand, sink);
  check_heads(kFn, dout, s, "dout");
  check_heads(kFn, out, s, "out");
  check_token_heads(kFn, lse, s, "lse");
  check_heads(kFn, dq, s, "dq");
  check_store(kFn, dstore, s.N, s.Dh, "dstore");
  check_vector(kFn, dsink, s.H, "dsink (H)");
  return s;
}

int64_t sparse_backward_chunk_tokens(const SparseShape& s) {
  return std::max<int64_t>(1, kChunkEntries / std::max<int64_t>(1, s.H * s.C));
}

}  // namespace detail

void sparse_attention_forward(const Context& ctx, Tensor out, Tensor lse, const Tensor& q,
                              const Tensor& store, const Tensor& cand, const Tensor& sink, float scale) {
  LS_GPU_DISPATCH(ctx, sparse_attention_forward, out, lse, q, store, cand, sink, scale);
  bool want_lse = false;
  const SparseShape s = detail::check_sparse_forward(out, lse, q, store, cand, sink, want_lse);
  const float* sk = sink.ptr<float>();
  ctx.parallel_for(
      s.T,
      [&](int64_t t0, int64_t t1) {
        TokenRows rows(s.C);
        std::vector<float> e(sz(s.C) + 1);  // (C) scores, then probabilities, of the valid columns
        for (int64_t t = t0; t < t1; ++t) {
          rows.gather(cand, store, t, s.C, s.Dh);
          for (int64_t h = 0; h < s.H; ++h) {
            const float sink_h = sk[h * sink.stride[0]];
            scores(e.data(), q.ptr<float>() + t * q.stride[0] + h * q.stride[1], rows, s.Dh, scale);
            float m = sink_h;
            if (rows.n > 0) m = std::max(m, max_reduce(e.data(), rows.n));
            for (int64_t k = 0; k < rows.n; ++k) e[sz(k)] = e[sz(k)] - m;
            vexp(e.data(), e.data(), rows.n);  // the bits of exp1, element by element
            const float l = canonical_sum(e.data(), rows.n) + exp1(sink_h - m);
            for (int64_t k = 0; k < rows.n; ++k) e[sz(k)] = e[sz(k)] / l;
            weighted_rows(out.ptr<float>() + t * out.stride[0] + h * out.stride[1], e.data(), rows, s.Dh);
            if (want_lse) lse.ptr<float>()[t * lse.stride[0] + h * lse.stride[1]] = m + log1(l);
          }
        }
      },
      token_grain(s));
}

namespace {

// The backward's shared views; chunk-local scratch lives in Chunk.
struct BackwardArgs {
  SparseShape s;
  Tensor dq, dstore, dsink, dout, out, lse, q, store, cand, sink;
  float scale;
  const float* q_row(int64_t t, int64_t h) const {
    return q.ptr<float>() + t * q.stride[0] + h * q.stride[1];
  }
  const float* dout_row(int64_t t, int64_t h) const {
    return dout.ptr<float>() + t * dout.stride[0] + h * dout.stride[1];
  }
};

// Per-(t, h, column) coefficients of one chunk of tokens [t0, t0 + n), and the
// inverse index: for each store row, the (token, column) pairs that gathered
// it, sorted by token then column.
struct Chunk {
  int64_t t0 = 0, n = 0;
  std::vector<float> p;          // (n, H, C) p_j (invalid columns unused)
  std::vector<float> ds;         // (n, H, C) dz_j * scale
  std::vector<float> sink_term;  // (n, H) p_sink * Dt
  std::vector<int64_t> first;    // (N + 1) CSR offsets into ref
  std::vector<int64_t> ref;      // (references) tt * C + column
};

// Pass 1, token t (chunk row tt): recompute p = exp1(z - lse), write dq[t] and
// the token's coefficients.
void backward_token(const BackwardArgs& a, Chunk& ch, int64_t tt, TokenRows& rows, float* z, float* dp) {
  const SparseShape& s = a.s;
  const int64_t t = ch.t0 + tt;
  rows.gather(a.cand, a.store, t, s.C, s.Dh);
  for (int64_t h = 0; h < s.H; ++h) {
    const float* dor = a.dout_row(t, h);
    const float Dt = canonical_dot(dor, a.out.ptr<float>() + t * a.out.stride[0] + h * a.out.stride[1], s.Dh);
    const float l = a.lse.ptr<float>()[t * a.lse.stride[0] + h * a.lse.stride[1]];
    scores(z, a.q_row(t, h), rows, s.Dh, a.scale);
    for (int64_t k = 0; k < rows.n; ++k) z[k] = z[k] - l;
    vexp(z, z, rows.n);
    scores(dp, dor, rows, s.Dh, 1.0f);
    float* pc = ch.p.data() + (tt * s.H + h) * s.C;
    float* dsc = ch.ds.data() + (tt * s.H + h) * s.C;
    for (int64_t k = 0; k < rows.n; ++k) {
      const float ds = z[k] * (dp[k] - Dt) * a.scale;
      dp[k] = ds;  // dp now holds dz * scale, the dq weights
      pc[rows.col[sz(k)]] = z[k];
      dsc[rows.col[sz(k)]] = ds;
    }
    weighted_rows(a.dq.ptr<float>() + t * a.dq.stride[0] + h * a.dq.stride[1], dp, rows, s.Dh);
    const float sink_h = a.sink.ptr<float>()[h * a.sink.stride[0]];
    ch.sink_term[sz(tt * s.H + h)] = exp1(sink_h - l) * Dt;
  }
}

// Counting sort of the chunk's valid references by store row; filling in
// (token, column) order leaves each row's list sorted.
void build_inverse_index(const BackwardArgs& a, Chunk& ch) {
  const SparseShape& s = a.s;
  std::fill(ch.first.begin(), ch.first.end(), 0);
  for (int64_t tt = 0; tt < ch.n; ++tt) {
    const int32_t* c = a.cand.ptr<int32_t>() + (ch.t0 + tt) * a.cand.stride[0];
    for (int64_t j = 0; j < s.C; ++j)
      if (c[j] >= 0) ++ch.first[sz(int64_t{c[j]} + 1)];
  }
  for (int64_t r = 0; r < s.N; ++r) ch.first[sz(r + 1)] += ch.first[sz(r)];
  ch.ref.resize(sz(ch.first[sz(s.N)]));
  std::vector<int64_t> next(ch.first.begin(), ch.first.end() - 1);  // (N) fill cursor per row
  for (int64_t tt = 0; tt < ch.n; ++tt) {
    const int32_t* c = a.cand.ptr<int32_t>() + (ch.t0 + tt) * a.cand.stride[0];
    for (int64_t j = 0; j < s.C; ++j)
      if (c[j] >= 0) ch.ref[sz(next[sz(c[j])]++)] = tt * s.C + j;
  }
}

// Pass 2, store row r: dstore[r] += ds * q[t,h] + p * dout[t,h] for each
// reference, in (t, h, column) order, as one fma chain on the row itself (so
// the chunking of tokens never shows in the bits).
void scatter_row(const BackwardArgs& a, const Chunk& ch, int64_t r) {
  const SparseShape& s = a.s;
  float* dst = a.dstore.ptr<float>() + r * s.Dh;
  const int64_t end = ch.first[sz(r + 1)];
  for (int64_t i = ch.first[sz(r)]; i < end;) {
    const int64_t tt = ch.ref[sz(i)] / s.C;
    int64_t run_end = i;  // [i, run_end): this token's columns
    while (run_end < end && ch.ref[sz(run_end)] / s.C == tt) ++run_end;
    const int64_t t = ch.t0 + tt;
    for (int64_t h = 0; h < s.H; ++h) {
      const float* qr = a.q_row(t, h);
      const float* dor = a.dout_row(t, h);
      for (int64_t k = i; k < run_end; ++k) {
        const int64_t col = ch.ref[sz(k)] % s.C;
        const float ds = ch.ds[sz((tt * s.H + h) * s.C + col)];
        const float p = ch.p[sz((tt * s.H + h) * s.C + col)];
        for (int64_t d = 0; d < s.Dh; ++d) dst[d] = std::fma(p, dor[d], std::fma(ds, qr[d], dst[d]));
      }
    }
    i = run_end;
  }
}

}  // namespace

void sparse_attention_backward(const Context& ctx, Tensor dq, Tensor dstore, Tensor dsink, const Tensor& dout,
                               const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& store,
                               const Tensor& cand, const Tensor& sink, float scale) {
  LS_GPU_DISPATCH(ctx, sparse_attention_backward, dq, dstore, dsink, dout, out, lse, q, store, cand, sink,
                  scale);
  const SparseShape s =
      detail::check_sparse_backward(dq, dstore, dsink, dout, out, lse, q, store, cand, sink);
  const BackwardArgs a{s, dq, dstore, dsink, dout, out, lse, q, store, cand, sink, scale};

  const int64_t chunk_tokens = detail::sparse_backward_chunk_tokens(s);
  Chunk ch;
  ch.first.resize(sz(s.N + 1));
  for (ch.t0 = 0; ch.t0 < s.T; ch.t0 += chunk_tokens) {
    ch.n = std::min(chunk_tokens, s.T - ch.t0);
    ch.p.resize(sz(ch.n * s.H * s.C));
    ch.ds.resize(sz(ch.n * s.H * s.C));
    ch.sink_term.resize(sz(ch.n * s.H));
    ctx.parallel_for(
        ch.n,
        [&](int64_t b, int64_t e) {
          TokenRows rows(s.C);
          std::vector<float> z(sz(s.C) + 1), dp(sz(s.C) + 1);  // (C) each
          for (int64_t tt = b; tt < e; ++tt) backward_token(a, ch, tt, rows, z.data(), dp.data());
        },
        token_grain(s));
    build_inverse_index(a, ch);
    ctx.parallel_for(
        s.N,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) scatter_row(a, ch, r);
        },
        64);
    float* ds = dsink.ptr<float>();
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t tt = 0; tt < ch.n; ++tt) ds[h * dsink.stride[0]] -= ch.sink_term[sz(tt * s.H + h)];
  }
}

}  // namespace lockstep::kernels
