// The GPU mHC kernels (kernels/gpu/mhc.cu) in interpret mode, bit for bit
// against the CPU kernels (kernels/cpu/mhc.h): every entry, forward and
// backward, over n = 1..4 streams (4 as DeepSeek-V4), odd D and T, 1, 3 and
// 20 Sinkhorn iterations, strided rows, accumulating outputs that start
// nonzero, the backward without dpost / dcomb, post's backward in place
// (dx over dy), several block sizes, 1 and 2 pool threads, the race check,
// and the dispatch from the CPU entries. The CPU references run on host
// copies, so this binary runs in strict interpret mode.
//
// Negative controls (done once by hand): reversing the column/row
// alternation of the Sinkhorn steps in mhc.cu's sinkhorn_forward (k % 2 == 1
// for columns) failed MixForwardAndBackwardMatchCpu at its first case (comb 1
// ulp off, then every gradient); summing df over the streams from the last in
// post_backward_kernel failed PostMixMatchesCpuAlsoInPlace.
#include "lockstep/kernels/gpu/mhc.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gpu/row_kernel_util.h"
#include "lockstep/kernels/cpu/mhc.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::expect_same_bits;
using gpu_test::PoolContext;
using gpu_test::rows_view;
using vf = std::vector<float>;

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

// Named buffers, each as a host vector (the CPU's) and a device copy (the
// GPU's) of the same values; t(name, dev) views one side.
class Buffers {
 public:
  // A (rows, cols) buffer with row stride ld (the padding is never written),
  // or (T, n, n) when n3 > 0, or a vector when cols == 0.
  void add(const std::string& name, const vf& v, int64_t rows, int64_t cols, int64_t ld = 0, int64_t n3 = 0) {
    auto e = std::make_unique<Entry>(v, name.c_str());
    e->rows = rows;
    e->cols = cols;
    e->ld = ld > 0 ? ld : cols;
    e->n3 = n3;
    entries_[name] = std::move(e);
  }
  Tensor t(const std::string& name, bool dev) const {
    const Entry& e = *entries_.at(name);
    float* p = dev ? e.dev.data() : const_cast<float*>(e.host.data());
    if (e.n3 > 0) return Tensor(p, DType::F32, {e.rows, e.n3, e.n3});
    if (e.cols == 0) return Tensor(p, DType::F32, {e.rows});
    return rows_view(p, e.rows, e.cols, e.ld);
  }
  // Every buffer (inputs too: a stray write shows) equal on both sides.
  void expect_equal(const std::string& what) const {
    for (const auto& [name, e] : entries_) expect_same_bits(e->dev.host(), e->host, what + ": " + name);
  }

 private:
  struct Entry {
    Entry(const vf& v, const char* what) : host(v), dev(v, what) {}
    vf host;
    DeviceArray<float> dev;
    int64_t rows = 0, cols = 0, ld = 0, n3 = 0;
  };
  std::map<std::string, std::unique_ptr<Entry>> entries_;
};

struct Shape {
  int n;
  int64_t D, T;
  int iters;
};

std::string name(const Shape& s, const G::MhcLaunch& launch, int threads) {
  return "n=" + std::to_string(s.n) + " D=" + std::to_string(s.D) + " T=" + std::to_string(s.T) +
         " iters=" + std::to_string(s.iters) + " threads/block=" + std::to_string(launch.threads) +
         " pool=" + std::to_string(threads);
}

std::vector<Shape> shapes() {
  return {{4, 16, 7, 20}, {4, 33, 1, 3}, {4, 5, 9, 1},  {1, 17, 3, 20},
          {2, 1, 5, 3},   {3, 40, 4, 2}, {4, 70, 2, 20}};
}

std::vector<G::MhcLaunch> launches() {
  return {G::MhcLaunch{}, G::MhcLaunch{16}, G::MhcLaunch{48}, G::MhcLaunch{256}};
}

vf poison(int64_t n) {
  return vf(sz(n), -7.0f);
}

// x (T, n*D) with row stride n*D + 3, the site's fn (M, n*D), base, scale.
void add_site_inputs(Buffers& b, const Shape& s, int64_t K, int n_scale, uint32_t seed) {
  const int64_t W = s.n * s.D;
  b.add("x", test::randn(s.T * (W + 3), seed, 1.0f), s.T, W, W + 3);
  b.add("fn", test::randn(K * W, seed + 1, 1.5f / std::sqrt(static_cast<float>(W))), K, W);
  b.add("base", test::randn(K, seed + 2, 0.5f), K, 0);
  b.add("scale", test::uniform(n_scale, seed + 3, 0.5f, 1.5f), n_scale, 0);
}

MhcConfig config_of(const Shape& s) {
  MhcConfig cfg;
  cfg.n = s.n;
  cfg.sinkhorn_iters = s.iters;
  return cfg;
}

MhcMix mix_of(const Buffers& b, bool dev) {
  return MhcMix{b.t("raw", dev), b.t("rstd", dev), b.t("pre", dev), b.t("post", dev), b.t("comb", dev)};
}

// Forward, then (with_post / with_comb choosing which gradients are given)
// the backward from the forward's saved values, both sides.
void check_mix(const Shape& s, const G::MhcLaunch& launch, int threads, bool with_post, bool with_comb,
               uint32_t seed) {
  const std::string what =
      name(s, launch, threads) + (with_post ? "" : " no dpost") + (with_comb ? "" : " no dcomb");
  const int64_t n = s.n, M = 2 * n + n * n, W = n * s.D, T = s.T;
  const MhcConfig cfg = config_of(s);
  Buffers b;
  add_site_inputs(b, s, M, 3, seed);
  b.add("raw", poison(T * M), T, M);
  b.add("rstd", poison(T), T, 0);
  b.add("pre", poison(T * n), T, n);
  b.add("post", poison(T * n), T, n);
  b.add("comb", poison(T * n * n), T, 0, 0, n);
  b.add("dpre", test::randn(T * n, seed + 4), T, n);
  b.add("dpost", test::randn(T * n, seed + 5), T, n);
  b.add("dcomb", test::randn(T * n * n, seed + 6), T, 0, 0, n);
  b.add("dx", test::randn(T * (W + 1), seed + 7), T, W, W + 1);
  b.add("dfn", test::randn(M * W, seed + 8), M, W);
  b.add("dbase", test::randn(M, seed + 9), M, 0);
  b.add("dscale", test::randn(3, seed + 10), 3, 0);
  PoolContext pc(threads);
  for (bool dev : {false, true}) {
    const MhcMix mix = mix_of(b, dev);
    const Tensor dpost = with_post ? b.t("dpost", dev) : Tensor(),
                 dcomb = with_comb ? b.t("dcomb", dev) : Tensor();
    if (dev) {
      G::mhc_mix_forward(pc.ctx, mix, b.t("x", dev), b.t("fn", dev), b.t("base", dev), b.t("scale", dev), cfg,
                         launch);
      G::mhc_mix_backward(pc.ctx, b.t("dx", dev), b.t("dfn", dev), b.t("dbase", dev), b.t("dscale", dev),
                          b.t("dpre", dev), dpost, dcomb, b.t("x", dev), mix, b.t("fn", dev),
                          b.t("base", dev), b.t("scale", dev), cfg, launch);
    } else {
      mhc_mix_forward(pc.ctx, mix, b.t("x", dev), b.t("fn", dev), b.t("base", dev), b.t("scale", dev), cfg);
      mhc_mix_backward(pc.ctx, b.t("dx", dev), b.t("dfn", dev), b.t("dbase", dev), b.t("dscale", dev),
                       b.t("dpre", dev), dpost, dcomb, b.t("x", dev), mix, b.t("fn", dev), b.t("base", dev),
                       b.t("scale", dev), cfg);
    }
  }
  b.expect_equal(what);
}

// The pre-mix and its backward: u = sum_i pre_i X_i; dx accumulated, dpre written.
void check_pre(const Shape& s, const G::MhcLaunch& launch, int threads, uint32_t seed) {
  const std::string what = name(s, launch, threads);
  const int64_t n = s.n, W = n * s.D, T = s.T;
  Buffers b;
  b.add("x", test::randn(T * (W + 2), seed), T, W, W + 2);
  b.add("pre", test::uniform(T * n, seed + 1, 0.0f, 1.0f), T, n);
  b.add("u", poison(T * s.D), T, s.D);
  b.add("du", test::randn(T * s.D, seed + 2), T, s.D);
  b.add("dx", test::randn(T * W, seed + 3), T, W);
  b.add("dpre", poison(T * n), T, n);
  PoolContext pc(threads);
  for (bool dev : {false, true}) {
    if (dev) {
      G::mhc_pre_apply(pc.ctx, b.t("u", dev), b.t("x", dev), b.t("pre", dev), s.n, launch);
      G::mhc_pre_apply_backward(pc.ctx, b.t("dx", dev), b.t("dpre", dev), b.t("du", dev), b.t("x", dev),
                                b.t("pre", dev), s.n, launch);
    } else {
      mhc_pre_apply(pc.ctx, b.t("u", dev), b.t("x", dev), b.t("pre", dev), s.n);
      mhc_pre_apply_backward(pc.ctx, b.t("dx", dev), b.t("dpre", dev), b.t("du", dev), b.t("x", dev),
                             b.t("pre", dev), s.n);
    }
  }
  b.expect_equal(what);
}

// The post-mix and its backward, dx separate or over dy (in place).
void check_post(const Shape& s, const G::MhcLaunch& launch, int threads, bool in_place, uint32_t seed) {
  const std::string what = name(s, launch, threads) + (in_place ? " dx over dy" : "");
  const int64_t n = s.n, W = n * s.D, T = s.T;
  Buffers b;
  b.add("x", test::randn(T * W, seed), T, W);
  b.add("f", test::randn(T * (s.D + 1), seed + 1), T, s.D, s.D + 1);
  b.add("post", test::uniform(T * n, seed + 2, 0.0f, 2.0f), T, n);
  b.add("comb", test::uniform(T * n * n, seed + 3, 0.0f, 1.0f), T, 0, 0, n);
  b.add("y", poison(T * W), T, W);
  b.add("dy", test::randn(T * W, seed + 4), T, W);
  b.add("dx", poison(T * W), T, W);
  b.add("df", poison(T * s.D), T, s.D);
  b.add("dpost", poison(T * n), T, n);
  b.add("dcomb", poison(T * n * n), T, 0, 0, n);
  PoolContext pc(threads);
  for (bool dev : {false, true}) {
    const Tensor dx = b.t(in_place ? "dy" : "dx", dev);
    if (dev) {
      G::mhc_post(pc.ctx, b.t("y", dev), b.t("f", dev), b.t("x", dev), b.t("post", dev), b.t("comb", dev),
                  s.n, launch);
      G::mhc_post_backward(pc.ctx, dx, b.t("df", dev), b.t("dpost", dev), b.t("dcomb", dev), b.t("dy", dev),
                           b.t("f", dev), b.t("x", dev), b.t("post", dev), b.t("comb", dev), s.n, launch);
    } else {
      mhc_post(pc.ctx, b.t("y", dev), b.t("f", dev), b.t("x", dev), b.t("post", dev), b.t("comb", dev), s.n);
      mhc_post_backward(pc.ctx, dx, b.t("df", dev), b.t("dpost", dev), b.t("dcomb", dev), b.t("dy", dev),
                        b.t("f", dev), b.t("x", dev), b.t("post", dev), b.t("comb", dev), s.n);
    }
  }
  b.expect_equal(what);
}

// The head mix, forward then backward from its saved values.
void check_head(const Shape& s, const G::MhcLaunch& launch, int threads, uint32_t seed) {
  const std::string what = name(s, launch, threads);
  const int64_t n = s.n, W = n * s.D, T = s.T;
  const MhcConfig cfg = config_of(s);
  Buffers b;
  add_site_inputs(b, s, n, 1, seed);
  b.add("h", poison(T * s.D), T, s.D);
  b.add("w", poison(T * n), T, n);
  b.add("raw", poison(T * n), T, n);
  b.add("rstd", poison(T), T, 0);
  b.add("dh", test::randn(T * s.D, seed + 4), T, s.D);
  b.add("dx", test::randn(T * W, seed + 5), T, W);
  b.add("dfn", test::randn(n * W, seed + 6), n, W);
  b.add("dbase", test::randn(n, seed + 7), n, 0);
  b.add("dscale", test::randn(1, seed + 8), 1, 0);
  PoolContext pc(threads);
  for (bool dev : {false, true}) {
    auto t = [&](const char* nm) { return b.t(nm, dev); };
    if (dev) {
      G::mhc_head_forward(pc.ctx, t("h"), t("w"), t("raw"), t("rstd"), t("x"), t("fn"), t("base"), t("scale"),
                          cfg, launch);
      G::mhc_head_backward(pc.ctx, t("dx"), t("dfn"), t("dbase"), t("dscale"), t("dh"), t("x"), t("w"),
                           t("raw"), t("rstd"), t("fn"), t("base"), t("scale"), cfg, launch);
    } else {
      mhc_head_forward(pc.ctx, t("h"), t("w"), t("raw"), t("rstd"), t("x"), t("fn"), t("base"), t("scale"),
                       cfg);
      mhc_head_backward(pc.ctx, t("dx"), t("dfn"), t("dbase"), t("dscale"), t("dh"), t("x"), t("w"), t("raw"),
                        t("rstd"), t("fn"), t("base"), t("scale"), cfg);
    }
  }
  b.expect_equal(what);
}

TEST(GpuMhc, MixForwardAndBackwardMatchCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (const Shape& s : shapes()) {
    check_mix(s, cfgs[k % cfgs.size()], 1 + int(k % 2), true, true, uint32_t(100 + 20 * k));
    ++k;
  }
}

TEST(GpuMhc, MixBackwardWithoutPostOrCombGradientsMatchesCpu) {
  check_mix({4, 16, 5, 20}, G::MhcLaunch{}, 2, false, true, 700);
  check_mix({4, 16, 5, 20}, G::MhcLaunch{}, 2, true, false, 720);
  check_mix({3, 7, 3, 3}, G::MhcLaunch{32}, 1, false, false, 740);
}

TEST(GpuMhc, PreMixMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (const Shape& s : shapes()) {
    check_pre(s, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(200 + 10 * k));
    ++k;
  }
}

TEST(GpuMhc, PostMixMatchesCpuAlsoInPlace) {
  const auto cfgs = launches();
  size_t k = 0;
  for (const Shape& s : shapes()) {
    check_post(s, cfgs[k % cfgs.size()], 1 + int(k % 2), k % 2 == 1, uint32_t(300 + 20 * k));
    ++k;
  }
  check_post({4, 33, 3, 1}, G::MhcLaunch{}, 2, true, 390);
}

TEST(GpuMhc, HeadMixMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (const Shape& s : shapes()) {
    check_head(s, cfgs[k % cfgs.size()], 1 + int(k % 2), uint32_t(400 + 20 * k));
    ++k;
  }
}

TEST(GpuMhc, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  const Shape s{4, 19, 3, 3};
  check_mix(s, G::MhcLaunch{32}, 2, true, true, 500);
  check_pre(s, G::MhcLaunch{32}, 2, 520);
  check_post(s, G::MhcLaunch{32}, 2, true, 540);
  check_head(s, G::MhcLaunch{32}, 2, 560);
}

// The CPU entries reach the GPU kernels through the backend table: on device
// buffers they give the CPU's bits (a CPU kernel reached instead would fault
// on them in strict mode).
TEST(GpuMhc, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.mhc_mix_forward, nullptr);
  ASSERT_NE(be.mhc_head_forward, nullptr);
  ASSERT_NE(be.mhc_mix_backward, nullptr);
  ASSERT_NE(be.mhc_pre_apply, nullptr);
  ASSERT_NE(be.mhc_pre_apply_backward, nullptr);
  ASSERT_NE(be.mhc_post, nullptr);
  ASSERT_NE(be.mhc_post_backward, nullptr);
  ASSERT_NE(be.mhc_head_backward, nullptr);
  const Shape s{4, 24, 5, 20};
  const int64_t n = s.n, M = 2 * n + n * n, W = n * s.D, T = s.T;
  const MhcConfig cfg = config_of(s);
  Buffers b;
  add_site_inputs(b, s, M, 3, 600);
  b.add("raw", poison(T * M), T, M);
  b.add("rstd", poison(T), T, 0);
  b.add("pre", poison(T * n), T, n);
  b.add("post", poison(T * n), T, n);
  b.add("comb", poison(T * n * n), T, 0, 0, n);
  b.add("u", poison(T * s.D), T, s.D);
  b.add("y", poison(T * W), T, W);
  b.add("dy", test::randn(T * W, 601), T, W);
  b.add("du", poison(T * s.D), T, s.D);
  b.add("dpost", poison(T * n), T, n);
  b.add("dcomb", poison(T * n * n), T, 0, 0, n);
  b.add("dpre", poison(T * n), T, n);
  b.add("dx", test::randn(T * W, 602), T, W);
  b.add("dfn", test::randn(M * W, 603), M, W);
  b.add("dbase", test::randn(M, 604), M, 0);
  b.add("dscale", test::randn(3, 605), 3, 0);
  PoolContext cpu(2), dev(2);
  dev.ctx.gpu = &be;
  for (bool d : {false, true}) {
    const Context& ctx = d ? dev.ctx : cpu.ctx;
    auto t = [&](const char* nm) { return b.t(nm, d); };
    const MhcMix mix = mix_of(b, d);
    mhc_mix_forward(ctx, mix, t("x"), t("fn"), t("base"), t("scale"), cfg);
    mhc_pre_apply(ctx, t("u"), t("x"), t("pre"), s.n);
    mhc_post(ctx, t("y"), t("u"), t("x"), t("post"), t("comb"), s.n);
    mhc_post_backward(ctx, t("dy"), t("du"), t("dpost"), t("dcomb"), t("dy"), t("u"), t("x"), t("post"),
                      t("comb"), s.n);
    mhc_pre_apply_backward(ctx, t("dx"), t("dpre"), t("du"), t("x"), t("pre"), s.n);
    mhc_mix_backward(ctx, t("dx"), t("dfn"), t("dbase"), t("dscale"), t("dpre"), t("dpost"), t("dcomb"),
                     t("x"), mix, t("fn"), t("base"), t("scale"), cfg);
  }
  b.expect_equal("dispatch");
}

// A token's bits do not depend on the tokens beside it (per token kernels,
// token-order sums aside: those are compared whole above).
TEST(GpuMhc, TokenAloneEqualsTheTokenInABatch) {
  const Shape s{4, 21, 6, 20};
  const int64_t n = s.n, M = 2 * n + n * n, W = n * s.D, T = s.T;
  const MhcConfig cfg = config_of(s);
  const vf x = test::randn(T * W, 800), fn = test::randn(M * W, 801, 0.3f), base = test::randn(M, 802, 0.5f),
           scale = test::uniform(3, 803, 0.5f, 1.5f);
  PoolContext pc(2);
  auto run = [&](int64_t t0, int64_t rows) {
    DeviceArray<float> dx(vf(x.begin() + t0 * W, x.begin() + (t0 + rows) * W), "x"), dfn(fn, "fn"),
        dbase(base, "base"), dscale(scale, "scale"), raw(rows * M, "raw"), rstd(rows, "rstd"),
        pre(rows * n, "pre"), post(rows * n, "post"), comb(rows * n * n, "comb");
    const MhcMix mix{rows_view(raw.data(), rows, M, M), Tensor(rstd.data(), DType::F32, {rows}),
                     rows_view(pre.data(), rows, n, n), rows_view(post.data(), rows, n, n),
                     Tensor(comb.data(), DType::F32, {rows, n, n})};
    G::mhc_mix_forward(pc.ctx, mix, rows_view(dx.data(), rows, W, W), rows_view(dfn.data(), M, W, W),
                       Tensor(dbase.data(), DType::F32, {M}), Tensor(dscale.data(), DType::F32, {3}), cfg,
                       G::MhcLaunch{});
    return comb.host();
  };
  const vf all = run(0, T);
  for (int64_t t = 0; t < T; ++t)
    expect_same_bits(run(t, 1), vf(all.begin() + t * n * n, all.begin() + (t + 1) * n * n),
                     "token " + std::to_string(t) + " alone vs in the batch");
}

TEST(GpuMhc, ShapeErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  vf a(256), c(256);
  const Tensor x(a.data(), DType::F32, {2, 8}), bad(c.data(), DType::F32, {2, 3});
  const Tensor pre(c.data(), DType::F32, {2, 4}), u(c.data(), DType::F32, {2, 2});
  MhcConfig cfg;
  cfg.n = 4;
  MhcConfig bad_cfg = cfg;
  bad_cfg.sinkhorn_iters = 0;
  const std::vector<std::function<void(const Context&)>> calls = {
      [&](const Context& ctx) { mhc_pre_apply(ctx, bad, x, pre, 4); },
      [&](const Context& ctx) { mhc_pre_apply(ctx, u, x, pre, 0); },
      [&](const Context& ctx) { mhc_pre_apply_backward(ctx, x, pre, bad, x, pre, 4); },
      [&](const Context& ctx) { mhc_post(ctx, x, bad, x, pre, Tensor(), 4); },
      [&](const Context& ctx) { mhc_post_backward(ctx, x, u, pre, bad, x, u, x, pre, bad, 4); },
      [&](const Context& ctx) { mhc_mix_forward(ctx, MhcMix{}, x, bad, bad, bad, bad_cfg); },
      [&](const Context& ctx) { mhc_mix_forward(ctx, MhcMix{}, x, bad, bad, bad, cfg); },
      [&](const Context& ctx) {
        mhc_mix_backward(ctx, x, x, x, x, x, x, x, x, MhcMix{}, bad, bad, bad, cfg);
      },
      [&](const Context& ctx) { mhc_head_forward(ctx, u, pre, pre, bad, x, bad, bad, bad, cfg); },
      [&](const Context& ctx) {
        mhc_head_backward(ctx, x, x, x, x, u, x, pre, pre, bad, bad, bad, bad, cfg);
      },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string want = error_of([&] { calls[i](cpu); });
    ASSERT_NE(want, "") << "call " << i;
    EXPECT_EQ(error_of([&] { calls[i](dev); }), want) << "call " << i;
  }
}

}  // namespace
}  // namespace lockstep::kernels
