// Tests for paged-cache attention: a double-precision reference, the contract
// written out in scalar code (bit for bit), the alignment tests (decode, chunked
// prefill, trainer; batch, block size, threads), finite differences for the
// backward, sentinel guards, and bad shapes / batches.
#include "lockstep/kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/cpu/wide.h"

namespace lockstep::kernels {
namespace {

using test::expect_bits_equal;
using test::expect_close;
using test::Guarded;

struct Shape {
  int64_t H, Hkv, Dh;
};

// Everything one sequence will ever feed to attention, per absolute position.
struct SeqData {
  int64_t len = 0;
  std::vector<float> q, k, v;  // (len, H, Dh), (len, Hkv, Dh), (len, Hkv, Dh)
};

SeqData make_seq(Shape sh, int64_t len, uint32_t seed) {
  SeqData s;
  s.len = len;
  s.q = test::randn(len * sh.H * sh.Dh, seed * 3 + 1);
  s.k = test::randn(len * sh.Hkv * sh.Dh, seed * 3 + 2);
  s.v = test::randn(len * sh.Hkv * sh.Dh, seed * 3 + 3);
  return s;
}

float default_scale(Shape sh) {
  return 1.0f / std::sqrt(static_cast<float>(sh.Dh));
}

// One layer's cache; each sequence id owns enough blocks for `caps[id]`
// positions, at scrambled physical indices, with spare blocks in between.
// Unwritten slots hold NaN so a read of one shows up in the outputs.
struct Paged {
  Shape sh{};
  int bs = 0;
  OwnedTensor k, v;  // (NB, bs, Hkv, Dh)
  std::vector<std::vector<int32_t>> blocks;

  Paged(Shape s, int block_size, const std::vector<int64_t>& caps, uint32_t seed, DType dt = DType::F32)
      : sh(s), bs(block_size) {
    int64_t need = 0;
    for (int64_t c : caps) need += (c + bs - 1) / bs;
    const int64_t nb = need + 3;
    std::vector<int32_t> perm(static_cast<size_t>(nb));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    size_t next = 0;
    for (int64_t c : caps) {
      blocks.emplace_back();
      for (int64_t b = 0; b < (c + bs - 1) / bs; ++b) blocks.back().push_back(perm[next++]);
    }
    k = OwnedTensor(dt, {nb, bs, sh.Hkv, sh.Dh});
    v = OwnedTensor(dt, {nb, bs, sh.Hkv, sh.Dh});
    for (OwnedTensor* t : {&k, &v}) {
      if (dt == DType::F32) {
        std::fill_n(t->f32(), t->numel(), std::nanf(""));
      } else {
        std::fill_n(t->view().bf16(), t->numel(), bf16_t{0x7fc1});
      }
    }
  }
};

// The part of one sequence that a step processes.
struct Part {
  int id;
  int64_t n_ctx, n_new;
};

// Batch tensors for a step (block table padded with -1, which must never be read).
struct BatchHolder {
  std::vector<int32_t> n_ctx, n_new, table;
  AttentionBatch batch;
  BatchHolder(const Paged& pc, const std::vector<Part>& parts) {
    size_t max_blocks = 1;
    for (const Part& p : parts) max_blocks = std::max(max_blocks, pc.blocks[p.id].size());
    table.assign(parts.size() * max_blocks, -1);
    for (size_t i = 0; i < parts.size(); ++i) {
      n_ctx.push_back(static_cast<int32_t>(parts[i].n_ctx));
      n_new.push_back(static_cast<int32_t>(parts[i].n_new));
      std::copy(pc.blocks[parts[i].id].begin(), pc.blocks[parts[i].id].end(), table.begin() + i * max_blocks);
    }
    const int64_t S = static_cast<int64_t>(parts.size());
    batch.n_ctx = Tensor(n_ctx.data(), DType::I32, {S});
    batch.n_new = Tensor(n_new.data(), DType::I32, {S});
    batch.block_table = Tensor(table.data(), DType::I32, {S, static_cast<int64_t>(max_blocks)});
    batch.block_size = pc.bs;
  }
};

// The new tokens' rows of a step, concatenated in part order.
struct StepInputs {
  int64_t T = 0;
  std::vector<float> q, k, v;  // (T, H, Dh), (T, Hkv, Dh), (T, Hkv, Dh)
  StepInputs(Shape sh, const std::vector<SeqData>& seqs, const std::vector<Part>& parts) {
    const int64_t qw = sh.H * sh.Dh, kw = sh.Hkv * sh.Dh;
    for (const Part& p : parts) {
      const SeqData& s = seqs[p.id];
      q.insert(q.end(), s.q.begin() + p.n_ctx * qw, s.q.begin() + (p.n_ctx + p.n_new) * qw);
      k.insert(k.end(), s.k.begin() + p.n_ctx * kw, s.k.begin() + (p.n_ctx + p.n_new) * kw);
      v.insert(v.end(), s.v.begin() + p.n_ctx * kw, s.v.begin() + (p.n_ctx + p.n_new) * kw);
      T += p.n_new;
    }
  }
};

struct StepOut {
  std::vector<float> out, lse;  // (T, H, Dh), (T, H)
};

// One engine step: writes the new tokens' K/V into the cache, then attends.
StepOut step(const Context& ctx, Paged& pc, const std::vector<SeqData>& seqs, const std::vector<Part>& parts,
             float scale) {
  const Shape sh = pc.sh;
  BatchHolder bh(pc, parts);
  StepInputs in(sh, seqs, parts);
  const int64_t T = in.T;
  kv_cache_write(ctx, pc.k.view(), pc.v.view(), Tensor(in.k.data(), DType::F32, {T, sh.Hkv, sh.Dh}),
                 Tensor(in.v.data(), DType::F32, {T, sh.Hkv, sh.Dh}), bh.batch);
  Guarded out(T * sh.H * sh.Dh), lse(T * sh.H);
  attention_forward(ctx, out.tensor({T, sh.H, sh.Dh}), lse.tensor({T, sh.H}),
                    Tensor(in.q.data(), DType::F32, {T, sh.H, sh.Dh}), pc.k.view(), pc.v.view(), bh.batch,
                    scale);
  out.check("out");
  lse.check("lse");
  return {out.values(), lse.values()};
}

// Plain causal softmax attention of one sequence in double: out (len, H, Dh), lse (len, H).
void reference_forward(Shape sh, int64_t len, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, double scale, std::vector<double>& out,
                       std::vector<double>& lse) {
  const int64_t G = sh.H / sh.Hkv, Dh = sh.Dh;
  out.assign(static_cast<size_t>(len * sh.H * Dh), 0.0);
  lse.assign(static_cast<size_t>(len * sh.H), 0.0);
  std::vector<double> s(static_cast<size_t>(len));
  for (int64_t t = 0; t < len; ++t) {
    for (int64_t h = 0; h < sh.H; ++h) {
      const double* qr = &q[(t * sh.H + h) * Dh];
      const int64_t kvh = h / G;
      double m = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        const double* kr = &k[(j * sh.Hkv + kvh) * Dh];
        double d = 0;
        for (int64_t c = 0; c < Dh; ++c) d += qr[c] * kr[c];
        s[j] = d * scale;
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j <= t; ++j) z += std::exp(s[j] - m);
      double* o = &out[(t * sh.H + h) * Dh];
      for (int64_t j = 0; j <= t; ++j) {
        const double w = std::exp(s[j] - m) / z;
        for (int64_t c = 0; c < Dh; ++c) o[c] += w * v[(j * sh.Hkv + kvh) * Dh + c];
      }
      lse[t * sh.H + h] = m + std::log(z);
    }
  }
}

std::vector<double> to_double(const std::vector<float>& x) {
  return std::vector<double>(x.begin(), x.end());
}

void reference_forward(Shape sh, const SeqData& s, double scale, std::vector<double>& out,
                       std::vector<double>& lse) {
  reference_forward(sh, s.len, to_double(s.q), to_double(s.k), to_double(s.v), scale, out, lse);
}

// The contract of attention.h for one (query, head), written out in scalar code.
void contract_reference(const float* q, const std::vector<const float*>& keys,
                        const std::vector<const float*>& vals, int64_t pos, int64_t Dh, float scale,
                        float* out, float* lse) {
  float m = 0, l = 0;
  std::vector<float> acc(static_cast<size_t>(Dh), 0.0f);
  for (int64_t p0 = 0; p0 <= pos; p0 += kKeyBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, pos + 1 - p0));
    const bool first = p0 == 0;
    float s[kKeyBlock], e[kKeyBlock];
    for (int i = 0; i < n; ++i) s[i] = canonical_dot(q, keys[p0 + i], Dh) * scale;
    const float mb = max_reduce(s, n);
    const float mn = first ? mb : std::max(m, mb);
    for (int i = 0; i < n; ++i) e[i] = exp1(s[i] - mn);
    const float lb = canonical_sum(e, n);
    if (first) {
      l = lb;
    } else {
      const float a = exp1(m - mn);
      l = l * a + lb;
      for (auto& x : acc) x = x * a;
    }
    for (int i = 0; i < n; ++i)
      for (int64_t c = 0; c < Dh; ++c) acc[c] = std::fma(e[i], vals[p0 + i][c], acc[c]);
    m = mn;
  }
  for (int64_t c = 0; c < Dh; ++c) out[c] = acc[c] / l;
  *lse = m + log1(l);
}

// Expected rows of a step (concatenated parts) from whole-sequence results.
template <typename T>
std::vector<T> gather_rows(const std::vector<std::vector<T>>& per_seq, const std::vector<Part>& parts,
                           int64_t width) {
  std::vector<T> r;
  for (const Part& p : parts)
    r.insert(r.end(), per_seq[p.id].begin() + p.n_ctx * width,
             per_seq[p.id].begin() + (p.n_ctx + p.n_new) * width);
  return r;
}

// A random batch: sequence i gets n_ctx context (written by an earlier step) and n_new new tokens.
struct RandomCase {
  Shape sh;
  int bs;
  std::vector<SeqData> seqs;
  std::vector<Part> parts;
};

RandomCase random_case(uint32_t seed) {
  std::mt19937 g(seed);
  auto pick = [&](std::initializer_list<int64_t> xs) { return *(xs.begin() + g() % xs.size()); };
  RandomCase rc;
  const int64_t H = pick({1, 2, 4, 8});
  int64_t Hkv = H;
  while (true) {
    Hkv = pick({1, 2, 4, 8});
    if (Hkv <= H && H % Hkv == 0) break;
  }
  rc.sh = {H, Hkv, pick({8, 16, 17, 32, 64, 128})};
  rc.bs = static_cast<int>(pick({1, 3, 4, 16}));
  const int S = 1 + static_cast<int>(g() % 4);
  for (int i = 0; i < S; ++i) {
    const int64_t n_ctx = (g() % 3 == 0) ? 0 : g() % 200;
    const int64_t n_new = 1 + g() % 100;
    rc.seqs.push_back(make_seq(rc.sh, n_ctx + n_new, seed * 10 + i));
    rc.parts.push_back({i, n_ctx, n_new});
  }
  return rc;
}

std::vector<int64_t> lengths(const std::vector<SeqData>& seqs) {
  std::vector<int64_t> r;
  for (const auto& s : seqs) r.push_back(s.len);
  return r;
}

// Writes every sequence's context with one step so that `parts` can then run.
void fill_context(const Context& ctx, Paged& pc, const std::vector<SeqData>& seqs,
                  const std::vector<Part>& parts) {
  std::vector<Part> pre;
  for (const Part& p : parts)
    if (p.n_ctx > 0) pre.push_back({p.id, 0, p.n_ctx});
  if (!pre.empty()) step(ctx, pc, seqs, pre, default_scale(pc.sh));
}

TEST(Attention, ForwardMatchesDoubleReference) {
  ThreadPool pool(2);
  for (uint32_t seed = 1; seed <= 14; ++seed) {
    RandomCase rc = random_case(seed);
    const Context ctx{seed % 2 ? &pool : nullptr};
    const float scale = default_scale(rc.sh) * (seed % 3 == 0 ? 3.0f : 1.0f);  // sharper softmax too
    Paged pc(rc.sh, rc.bs, lengths(rc.seqs), seed);
    fill_context(ctx, pc, rc.seqs, rc.parts);
    const StepOut got = step(ctx, pc, rc.seqs, rc.parts, scale);
    std::vector<std::vector<double>> outs, lses;
    for (const auto& s : rc.seqs) {
      outs.emplace_back();
      lses.emplace_back();
      reference_forward(rc.sh, s, scale, outs.back(), lses.back());
    }
    const std::string what = "seed " + std::to_string(seed) + " H=" + std::to_string(rc.sh.H) +
                             " Hkv=" + std::to_string(rc.sh.Hkv) + " Dh=" + std::to_string(rc.sh.Dh) +
                             " bs=" + std::to_string(rc.bs);
    expect_close(got.out, gather_rows(outs, rc.parts, rc.sh.H * rc.sh.Dh), 2e-5, (what + " out").c_str());
    expect_close(got.lse, gather_rows(lses, rc.parts, rc.sh.H), 2e-6, (what + " lse").c_str(), 1e-5);
  }
}

// Fast-mode rollout keeps K/V in a bf16 cache: the cache rounds them on write,
// so the output is the double reference's on the rounded K/V (q stays f32).
TEST(Attention, Bf16CacheMatchesDoubleReferenceOnRoundedKv) {
  ThreadPool pool(2);
  for (uint32_t seed = 101; seed <= 112; ++seed) {
    const RandomCase rc = random_case(seed);
    const Context ctx{seed % 2 ? &pool : nullptr};
    const float scale = default_scale(rc.sh) * (seed % 3 == 0 ? 3.0f : 1.0f);
    Paged pc(rc.sh, rc.bs, lengths(rc.seqs), seed, DType::BF16);
    fill_context(ctx, pc, rc.seqs, rc.parts);  // writes the unrounded K/V
    const StepOut got = step(ctx, pc, rc.seqs, rc.parts, scale);
    std::vector<std::vector<double>> outs, lses;
    for (SeqData s : rc.seqs) {
      for (auto* v : {&s.k, &s.v})
        for (float& x : *v) x = round_bf16(x);
      outs.emplace_back();
      lses.emplace_back();
      reference_forward(rc.sh, s, scale, outs.back(), lses.back());
    }
    const std::string what = "bf16 cache, seed " + std::to_string(seed) + " H=" + std::to_string(rc.sh.H) +
                             " Hkv=" + std::to_string(rc.sh.Hkv) + " Dh=" + std::to_string(rc.sh.Dh) +
                             " bs=" + std::to_string(rc.bs);
    expect_close(got.out, gather_rows(outs, rc.parts, rc.sh.H * rc.sh.Dh), 2e-5, (what + " out").c_str());
    expect_close(got.lse, gather_rows(lses, rc.parts, rc.sh.H), 2e-6, (what + " lse").c_str(), 1e-5);
  }
}

// The kernel's inlined dot products, block loop and accumulation give exactly
// the bits of the contract spelled out with simd.h's functions.
void forward_follows_the_contract() {
  // Every head width the kernel specializes (16, 32, 64, 128), the generic
  // multiple of 16 (48), the canonical_dot fallback (8, 17), head groups of
  // 1, 3, 4 and 8 (two accumulation passes), a bf16 cache, and q, k so small
  // that the scores underflow to zeros and subnormals.
  struct Fixed {
    Shape sh;
    DType dt;
    float qk_scale;
  };
  const std::vector<Fixed> fixed{
      {{2, 2, 16}, DType::F32, 1},  {{8, 2, 32}, DType::F32, 1},  {{8, 4, 64}, DType::F32, 1},
      {{4, 1, 128}, DType::F32, 1}, {{3, 1, 48}, DType::F32, 1},  {{8, 1, 8}, DType::F32, 1},
      {{4, 2, 17}, DType::F32, 1},  {{8, 2, 32}, DType::BF16, 1}, {{4, 2, 32}, DType::F32, 1e-23f},
      // bf16 caches (fast-mode rollout) on every specialized width and the fallback.
      {{2, 2, 16}, DType::BF16, 1}, {{8, 4, 64}, DType::BF16, 1}, {{4, 1, 128}, DType::BF16, 1},
      {{3, 1, 48}, DType::BF16, 1}, {{8, 1, 8}, DType::BF16, 1},  {{4, 2, 6}, DType::BF16, 1}};
  for (uint32_t seed = 20; seed < 20 + fixed.size() + 4; ++seed) {
    RandomCase rc = random_case(seed);
    const size_t f = seed - 20;
    DType dt = DType::F32;
    if (f < fixed.size()) {
      rc.sh = fixed[f].sh;
      dt = fixed[f].dt;
      for (size_t i = 0; i < rc.seqs.size(); ++i) {
        rc.seqs[i] = make_seq(rc.sh, rc.seqs[i].len, seed * 10 + i);
        for (auto* v : {&rc.seqs[i].q, &rc.seqs[i].k})
          for (float& x : *v) x *= fixed[f].qk_scale;
        if (dt == DType::BF16) {
          for (auto* v : {&rc.seqs[i].k, &rc.seqs[i].v})
            for (float& x : *v) x = round_bf16(x);  // what the cache will hold
        }
      }
    }
    const Context ctx{};
    const float scale = default_scale(rc.sh);
    Paged pc(rc.sh, rc.bs, lengths(rc.seqs), seed, dt);
    fill_context(ctx, pc, rc.seqs, rc.parts);
    const StepOut got = step(ctx, pc, rc.seqs, rc.parts, scale);
    const Shape sh = rc.sh;
    int64_t row = 0;
    std::vector<float> o(static_cast<size_t>(sh.Dh));
    for (const Part& p : rc.parts) {
      const SeqData& s = rc.seqs[p.id];
      for (int64_t pos = p.n_ctx; pos < p.n_ctx + p.n_new; ++pos, ++row) {
        for (int64_t h = 0; h < sh.H; ++h) {
          const int64_t kvh = h / (sh.H / sh.Hkv);
          std::vector<const float*> keys, vals;
          for (int64_t j = 0; j <= pos; ++j) {
            keys.push_back(&s.k[(j * sh.Hkv + kvh) * sh.Dh]);
            vals.push_back(&s.v[(j * sh.Hkv + kvh) * sh.Dh]);
          }
          float lse;
          contract_reference(&s.q[(pos * sh.H + h) * sh.Dh], keys, vals, pos, sh.Dh, scale, o.data(), &lse);
          expect_bits_equal(&got.out[(row * sh.H + h) * sh.Dh], o.data(), sh.Dh, "out vs contract");
          expect_bits_equal(&got.lse[row * sh.H + h], &lse, 1, "lse vs contract");
        }
      }
    }
  }
}

TEST(Attention, ForwardFollowsTheContractBitForBit) {
  forward_follows_the_contract();
}

// The same with the 8-wide form where the CPU would run the 16-wide one.
TEST(AttentionNarrow, ForwardFollowsTheContractBitForBit) {
  set_wide_vectors(false);
  forward_follows_the_contract();
  set_wide_vectors(true);
}

// THE alignment test: the trainer (whole sequence new), chunked prefill with
// chunks of 1 (decode), 2, 3, 7, 16 tokens, different cache block sizes and
// block orders, 1 or 2 threads: every position gets the same bits.
TEST(Attention, DecodeChunkedPrefillAndTrainerAgreeBitForBit) {
  ThreadPool pool1(1), pool2(2);
  for (Shape sh : {Shape{8, 2, 32}, Shape{8, 4, 64}, Shape{3, 1, 17}}) {
    const int64_t L = 131;  // crosses four key-block boundaries
    const std::vector<SeqData> seqs{make_seq(sh, L, 7)};
    const float scale = default_scale(sh);
    Paged whole_pc(sh, 16, {L}, 1);
    const StepOut whole = step(Context{&pool1}, whole_pc, seqs, {{0, 0, L}}, scale);
    int variant = 0;
    for (int64_t chunk : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{16}, L}) {
      for (int bs : {1, 4, 16}) {
        for (ThreadPool* pool : {&pool1, &pool2}) {
          ++variant;
          if (chunk == 1 && bs != 4) continue;  // decode: one block size per pool keeps the test fast
          Paged pc(sh, bs, {L}, 100 + variant);
          std::vector<float> out, lse;
          for (int64_t c0 = 0; c0 < L; c0 += chunk) {
            const StepOut r = step(Context{pool}, pc, seqs, {{0, c0, std::min(chunk, L - c0)}}, scale);
            out.insert(out.end(), r.out.begin(), r.out.end());
            lse.insert(lse.end(), r.lse.begin(), r.lse.end());
          }
          const std::string what = "Dh=" + std::to_string(sh.Dh) + " chunk=" + std::to_string(chunk) +
                                   " bs=" + std::to_string(bs) + " threads=" + std::to_string(pool->size());
          expect_bits_equal(out.data(), whole.out.data(), L * sh.H * sh.Dh, (what + " out").c_str());
          expect_bits_equal(lse.data(), whole.lse.data(), L * sh.H, (what + " lse").c_str());
        }
      }
    }
  }
}

// A sequence's rows do not depend on what else is in the batch.
TEST(Attention, MixedBatchMatchesEachSequenceAlone) {
  ThreadPool pool1(1), pool2(2);
  const Shape sh{8, 2, 32};
  const float scale = default_scale(sh);
  // (n_ctx, n_new): decode steps, a prefill chunk, a fresh prompt, an idle sequence, a long one.
  const std::vector<std::pair<int64_t, int64_t>> shapes{{40, 1},  {0, 70}, {95, 1},
                                                        {33, 17}, {12, 0}, {250, 1}};
  std::vector<SeqData> seqs;
  std::vector<Part> parts;
  for (size_t i = 0; i < shapes.size(); ++i) {
    seqs.push_back(make_seq(sh, shapes[i].first + shapes[i].second, 50 + static_cast<uint32_t>(i)));
    parts.push_back({static_cast<int>(i), shapes[i].first, shapes[i].second});
  }
  for (ThreadPool* pool : {&pool1, &pool2}) {
    const Context ctx{pool};
    Paged pc(sh, 16, lengths(seqs), 3);
    fill_context(ctx, pc, seqs, parts);
    const StepOut batched = step(ctx, pc, seqs, parts, scale);
    int64_t row = 0;
    for (const Part& p : parts) {
      Paged alone_pc(sh, 4, {seqs[p.id].len}, 9 + p.id);
      std::vector<SeqData> one{seqs[p.id]};
      fill_context(Context{&pool1}, alone_pc, one, {{0, p.n_ctx, p.n_new}});
      const StepOut alone = step(Context{&pool1}, alone_pc, one, {{0, p.n_ctx, p.n_new}}, scale);
      const std::string what =
          "sequence " + std::to_string(p.id) + " threads=" + std::to_string(pool->size());
      expect_bits_equal(&batched.out[row * sh.H * sh.Dh], alone.out.data(), p.n_new * sh.H * sh.Dh,
                        what.c_str());
      expect_bits_equal(&batched.lse[row * sh.H], alone.lse.data(), p.n_new * sh.H, what.c_str());
      row += p.n_new;
    }
  }
}

// q, k_new, v_new as column views of one fused (T, (H + 2 Hkv) * Dh) projection.
TEST(Attention, StridedTokenRowsGiveTheSameBits) {
  const Shape sh{4, 2, 16};
  const int64_t L = 45, W = (sh.H + 2 * sh.Hkv) * sh.Dh;
  const std::vector<SeqData> seqs{make_seq(sh, L, 77)};
  const float scale = default_scale(sh);
  Paged ref_pc(sh, 8, {L}, 1);
  const StepOut want = step(Context{}, ref_pc, seqs, {{0, 0, L}}, scale);

  std::vector<float> qkv(static_cast<size_t>(L * W));
  for (int64_t t = 0; t < L; ++t) {
    std::copy_n(&seqs[0].q[t * sh.H * sh.Dh], sh.H * sh.Dh, &qkv[t * W]);
    std::copy_n(&seqs[0].k[t * sh.Hkv * sh.Dh], sh.Hkv * sh.Dh, &qkv[t * W + sh.H * sh.Dh]);
    std::copy_n(&seqs[0].v[t * sh.Hkv * sh.Dh], sh.Hkv * sh.Dh, &qkv[t * W + (sh.H + sh.Hkv) * sh.Dh]);
  }
  auto view = [&](int64_t col, int64_t heads) {
    Tensor t(&qkv[col], DType::F32, {L, heads, sh.Dh});
    t.stride[0] = W;
    return t;
  };
  Paged pc(sh, 8, {L}, 1);
  BatchHolder bh(pc, {{0, 0, L}});
  kv_cache_write(Context{}, pc.k.view(), pc.v.view(), view(sh.H * sh.Dh, sh.Hkv),
                 view((sh.H + sh.Hkv) * sh.Dh, sh.Hkv), bh.batch);
  Guarded out(L * sh.H * sh.Dh);
  attention_forward(Context{}, out.tensor({L, sh.H, sh.Dh}), Tensor(), view(0, sh.H), pc.k.view(),
                    pc.v.view(), bh.batch, scale);
  out.check("out");
  expect_bits_equal(out.data(), want.out.data(), L * sh.H * sh.Dh, "strided q/k/v");
}

// A bf16 cache stores K/V rounded to nearest even and widens them exactly, so it
// gives the bits of an f32 cache holding the rounded values.
TEST(Attention, Bf16CacheEqualsF32CacheOfRoundedValues) {
  const Shape sh{8, 2, 32};
  const int64_t L = 70;
  std::vector<SeqData> seqs{make_seq(sh, L, 5)};
  std::vector<SeqData> rounded = seqs;
  for (auto* v : {&rounded[0].k, &rounded[0].v})
    for (float& x : *v) x = round_bf16(x);
  const float scale = default_scale(sh);
  Paged bpc(sh, 4, {L}, 2, DType::BF16);
  const StepOut a = step(Context{}, bpc, seqs, {{0, 0, 50}}, scale);
  const StepOut a2 = step(Context{}, bpc, seqs, {{0, 50, 20}}, scale);
  Paged fpc(sh, 16, {L}, 3);
  const StepOut b = step(Context{}, fpc, rounded, {{0, 0, L}}, scale);
  expect_bits_equal(a.out.data(), b.out.data(), 50 * sh.H * sh.Dh, "bf16 cache, first chunk");
  expect_bits_equal(a2.out.data(), &b.out[50 * sh.H * sh.Dh], 20 * sh.H * sh.Dh, "bf16 cache, second chunk");
  // The cache holds the rounded bits.
  const bf16_t* kc = bpc.k.view().bf16();
  for (int64_t pos : {int64_t{0}, int64_t{33}, L - 1}) {
    const int64_t off = (bpc.blocks[0][pos / 4] * 4 + pos % 4) * sh.Hkv * sh.Dh;
    for (int64_t c = 0; c < sh.Hkv * sh.Dh; ++c)
      ASSERT_EQ(kc[off + c], f32_to_bf16(seqs[0].k[pos * sh.Hkv * sh.Dh + c])) << pos << " " << c;
  }
}

TEST(Attention, KvCacheWriteFillsExactlyTheNewSlots) {
  const Shape sh{2, 2, 8};
  const int bs = 4;
  std::vector<SeqData> seqs{make_seq(sh, 10, 1), make_seq(sh, 6, 2)};
  Paged pc(sh, bs, {10, 6}, 4);
  const int64_t NB = pc.k.view().dim(0), row = sh.Hkv * sh.Dh;
  // Positions [3, 10) of sequence 0 and [0, 6) of sequence 1.
  BatchHolder bh(pc, {{0, 3, 7}, {1, 0, 6}});
  StepInputs in(sh, seqs, {{0, 3, 7}, {1, 0, 6}});
  kv_cache_write(Context{}, pc.k.view(), pc.v.view(), Tensor(in.k.data(), DType::F32, {13, sh.Hkv, sh.Dh}),
                 Tensor(in.v.data(), DType::F32, {13, sh.Hkv, sh.Dh}), bh.batch);
  std::vector<bool> written(static_cast<size_t>(NB * bs), false);
  for (int id = 0; id < 2; ++id) {
    for (int64_t pos = id == 0 ? 3 : 0; pos < seqs[id].len; ++pos) {
      const int64_t slot = pc.blocks[id][pos / bs] * bs + pos % bs;
      written[slot] = true;
      expect_bits_equal(pc.k.f32() + slot * row, &seqs[id].k[pos * row], row, "k slot");
      expect_bits_equal(pc.v.f32() + slot * row, &seqs[id].v[pos * row], row, "v slot");
    }
  }
  for (int64_t slot = 0; slot < NB * bs; ++slot) {
    if (written[slot]) continue;
    for (int64_t c = 0; c < row; ++c) {
      ASSERT_TRUE(std::isnan(pc.k.f32()[slot * row + c])) << "k slot " << slot << " was overwritten";
      ASSERT_TRUE(std::isnan(pc.v.f32()[slot * row + c])) << "v slot " << slot << " was overwritten";
    }
  }
}

// Runs the training-case forward and backward of `seqs` (all tokens new) with dout = w.
struct Grads {
  std::vector<float> out, dq, dk, dv;
};
Grads train_step(const Context& ctx, Shape sh, int bs, const std::vector<SeqData>& seqs,
                 const std::vector<float>& w, float scale, uint32_t layout_seed, DType dt = DType::F32) {
  std::vector<Part> parts;
  for (size_t i = 0; i < seqs.size(); ++i) parts.push_back({static_cast<int>(i), 0, seqs[i].len});
  Paged pc(sh, bs, lengths(seqs), layout_seed, dt);
  BatchHolder bh(pc, parts);
  StepInputs in(sh, seqs, parts);
  const int64_t T = in.T;
  kv_cache_write(ctx, pc.k.view(), pc.v.view(), Tensor(in.k.data(), DType::F32, {T, sh.Hkv, sh.Dh}),
                 Tensor(in.v.data(), DType::F32, {T, sh.Hkv, sh.Dh}), bh.batch);
  const Tensor q(in.q.data(), DType::F32, {T, sh.H, sh.Dh});
  std::vector<float> out(static_cast<size_t>(T * sh.H * sh.Dh)), lse(static_cast<size_t>(T * sh.H));
  attention_forward(ctx, Tensor(out.data(), DType::F32, {T, sh.H, sh.Dh}),
                    Tensor(lse.data(), DType::F32, {T, sh.H}), q, pc.k.view(), pc.v.view(), bh.batch, scale);
  Guarded dq(T * sh.H * sh.Dh, 7.0f), dk(T * sh.Hkv * sh.Dh, 7.0f), dv(T * sh.Hkv * sh.Dh, 7.0f);
  std::vector<float> dout = w;
  attention_backward(ctx, dq.tensor({T, sh.H, sh.Dh}), dk.tensor({T, sh.Hkv, sh.Dh}),
                     dv.tensor({T, sh.Hkv, sh.Dh}), Tensor(dout.data(), DType::F32, {T, sh.H, sh.Dh}),
                     Tensor(out.data(), DType::F32, {T, sh.H, sh.Dh}),
                     Tensor(lse.data(), DType::F32, {T, sh.H}), q, pc.k.view(), pc.v.view(), bh.batch, scale);
  dq.check("dq");
  dk.check("dk");
  dv.check("dv");
  return {out, dq.values(), dk.values(), dv.values()};
}

// Central differences of L = Σ w . out on the double reference.
TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (Shape sh : {Shape{4, 2, 8}, Shape{2, 1, 17}}) {
    const float scale = default_scale(sh) * 2.0f;
    std::vector<SeqData> seqs{make_seq(sh, 13, 11), make_seq(sh, 41, 12)};  // 41 crosses a key block
    const int64_t T = 54;
    const std::vector<float> w = test::randn(T * sh.H * sh.Dh, 99);
    const Grads g = train_step(Context{}, sh, 4, seqs, w, scale, 5);

    std::vector<double> fd_q, fd_k, fd_v;
    int64_t row = 0;
    for (const SeqData& s : seqs) {
      std::vector<double> q = to_double(s.q), k = to_double(s.k), v = to_double(s.v), out, lse;
      auto loss = [&] {
        reference_forward(sh, s.len, q, k, v, scale, out, lse);
        double L = 0;
        for (size_t i = 0; i < out.size(); ++i) L += w[row * sh.H * sh.Dh + i] * out[i];
        return L;
      };
      for (auto [x, fd] : {std::pair{&q, &fd_q}, std::pair{&k, &fd_k}, std::pair{&v, &fd_v}}) {
        for (double& xi : *x) {
          const double x0 = xi, eps = 1e-4;
          xi = x0 + eps;
          const double lp = loss();
          xi = x0 - eps;
          const double lm = loss();
          xi = x0;
          fd->push_back((lp - lm) / (2 * eps));
        }
      }
      row += s.len;
    }
    const std::string what = "Dh=" + std::to_string(sh.Dh);
    expect_close(g.dq, fd_q, 1e-4, (what + " dq").c_str());
    expect_close(g.dk, fd_k, 1e-4, (what + " dk").c_str());
    expect_close(g.dv, fd_v, 1e-4, (what + " dv").c_str());

    // And the kernel's own f32 forward agrees with its backward, loosely.
    std::mt19937 pick(3);
    for (int trial = 0; trial < 6; ++trial) {
      const int which = trial % 3;
      std::vector<SeqData> pert = seqs;
      std::vector<float>& x = which == 0 ? pert[1].q : which == 1 ? pert[1].k : pert[1].v;
      const size_t i = pick() % x.size();
      const float x0 = x[i], eps = 1e-2f;
      auto loss = [&](float xv) {
        x[i] = xv;
        const Grads r = train_step(Context{}, sh, 4, pert, w, scale, 5);
        double L = 0;
        for (size_t j = 0; j < r.out.size(); ++j) L += double(w[j]) * r.out[j];
        return L;
      };
      const double fd = (loss(x0 + eps) - loss(x0 - eps)) / (2.0 * eps);
      const size_t off = which == 0 ? 13 * sh.H * sh.Dh : 13 * sh.Hkv * sh.Dh;
      const float got = (which == 0 ? g.dq : which == 1 ? g.dk : g.dv)[off + i];
      EXPECT_NEAR(got, fd, 1e-2 * (std::fabs(fd) + 0.05))
          << what << " f32 fd, tensor " << which << " elem " << i;
    }
  }
}

// The backward's contract (attention.h), written out in scalar code for one
// sequence: P and dS from canonical dots and exp1, then one fma chain per
// element, dq over keys ascending, dk and dv over the group's heads, then
// queries ascending. A faster kernel must keep every bit of it.
Grads backward_contract(Shape sh, const SeqData& s, const std::vector<float>& dout,
                        const std::vector<float>& out, const std::vector<float>& lse, float scale) {
  const int64_t L = s.len, H = sh.H, Hkv = sh.Hkv, Dh = sh.Dh, G = H / Hkv;
  Grads g;
  g.dq.assign(size_t(L * H * Dh), 0.0f);
  g.dk.assign(size_t(L * Hkv * Dh), 0.0f);
  g.dv.assign(size_t(L * Hkv * Dh), 0.0f);
  const auto qr = [&](int64_t t, int64_t h) { return &s.q[size_t((t * H + h) * Dh)]; };
  const auto kr = [&](int64_t j, int64_t kvh) { return &s.k[size_t((j * Hkv + kvh) * Dh)]; };
  const auto vr = [&](int64_t j, int64_t kvh) { return &s.v[size_t((j * Hkv + kvh) * Dh)]; };
  const auto dor = [&](int64_t t, int64_t h) { return &dout[size_t((t * H + h) * Dh)]; };
  std::vector<float> P(size_t(L * L)), dS(size_t(L * L));  // one head's (query, key) terms
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kvh = h / G;
    for (int64_t t = 0; t < L; ++t) {
      const float D = canonical_dot(dor(t, h), &out[size_t((t * H + h) * Dh)], Dh);
      for (int64_t j = 0; j <= t; ++j) {
        const float p = exp1(canonical_dot(qr(t, h), kr(j, kvh), Dh) * scale - lse[size_t(t * H + h)]);
        const float dp = canonical_dot(dor(t, h), vr(j, kvh), Dh) * 1.0f;
        P[size_t(t * L + j)] = p;
        dS[size_t(t * L + j)] = p * (dp - D);
      }
      float* dq = &g.dq[size_t((t * H + h) * Dh)];
      for (int64_t c = 0; c < Dh; ++c) {
        float a = 0.0f;
        for (int64_t j = 0; j <= t; ++j) a = std::fma(dS[size_t(t * L + j)], kr(j, kvh)[c], a);
        dq[c] = a * scale;
      }
    }
    for (int64_t j = 0; j < L; ++j) {  // the group's heads come in order: accumulate, scale after the last
      float* dk = &g.dk[size_t((j * Hkv + kvh) * Dh)];
      float* dv = &g.dv[size_t((j * Hkv + kvh) * Dh)];
      for (int64_t c = 0; c < Dh; ++c)
        for (int64_t t = j; t < L; ++t) {
          dk[c] = std::fma(dS[size_t(t * L + j)], qr(t, h)[c], dk[c]);
          dv[c] = std::fma(P[size_t(t * L + j)], dor(t, h)[c], dv[c]);
        }
    }
  }
  for (float& x : g.dk) x = x * scale;
  return g;
}

// Every head width the kernels specialize and the fallbacks, head groups of
// 1 to 8, sequences shorter and longer than a key block, 1 and 2 threads.
void backward_follows_the_contract() {
  ThreadPool pool2(2), pool4(4);
  const std::vector<Shape> shapes{{2, 2, 16}, {8, 2, 32}, {8, 4, 64}, {4, 1, 128},
                                  {3, 1, 48}, {8, 1, 8},  {4, 2, 17}};
  uint32_t seed = 60;
  for (const Shape sh : shapes) {
    for (const std::vector<int64_t>& lens : {std::vector<int64_t>{1, 33, 70}, std::vector<int64_t>{97}}) {
      std::vector<SeqData> seqs;
      int64_t T = 0;
      for (int64_t len : lens) {
        seqs.push_back(make_seq(sh, len, ++seed));
        T += len;
      }
      const float scale = default_scale(sh);
      const std::vector<float> w = test::randn(T * sh.H * sh.Dh, ++seed);
      // 1, 2 and 4 threads: few (sequence, kv head) items on 4 threads take
      // the two-pass schedule, the rest the fused one.
      for (const Context ctx : {Context{}, Context{&pool2}, Context{&pool4}}) {
        const Grads got = train_step(ctx, sh, 8, seqs, w, scale, seed);
        int64_t row = 0;
        for (const SeqData& s : seqs) {
          const auto rows = [&](const std::vector<float>& v, int64_t heads) {
            return std::vector<float>(v.begin() + row * heads * sh.Dh,
                                      v.begin() + (row + s.len) * heads * sh.Dh);
          };
          // The forward's lse, from its out (the forward follows its own contract).
          std::vector<float> lse(size_t(s.len * sh.H)), o(size_t(sh.Dh));
          for (int64_t t = 0; t < s.len; ++t)
            for (int64_t h = 0; h < sh.H; ++h) {
              std::vector<const float*> keys, vals;
              const int64_t kvh = h / (sh.H / sh.Hkv);
              for (int64_t j = 0; j <= t; ++j) {
                keys.push_back(&s.k[size_t((j * sh.Hkv + kvh) * sh.Dh)]);
                vals.push_back(&s.v[size_t((j * sh.Hkv + kvh) * sh.Dh)]);
              }
              contract_reference(&s.q[size_t((t * sh.H + h) * sh.Dh)], keys, vals, t, sh.Dh, scale, o.data(),
                                 &lse[size_t(t * sh.H + h)]);
            }
          const Grads want = backward_contract(sh, s, rows(w, sh.H), rows(got.out, sh.H), lse, scale);
          const std::string what = "H=" + std::to_string(sh.H) + " Hkv=" + std::to_string(sh.Hkv) +
                                   " Dh=" + std::to_string(sh.Dh) + " len=" + std::to_string(s.len);
          expect_bits_equal(rows(got.dq, sh.H).data(), want.dq.data(), s.len * sh.H * sh.Dh,
                            (what + " dq").c_str());
          expect_bits_equal(rows(got.dk, sh.Hkv).data(), want.dk.data(), s.len * sh.Hkv * sh.Dh,
                            (what + " dk").c_str());
          expect_bits_equal(rows(got.dv, sh.Hkv).data(), want.dv.data(), s.len * sh.Hkv * sh.Dh,
                            (what + " dv").c_str());
          row += s.len;
        }
      }
    }
  }
}

TEST(Attention, BackwardFollowsTheContractBitForBit) {
  backward_follows_the_contract();
}

// The same with the 8-wide form where the CPU would run the 16-wide one.
TEST(AttentionNarrow, BackwardFollowsTheContractBitForBit) {
  set_wide_vectors(false);
  backward_follows_the_contract();
  set_wide_vectors(true);
}

TEST(Attention, BackwardIsThreadAndBatchInvariant) {
  ThreadPool pool2(2);
  const Shape sh{8, 2, 32};
  const float scale = default_scale(sh);
  std::vector<SeqData> seqs{make_seq(sh, 90, 1), make_seq(sh, 7, 2), make_seq(sh, 160, 3)};
  const int64_t T = 257;
  const std::vector<float> w = test::randn(T * sh.H * sh.Dh, 4);
  const Grads a = train_step(Context{}, sh, 16, seqs, w, scale, 1);
  const Grads b = train_step(Context{&pool2}, sh, 4, seqs, w, scale, 2);
  expect_bits_equal(a.dq.data(), b.dq.data(), T * sh.H * sh.Dh, "dq threads");
  expect_bits_equal(a.dk.data(), b.dk.data(), T * sh.Hkv * sh.Dh, "dk threads");
  expect_bits_equal(a.dv.data(), b.dv.data(), T * sh.Hkv * sh.Dh, "dv threads");
  // The last sequence alone.
  const int64_t off = 97;
  const std::vector<float> w3(w.begin() + off * sh.H * sh.Dh, w.end());
  const Grads c = train_step(Context{&pool2}, sh, 1, {seqs[2]}, w3, scale, 3);
  expect_bits_equal(&a.dq[off * sh.H * sh.Dh], c.dq.data(), 160 * sh.H * sh.Dh, "dq alone");
  expect_bits_equal(&a.dk[off * sh.Hkv * sh.Dh], c.dk.data(), 160 * sh.Hkv * sh.Dh, "dk alone");
  expect_bits_equal(&a.dv[off * sh.Hkv * sh.Dh], c.dv.data(), 160 * sh.Hkv * sh.Dh, "dv alone");
  // A bf16 cache gives the f32 cache's bits for rounded K/V.
  std::vector<SeqData> rounded = seqs;
  for (auto& s : rounded)
    for (auto* v : {&s.k, &s.v})
      for (float& x : *v) x = round_bf16(x);
  const Grads d = train_step(Context{}, sh, 16, seqs, w, scale, 1, DType::BF16);
  const Grads e = train_step(Context{}, sh, 16, rounded, w, scale, 1);
  expect_bits_equal(d.dq.data(), e.dq.data(), T * sh.H * sh.Dh, "dq bf16");
  expect_bits_equal(d.dk.data(), e.dk.data(), T * sh.Hkv * sh.Dh, "dk bf16");
}

// A sequence long enough for the fused schedule's key bands (1 MiB of K,
// V, dk and dv rows: 16 tiles of 32 keys at Dh = 128, so 1,100 tokens make
// bands of 16, 16 and 3 tiles, the query tiles' dq carried across them)
// gives the bits of the two-pass schedule, which has no bands: one
// (sequence, kv head) item on 4 threads takes it.
TEST(Attention, BackwardKeyBandsGiveTheTwoPassBits) {
  ThreadPool pool4(4);
  const Shape sh{2, 1, 128};
  const float scale = default_scale(sh);
  const int64_t T = 1100;
  const std::vector<SeqData> seqs{make_seq(sh, T, 5)};
  const std::vector<float> w = test::randn(T * sh.H * sh.Dh, 6);
  const Grads fused = train_step(Context{}, sh, 16, seqs, w, scale, 1);
  const Grads passes = train_step(Context{&pool4}, sh, 16, seqs, w, scale, 1);
  expect_bits_equal(fused.dq.data(), passes.dq.data(), T * sh.H * sh.Dh, "dq");
  expect_bits_equal(fused.dk.data(), passes.dk.data(), T * sh.Hkv * sh.Dh, "dk");
  expect_bits_equal(fused.dv.data(), passes.dv.data(), T * sh.Hkv * sh.Dh, "dv");
}

// Bad shapes and batches throw an Error naming the values, before any write.
class AttentionErrors : public ::testing::Test {
 protected:
  const Shape sh{4, 2, 8};
  std::vector<SeqData> seqs{make_seq(sh, 10, 1), make_seq(sh, 5, 2)};
  Paged pc{sh, 4, {10, 5}, 1};
  std::vector<float> q = test::randn(15 * 4 * 8, 3), kv = test::randn(15 * 2 * 8, 4);

  // Runs fn and expects an Error whose message contains every needle.
  template <typename Fn>
  void expect_error(Fn fn, std::initializer_list<const char*> needles) {
    try {
      fn();
      FAIL() << "no error thrown; expected " << *needles.begin();
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg;
    }
  }
  void forward(BatchHolder& bh, int64_t T, int64_t H, int64_t Dh) {
    Guarded out(T * H * Dh, 5.0f);
    std::vector<float> qq(static_cast<size_t>(T * H * Dh), 1.0f);
    try {
      attention_forward(Context{}, out.tensor({T, H, Dh}), Tensor(),
                        Tensor(qq.data(), DType::F32, {T, H, Dh}), pc.k.view(), pc.v.view(), bh.batch, 1.0f);
    } catch (...) {
      for (int64_t i = 0; i < T * H * Dh; ++i) EXPECT_EQ(out[i], 5.0f) << "out written before the error";
      out.check("out");
      throw;
    }
  }
};

TEST_F(AttentionErrors, CapacityExceeded) {
  BatchHolder bh(pc, {{0, 8, 5}, {1, 0, 5}});  // sequence 0 has 3 blocks of 4 = 12 < 13
  expect_error([&] { forward(bh, 10, 4, 8); }, {"sequence 0", "8 + 5 = 13", "capacity of 3 blocks x 4 = 12"});
  expect_error(
      [&] {
        kv_cache_write(Context{}, pc.k.view(), pc.v.view(), Tensor(kv.data(), DType::F32, {10, 2, 8}),
                       Tensor(kv.data(), DType::F32, {10, 2, 8}), bh.batch);
      },
      {"kv_cache_write", "capacity"});
}

TEST_F(AttentionErrors, BlockIndexOutOfRange) {
  BatchHolder bh(pc, {{0, 0, 10}, {1, 0, 5}});
  bh.table[1] = 999;
  expect_error([&] { forward(bh, 15, 4, 8); }, {"block_table[0][1] = 999", "outside the cache's"});
  bh.table[1] = -2;
  expect_error([&] { forward(bh, 15, 4, 8); }, {"block_table[0][1] = -2"});
}

TEST_F(AttentionErrors, TokenCountMismatch) {
  BatchHolder bh(pc, {{0, 0, 10}, {1, 0, 5}});
  expect_error([&] { forward(bh, 14, 4, 8); }, {"T = 14", "sum to 15"});
  bh.n_new[1] = -1;
  expect_error([&] { forward(bh, 9, 4, 8); }, {"sequence 1", "n_new = -1"});
}

TEST_F(AttentionErrors, HeadsNotAMultipleOfKvHeads) {
  BatchHolder bh(pc, {{0, 0, 10}, {1, 0, 5}});
  expect_error([&] { forward(bh, 15, 3, 8); }, {"H = 3", "Hkv = 2"});
  expect_error([&] { forward(bh, 15, 4, 16); }, {"q (T, H, Dh)", "(15, 4, 16)"});
}

TEST_F(AttentionErrors, BadCachesAndBatchTensors) {
  BatchHolder bh(pc, {{0, 0, 10}, {1, 0, 5}});
  bh.batch.block_size = 8;
  expect_error([&] { forward(bh, 15, 4, 8); }, {"block_size = 8", "4 positions per block"});
  bh.batch.block_size = 4;
  OwnedTensor small(DType::F32, {3, 4, 2, 8});
  expect_error(
      [&] {
        attention_forward(Context{}, Tensor(q.data(), DType::F32, {15, 4, 8}), Tensor(),
                          Tensor(q.data(), DType::F32, {15, 4, 8}), pc.k.view(), small.view(), bh.batch,
                          1.0f);
      },
      {"v_cache", "(3, 4, 2, 8)"});
  bh.batch.n_ctx = Tensor(bh.n_ctx.data(), DType::F32, {2});
  expect_error([&] { forward(bh, 15, 4, 8); }, {"batch.n_ctx", "i32"});
}

TEST_F(AttentionErrors, DuplicateCacheSlots) {
  BatchHolder bh(pc, {{0, 0, 10}, {1, 0, 5}});
  bh.table[bh.table.size() / 2] = bh.table[0];  // sequence 1's first block = sequence 0's
  expect_error(
      [&] {
        kv_cache_write(Context{}, pc.k.view(), pc.v.view(), Tensor(kv.data(), DType::F32, {15, 2, 8}),
                       Tensor(kv.data(), DType::F32, {15, 2, 8}), bh.batch);
      },
      {"token 0", "token 10", "same cache slot"});
}

TEST_F(AttentionErrors, BackwardNeedsTheTrainingCase) {
  BatchHolder bh(pc, {{0, 3, 7}, {1, 0, 5}});
  std::vector<float> g(15 * 4 * 8), gk(15 * 2 * 8), l(15 * 4);
  const Tensor t4(g.data(), DType::F32, {12, 4, 8}), t2(gk.data(), DType::F32, {12, 2, 8});
  expect_error(
      [&] {
        attention_backward(Context{}, t4, t2, t2, t4, t4, Tensor(l.data(), DType::F32, {12, 4}), t4,
                           pc.k.view(), pc.v.view(), bh.batch, 1.0f);
      },
      {"sequence 0 has n_ctx = 3", "every n_ctx == 0"});
}

}  // namespace
}  // namespace lockstep::kernels
