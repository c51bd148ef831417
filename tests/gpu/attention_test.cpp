// The GPU paged-cache attention (kernels/gpu/attention.cu) in interpret mode
// against the CPU kernels, bit for bit: the cache write, the forward (out and
// lse) and the backward (dq, dk, dv), over ragged batches (decode, prefill
// chunks, empty sequences, blocks crossed), GQA ratios, head widths, cache block
// sizes and dtypes, launch shapes, 1 and 2 pool threads, and through the
// backend table. Negative control, done once by hand: accumulating dk over
// the queries before the heads of a group (loops swapped in attention_dkv_kernel)
// fails BackwardMatchesCpuBitForBit at the first case with G > 1.
#include "lockstep/kernels/gpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace emu = lockstep::gpu::emu;
namespace kg = lockstep::kernels::gpu::interp;

// n elements of emulated device memory (guarded, poisoned), freed at scope end.
template <typename T>
struct Dev {
  Dev(int64_t n, const char* what)
      : n(n),
        p(static_cast<T*>(
            emu::device_alloc(sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1)), what))) {}
  Dev(const std::vector<T>& h, const char* what) : Dev(static_cast<int64_t>(h.size()), what) {
    emu::copy_to_device(p, h.data(), h.size() * sizeof(T));
  }
  ~Dev() { emu::device_free(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> v(static_cast<size_t>(n));
    emu::copy_from_device(v.data(), p, v.size() * sizeof(T));
    return v;
  }
  int64_t n;
  T* p;
};

void expect_same_bytes(const void* a, const void* b, size_t n, const std::string& what) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], y[i]) << what << ": first differing byte " << i;
}

void expect_same_floats(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  test::expect_bits_equal(a.data(), b.data(), static_cast<int64_t>(a.size()), what.c_str());
}

struct Seq {
  int64_t n_ctx, n_new;
};

struct Case {
  std::string name;
  int64_t H, Hkv, Dh;
  int bs;
  DType dt;
  std::vector<Seq> seqs;
};

std::string describe(const Case& c) {
  return c.name + " H" + std::to_string(c.H) + " Hkv" + std::to_string(c.Hkv) + " Dh" + std::to_string(c.Dh) +
         " bs" + std::to_string(c.bs) + (c.dt == DType::BF16 ? " bf16" : " f32");
}

// A ragged batch over a paged cache in device memory: each sequence's blocks at
// scrambled physical indices with spare blocks around, the block table padded
// with -1 (never read), and the context positions already written (by the CPU's
// kv_cache_write). New tokens' q, k, v are column views of one fused (T, W) row.
struct PagedStep {
  Case c;
  int64_t S = 0, T = 0, NB = 0, max_blocks = 1, W = 0;
  std::vector<int32_t> n_ctx, n_new, table;
  AttentionBatch batch;
  Dev<unsigned char> k_cache, v_cache;  // (NB, bs, Hkv, Dh)
  Dev<float> qkv;                       // (T, W): [q (H, Dh) | k (Hkv, Dh) | v (Hkv, Dh)]

  PagedStep(const Case& cs, uint32_t seed)
      : c(cs),
        S(static_cast<int64_t>(cs.seqs.size())),
        T(count_new(cs)),
        NB(count_blocks(cs) + 3),
        W((cs.H + 2 * cs.Hkv) * cs.Dh),
        k_cache(cache_bytes(cs, count_blocks(cs) + 3), "k_cache"),
        v_cache(cache_bytes(cs, count_blocks(cs) + 3), "v_cache"),
        qkv(count_new(cs) * (cs.H + 2 * cs.Hkv) * cs.Dh, "qkv") {
    std::mt19937 g(seed);
    std::vector<int32_t> perm(static_cast<size_t>(NB));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (const Seq& s : c.seqs) max_blocks = std::max(max_blocks, blocks_of(s));
    table.assign(static_cast<size_t>(S * max_blocks), -1);
    size_t next = 0;
    for (int64_t i = 0; i < S; ++i) {
      n_ctx.push_back(static_cast<int32_t>(c.seqs[i].n_ctx));
      n_new.push_back(static_cast<int32_t>(c.seqs[i].n_new));
      for (int64_t b = 0; b < blocks_of(c.seqs[i]); ++b) table[i * max_blocks + b] = perm[next++];
    }
    batch.n_ctx = Tensor(n_ctx.data(), DType::I32, {S});
    batch.n_new = Tensor(n_new.data(), DType::I32, {S});
    batch.block_table = Tensor(table.data(), DType::I32, {S, max_blocks});
    batch.block_size = c.bs;
    const std::vector<float> x = test::randn(T * W, seed + 7, 1.5f);
    std::copy(x.begin(), x.end(), qkv.p);
    write_context(seed + 11);
  }

  Tensor kc() const { return Tensor(k_cache.p, c.dt, {NB, c.bs, c.Hkv, c.Dh}); }
  Tensor vc() const { return Tensor(v_cache.p, c.dt, {NB, c.bs, c.Hkv, c.Dh}); }
  Tensor cols(int64_t col, int64_t heads) const {
    Tensor t(qkv.p + col, DType::F32, {T, heads, c.Dh});
    t.stride[0] = W;
    return t;
  }
  Tensor q() const { return cols(0, c.H); }
  Tensor k_new() const { return cols(c.H * c.Dh, c.Hkv); }
  Tensor v_new() const { return cols((c.H + c.Hkv) * c.Dh, c.Hkv); }

 private:
  static int64_t count_new(const Case& c) {
    int64_t t = 0;
    for (const Seq& s : c.seqs) t += s.n_new;
    return t;
  }
  int64_t blocks_of(const Seq& s) const { return (s.n_ctx + s.n_new + c.bs - 1) / c.bs; }
  static int64_t count_blocks(const Case& c) {
    int64_t n = 0;
    for (const Seq& s : c.seqs) n += (s.n_ctx + s.n_new + c.bs - 1) / c.bs;
    return n;
  }
  static int64_t cache_bytes(const Case& c, int64_t nb) {
    return nb * c.bs * c.Hkv * c.Dh * static_cast<int64_t>(dtype_size(c.dt));
  }
  // Positions [0, n_ctx) of every sequence, as an earlier step would have left them.
  void write_context(uint32_t seed) {
    std::vector<int32_t> zeros(static_cast<size_t>(S), 0);
    int64_t tc = 0;
    for (const Seq& s : c.seqs) tc += s.n_ctx;
    const std::vector<float> kv = test::randn(2 * tc * c.Hkv * c.Dh, seed, 1.5f);
    AttentionBatch b = batch;
    b.n_ctx = Tensor(zeros.data(), DType::I32, {S});
    b.n_new = Tensor(n_ctx.data(), DType::I32, {S});
    std::vector<float> k(kv.begin(), kv.begin() + tc * c.Hkv * c.Dh),
        v(kv.begin() + tc * c.Hkv * c.Dh, kv.end());
    kv_cache_write(Context{}, kc(), vc(), Tensor(k.data(), DType::F32, {tc, c.Hkv, c.Dh}),
                   Tensor(v.data(), DType::F32, {tc, c.Hkv, c.Dh}), b);
  }
};

const Case kForwardCases[] = {
    // decode (n_new 1), prefill chunks, an empty sequence, a context-only one,
    // lengths across key blocks (32) and cache blocks
    {"mixed", 4, 2, 16, 16, DType::F32, {{0, 37}, {5, 1}, {0, 0}, {40, 1}, {33, 8}, {9, 0}, {0, 1}}},
    {"mha odd blocks", 2, 2, 8, 7, DType::F32, {{0, 20}, {64, 3}, {31, 2}}},
    {"gqa4 bf16", 8, 2, 64, 5, DType::BF16, {{70, 1}, {0, 33}, {12, 21}}},
    {"mqa wide-odd", 4, 1, 24, 3, DType::F32, {{0, 9}, {95, 2}}},
    {"decode bf16", 2, 1, 16, 1, DType::BF16, {{63, 1}, {64, 1}, {0, 1}, {100, 1}}},
};

const Case kBackwardCases[] = {
    {"train mixed", 4, 2, 16, 16, DType::F32, {{0, 37}, {0, 1}, {0, 0}, {0, 9}}},
    {"train gqa4 bf16", 8, 2, 8, 7, DType::BF16, {{0, 33}, {0, 5}}},
    {"train mha wide", 2, 2, 64, 5, DType::F32, {{0, 20}}},
    {"train mqa odd", 4, 1, 24, 3, DType::F32, {{0, 40}, {0, 3}}},
    {"train long", 4, 2, 16, 16, DType::F32, {{0, 70}}},
};

// One step on both sides: the new tokens' K/V into the cache (GPU into the
// device cache, CPU into a host copy of it; the bytes must agree), then the
// forward; out and lse must agree bit for bit.
void check_forward(const Case& c, const Context& ctx, const kg::AttentionLaunch& launch, bool with_lse,
                   uint32_t seed) {
  SCOPED_TRACE(describe(c) + " threads " + std::to_string(launch.threads) + " pool " +
               std::to_string(ctx.threads()) + (ctx.gpu ? " via table" : ""));
  PagedStep st(c, seed);
  const size_t cache_n = static_cast<size_t>(st.k_cache.n);
  std::vector<unsigned char> hk = st.k_cache.host(), hv = st.v_cache.host();
  const Tensor hkc(hk.data(), c.dt, {st.NB, c.bs, c.Hkv, c.Dh}),
      hvc(hv.data(), c.dt, {st.NB, c.bs, c.Hkv, c.Dh});

  if (ctx.gpu != nullptr) {
    kv_cache_write(ctx, st.kc(), st.vc(), st.k_new(), st.v_new(), st.batch);
  } else {
    kg::kv_cache_write(ctx, st.kc(), st.vc(), st.k_new(), st.v_new(), st.batch,
                       kg::KvWriteLaunch{launch.threads});
  }
  kv_cache_write(Context{}, hkc, hvc, st.k_new(), st.v_new(), st.batch);
  expect_same_bytes(st.k_cache.p, hk.data(), cache_n, "k_cache");
  expect_same_bytes(st.v_cache.p, hv.data(), cache_n, "v_cache");

  const int64_t T = st.T, H = c.H, Dh = c.Dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  Dev<float> out(T * H * Dh, "out"), lse(T * H, "lse");
  std::vector<float> cpu_out(static_cast<size_t>(T * H * Dh)), cpu_lse(static_cast<size_t>(T * H));
  const Tensor lse_t = with_lse ? Tensor(lse.p, DType::F32, {T, H}) : Tensor();
  const Tensor out_t(out.p, DType::F32, {T, H, Dh});
  if (ctx.gpu != nullptr) {
    attention_forward(ctx, out_t, lse_t, st.q(), st.kc(), st.vc(), st.batch, scale);
  } else {
    kg::attention_forward(ctx, out_t, lse_t, st.q(), st.kc(), st.vc(), st.batch, scale, launch);
  }
  attention_forward(Context{}, Tensor(cpu_out.data(), DType::F32, {T, H, Dh}),
                    Tensor(cpu_lse.data(), DType::F32, {T, H}), st.q(), hkc, hvc, st.batch, scale);
  expect_same_floats(out.host(), cpu_out, "out");
  if (with_lse) expect_same_floats(lse.host(), cpu_lse, "lse");
  for (float x : cpu_out) ASSERT_FALSE(std::isnan(x)) << "the CPU read an unwritten slot";
}

TEST(GpuAttention, ForwardMatchesCpuBitForBit) {
  const auto pool = make_pool(2);
  Context two;
  two.pool = pool.get();
  const int threads[] = {64, 1, 7, 32, 128};
  uint32_t seed = 1;
  for (const Case& c : kForwardCases) {
    for (int th : threads) {
      check_forward(c, seed % 2 ? Context{} : two, kg::AttentionLaunch{th}, /*with_lse=*/th != 7, seed);
      ++seed;
    }
  }
}

TEST(GpuAttention, ForwardHasNoRaceInAnyThreadOrder) {
  emu::Options o;
  o.check_races = true;
  emu::ScopedOptions scoped(o);
  check_forward(kForwardCases[0], Context{}, kg::AttentionLaunch{32}, true, 99);
  check_forward(kForwardCases[2], Context{}, kg::AttentionLaunch{7}, true, 98);
}

// The training step: cache written, the CPU forward gives out and lse, then the
// backward on both sides from the same inputs; dq, dk, dv must agree.
void check_backward(const Case& c, const Context& ctx, const kg::AttentionLaunch& launch, uint32_t seed) {
  SCOPED_TRACE(describe(c) + " threads " + std::to_string(launch.threads) + " pool " +
               std::to_string(ctx.threads()) + (ctx.gpu ? " via table" : ""));
  PagedStep st(c, seed);
  kv_cache_write(Context{}, st.kc(), st.vc(), st.k_new(), st.v_new(), st.batch);
  const int64_t T = st.T, H = c.H, Hkv = c.Hkv, Dh = c.Dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  Dev<float> out(T * H * Dh, "out"), lse(T * H, "lse");
  Dev<float> dout(test::randn(T * H * Dh, seed + 5), "dout");
  attention_forward(Context{}, Tensor(out.p, DType::F32, {T, H, Dh}), Tensor(lse.p, DType::F32, {T, H}),
                    st.q(), st.kc(), st.vc(), st.batch, scale);

  Dev<float> dq(T * H * Dh, "dq"), dk(T * Hkv * Dh, "dk"), dv(T * Hkv * Dh, "dv");
  std::vector<float> cdq(static_cast<size_t>(T * H * Dh)), cdk(static_cast<size_t>(T * Hkv * Dh)),
      cdv(static_cast<size_t>(T * Hkv * Dh));
  const Tensor dout_t(dout.p, DType::F32, {T, H, Dh}), out_t(out.p, DType::F32, {T, H, Dh}),
      lse_t(lse.p, DType::F32, {T, H});
  const Tensor dq_t(dq.p, DType::F32, {T, H, Dh}), dk_t(dk.p, DType::F32, {T, Hkv, Dh}),
      dv_t(dv.p, DType::F32, {T, Hkv, Dh});
  if (ctx.gpu != nullptr) {
    attention_backward(ctx, dq_t, dk_t, dv_t, dout_t, out_t, lse_t, st.q(), st.kc(), st.vc(), st.batch,
                       scale);
  } else {
    kg::attention_backward(ctx, dq_t, dk_t, dv_t, dout_t, out_t, lse_t, st.q(), st.kc(), st.vc(), st.batch,
                           scale, launch);
  }
  attention_backward(Context{}, Tensor(cdq.data(), DType::F32, {T, H, Dh}),
                     Tensor(cdk.data(), DType::F32, {T, Hkv, Dh}),
                     Tensor(cdv.data(), DType::F32, {T, Hkv, Dh}), dout_t, out_t, lse_t, st.q(), st.kc(),
                     st.vc(), st.batch, scale);
  expect_same_floats(dq.host(), cdq, "dq");
  expect_same_floats(dk.host(), cdk, "dk");
  expect_same_floats(dv.host(), cdv, "dv");
}

TEST(GpuAttention, BackwardMatchesCpuBitForBit) {
  const auto pool = make_pool(2);
  Context two;
  two.pool = pool.get();
  const int threads[] = {64, 1, 7, 32};
  uint32_t seed = 100;
  for (const Case& c : kBackwardCases) {
    for (int th : threads) {
      check_backward(c, seed % 2 ? Context{} : two, kg::AttentionLaunch{th}, seed);
      ++seed;
    }
  }
}

TEST(GpuAttention, BackwardHasNoRaceInAnyThreadOrder) {
  emu::Options o;
  o.check_races = true;
  emu::ScopedOptions scoped(o);
  check_backward(kBackwardCases[1], Context{}, kg::AttentionLaunch{7}, 199);
}

// Seeded random shapes: any GQA ratio, odd head widths (1, 17, 33), cache
// blocks of 1..16, up to 4 sequences with or without context, any block shape.
TEST(GpuAttention, RandomShapesMatchCpuBitForBit) {
  const auto pool = make_pool(2);
  Context two;
  two.pool = pool.get();
  for (uint32_t seed = 500; seed < 508; ++seed) {
    std::mt19937 g(seed);
    auto pick = [&](std::initializer_list<int64_t> xs) { return *(xs.begin() + g() % xs.size()); };
    Case c{"random " + std::to_string(seed),
           pick({1, 2, 4, 8}),
           1,
           pick({1, 8, 17, 33, 64}),
           static_cast<int>(pick({1, 3, 4, 7, 16})),
           g() % 2 ? DType::BF16 : DType::F32,
           {}};
    do {
      c.Hkv = pick({1, 2, 4, 8});
    } while (c.Hkv > c.H || c.H % c.Hkv != 0);
    Case train = c;
    const int S = 1 + static_cast<int>(g() % 4);
    for (int i = 0; i < S; ++i) {
      const int64_t n_new = g() % 40;
      c.seqs.push_back({g() % 3 == 0 ? 0 : int64_t(g() % 100), g() % 2 ? 1 : n_new});
      train.seqs.push_back({0, n_new});
    }
    const kg::AttentionLaunch launch{static_cast<int>(pick({1, 7, 32, 64, 100}))};
    const Context ctx = seed % 2 ? two : Context{};
    check_forward(c, ctx, launch, true, seed);
    check_backward(train, ctx, launch, seed);
  }
}

// ctx.gpu set: the CPU entries forward to the table (check_forward and
// check_backward call kernels:: instead of the launch-shape overloads).
TEST(GpuAttention, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.kv_cache_write, nullptr);
  ASSERT_NE(be.attention_forward, nullptr);
  ASSERT_NE(be.attention_backward, nullptr);
  const auto pool = make_pool(2);
  for (int threads : {1, 2}) {
    Context ctx;
    if (threads == 2) ctx.pool = pool.get();
    ctx.gpu = &be;
    check_forward(kForwardCases[0], ctx, kg::AttentionLaunch{}, true, 300 + threads);
    check_backward(kBackwardCases[0], ctx, kg::AttentionLaunch{}, 310 + threads);
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GpuAttention, BadInputsGiveTheCpuErrors) {
  const Case& c = kForwardCases[1];
  PagedStep st(c, 400);
  const int64_t T = st.T;
  std::vector<float> out(static_cast<size_t>(T * c.H * c.Dh)), d(out.size());
  const Tensor out_t(out.data(), DType::F32, {T, c.H, c.Dh});
  // Two tokens on one slot.
  std::vector<int32_t> table = st.table;
  // Sequence 2's block 4 (positions 28..34) made sequence 1's block 9 (63..69):
  // sequence 2's new position 31 and sequence 1's 66 share offset 3.
  table[static_cast<size_t>(st.max_blocks) * 2 + 4] = table[static_cast<size_t>(st.max_blocks) + 9];
  AttentionBatch dup = st.batch;
  dup.block_table = Tensor(table.data(), DType::I32, {st.S, st.max_blocks});
  auto same_error = [](const std::function<void()>& gpu, const std::function<void()>& cpu) {
    const std::string g = error_of(gpu), want = error_of(cpu);
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(g, want);
  };
  same_error([&] { kg::kv_cache_write(Context{}, st.kc(), st.vc(), st.k_new(), st.v_new(), dup, {}); },
             [&] { kv_cache_write(Context{}, st.kc(), st.vc(), st.k_new(), st.v_new(), dup); });
  // H not a multiple of Hkv.
  const Tensor q3(st.qkv.p, DType::F32, {T, 3, c.Dh});
  same_error(
      [&] { kg::attention_forward(Context{}, out_t, Tensor(), q3, st.kc(), st.vc(), st.batch, 1.0f, {}); },
      [&] { attention_forward(Context{}, out_t, Tensor(), q3, st.kc(), st.vc(), st.batch, 1.0f); });
  // The backward with context.
  std::vector<float> lse(static_cast<size_t>(T * c.H));
  const Tensor lse_t(lse.data(), DType::F32, {T, c.H});
  const Tensor dk(d.data(), DType::F32, {T, c.Hkv, c.Dh});
  same_error(
      [&] {
        kg::attention_backward(Context{}, out_t, dk, dk, out_t, out_t, lse_t, st.q(), st.kc(), st.vc(),
                               st.batch, 1.0f, {});
      },
      [&] {
        attention_backward(Context{}, out_t, dk, dk, out_t, out_t, lse_t, st.q(), st.kc(), st.vc(), st.batch,
                           1.0f);
      });
}

}  // namespace
}  // namespace lockstep::kernels
