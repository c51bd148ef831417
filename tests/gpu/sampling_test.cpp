// The GPU sampling kernel (kernels/gpu/sampling.cu) against the CPU kernel
// (kernels/cpu/sampling.h): the same token for every draw, on rows with ties,
// -inf, NaN and +inf, V = 1 to 5000, every mode and combination, several block
// sizes; the CPU kernel against a double-precision reference distribution; batch
// invariance; and the device-side Philox against base/rng.h.
//
// Negative control (done once by hand): scanning a chunk as the running sum
// ((P_c + w_0) + w_1) + ... instead of P_c + ((w_0 + w_1) + ...) in the GPU's
// first_reaching made GpuMatchesCpuAtTheBoundariesOfEveryInterval fail on the
// spread row (mode 0, draw 4); random draws alone (the other tests) did not
// catch it, which is why the boundary test exists. Dropping the barrier after
// each bitonic pass made every comparison test fail and SameTokensInEveryThreadOrder
// report the race (the chunk sums differ in reverse thread order).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/row_kernel_util.h"
#include "lockstep/base/philox.h"
#include "lockstep/base/rng.h"
#include "lockstep/kernels/cpu/sampling.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/sampling.h"

namespace lockstep::kernels {
namespace {

namespace G = gpu::interp;
using gpu_test::DeviceArray;
using gpu_test::error_of;
using gpu_test::PoolContext;

constexpr float kInf = std::numeric_limits<float>::infinity();

// (N, V) logits. kind 0: normal(0, 3); 1: few distinct values (ties) with some
// -inf; 2: ties and specials (NaN, -inf, an occasional +inf).
std::vector<float> logits_for(int64_t N, int64_t V, int kind, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(0, 3), pct(0, 99);
  std::vector<float> z(static_cast<size_t>(N * V));
  for (auto& x : z) {
    if (kind == 0) {
      x = nd(g);
    } else {
      x = float(small(g)) * 0.5f;
      const int p = pct(g);
      if (p < 15) x = -kInf;
      if (kind == 2 && p == 20) x = std::nanf("");
      if (kind == 2 && p == 21 && pct(g) < 5) x = kInf;
      if (kind == 2 && p == 22) x = -0.0f;
    }
  }
  return z;
}

// Every combination the tests run: (temperature, top_k, top_p, min_p).
struct Mode {
  float t;
  int64_t k;
  float p, mp;
};
std::vector<Mode> modes(int64_t V) {
  std::vector<Mode> m;
  for (float t : {0.0f, 0.7f, 1.0f, 5.0f}) {
    for (int64_t k : {int64_t(0), int64_t(1), int64_t(2), int64_t(40), V - 1, V, V + 3}) {
      for (float p : {1.0f, 0.9f, 0.3f}) {
        for (float mp : {0.0f, 0.05f, 0.5f}) {
          if (t == 0.0f && (k != 0 || p != 1.0f || mp != 0.0f)) continue;
          m.push_back({t, k, p, mp});
        }
      }
    }
  }
  return m;
}

std::vector<SampleSpec> specs_for(int64_t R, int64_t N, const std::vector<Mode>& ms, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<SampleSpec> out(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    const Mode& m = ms[size_t(i) % ms.size()];
    SampleSpec& s = out[size_t(i)];
    s.logit_row = int64_t(g() % uint64_t(N));
    s.temperature = m.t;
    s.top_k = m.k;
    s.top_p = m.p;
    s.min_p = m.mp;
    s.seed = g();
    s.stream = g();
    s.counter = g() % 4096;
  }
  return out;
}

G::SampleLaunch launch(int threads) {
  G::SampleLaunch c;
  c.threads = threads;
  return c;
}

// The tokens of sample_rows on ctx, from device buffers.
std::vector<int32_t> run(const Context& ctx, const std::vector<float>& z, int64_t N, int64_t V,
                         const std::vector<SampleSpec>& rows, const G::SampleLaunch* cfg) {
  DeviceArray<float> dz(z, "logits");
  DeviceArray<int32_t> tok(int64_t(rows.size()), "tokens");
  const Tensor tz(dz.data(), DType::F32, {N, V}), tt(tok.data(), DType::I32, {int64_t(rows.size())});
  if (cfg != nullptr) {
    G::sample_rows(ctx, tt, tz, rows, *cfg);
  } else {
    sample_rows(ctx, tt, tz, rows);
  }
  return tok.host();
}

void expect_same_tokens(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                        const std::vector<SampleSpec>& rows, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const SampleSpec& s = rows[i];
    ASSERT_EQ(got[i], want[i]) << what << ": draw " << i << " (T " << s.temperature << ", k " << s.top_k
                               << ", p " << s.top_p << ", min_p " << s.min_p << ", row " << s.logit_row << ")";
  }
}

TEST(GpuSampling, GpuMatchesCpuOnEveryModeAndShape) {
  for (int64_t V : {1, 7, 33, 1000, 5000}) {
    const int64_t N = 3;
    const std::vector<Mode> ms = modes(V);
    for (int kind : {0, 1, 2}) {
      const std::vector<float> z = logits_for(N, V, kind, uint64_t(V * 10 + kind));
      // The larger rows get fewer draws (the emulator runs each thread of the sort).
      const int64_t R = V >= 1000 ? int64_t(ms.size()) / 4 + 8 : int64_t(ms.size());
      std::vector<Mode> pick = ms;
      if (V >= 1000) std::shuffle(pick.begin(), pick.end(), std::mt19937_64(uint64_t(kind)));
      const std::vector<SampleSpec> rows = specs_for(R, N, pick, uint64_t(V + kind));
      PoolContext cpu(2);
      const std::vector<int32_t> want = run(cpu.ctx, z, N, V, rows, nullptr);
      const int threads = V >= 1000 ? 128 : (kind == 1 ? 1 : 32);
      const G::SampleLaunch cfg = launch(threads);
      expect_same_tokens(run(cpu.ctx, z, N, V, rows, &cfg), want, rows,
                         "V " + std::to_string(V) + " kind " + std::to_string(kind));
    }
  }
}

// The u where the CPU's token changes, to the last bit: u_lo < u_hi adjacent
// doubles with different tokens, found by bisection on the bit patterns.
std::vector<double> boundaries(const float* z, int64_t V, const SampleSpec& s, int count, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::vector<double> out;
  for (int tries = 0; tries < 20 * count && int(out.size()) < 2 * count; ++tries) {
    double lo = ud(g), hi = std::nextafter(lo + 0.02 * ud(g), 0.0);
    if (hi >= 1.0) hi = std::nextafter(1.0, 0.0);
    const int32_t tlo = sample_row(z, V, s, lo);
    if (sample_row(z, V, s, hi) == tlo) continue;
    uint64_t a = std::bit_cast<uint64_t>(lo), b = std::bit_cast<uint64_t>(hi);
    while (b - a > 1) {
      const uint64_t mid = a + (b - a) / 2;
      (sample_row(z, V, s, std::bit_cast<double>(mid)) == tlo ? a : b) = mid;
    }
    out.push_back(std::bit_cast<double>(a));
    out.push_back(std::bit_cast<double>(b));
  }
  return out;
}

// At the exact boundaries between two candidates' intervals the GPU must still
// choose the CPU's token: this is what pins every rounding of the sums (a
// random draw lands within one ulp of a boundary almost never).
TEST(GpuSampling, GpuMatchesCpuAtTheBoundariesOfEveryInterval) {
  const int64_t V = 1300;
  const std::vector<float> z = logits_for(1, V, 0, 3);
  const std::vector<float> flat = logits_for(1, V, 1, 4);
  // Weights from 1 down to e^-40: sums that round at almost every step.
  std::vector<float> spread_row(static_cast<size_t>(V));
  std::mt19937_64 g(5);
  for (auto& x : spread_row) x = std::uniform_real_distribution<float>(-40.0f, 0.0f)(g);
  const std::vector<float> spread = spread_row;
  std::vector<Mode> ms = {{1.0f, 0, 1.0f, 0.0f}, {5.0f, 0, 1.0f, 0.0f}, {2.0f, 700, 1.0f, 0.0f},
                          {3.0f, 0, 0.9f, 0.0f}, {4.0f, 0, 1.0f, 0.02f}, {5.0f, 900, 0.8f, 0.01f}};
  int64_t checked = 0;
  for (const std::vector<float>* row : {&z, &flat, &spread}) {
    for (size_t mi = 0; mi < ms.size(); ++mi) {
      SampleSpec s;
      s.temperature = ms[mi].t;
      s.top_k = ms[mi].k;
      s.top_p = ms[mi].p;
      s.min_p = ms[mi].mp;
      const std::vector<double> us = boundaries(row->data(), V, s, 6, 50 + mi);
      ASSERT_GE(us.size(), 4u) << "mode " << mi;
      G::SampleLaunch cfg = launch(128);
      cfg.draws = us;
      const std::vector<SampleSpec> rows(us.size(), s);
      std::vector<int32_t> want;
      for (double u : us) want.push_back(sample_row(row->data(), V, s, u));
      PoolContext ctx(1);
      expect_same_tokens(run(ctx.ctx, *row, 1, V, rows, &cfg), want, rows, "boundaries, mode " + std::to_string(mi));
      checked += int64_t(us.size());
    }
  }
  EXPECT_GT(checked, 60);
}

TEST(GpuSampling, EveryBlockSizeGivesTheSameTokens) {
  const int64_t N = 4, V = 700;
  const std::vector<float> z = logits_for(N, V, 0, 5);
  std::vector<Mode> ms = {{1.0f, 0, 1.0f, 0.0f}, {3.0f, 0, 1.0f, 0.0f}, {0.9f, 30, 1.0f, 0.0f},
                          {2.0f, 0, 0.95f, 0.0f}, {4.0f, 0, 1.0f, 0.01f}, {1.5f, 300, 0.9f, 0.02f},
                          {0.0f, 0, 1.0f, 0.0f}};
  const std::vector<SampleSpec> rows = specs_for(14, N, ms, 6);
  PoolContext one(1);
  const std::vector<int32_t> want = run(one.ctx, z, N, V, rows, nullptr);
  for (int threads : {1, 2, 64, 256, 1024}) {
    for (int pool : {1, 2}) {
      PoolContext ctx(pool);
      const G::SampleLaunch cfg = launch(threads);
      expect_same_tokens(run(ctx.ctx, z, N, V, rows, &cfg), want, rows, "threads " + std::to_string(threads));
    }
  }
}

TEST(GpuSampling, SameTokensInEveryThreadOrder) {
  gpu_test::emu::Options o;
  o.check_races = true;
  gpu_test::emu::ScopedOptions scoped(o);
  const int64_t N = 2, V = 300;
  const std::vector<float> z = logits_for(N, V, 1, 9);
  std::vector<Mode> ms = {{0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f}, {1.0f, 5, 0.8f, 0.1f}};
  const std::vector<SampleSpec> rows = specs_for(3, N, ms, 10);
  PoolContext cpu(1);
  const G::SampleLaunch cfg = launch(64);
  expect_same_tokens(run(cpu.ctx, z, N, V, rows, &cfg), run(cpu.ctx, z, N, V, rows, nullptr), rows, "races");
}

TEST(GpuSampling, CpuEntryDispatchesToTheInterpretBackend) {
  const GpuBackend& be = interpret_backend();
  ASSERT_NE(be.sample_rows, nullptr);
  const int64_t N = 3, V = 257;
  const std::vector<float> z = logits_for(N, V, 2, 12);
  const std::vector<SampleSpec> rows = specs_for(40, N, modes(V), 13);
  for (int threads : {1, 2}) {
    PoolContext cpu(threads), dev(threads);
    dev.ctx.gpu = &be;
    expect_same_tokens(run(dev.ctx, z, N, V, rows, nullptr), run(cpu.ctx, z, N, V, rows, nullptr), rows,
                       "dispatch");
  }
}

// A draw's token depends on its row and spec only: alone, in a batch, on a
// copy of its row elsewhere, with 1 or 2 threads, on either device.
TEST(GpuSampling, TokensDoNotDependOnTheBatch) {
  const int64_t N = 5, V = 520;
  const std::vector<float> z = logits_for(N, V, 0, 14);
  const std::vector<SampleSpec> rows = specs_for(30, N, modes(V), 15);
  for (bool gpu : {false, true}) {
    PoolContext ctx(2);
    if (gpu) ctx.ctx.gpu = &interpret_backend();
    const std::vector<int32_t> all = run(ctx.ctx, z, N, V, rows, nullptr);
    for (size_t i = 0; i < rows.size(); i += 7) {
      SampleSpec s = rows[i];
      const int64_t r = s.logit_row;
      s.logit_row = 0;
      const std::vector<float> one(z.begin() + r * V, z.begin() + (r + 1) * V);
      EXPECT_EQ(run(ctx.ctx, one, 1, V, {s}, nullptr)[0], all[i]) << "draw " << i << " gpu " << gpu;
    }
  }
}

// The reference: the same truncation and distribution from std::exp in long
// double. For u on a fine grid the kernel's token must be one whose reference
// interval [F_before, F_after) contains u, up to the f32 weights' error.
struct RefDist {
  std::vector<int64_t> ids;       // the kept candidates in order
  std::vector<long double> cdf;   // cdf[j] = mass of ids[0..j]
};

RefDist reference(const std::vector<float>& z, const SampleSpec& s) {
  const int64_t V = int64_t(z.size());
  std::vector<int64_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  const bool sorted = s.top_k > 0 && s.top_k < V ? true : (s.top_p < 1.0f || s.min_p > 0.0f);
  if (sorted) {
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return z[size_t(a)] > z[size_t(b)]; });
    if (s.top_k > 0 && s.top_k < V) ids.resize(size_t(s.top_k));
  }
  float mx = *std::max_element(z.begin(), z.end());
  std::vector<long double> w;
  for (int64_t i : ids) w.push_back(std::exp((long double)z[size_t(i)] / s.temperature - (long double)mx / s.temperature));
  if (s.min_p > 0.0f) {
    size_t k = 1;
    while (k < w.size() && w[k] >= (long double)s.min_p) ++k;
    w.resize(k);
    ids.resize(k);
  }
  long double total = std::accumulate(w.begin(), w.end(), 0.0L);
  if (s.top_p < 1.0f) {
    long double cum = 0;
    size_t k = 0;
    while (k < w.size()) {
      cum += w[k++];
      if (cum >= (long double)s.top_p * total) break;
    }
    w.resize(k);
    ids.resize(k);
    total = std::accumulate(w.begin(), w.end(), 0.0L);
  }
  RefDist d;
  d.ids = ids;
  long double cum = 0;
  for (long double x : w) d.cdf.push_back((cum += x) / total);
  return d;
}

TEST(GpuSampling, CpuKernelSamplesTheReferenceDistribution) {
  const int64_t V = 1500;
  const std::vector<Mode> ms = {{1.0f, 0, 1.0f, 0.0f}, {4.0f, 0, 1.0f, 0.0f}, {0.8f, 50, 1.0f, 0.0f},
                                {2.0f, 0, 0.9f, 0.0f}, {3.0f, 0, 1.0f, 0.02f}, {2.5f, 600, 0.7f, 0.01f}};
  const int M = 10000;
  for (size_t mi = 0; mi < ms.size(); ++mi) {
    const std::vector<float> z = logits_for(1, V, 0, 100 + mi);
    SampleSpec s;
    s.temperature = ms[mi].t;
    s.top_k = ms[mi].k;
    s.top_p = ms[mi].p;
    s.min_p = ms[mi].mp;
    const RefDist ref = reference(z, s);
    std::vector<int64_t> pos(static_cast<size_t>(V), -1);
    for (size_t j = 0; j < ref.ids.size(); ++j) pos[size_t(ref.ids[j])] = int64_t(j);
    const long double tol = 1e-5L;
    std::vector<int> hits(ref.ids.size());
    for (int i = 0; i < M; ++i) {
      const double u = (i + 0.5) / M;
      const int32_t tok = sample_row(z.data(), V, s, u);
      const int64_t j = pos[size_t(tok)];
      ASSERT_GE(j, 0) << "mode " << mi << ": token " << tok << " is not a kept candidate";
      ++hits[size_t(j)];
      const long double lo = j > 0 ? ref.cdf[size_t(j - 1)] : 0.0L, hi = ref.cdf[size_t(j)];
      ASSERT_TRUE(lo - tol <= u && u < hi + tol)
          << "mode " << mi << " u " << u << ": token " << tok << " has reference interval [" << double(lo) << ", "
          << double(hi) << ")";
    }
    // Frequencies over the grid: each candidate within 1 grid point (plus the tolerance) of its mass.
    for (size_t j = 0; j < hits.size(); ++j) {
      const long double p = ref.cdf[j] - (j > 0 ? ref.cdf[j - 1] : 0.0L);
      EXPECT_NEAR(double(hits[j]), double(p * M), 2.0 + double(tol) * M * 2) << "mode " << mi << " candidate " << j;
    }
  }
}

TEST(GpuSampling, SpecialRows) {
  const int64_t V = 600;
  SampleSpec s;
  std::vector<float> z(static_cast<size_t>(V), -kInf);
  // A row of -inf: greedy takes id 0, sampling is uniform over the whole row.
  s.temperature = 0.0f;
  EXPECT_EQ(sample_row(z.data(), V, s, 0.5), 0);
  s.temperature = 1.0f;
  EXPECT_EQ(sample_row(z.data(), V, s, 0.0), 0);
  EXPECT_EQ(sample_row(z.data(), V, s, 0.5), 300);
  EXPECT_EQ(sample_row(z.data(), V, s, 0.999999), V - 1);
  // NaN ranks as -inf; a +inf logit takes all the mass; ties go to the lower id.
  z[3] = std::nanf("");
  z[10] = 1.0f;
  z[20] = 1.0f;
  s.temperature = 0.0f;
  EXPECT_EQ(sample_row(z.data(), V, s, 0.5), 10);
  s.temperature = 1.0f;
  s.top_k = 1;
  EXPECT_EQ(sample_row(z.data(), V, s, 0.9), 10);
  s.top_k = 0;
  EXPECT_EQ(sample_row(z.data(), V, s, 0.4), 10);
  EXPECT_EQ(sample_row(z.data(), V, s, 0.6), 20);
  s.top_p = 0.5f;  // the first of the two equal candidates carries half the mass
  EXPECT_EQ(sample_row(z.data(), V, s, 0.9), 10);
  s.top_p = 1.0f;
  z[500] = kInf;
  EXPECT_EQ(sample_row(z.data(), V, s, 0.01), 500);
  EXPECT_EQ(sample_row(z.data(), V, s, 0.99), 500);
  // u just below 1 still lands on a candidate of positive weight.
  std::vector<float> y = {0.0f, -kInf, -kInf};
  EXPECT_EQ(sample_row(y.data(), 3, s, 0.99999999999999989), 0);
}

// The draw inside the kernel is Philox::uniform_double, and the device header's
// Philox is the reference algorithm (written out again here) and base/rng.h's.
std::array<uint32_t, 4> philox_reference(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c;
}

TEST(GpuSampling, DevicePhiloxIsBaseRngsPhilox) {
  uint32_t kat[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  philox::rounds10(kat, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(kat[0], 0xd16cfe09u);
  EXPECT_EQ(kat[3], 0x24126ea1u);
  std::mt19937_64 g(77);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t seed = g(), stream = g(), counter = i < 1000 ? uint64_t(i) : g();
    const Philox ph(seed);
    const auto want = philox_reference({uint32_t(counter), uint32_t(counter >> 32), uint32_t(stream),
                                        uint32_t(stream >> 32)},
                                       {uint32_t(seed), uint32_t(seed >> 32)});
    ASSERT_EQ(ph.block(stream, counter), want);
    ASSERT_EQ(philox::u64(seed, stream, counter), ph.u64(stream, counter));
    SampleSpec s;
    s.seed = seed;
    s.stream = stream;
    s.counter = counter;
    const double u = sampling::draw(s), want_u = ph.uniform_double(stream, counter);
    ASSERT_EQ(std::memcmp(&u, &want_u, 8), 0);
  }
}

// The batched kernel is the one-row form with the spec's own draw.
TEST(GpuSampling, SampleRowsIsSampleRowWithThePhiloxDraw) {
  const int64_t N = 2, V = 333;
  const std::vector<float> z = logits_for(N, V, 1, 40);
  const std::vector<SampleSpec> rows = specs_for(60, N, modes(V), 41);
  PoolContext cpu(1);
  const std::vector<int32_t> got = run(cpu.ctx, z, N, V, rows, nullptr);
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_EQ(got[i], sample_row(z.data() + rows[i].logit_row * V, V, rows[i], sampling::draw(rows[i])));
}

TEST(GpuSampling, ArgumentErrorsAreTheCpuKernelsErrors) {
  Context cpu, dev;
  dev.gpu = &interpret_backend();
  std::vector<float> z(3 * 5);
  std::vector<int32_t> tok(2);
  const Tensor tz(z.data(), DType::F32, {3, 5}), tt(tok.data(), DType::I32, {2});
  SampleSpec ok;
  SampleSpec bad_row = ok, bad_p = ok, bad_mp = ok, bad_t = ok;
  bad_row.logit_row = 3;
  bad_p.top_p = 0.0f;
  bad_mp.min_p = 1.5f;
  bad_t.temperature = -1.0f;
  for (const auto& rows : std::vector<std::vector<SampleSpec>>{
           {ok, bad_row}, {bad_p, ok}, {ok, bad_mp}, {bad_t, ok}, {ok}}) {
    const std::string want = error_of([&] { sample_rows(cpu, tt, tz, rows); });
    ASSERT_NE(want, "");
    EXPECT_EQ(error_of([&] { sample_rows(dev, tt, tz, rows); }), want);
  }
}

}  // namespace
}  // namespace lockstep::kernels
