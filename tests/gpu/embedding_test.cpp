// The GPU embedding kernels (kernels/gpu/embedding.cu) in interpret mode
// against the CPU kernels, bit for bit: odd shapes, row strides, repeated ids
// (the backward's token order), special values, several block shapes, the race
// check, 1 and 2 pool threads, the dispatch, and the CPU's errors for a bad id.
//
// Negative control (done once by hand): with the backward's token loop run
// from T-1 down to 0, BackwardMatchesCpuInTokenOrder fails on its first case
// with a repeated id (T=7 D=1 V=5), and so do the race-check and dispatch
// tests; restoring the order makes them pass.
#include "lockstep/kernels/cpu/embedding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/embedding.h"

namespace lockstep::kernels {
namespace {

namespace emu = lockstep::gpu::emu;
namespace dev = lockstep::kernels::gpu::interp;
using dev::EmbeddingLaunch;

const EmbeddingLaunch kConfigs[] = {{}, {32, 1}, {7, 3}, {1, 1}, {256, 16}};
constexpr int kNumConfigs = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));

// n elements of emulated device memory; freed at scope end.
template <typename E>
struct DevBuf {
  DevBuf(int64_t n_, const char* what)
      : n(std::max<int64_t>(1, n_)), p(static_cast<E*>(emu::device_alloc(sizeof(E) * size_t(n), what))) {}
  ~DevBuf() { emu::device_free(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  int64_t n;
  E* p;
};

Tensor matrix(void* p, int64_t rows, int64_t cols, int64_t ld) {
  Tensor t(p, DType::F32, {rows, cols});
  t.stride[0] = ld;
  return t;
}

// Normal floats, and with `specials` zeros of both signs, subnormals, inf and NaN.
float draw(std::mt19937& g, bool specials) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  if (!specials) return nd(g);
  switch (std::uniform_int_distribution<int>(0, 9)(g)) {
    case 0: return -0.0f;
    case 1: return std::ldexp(nd(g), -135);
    case 2: return std::numeric_limits<float>::infinity();
    case 3: return std::numeric_limits<float>::quiet_NaN();
    default: return nd(g);
  }
}

// Bitwise (NaN equals NaN whatever its payload: a GPU returns its canonical NaN).
void expect_same_bits(const float* want, const float* got, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    uint32_t a, b;
    std::memcpy(&a, want + i, 4);
    std::memcpy(&b, got + i, 4);
    ASSERT_EQ(a, b) << what << ": element " << i << " cpu " << want[i] << " gpu " << got[i];
  }
}

struct Case {
  int64_t T, D, V;
  bool specials = false;
};

std::string label(const char* fn, const Case& c, int cfg) {
  return std::string(fn) + " T=" + std::to_string(c.T) + " D=" + std::to_string(c.D) +
         " V=" + std::to_string(c.V) + (c.specials ? " specials" : "") + " config " + std::to_string(cfg);
}

// forward: out (T, D) from table (V, D); backward: dtable (V, D) += dout (T, D).
// Both rows strided; the whole output buffer (padding too) must match.
void check_case(const Context& gpu_ctx, const Case& c, int cfg, uint32_t seed, bool backward) {
  std::mt19937 g(seed);
  const Context cpu;
  const int64_t ld_a = c.D + (seed % 3) * 2, ld_b = c.D + (seed % 2);
  const int64_t out_rows = backward ? c.V : c.T, in_rows = backward ? c.T : c.V;
  DevBuf<float> in(in_rows * ld_b, backward ? "dout" : "table"),
      out(out_rows * ld_a, backward ? "dtable" : "out");
  DevBuf<int32_t> ids(c.T, "ids");
  for (int64_t i = 0; i < in.n; ++i) in.p[i] = draw(g, c.specials);
  for (int64_t i = 0; i < out.n; ++i) out.p[i] = draw(g, c.specials);
  // Few distinct ids: rows hit by several tokens, so the order of their adds shows.
  for (int64_t t = 0; t < c.T; ++t) ids.p[t] = std::uniform_int_distribution<int32_t>(0, int32_t(c.V - 1))(g);
  std::vector<float> host(out.p, out.p + out.n);
  const Tensor id(ids.p, DType::I32, {c.T});
  if (backward) {
    embedding_backward(cpu, matrix(host.data(), c.V, c.D, ld_a), matrix(in.p, c.T, c.D, ld_b), id);
    dev::embedding_backward(gpu_ctx, matrix(out.p, c.V, c.D, ld_a), matrix(in.p, c.T, c.D, ld_b), id,
                            kConfigs[cfg]);
  } else {
    embedding_forward(cpu, matrix(host.data(), c.T, c.D, ld_a), matrix(in.p, c.V, c.D, ld_b), id);
    dev::embedding_forward(gpu_ctx, matrix(out.p, c.T, c.D, ld_a), matrix(in.p, c.V, c.D, ld_b), id,
                           kConfigs[cfg]);
  }
  expect_same_bits(host.data(), out.p, out.n,
                   label(backward ? "embedding_backward" : "embedding_forward", c, cfg));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t T : {1, 7, 33, 100})
    for (int64_t D : {1, 7, 16, 100, 300})
      for (int64_t V : {1, 5, 50}) out.push_back({T, D, V, (T + D + V) % 3 == 0});
  return out;
}

TEST(GpuEmbedding, ForwardMatchesCpu) {
  ThreadPool pool1(1), pool2(2);
  for (ThreadPool* pool : {&pool1, &pool2}) {
    Context ctx;
    ctx.pool = pool;
    int i = 0;
    for (const Case& c : cases()) {
      check_case(ctx, c, i % kNumConfigs, 100u + uint32_t(i), false);
      if (HasFatalFailure()) return;
      ++i;
    }
  }
}

TEST(GpuEmbedding, BackwardMatchesCpuInTokenOrder) {
  ThreadPool pool1(1), pool2(2);
  for (ThreadPool* pool : {&pool1, &pool2}) {
    Context ctx;
    ctx.pool = pool;
    int i = 0;
    for (const Case& c : cases()) {
      check_case(ctx, c, i % kNumConfigs, 200u + uint32_t(i), true);
      if (HasFatalFailure()) return;
      ++i;
    }
  }
}

TEST(GpuEmbedding, NoRacesInAnyThreadOrder) {
  emu::Options o;
  o.check_races = true;
  emu::ScopedOptions scoped(o);
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    check_case(ctx, {33, 100, 5, true}, cfg, 300u + uint32_t(cfg), false);
    check_case(ctx, {100, 33, 5, true}, cfg, 400u + uint32_t(cfg), true);
    if (HasFatalFailure()) return;
  }
}

// Through the CPU entry points with ctx.gpu set, on 1 and 2 pool threads.
TEST(GpuEmbedding, DispatchFromTheCpuEntryPoints) {
  const GpuBackend& be = interpret_backend();
  const auto cov = be.covered();
  for (const char* name : {"embedding_forward", "embedding_backward"})
    EXPECT_NE(std::find(cov.begin(), cov.end(), name), cov.end()) << name;
  ThreadPool pool1(1), pool2(2);
  const Context cpu;
  for (ThreadPool* pool : {&pool1, &pool2}) {
    Context ctx;
    ctx.pool = pool;
    ctx.gpu = &be;
    const int64_t T = 37, D = 129, V = 6;
    std::mt19937 g(500);
    DevBuf<float> table(V * D, "table"), dout(T * D, "dout"), out(T * D, "out"), dtable(V * D, "dtable");
    DevBuf<int32_t> ids(T, "ids");
    for (int64_t i = 0; i < V * D; ++i) table.p[i] = dtable.p[i] = draw(g, false);
    for (int64_t i = 0; i < T * D; ++i) dout.p[i] = draw(g, false);
    for (int64_t t = 0; t < T; ++t) ids.p[t] = int32_t(t * 5 % V);
    std::vector<float> out_cpu(size_t(T * D)), dtable_cpu(dtable.p, dtable.p + V * D);
    const Tensor id(ids.p, DType::I32, {T});
    embedding_forward(cpu, Tensor(out_cpu.data(), DType::F32, {T, D}), Tensor(table.p, DType::F32, {V, D}),
                      id);
    embedding_forward(ctx, Tensor(out.p, DType::F32, {T, D}), Tensor(table.p, DType::F32, {V, D}), id);
    embedding_backward(cpu, Tensor(dtable_cpu.data(), DType::F32, {V, D}), Tensor(dout.p, DType::F32, {T, D}),
                       id);
    embedding_backward(ctx, Tensor(dtable.p, DType::F32, {V, D}), Tensor(dout.p, DType::F32, {T, D}), id);
    expect_same_bits(out_cpu.data(), out.p, T * D, "dispatch forward");
    expect_same_bits(dtable_cpu.data(), dtable.p, V * D, "dispatch backward");
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// An id outside [0, V) (the last one, so a kernel writing before checking would
// have written the rest): the CPU's error, word for word, and nothing written.
TEST(GpuEmbedding, OutOfRangeIdGivesTheCpuErrorBeforeAnyWrite) {
  const int64_t T = 5, D = 8, V = 4;
  DevBuf<float> table(V * D, "table"), rows(T * D, "out");
  DevBuf<int32_t> ids(T, "ids");
  for (int64_t i = 0; i < V * D; ++i) table.p[i] = float(i);
  Context gpu;
  gpu.gpu = &interpret_backend();
  const Context cpu;
  const Tensor tab(table.p, DType::F32, {V, D}), out(rows.p, DType::F32, {T, D}), id(ids.p, DType::I32, {T});
  for (int32_t bad : {-1, int32_t(V), 1 << 30}) {
    for (int64_t t = 0; t < T; ++t) ids.p[t] = int32_t(t % V);
    ids.p[T - 1] = bad;
    for (int64_t i = 0; i < T * D; ++i) rows.p[i] = -7.0f;
    const std::string want_f = error_of([&] { embedding_forward(cpu, out, tab, id); });
    EXPECT_NE(want_f.find("token id " + std::to_string(bad) + " at position 4"), std::string::npos) << want_f;
    EXPECT_EQ(error_of([&] { embedding_forward(gpu, out, tab, id); }), want_f);
    EXPECT_EQ(error_of([&] { dev::embedding_forward(gpu, out, tab, id, EmbeddingLaunch{}); }), want_f);
    const std::string want_b = error_of([&] { embedding_backward(cpu, tab, out, id); });
    EXPECT_NE(want_b.find("outside [0, 4)"), std::string::npos) << want_b;
    EXPECT_EQ(error_of([&] { embedding_backward(gpu, tab, out, id); }), want_b);
    for (int64_t i = 0; i < T * D; ++i) ASSERT_EQ(rows.p[i], -7.0f) << i;
    for (int64_t i = 0; i < V * D; ++i) ASSERT_EQ(table.p[i], float(i)) << i;
  }
}

TEST(GpuEmbedding, LaunchConfigsThatDoNotFitThrow) {
  EXPECT_THROW(dev::check_embedding_launch({0, 1}), Error);
  EXPECT_THROW(dev::check_embedding_launch({2048, 1}), Error);
  EXPECT_THROW(dev::check_embedding_launch({32, 0}), Error);
  EXPECT_NO_THROW(dev::check_embedding_launch({}));
}

}  // namespace
}  // namespace lockstep::kernels
