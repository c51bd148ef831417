// DeepSeek-V4's KV compressor and lightning-indexer selection on the GPU
// (kernels/gpu/kv_compress.cu) in interpret mode, bit for bit against the CPU
// kernels (kernels/cpu/kv_compress.h): CSA (ratio 4, overlapping windows,
// block 0's masked half) and HCA (ratio 128), extra masked slots, odd widths
// and strided rows, special values, a top-k with many ties (ReLU zeros,
// repeated key rows), NaN scores, -1 padding and queries with no candidate,
// several block shapes and grid-stride loops, 1 and 2 pool threads, the race
// check, the dispatch from the CPU entries and the CPU's error messages. The
// CPU references run on host copies, so this binary runs in strict interpret
// mode.
//
// Negative controls (done once by hand): std::max's operand order flipped in
// entry_channel's max (mx < z ? mx : z) failed CompressForwardMatchesCpu; the
// indexer's tie rule flipped (a > b) failed IndexerSelectMatchesCpu on the
// tied queries.
#include "lockstep/kernels/gpu/kv_compress.h"

#include <gtest/gtest.h>

#include <algorithm>
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
using gpu_test::rows_view;

inline size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<G::KvCompressLaunch> launches() {
  return {G::KvCompressLaunch{}, G::KvCompressLaunch{1, 0}, G::KvCompressLaunch{33, 2},
          G::KvCompressLaunch{1024, 1}, G::KvCompressLaunch{16, 0}};
}

std::string launch_name(const G::KvCompressLaunch& cfg, int threads) {
  return " threads/block=" + std::to_string(cfg.threads) + " max_blocks=" + std::to_string(cfg.max_blocks) +
         " pool=" + std::to_string(threads);
}

// ------------------------------------------------------------ compressor

// Sequences one after the other in the store; entry t of a sequence covers its
// block t (HCA) or blocks t-1 and t (CSA; block 0's previous half is -1).
// Every 5th entry also loses a random slot of its own block (never the last
// valid one), so masks appear inside entries too.
struct Problem {
  int64_t c = 0, kappa = 1, Dc = 0, P = 0, N = 0, Ne = 0;
  bool overlap = false;
  int64_t ld_store = 0, ld_out = 0;  // row strides with padding
  std::vector<float> store;          // (N, ld_store) [C | Z | pad]
  std::vector<int32_t> rows;         // (Ne, P)
  std::vector<float> ape;            // (c, kappa*Dc)
};

Problem make_problem(int64_t c, bool overlap, int64_t Dc, const std::vector<int64_t>& lens, uint32_t seed) {
  Problem pr;
  pr.c = c;
  pr.overlap = overlap;
  pr.kappa = overlap ? 2 : 1;
  pr.Dc = Dc;
  pr.P = pr.kappa * c;
  for (int64_t len : lens) {
    for (int64_t t = 0; t < len / c; ++t) {
      if (overlap)
        for (int64_t p = 0; p < c; ++p) pr.rows.push_back(t == 0 ? -1 : int32_t(pr.N + (t - 1) * c + p));
      for (int64_t p = 0; p < c; ++p) pr.rows.push_back(int32_t(pr.N + t * c + p));
    }
    pr.N += len;
  }
  pr.Ne = static_cast<int64_t>(pr.rows.size()) / pr.P;
  for (int64_t e = 0; e < pr.Ne; e += 5) pr.rows[sz(e * pr.P + pr.P - 1 - (e / 5) % c)] = -1;
  pr.ld_store = 2 * pr.kappa * Dc + 3;
  pr.ld_out = Dc + 2;
  pr.store = test::randn(pr.N * pr.ld_store, seed, 2.0f);
  // Specials in Z and C: a slot that dominates, one that vanishes, an inf value.
  if (pr.N > 3) {
    pr.store[sz(1 * pr.ld_store + pr.kappa * Dc)] = 90.0f;
    pr.store[sz(2 * pr.ld_store + pr.kappa * Dc)] = -kInf;
    pr.store[sz(3 * pr.ld_store)] = kInf;
  }
  pr.ape = test::randn(c * pr.kappa * Dc, seed + 1);
  return pr;
}

std::string problem_name(const Problem& pr) {
  return "c=" + std::to_string(pr.c) + (pr.overlap ? " overlap" : "") + " Dc=" + std::to_string(pr.Dc) +
         " N=" + std::to_string(pr.N) + " Ne=" + std::to_string(pr.Ne);
}

Tensor rows_of(int32_t* p, const Problem& pr) {
  return Tensor(p, DType::I32, {pr.Ne, pr.P});
}

// Forward and backward on the CPU (host copies) and the GPU (device buffers);
// outputs padded, gradients accumulated onto random values.
void check_compress(const Problem& pr, const G::KvCompressLaunch& cfg, int threads, uint32_t seed) {
  const std::string what = problem_name(pr) + launch_name(cfg, threads);
  const int64_t W = 2 * pr.kappa * pr.Dc, A = pr.kappa * pr.Dc;
  const std::vector<float> out0(sz(pr.Ne * pr.ld_out), -7.0f), dout = test::randn(pr.Ne * pr.ld_out, seed),
                                                               dstore0 = test::randn(pr.N * W, seed + 1),
                                                               dape0 = test::randn(pr.c * A, seed + 2);
  PoolContext pc(threads);
  std::vector<float> cs = pr.store, ca = pr.ape, co = out0, cdo = dout, cds = dstore0, cda = dape0;
  std::vector<int32_t> cr = pr.rows;
  const Tensor cst = rows_view(cs.data(), pr.N, W, pr.ld_store), cat = rows_view(ca.data(), pr.c, A, A);
  compress_forward(pc.ctx, rows_view(co.data(), pr.Ne, pr.Dc, pr.ld_out), cst, rows_of(cr.data(), pr), cat,
                   int(pr.c), pr.overlap);
  compress_backward(pc.ctx, rows_view(cds.data(), pr.N, W, W), rows_view(cda.data(), pr.c, A, A),
                    rows_view(cdo.data(), pr.Ne, pr.Dc, pr.ld_out), cst, rows_of(cr.data(), pr), cat,
                    int(pr.c), pr.overlap);

  DeviceArray<float> ds(pr.store, "store"), da(pr.ape, "ape"), dout_d(out0, "out"), ddo(dout, "dout"),
      dds(dstore0, "dstore"), dda(dape0, "dape");
  DeviceArray<int32_t> dr(pr.rows, "rows");
  const Tensor dst = rows_view(ds.data(), pr.N, W, pr.ld_store), dat = rows_view(da.data(), pr.c, A, A);
  G::compress_forward(pc.ctx, rows_view(dout_d.data(), pr.Ne, pr.Dc, pr.ld_out), dst, rows_of(dr.data(), pr),
                      dat, int(pr.c), pr.overlap, cfg);
  G::compress_backward(pc.ctx, rows_view(dds.data(), pr.N, W, W), rows_view(dda.data(), pr.c, A, A),
                       rows_view(ddo.data(), pr.Ne, pr.Dc, pr.ld_out), dst, rows_of(dr.data(), pr), dat,
                       int(pr.c), pr.overlap, cfg);
  expect_same_bits(dout_d.host(), co, what + ": out");
  expect_same_bits(dds.host(), cds, what + ": dstore");
  expect_same_bits(dda.host(), cda, what + ": dape");
}

TEST(GpuKvCompress, CompressMatchesCpuCsaAndHca) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t Dc : {1, 7, 33, 70}) {
    check_compress(make_problem(4, true, Dc, {12, 4, 20}, uint32_t(100 + k)), cfgs[k % cfgs.size()],
                   1 + int(k % 2), uint32_t(200 + k));
    ++k;
  }
  for (int64_t Dc : {5, 64}) {
    check_compress(make_problem(128, false, Dc, {256, 128}, uint32_t(100 + k)), cfgs[k % cfgs.size()],
                   1 + int(k % 2), uint32_t(200 + k));
    ++k;
  }
  // Ratio 4 without overlap and ratio 128 with it: the layouts the kernels
  // take even if the model uses only the two above.
  check_compress(make_problem(4, false, 9, {8, 16}, 300), cfgs[1], 2, 301);
  check_compress(make_problem(128, true, 3, {384}, 302), cfgs[2], 1, 303);
}

TEST(GpuKvCompress, EveryLaunchShapeGivesTheSameBits) {
  const Problem pr = make_problem(4, true, 21, {16, 8}, 400);
  for (const auto& cfg : launches())
    for (int threads : {1, 2}) check_compress(pr, cfg, threads, 401);
}

// ------------------------------------------------------------ indexer

struct IndexerProblem {
  int64_t T = 0, HI = 0, DI = 0, N = 0, C = 0, K = 0;
  std::vector<float> qi, w, keys;  // (T, HI, DI), (T, HI), (N, DI)
  std::vector<int32_t> cand;       // (T, C)
};

// Query t sees (t * 7) % (C + 1) candidates (0 for some), drawn from N rows
// with repeats; keys 0 and 1 are equal (tied scores), every third query's
// weights are negative on half its heads and many dots are negative (ReLU
// zeros: more ties); key 2 holds a NaN when nan_key.
IndexerProblem make_indexer(int64_t T, int64_t HI, int64_t DI, int64_t N, int64_t C, int64_t K, bool nan_key,
                            uint32_t seed) {
  IndexerProblem p{T, HI, DI, N, C, K, {}, {}, {}, {}};
  p.qi = test::randn(T * HI * DI, seed);
  p.w = test::randn(T * HI, seed + 1);
  p.keys = test::randn(N * DI, seed + 2);
  for (int64_t d = 0; d < DI; ++d) p.keys[sz(1 * DI + d)] = p.keys[sz(d)];
  if (nan_key && N > 2) p.keys[sz(2 * DI)] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> pick = test::uniform(T * C, seed + 3, 0.0f, float(N));
  p.cand.assign(sz(T * C), -1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t valid = (t * 7) % (C + 1);
    for (int64_t j = 0; j < valid; ++j)
      p.cand[sz(t * C + j)] = std::min<int32_t>(int32_t(pick[sz(t * C + j)]), int32_t(N - 1));
    if (valid > 2) {  // the tied pair
      p.cand[sz(t * C)] = 0;
      p.cand[sz(t * C + 1)] = 1;
    }
  }
  return p;
}

void check_indexer(const IndexerProblem& p, const G::KvCompressLaunch& cfg, int threads, bool want_scores) {
  const std::string what = "T=" + std::to_string(p.T) + " HI=" + std::to_string(p.HI) +
                           " DI=" + std::to_string(p.DI) + " N=" + std::to_string(p.N) +
                           " C=" + std::to_string(p.C) + " K=" + std::to_string(p.K) +
                           launch_name(cfg, threads);
  PoolContext pc(threads);
  const int64_t ld_sel = p.K + 1;
  std::vector<float> cq = p.qi, cw = p.w, ck = p.keys, csc(sz(p.T * p.C), 5.0f);
  std::vector<int32_t> cc = p.cand, csel(sz(p.T * ld_sel), 77);
  Tensor csel_t(csel.data(), DType::I32, {p.T, p.K});
  csel_t.stride[0] = ld_sel;
  indexer_select(pc.ctx, csel_t, want_scores ? rows_view(csc.data(), p.T, p.C, p.C) : Tensor(),
                 Tensor(cq.data(), DType::F32, {p.T, p.HI, p.DI}), rows_view(cw.data(), p.T, p.HI, p.HI),
                 rows_view(ck.data(), p.N, p.DI, p.DI), Tensor(cc.data(), DType::I32, {p.T, p.C}));

  DeviceArray<float> dq(p.qi, "qi"), dw(p.w, "w"), dk(p.keys, "keys"),
      dsc(std::vector<float>(sz(p.T * p.C), 5.0f), "scores");
  DeviceArray<int32_t> dc(p.cand, "cand"), dsel(std::vector<int32_t>(sz(p.T * ld_sel), 77), "selected");
  Tensor dsel_t(dsel.data(), DType::I32, {p.T, p.K});
  dsel_t.stride[0] = ld_sel;
  G::indexer_select(pc.ctx, dsel_t, want_scores ? rows_view(dsc.data(), p.T, p.C, p.C) : Tensor(),
                    Tensor(dq.data(), DType::F32, {p.T, p.HI, p.DI}), rows_view(dw.data(), p.T, p.HI, p.HI),
                    rows_view(dk.data(), p.N, p.DI, p.DI), Tensor(dc.data(), DType::I32, {p.T, p.C}), cfg);
  EXPECT_EQ(dsel.host(), csel) << what << ": selected";
  expect_same_bits(dsc.host(), csc, what + ": scores");
}

TEST(GpuKvCompress, IndexerSelectMatchesCpu) {
  const auto cfgs = launches();
  size_t k = 0;
  for (int64_t C : {1, 9, 40})
    for (int64_t K : {1, 4, 64}) {
      check_indexer(make_indexer(7 + C % 5, 3, 17, 30, C, K, k % 3 == 2, uint32_t(500 + k)),
                    cfgs[k % cfgs.size()], 1 + int(k % 2), k % 4 != 3);
      ++k;
    }
  // The selection is invariant to ties only through the rule "lower column
  // first": make every score of a query tie (all weights zero).
  IndexerProblem p = make_indexer(5, 2, 8, 12, 20, 6, false, 600);
  std::fill(p.w.begin(), p.w.end(), 0.0f);
  check_indexer(p, cfgs[0], 2, true);
}

TEST(GpuKvCompress, IndexerEveryLaunchShapeGivesTheSameBits) {
  const IndexerProblem p = make_indexer(9, 4, 20, 25, 33, 5, true, 700);
  for (const auto& cfg : launches())
    for (int threads : {1, 2}) check_indexer(p, cfg, threads, true);
}

TEST(GpuKvCompress, SameBitsInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  check_compress(make_problem(4, true, 19, {12, 8}, 800), G::KvCompressLaunch{8, 2}, 2, 801);
  check_indexer(make_indexer(6, 2, 9, 14, 11, 3, true, 802), G::KvCompressLaunch{4, 2}, 2, true);
}

// ------------------------------------------------------------ dispatch and errors

TEST(GpuKvCompress, CpuEntriesDispatchToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.compress_forward, nullptr);
  ASSERT_NE(be.compress_backward, nullptr);
  ASSERT_NE(be.indexer_select, nullptr);
  const Problem pr = make_problem(4, true, 10, {8, 12}, 900);
  const IndexerProblem ip = make_indexer(6, 2, 8, 10, 7, 3, false, 901);
  const int64_t W = 2 * pr.kappa * pr.Dc, A = pr.kappa * pr.Dc;
  PoolContext cpu(2), dev(2);
  dev.ctx.gpu = &be;
  // The CPU on host vectors; the device context on device buffers (a CPU
  // kernel reached through it would fault on them in strict mode).
  std::vector<float> cs = pr.store, ca = pr.ape, co(sz(pr.Ne * pr.Dc)), cds(sz(pr.N * W), 0.0f),
                     cda(sz(pr.c * A), 0.0f), cq = ip.qi, cw = ip.w, ck = ip.keys;
  std::vector<int32_t> cr = pr.rows, cc = ip.cand, csel(sz(ip.T * ip.K));
  DeviceArray<float> ds(pr.store, "store"), da(pr.ape, "ape"), dout(pr.Ne * pr.Dc, "out"),
      dds(std::vector<float>(sz(pr.N * W), 0.0f), "dstore"),
      dda(std::vector<float>(sz(pr.c * A), 0.0f), "dape"), dq(ip.qi, "qi"), dw(ip.w, "w"),
      dk(ip.keys, "keys");
  DeviceArray<int32_t> dr(pr.rows, "rows"), dc(ip.cand, "cand"), dsel(ip.T * ip.K, "selected");
  for (int side = 0; side < 2; ++side) {
    const Context& ctx = side == 0 ? cpu.ctx : dev.ctx;
    float* store = side == 0 ? cs.data() : ds.data();
    float* ape = side == 0 ? ca.data() : da.data();
    float* out = side == 0 ? co.data() : dout.data();
    int32_t* rows = side == 0 ? cr.data() : dr.data();
    const Tensor st = rows_view(store, pr.N, W, pr.ld_store), at = rows_view(ape, pr.c, A, A),
                 ot = rows_view(out, pr.Ne, pr.Dc, pr.Dc);
    compress_forward(ctx, ot, st, rows_of(rows, pr), at, 4, true);
    compress_backward(ctx, rows_view(side == 0 ? cds.data() : dds.data(), pr.N, W, W),
                      rows_view(side == 0 ? cda.data() : dda.data(), pr.c, A, A), ot, st, rows_of(rows, pr),
                      at, 4, true);
    indexer_select(ctx, Tensor(side == 0 ? csel.data() : dsel.data(), DType::I32, {ip.T, ip.K}), Tensor(),
                   Tensor(side == 0 ? cq.data() : dq.data(), DType::F32, {ip.T, ip.HI, ip.DI}),
                   rows_view(side == 0 ? cw.data() : dw.data(), ip.T, ip.HI, ip.HI),
                   rows_view(side == 0 ? ck.data() : dk.data(), ip.N, ip.DI, ip.DI),
                   Tensor(side == 0 ? cc.data() : dc.data(), DType::I32, {ip.T, ip.C}));
  }
  expect_same_bits(dout.host(), co, "dispatch: out");
  expect_same_bits(dds.host(), cds, "dispatch: dstore");
  expect_same_bits(dda.host(), cda, "dispatch: dape");
  EXPECT_EQ(dsel.host(), csel) << "dispatch: selected";
}

// Bad indices in device memory: the GPU entry reads them through a copy and
// stops with the CPU's message.
TEST(GpuKvCompress, ErrorsAreTheCpuKernelsErrors) {
  const Problem pr = make_problem(4, true, 3, {8}, 950);
  const int64_t W = 2 * pr.kappa * pr.Dc, A = pr.kappa * pr.Dc;
  std::vector<int32_t> bad_rows = pr.rows, masked_rows = pr.rows, bad_cand = {0, 1, -1, 2, 0, -1, 9, 1};
  bad_rows[3] = int32_t(pr.N);
  std::fill(masked_rows.begin() + pr.P, masked_rows.begin() + 2 * pr.P, -1);
  std::vector<float> hs = pr.store, ha = pr.ape, ho(sz(pr.Ne * pr.Dc)), hq(2 * 2 * 4), hw(2 * 2), hk(4 * 4);
  std::vector<int32_t> hsel(4);
  DeviceArray<float> ds(pr.store, "store"), da(pr.ape, "ape"), dout(pr.Ne * pr.Dc, "out"),
      dq(std::vector<float>(hq.size(), 0.0f), "qi"), dw(std::vector<float>(hw.size(), 0.0f), "w"),
      dk(std::vector<float>(hk.size(), 0.0f), "keys");
  DeviceArray<int32_t> dbad(bad_rows, "rows"), dmasked(masked_rows, "rows"), dcand(bad_cand, "cand"),
      dsel(4, "selected");
  Context cpu;
  const Context dev;
  const std::vector<std::pair<std::function<void()>, std::function<void()>>> calls = {
      {[&] {
         compress_forward(cpu, rows_view(ho.data(), pr.Ne, pr.Dc, pr.Dc),
                          rows_view(hs.data(), pr.N, W, pr.ld_store), rows_of(bad_rows.data(), pr),
                          rows_view(ha.data(), pr.c, A, A), 4, true);
       },
       [&] {
         G::compress_forward(dev, rows_view(dout.data(), pr.Ne, pr.Dc, pr.Dc),
                             rows_view(ds.data(), pr.N, W, pr.ld_store), rows_of(dbad.data(), pr),
                             rows_view(da.data(), pr.c, A, A), 4, true);
       }},
      {[&] {
         compress_backward(cpu, rows_view(hs.data(), pr.N, W, pr.ld_store), rows_view(ha.data(), pr.c, A, A),
                           rows_view(ho.data(), pr.Ne, pr.Dc, pr.Dc),
                           rows_view(hs.data(), pr.N, W, pr.ld_store), rows_of(masked_rows.data(), pr),
                           rows_view(ha.data(), pr.c, A, A), 4, true);
       },
       [&] {
         G::compress_backward(dev, rows_view(ds.data(), pr.N, W, pr.ld_store),
                              rows_view(da.data(), pr.c, A, A), rows_view(dout.data(), pr.Ne, pr.Dc, pr.Dc),
                              rows_view(ds.data(), pr.N, W, pr.ld_store), rows_of(dmasked.data(), pr),
                              rows_view(da.data(), pr.c, A, A), 4, true);
       }},
      {[&] {
         indexer_select(cpu, Tensor(hsel.data(), DType::I32, {2, 2}), Tensor(),
                        Tensor(hq.data(), DType::F32, {2, 2, 4}), rows_view(hw.data(), 2, 2, 2),
                        rows_view(hk.data(), 4, 4, 4), Tensor(bad_cand.data(), DType::I32, {2, 4}));
       },
       [&] {
         G::indexer_select(dev, Tensor(dsel.data(), DType::I32, {2, 2}), Tensor(),
                           Tensor(dq.data(), DType::F32, {2, 2, 4}), rows_view(dw.data(), 2, 2, 2),
                           rows_view(dk.data(), 4, 4, 4), Tensor(dcand.data(), DType::I32, {2, 4}));
       }},
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string want = error_of(calls[i].first);
    ASSERT_NE(want, "") << "call " << i;
    EXPECT_EQ(error_of(calls[i].second), want) << "call " << i;
  }
}

}  // namespace
}  // namespace lockstep::kernels
