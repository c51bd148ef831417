// The GPU per-token logprob forward and backward, and the chunked head's row
// statistics and column-block backward (kernels/gpu/softmax.cu) in
// interpret mode, bit for bit against the CPU (kernels/cpu/softmax.h): vocab
// sizes from 1, temperatures other than 1, targets at both ends, strided
// logits, masked (-inf) entries, ties for the maximum (signed zeros included),
// NaN rows, optional outputs and gradients, dlogits over the logits, several
// block shapes, 1 and 2 pool threads, the race check, and the dispatch.
//
// Negative controls (done once by hand): keeping the first instead of the
// last NaN in combine_max failed NaNAndFullyMaskedRowsMatchCpu (the other
// NaN payload in logp, lse and dlogits), and adding the 16 lane sums of e in
// a row instead of by the tree failed ForwardMatchesCpu from V = 5 on.
#include "lockstep/kernels/gpu/softmax.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;
using gpu_test::rows_view;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

const float kInf = std::numeric_limits<float>::infinity();

float nan_with_payload(uint32_t payload) {
  const uint32_t u = 0x7fc00000u | payload;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// (T, ld) logits, row t shaped by t % 6: plain, masked every third entry,
// constant, signed zeros over negatives, scale 1000 (most e underflow), and a
// maximum that appears twice.
std::vector<float> logits_for(int64_t T, int64_t V, int64_t ld, uint32_t seed) {
  std::vector<float> z = test::randn(T * ld, seed, 3.0f);
  for (int64_t t = 0; t < T; ++t) {
    float* row = z.data() + t * ld;
    for (int64_t j = 0; j < V; ++j) {
      switch (t % 6) {
        case 1:
          if (j % 3 == 1) row[j] = -kInf;
          break;
        case 2: row[j] = 0.5f; break;
        case 3: row[j] = j % 4 == 0 ? -0.0f : j % 4 == 2 ? 0.0f : -1.0f - float(j); break;
        case 4: row[j] *= 1000.0f; break;
        case 5:
          if (j == V / 3 || j == V - 1) row[j] = 50.0f;
          break;
        default: break;
      }
    }
  }
  return z;
}

// Targets: row 0 at 0, the last row at V - 1, the others random.
std::vector<int32_t> targets_for(int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  std::vector<int32_t> y(sz(T));
  for (auto& v : y) v = d(g);
  y.front() = 0;
  if (T > 1) y.back() = int32_t(V - 1);
  return y;
}

std::vector<G::SoftmaxLaunch> launches() {
  return {G::SoftmaxLaunch{}, G::SoftmaxLaunch{1}, G::SoftmaxLaunch{3}, G::SoftmaxLaunch{64}};
}

struct Case {
  int64_t T, V, ld;
  float temperature;
  G::SoftmaxLaunch cfg;
  int threads;
  std::string name() const {
    return "T=" + std::to_string(T) + " V=" + std::to_string(V) + " ld=" + std::to_string(ld) +
           " temperature=" + std::to_string(temperature) +
           " rows_per_block=" + std::to_string(cfg.rows_per_block) + " pool=" + std::to_string(threads);
  }
};

// Forward with every output (outs = 7), or some of them: bit 1 entropy, bit 2 lse.
void check_forward(const Case& c, const std::vector<float>& z, int outs) {
  const std::string what = c.name() + " outs=" + std::to_string(outs);
  const std::vector<int32_t> y = targets_for(c.T, c.V, uint32_t(c.V + c.T));
  PoolContext pc(c.threads);
  const float unwritten = nan_with_payload(0xbeef);
  std::vector<float> res[2];  // logp, entropy, lse of each side, concatenated
  for (int side = 0; side < 2; ++side) {
    DeviceArray<float> dz(z, "logits"), lp(std::vector<float>(sz(c.T), unwritten), "logp"),
        h(std::vector<float>(sz(c.T), unwritten), "entropy"),
        lse(std::vector<float>(sz(c.T), unwritten), "lse");
    DeviceArray<int32_t> dy(y, "targets");
    const Tensor tz = rows_view(dz.data(), c.T, c.V, c.ld), ty(dy.data(), DType::I32, {c.T});
    const Tensor tl(lp.data(), DType::F32, {c.T});
    const Tensor th = outs & 2 ? Tensor(h.data(), DType::F32, {c.T}) : Tensor();
    const Tensor tlse = outs & 4 ? Tensor(lse.data(), DType::F32, {c.T}) : Tensor();
    if (side == 0) {
      token_logprob_forward(pc.ctx, tl, th, tlse, tz, ty, c.temperature);
    } else {
      G::token_logprob_forward(pc.ctx, tl, th, tlse, tz, ty, c.temperature, c.cfg);
    }
    expect_same_bits(dz.host(), z, what + ": logits unchanged");
    for (const auto* a : {&lp, &h, &lse}) {
      const auto v = a->host();
      res[side].insert(res[side].end(), v.begin(), v.end());
    }
  }
  expect_same_bits(res[1], res[0], what + ": logp | entropy | lse");
}

// Backward with dlogp (grads bit 1) and/or dentropy (bit 2); in_place writes
// dlogits over the logits.
void check_backward(const Case& c, const std::vector<float>& z, int grads, bool in_place) {
  const std::string what = c.name() + " grads=" + std::to_string(grads) + (in_place ? " in place" : "");
  const std::vector<int32_t> y = targets_for(c.T, c.V, uint32_t(c.V + 2 * c.T));
  const std::vector<float> gl = test::randn(c.T, 5), ge = test::uniform(c.T, 6, -2.0f, 2.0f);
  PoolContext pc(c.threads);
  std::vector<float> res[2];  // logits then dlogits of each side
  for (int side = 0; side < 2; ++side) {
    DeviceArray<float> dz(z, "logits"), dgl(gl, "dlogp"), dge(ge, "dentropy"),
        out(std::vector<float>(sz(c.T * c.ld), nan_with_payload(0xbeef)), "dlogits");
    DeviceArray<int32_t> dy(y, "targets");
    const Tensor tz = rows_view(dz.data(), c.T, c.V, c.ld), ty(dy.data(), DType::I32, {c.T});
    const Tensor tout = in_place ? tz : rows_view(out.data(), c.T, c.V, c.ld);
    const Tensor tgl = grads & 1 ? Tensor(dgl.data(), DType::F32, {c.T}) : Tensor();
    const Tensor tge = grads & 2 ? Tensor(dge.data(), DType::F32, {c.T}) : Tensor();
    if (side == 0) {
      token_logprob_backward(pc.ctx, tout, tgl, tge, tz, ty, c.temperature);
    } else {
      G::token_logprob_backward(pc.ctx, tout, tgl, tge, tz, ty, c.temperature, c.cfg);
    }
    res[side] = dz.host();
    const auto v = out.host();
    res[side].insert(res[side].end(), v.begin(), v.end());
  }
  expect_same_bits(res[1], res[0], what + ": logits | dlogits");
}

// The chunked head's pair: the row statistics (with and without H), then
// the dlogits of every column block [col0, col0 + W) of width `block` from
// them, each side from its own statistics; grads as in check_backward,
// in_place writes each block over its logits. The blocks together must also
// give the full-row backward's bits.
void check_chunked(const Case& c, const std::vector<float>& z, int grads, bool in_place, int64_t block) {
  const std::string what = c.name() + " grads=" + std::to_string(grads) + " block=" + std::to_string(block) +
                           (in_place ? " in place" : "");
  const std::vector<int32_t> y = targets_for(c.T, c.V, uint32_t(c.V + 3 * c.T));
  const std::vector<float> gl = test::randn(c.T, 7), ge = test::uniform(c.T, 8, -2.0f, 2.0f);
  const bool want_h = (grads & 2) != 0 || block % 2 == 1;
  PoolContext pc(c.threads);
  std::vector<float> stats[2], res[2];  // stats; logits then dlogits of each side
  for (int side = 0; side < 2; ++side) {
    DeviceArray<float> dz(z, "logits"), dgl(gl, "dlogp"), dge(ge, "dentropy"),
        st(std::vector<float>(sz(c.T * 4), nan_with_payload(0xbeef)), "stats"),
        out(std::vector<float>(sz(c.T * c.ld), nan_with_payload(0xbeef)), "dlogits");
    DeviceArray<int32_t> dy(y, "targets");
    const Tensor tz = rows_view(dz.data(), c.T, c.V, c.ld), ty(dy.data(), DType::I32, {c.T});
    const Tensor tst(st.data(), DType::F32, {c.T, 4});
    const Tensor tgl = grads & 1 ? Tensor(dgl.data(), DType::F32, {c.T}) : Tensor();
    const Tensor tge = grads & 2 ? Tensor(dge.data(), DType::F32, {c.T}) : Tensor();
    if (side == 0) {
      token_logprob_stats(pc.ctx, tst, tz, c.temperature, want_h);
    } else {
      G::token_logprob_stats(pc.ctx, tst, tz, c.temperature, want_h, c.cfg);
    }
    stats[side] = st.host();
    for (int64_t v0 = 0; v0 < c.V; v0 += block) {
      const int64_t W = std::min(block, c.V - v0);
      const Tensor zc = rows_view(dz.data() + v0, c.T, W, c.ld);
      const Tensor oc = in_place ? zc : rows_view(out.data() + v0, c.T, W, c.ld);
      if (side == 0) {
        token_logprob_backward_cols(pc.ctx, oc, tgl, tge, zc, ty, tst, v0, c.temperature);
      } else {
        G::token_logprob_backward_cols(pc.ctx, oc, tgl, tge, zc, ty, tst, v0, c.temperature, c.cfg);
      }
    }
    res[side] = dz.host();
    const auto v = out.host();
    res[side].insert(res[side].end(), v.begin(), v.end());
  }
  expect_same_bits(stats[1], stats[0], what + ": stats");
  expect_same_bits(res[1], res[0], what + ": logits | dlogits by column blocks");
  // The full-row kernel on the GPU: the blocks' dlogits are its bits.
  DeviceArray<float> dz(z, "logits"), dgl(gl, "dlogp"), dge(ge, "dentropy"), out(sz(c.T * c.ld), "dlogits");
  DeviceArray<int32_t> dy(y, "targets");
  const Tensor tz = rows_view(dz.data(), c.T, c.V, c.ld), ty(dy.data(), DType::I32, {c.T});
  const Tensor tout = in_place ? tz : rows_view(out.data(), c.T, c.V, c.ld);
  G::token_logprob_backward(pc.ctx, tout, grads & 1 ? Tensor(dgl.data(), DType::F32, {c.T}) : Tensor(),
                            grads & 2 ? Tensor(dge.data(), DType::F32, {c.T}) : Tensor(), tz, ty,
                            c.temperature, c.cfg);
  const std::vector<float> full = in_place ? dz.host() : out.host();
  const std::vector<float> blocks(res[1].begin() + (in_place ? 0 : int64_t(z.size())),
                                  res[1].begin() + (in_place ? int64_t(z.size()) : int64_t(res[1].size())));
  for (int64_t t = 0; t < c.T; ++t)
    expect_same_bits(std::vector<float>(blocks.begin() + t * c.ld, blocks.begin() + t * c.ld + c.V),
                     std::vector<float>(full.begin() + t * c.ld, full.begin() + t * c.ld + c.V),
                     what + ": row " + std::to_string(t) + " against the full-row backward");
}

TEST(GpuSoftmax, ForwardMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t V : {1, 5, 17, 100, 1000})
    for (int64_t T : {1, 3, 9}) {
      const float temps[] = {1.0f, 0.7f, 1.3f};
      const Case c{T, V, k % 2 == 1 ? V + 5 : V, temps[k % 3], cfgs[k % cfgs.size()], 1 + int(k % 2)};
      check_forward(c, logits_for(c.T, c.V, c.ld, uint32_t(300 + k)),
                    k % 4 == 3 ? 1 + 2 * int(k % 3 == 0) : 7);
      ++k;
    }
}

TEST(GpuSoftmax, BackwardMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t V : {1, 5, 17, 100, 1000})
    for (int64_t T : {1, 3, 9}) {
      const float temps[] = {0.7f, 1.0f, 1.3f};
      const Case c{T, V, k % 2 == 0 ? V + 3 : V, temps[k % 3], cfgs[k % cfgs.size()], 1 + int(k % 2)};
      check_backward(c, logits_for(c.T, c.V, c.ld, uint32_t(400 + k)), int(k % 4), k % 5 == 2);
      ++k;
    }
}

TEST(GpuSoftmax, EveryLaunchShapeAndGradientSetGivesTheSameBits) {
  for (const auto& cfg : launches()) {
    const Case c{12, 77, 80, 0.9f, cfg, 2};
    const std::vector<float> z = logits_for(c.T, c.V, c.ld, 17);
    check_forward(c, z, 7);
    for (int grads : {0, 1, 2, 3}) check_backward(c, z, grads, grads == 3);
  }
}

TEST(GpuSoftmax, ChunkedHeadStatsAndColumnBlocksMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t V : {1, 5, 17, 100, 1000})
    for (int64_t T : {1, 3, 9}) {
      const float temps[] = {0.7f, 1.0f, 1.3f};
      const Case c{T, V, k % 2 == 0 ? V + 3 : V, temps[k % 3], cfgs[k % cfgs.size()], 1 + int(k % 2)};
      const int64_t blocks[] = {1, 3, 16, V};
      check_chunked(c, logits_for(c.T, c.V, c.ld, uint32_t(500 + k)), int(k % 4), k % 5 == 2, blocks[k % 4]);
      ++k;
    }
}

TEST(GpuSoftmax, SignedZeroAndTiedMaximaMatchCpu) {
  // Zero maxima whose first occurrence (in some lane, not lane 0) is -0 or +0,
  // and equal maxima in different lanes. Coverage of combine_max's tie rule
  // more than a sharp check: with a tie s >= 2, so ls > 0 absorbs the sign of
  // a zero m in every output; NaN payloads (below) are the sharp check.
  const int64_t V = 40;
  std::vector<float> z(sz(4 * V), -3.0f);
  z[sz(0 * V + 5)] = -0.0f, z[sz(0 * V + 6)] = 0.0f, z[sz(0 * V + 21)] = 0.0f;
  z[sz(1 * V + 3)] = 0.0f, z[sz(1 * V + 19)] = -0.0f, z[sz(1 * V + 35)] = -0.0f;
  z[sz(2 * V + 30)] = 2.5f, z[sz(2 * V + 14)] = 2.5f;
  z[sz(3 * V + 0)] = -0.0f, z[sz(3 * V + 16)] = 0.0f;
  for (const auto& cfg : launches()) {
    const Case c{4, V, V, 1.0f, cfg, 1};
    check_forward(c, z, 7);
    check_backward(c, z, 3, false);
  }
}

TEST(GpuSoftmax, NaNAndFullyMaskedRowsMatchCpu) {
  // Row 0 has two NaNs with different payloads (the last one wins the max),
  // row 1 is all -inf (NaN from -inf - -inf), row 2 has a single finite entry.
  const int64_t V = 37;
  std::vector<float> z = test::randn(3 * V, 21);
  z[sz(4)] = nan_with_payload(0x11), z[sz(29)] = nan_with_payload(0x22);
  for (int64_t j = 0; j < V; ++j) z[sz(V + j)] = -kInf;
  for (int64_t j = 0; j < V; ++j) z[sz(2 * V + j)] = j == 20 ? 1.0f : -kInf;
  const Case c{3, V, V, 0.8f, G::SoftmaxLaunch{2}, 2};
  check_forward(c, z, 7);
  check_backward(c, z, 3, false);
  check_backward(c, z, 3, true);
  check_chunked(c, z, 3, false, 5);
  check_chunked(c, z, 3, true, 5);
}

TEST(GpuSoftmax, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  const Case c{7, 150, 153, 1.1f, G::SoftmaxLaunch{4}, 2};
  const std::vector<float> z = logits_for(c.T, c.V, c.ld, 23);
  check_forward(c, z, 7);
  check_backward(c, z, 3, false);
  check_backward(c, z, 3, true);
  check_chunked(c, z, 3, true, 40);
}

TEST(GpuSoftmax, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.token_logprob_forward, nullptr);
  ASSERT_NE(be.token_logprob_backward, nullptr);
  ASSERT_NE(be.token_logprob_stats, nullptr);
  ASSERT_NE(be.token_logprob_backward_cols, nullptr);
  const int64_t T = 5, V = 333;
  const std::vector<float> z = logits_for(T, V, V, 31), gl = test::randn(T, 32), ge = test::randn(T, 33);
  const std::vector<int32_t> y = targets_for(T, V, 34);
  for (int threads : {1, 2}) {
    PoolContext cpu(threads), dev(threads);
    dev.ctx.gpu = &be;
    std::vector<float> out[2];
    for (int side = 0; side < 2; ++side) {
      const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
      DeviceArray<float> dz(z, "logits"), dgl(gl, "dlogp"), dge(ge, "dentropy"), lp(T, "logp"),
          h(T, "entropy"), lse(T, "lse"), dl(T * V, "dlogits");
      DeviceArray<int32_t> dy(y, "targets");
      const Tensor tz(dz.data(), DType::F32, {T, V}), ty(dy.data(), DType::I32, {T});
      token_logprob_forward(ctx, Tensor(lp.data(), DType::F32, {T}), Tensor(h.data(), DType::F32, {T}),
                            Tensor(lse.data(), DType::F32, {T}), tz, ty, 0.6f);
      token_logprob_backward(ctx, Tensor(dl.data(), DType::F32, {T, V}), Tensor(dgl.data(), DType::F32, {T}),
                             Tensor(dge.data(), DType::F32, {T}), tz, ty, 0.6f);
      DeviceArray<float> st(T * 4, "stats"), dc(T * 100, "dlogits columns");
      const Tensor tst(st.data(), DType::F32, {T, 4});
      token_logprob_stats(ctx, tst, tz, 0.6f, true);
      token_logprob_backward_cols(ctx, Tensor(dc.data(), DType::F32, {T, 100}),
                                  Tensor(dgl.data(), DType::F32, {T}), Tensor(dge.data(), DType::F32, {T}),
                                  tz.slice_cols(200, 300), ty, tst, 200, 0.6f);
      for (const auto* a : {&lp, &h, &lse, &dl, &st, &dc}) {
        const auto v = a->host();
        out[side].insert(out[side].end(), v.begin(), v.end());
      }
    }
    expect_same_bits(out[1], out[0], "dispatch, threads=" + std::to_string(threads));
  }
}

TEST(GpuSoftmax, ArgumentErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  std::vector<float> z(3 * 5), lp(3), d(3 * 5);
  std::vector<int32_t> bad = {0, 5, 1}, good = {0, 4, 1};
  const Tensor tz(z.data(), DType::F32, {3, 5}), tl(lp.data(), DType::F32, {3}),
      td(d.data(), DType::F32, {3, 5});
  const Tensor tbad(bad.data(), DType::I32, {3}), tgood(good.data(), DType::I32, {3});
  for (const auto& call : std::vector<std::function<void(const Context&)>>{
           [&](const Context& c) { token_logprob_forward(c, tl, Tensor(), Tensor(), tz, tbad, 1.0f); },
           [&](const Context& c) { token_logprob_forward(c, tl, Tensor(), Tensor(), tz, tgood, 0.0f); },
           [&](const Context& c) { token_logprob_backward(c, td, tl, Tensor(), tz, tbad, 1.0f); },
           [&](const Context& c) {
             token_logprob_backward(c, tz.slice_cols(0, 4), tl, Tensor(), tz, tgood, 1.0f);
           },
           [&](const Context& c) { token_logprob_stats(c, td.slice_cols(0, 3), tz, 1.0f, true); },
           [&](const Context& c) {
             token_logprob_backward_cols(c, td, tl, Tensor(), tz, tgood, td.slice_cols(0, 4).slice_rows(0, 3),
                                         -1, 1.0f);
           }}) {
    const std::string want = error_of([&] { call(cpu); });
    ASSERT_NE(want, "");
    EXPECT_EQ(error_of([&] { call(dev); }), want);
  }
}

}  // namespace
}  // namespace lockstep::kernels
