// DeepSeek-V4's sparse attention with a sink on the GPU
// (kernels/gpu/sparse_attention.cu) in interpret mode, bit for bit against the
// CPU kernel (kernels/cpu/sparse_attention.h), forward and backward: each
// token's sliding window over its sequence's rows plus a few compressed rows,
// -1 padding anywhere in a candidate row, a token with no candidate (the sink
// alone), repeated candidates, strided q and out, odd T, head widths below
// and above 16, special values, several block shapes and grid-stride loops,
// 1 and 2 pool threads, the race check, the dispatch from the CPU entries and
// the CPU's error messages. The CPU references run on host copies, so this
// binary runs in strict interpret mode.
//
// Negative controls (done once by hand): the denominator summed over 2 lanes
// instead of 16 failed ForwardAndBackwardMatchCpu (out, lse, dq, dstore,
// dsink, 1 ulp); the dstore scatter's two fmas swapped failed it on dstore.
// (Reversing or rotating the lanes is no control: the tree pairs lanes j and
// j + 8, j + 4, ..., so those give the same sums.)
#include "lockstep/kernels/gpu/sparse_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

std::vector<G::SparseAttentionLaunch> launches() {
  return {G::SparseAttentionLaunch{}, G::SparseAttentionLaunch{1, 0}, G::SparseAttentionLaunch{33, 2},
          G::SparseAttentionLaunch{1024, 1}, G::SparseAttentionLaunch{16, 0}};
}

// T tokens over sequences of `seq` tokens each; the store holds their rows
// then `extra` compressed rows. Token t's candidates: its window of the last
// `window` rows of its sequence (up to itself; -1 before the sequence start),
// then the compressed rows it may see (every third column -1, and the first
// one repeated when there are several). Token 2 sees nothing.
struct Problem {
  int64_t T = 0, H = 0, Dh = 0, N = 0, C = 0, seq = 0, window = 0, extra = 0;
  int64_t ld_q = 0;  // token stride of q, out, dout and dq: H * Dh + 3 (padding never written)
  float scale = 0.0f;
  std::vector<float> q, store, sink;  // (T, ld_q), (N, Dh), (H)
  std::vector<int32_t> cand;          // (T, C)
};

Problem make_problem(int64_t T, int64_t H, int64_t Dh, int64_t seq, int64_t window, int64_t extra,
                     uint32_t seed) {
  Problem p;
  p.T = T, p.H = H, p.Dh = Dh, p.seq = seq, p.window = window, p.extra = extra;
  p.N = T + extra;
  p.C = window + extra;
  p.ld_q = H * Dh + 3;
  p.scale = 1.0f / std::sqrt(float(Dh));
  p.q = test::randn(T * p.ld_q, seed, 1.5f);
  p.store = test::randn(p.N * Dh, seed + 1);
  p.sink = test::randn(H, seed + 2);
  if (H > 1) p.sink[1] = 40.0f;             // a sink that takes nearly all the mass
  if (p.N > 4) p.store[sz(4 * Dh)] = 6.0f;  // a score above the rest
  p.cand.assign(sz(T * p.C), -1);
  for (int64_t t = 0; t < T; ++t) {
    if (t == 2) continue;
    const int64_t start = t / seq * seq;
    for (int64_t w = 0; w < window; ++w) {
      const int64_t r = t - window + 1 + w;
      if (r >= start) p.cand[sz(t * p.C + w)] = int32_t(r);
    }
    for (int64_t e = 0; e < extra; ++e)
      if ((t + e) % 3 != 0) p.cand[sz(t * p.C + window + e)] = int32_t(T + (e * 5 + t) % extra);
    if (extra > 1) p.cand[sz(t * p.C + window + 1)] = p.cand[sz(t * p.C + window)];
  }
  return p;
}

std::string problem_name(const Problem& p) {
  return "T=" + std::to_string(p.T) + " H=" + std::to_string(p.H) + " Dh=" + std::to_string(p.Dh) +
         " window=" + std::to_string(p.window) + " extra=" + std::to_string(p.extra);
}

Tensor heads(float* p, const Problem& pr) {
  Tensor t(p, DType::F32, {pr.T, pr.H, pr.Dh});
  t.stride[0] = pr.ld_q;
  return t;
}

// The six tensors of one side (host or device) and the calls on them.
struct Side {
  float *q, *store, *sink, *out, *lse, *dout, *dq, *dstore, *dsink;
  int32_t* cand;
};

// The forward then the backward (given the forward's out and lse), on the
// CPU kernels (host vectors) and on the GPU entries (device buffers).
void check(const Problem& p, const G::SparseAttentionLaunch& cfg, int threads, bool want_lse, uint32_t seed) {
  const std::string what = problem_name(p) + " threads/block=" + std::to_string(cfg.threads) +
                           " max_blocks=" + std::to_string(cfg.max_blocks) +
                           " pool=" + std::to_string(threads);
  const std::vector<float> out0(sz(p.T * p.ld_q), -7.0f), lse0(sz(p.T * p.H), -7.0f),
      dout = test::randn(p.T * p.ld_q, seed), dstore0 = test::randn(p.N * p.Dh, seed + 1),
      dsink0 = test::randn(p.H, seed + 2);
  PoolContext pc(threads);
  std::vector<float> cq = p.q, cst = p.store, csk = p.sink, co = out0, cl = lse0, cdo = dout, cdq = out0,
                     cds = dstore0, cdsk = dsink0;
  std::vector<int32_t> cc = p.cand;
  DeviceArray<float> dq_(p.q, "q"), dst(p.store, "store"), dsk(p.sink, "sink"), dout_(out0, "out"),
      dl(lse0, "lse"), ddo(dout, "dout"), ddq(out0, "dq"), dds(dstore0, "dstore"), ddsk(dsink0, "dsink");
  DeviceArray<int32_t> dc(p.cand, "cand");
  const Side host{cq.data(),  cst.data(), csk.data(), co.data(),   cl.data(),
                  cdo.data(), cdq.data(), cds.data(), cdsk.data(), cc.data()};
  const Side dev{dq_.data(), dst.data(), dsk.data(), dout_.data(), dl.data(),
                 ddo.data(), ddq.data(), dds.data(), ddsk.data(),  dc.data()};
  for (int s = 0; s < 2; ++s) {
    const Side& x = s == 0 ? host : dev;
    const Tensor store(x.store, DType::F32, {p.N, p.Dh}), cand(x.cand, DType::I32, {p.T, p.C}),
        sink(x.sink, DType::F32, {p.H}), lse(x.lse, DType::F32, {p.T, p.H});
    if (s == 0) {
      sparse_attention_forward(pc.ctx, heads(x.out, p), want_lse ? lse : Tensor(), heads(x.q, p), store, cand,
                               sink, p.scale);
      if (!want_lse)
        sparse_attention_forward(pc.ctx, heads(x.out, p), lse, heads(x.q, p), store, cand, sink, p.scale);
      sparse_attention_backward(pc.ctx, heads(x.dq, p), Tensor(x.dstore, DType::F32, {p.N, p.Dh}),
                                Tensor(x.dsink, DType::F32, {p.H}), heads(x.dout, p), heads(x.out, p), lse,
                                heads(x.q, p), store, cand, sink, p.scale);
    } else {
      G::sparse_attention_forward(pc.ctx, heads(x.out, p), want_lse ? lse : Tensor(), heads(x.q, p), store,
                                  cand, sink, p.scale, cfg);
      if (!want_lse)
        G::sparse_attention_forward(pc.ctx, heads(x.out, p), lse, heads(x.q, p), store, cand, sink, p.scale,
                                    cfg);
      G::sparse_attention_backward(pc.ctx, heads(x.dq, p), Tensor(x.dstore, DType::F32, {p.N, p.Dh}),
                                   Tensor(x.dsink, DType::F32, {p.H}), heads(x.dout, p), heads(x.out, p), lse,
                                   heads(x.q, p), store, cand, sink, p.scale, cfg);
    }
  }
  expect_same_bits(dout_.host(), co, what + ": out");
  expect_same_bits(dl.host(), cl, what + ": lse");
  expect_same_bits(ddq.host(), cdq, what + ": dq");
  expect_same_bits(dds.host(), cds, what + ": dstore");
  expect_same_bits(ddsk.host(), cdsk, what + ": dsink");
}

TEST(GpuSparseAttention, ForwardAndBackwardMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t Dh : {1, 16, 37})
    for (int64_t T : {1, 7, 13}) {
      check(make_problem(T, 1 + int64_t(k % 3), Dh, 5, 4, 3 + int64_t(k % 4), uint32_t(100 + k)),
            cfgs[k % cfgs.size()], 1 + int(k % 2), k % 3 != 1, uint32_t(200 + k));
      ++k;
    }
  // A wide window (more than 16 valid columns: every lane of the denominator
  // and of the dots gets several elements) and no compressed rows.
  check(make_problem(21, 2, 40, 21, 20, 0, 300), cfgs[0], 2, true, 301);
  check(make_problem(9, 3, 24, 9, 9, 19, 302), cfgs[2], 1, true, 303);
}

// So many candidate columns (mostly -1) that the backward holds one token's
// coefficients at a time (sparse_backward_chunk_tokens is 1): store rows
// referenced by several tokens accumulate over the chunks, in token order.
TEST(GpuSparseAttention, BackwardOverSeveralTokenChunks) {
  const int64_t C = (int64_t{1} << 19) + 7;
  Problem p = make_problem(5, 2, 9, 5, 3, 4, 350);
  ASSERT_EQ(detail::sparse_backward_chunk_tokens(detail::SparseShape{p.T, p.H, p.Dh, p.N, C}), 1);
  std::vector<int32_t> wide(sz(p.T * C), -1);
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t j = 0; j < p.C; ++j) wide[sz(t * C + j * (C / p.C))] = p.cand[sz(t * p.C + j)];
  p.cand = std::move(wide);
  p.C = C;
  check(p, G::SparseAttentionLaunch{}, 2, true, 351);
}

TEST(GpuSparseAttention, EveryLaunchShapeGivesTheSameBits) {
  const Problem p = make_problem(11, 2, 20, 6, 5, 4, 400);
  for (const auto& cfg : launches())
    for (int threads : {1, 2}) check(p, cfg, threads, true, 401);
}

TEST(GpuSparseAttention, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check(make_problem(7, 2, 18, 4, 3, 3, 500), G::SparseAttentionLaunch{8, 2}, 2, true, 501);
}

TEST(GpuSparseAttention, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.sparse_attention_forward, nullptr);
  ASSERT_NE(be.sparse_attention_backward, nullptr);
  const Problem p = make_problem(6, 2, 12, 4, 3, 2, 600);
  const std::vector<float> dout = test::randn(p.T * p.ld_q, 601), zeros(sz(p.N * p.Dh), 0.0f),
                           out0(sz(p.T * p.ld_q), 0.0f);
  PoolContext cpu(2), dev(2);
  dev.ctx.gpu = &be;
  // The CPU on host vectors; the device context on device buffers (a CPU
  // kernel reached through it would fault on them in strict mode).
  std::vector<float> cq = p.q, cst = p.store, csk = p.sink, co = out0, cl(sz(p.T * p.H)), cdo = dout,
                     cdq = out0, cds = zeros, cdsk(sz(p.H), 0.0f);
  std::vector<int32_t> cc = p.cand;
  DeviceArray<float> dq_(p.q, "q"), dst(p.store, "store"), dsk(p.sink, "sink"), dout_(out0, "out"),
      dl(p.T * p.H, "lse"), ddo(dout, "dout"), ddq(out0, "dq"), dds(zeros, "dstore"),
      ddsk(std::vector<float>(sz(p.H), 0.0f), "dsink");
  DeviceArray<int32_t> dc(p.cand, "cand");
  for (int s = 0; s < 2; ++s) {
    const Context& ctx = s == 0 ? cpu.ctx : dev.ctx;
    const auto pick = [&](std::vector<float>& h, DeviceArray<float>& d) {
      return s == 0 ? h.data() : d.data();
    };
    const Tensor store(pick(cst, dst), DType::F32, {p.N, p.Dh}),
        cand(s == 0 ? cc.data() : dc.data(), DType::I32, {p.T, p.C}), sink(pick(csk, dsk), DType::F32, {p.H}),
        lse(pick(cl, dl), DType::F32, {p.T, p.H});
    sparse_attention_forward(ctx, heads(pick(co, dout_), p), lse, heads(pick(cq, dq_), p), store, cand, sink,
                             p.scale);
    sparse_attention_backward(ctx, heads(pick(cdq, ddq), p), Tensor(pick(cds, dds), DType::F32, {p.N, p.Dh}),
                              Tensor(pick(cdsk, ddsk), DType::F32, {p.H}), heads(pick(cdo, ddo), p),
                              heads(pick(co, dout_), p), lse, heads(pick(cq, dq_), p), store, cand, sink,
                              p.scale);
  }
  expect_same_bits(dout_.host(), co, "dispatch: out");
  expect_same_bits(dl.host(), cl, "dispatch: lse");
  expect_same_bits(ddq.host(), cdq, "dispatch: dq");
  expect_same_bits(dds.host(), cds, "dispatch: dstore");
  expect_same_bits(ddsk.host(), cdsk, "dispatch: dsink");
}

// A candidate out of range in device memory: the GPU entries read cand
// through a copy and stop with the CPU's message.
TEST(GpuSparseAttention, ErrorsAreTheCpuKernelsErrors) {
  const int64_t T = 2, H = 1, Dh = 4, N = 3, C = 2;
  const std::vector<int32_t> bad = {0, -1, 2, 3};
  std::vector<float> h(64, 0.0f);
  std::vector<int32_t> hc = bad;
  DeviceArray<float> d(std::vector<float>(64, 0.0f), "buffers");
  DeviceArray<int32_t> dc(bad, "cand");
  const auto call = [&](bool gpu, bool backward) {
    float* b = gpu ? d.data() : h.data();
    const Tensor q(b, DType::F32, {T, H, Dh}), store(b + 8, DType::F32, {N, Dh}),
        sink(b + 20, DType::F32, {H}), out(b + 24, DType::F32, {T, H, Dh}), lse(b + 32, DType::F32, {T, H}),
        cand(gpu ? dc.data() : hc.data(), DType::I32, {T, C});
    const Context ctx;
    if (!backward && gpu) G::sparse_attention_forward(ctx, out, lse, q, store, cand, sink, 1.0f);
    if (!backward && !gpu) sparse_attention_forward(ctx, out, lse, q, store, cand, sink, 1.0f);
    const Tensor dq(b + 36, DType::F32, {T, H, Dh}), dstore(b + 44, DType::F32, {N, Dh}),
        dsink(b + 56, DType::F32, {H});
    if (backward && gpu)
      G::sparse_attention_backward(ctx, dq, dstore, dsink, out, out, lse, q, store, cand, sink, 1.0f);
    if (backward && !gpu)
      sparse_attention_backward(ctx, dq, dstore, dsink, out, out, lse, q, store, cand, sink, 1.0f);
  };
  for (bool backward : {false, true}) {
    const std::string want = error_of([&] { call(false, backward); });
    ASSERT_NE(want, "") << (backward ? "backward" : "forward");
    EXPECT_NE(want.find("is outside [-1, N = 3)"), std::string::npos) << want;
    EXPECT_EQ(error_of([&] { call(true, backward); }), want) << (backward ? "backward" : "forward");
  }
}

}  // namespace
}  // namespace lockstep::kernels
