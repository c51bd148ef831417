// The GPU GEMM kernels (kernels/gpu/gemm.cu) in interpret mode against the CPU
// kernels, bit for bit: every product and packed storage, odd shapes, row
// strides, accumulate on and off, several block shapes, special values, the
// race check, 1 and 2 pool threads, the dispatch from the CPU entry points and
// the CPU's errors.
//
// Negative control (done once by hand): with the kernel's inner loop run over
// kk descending inside each staged tile, XwtPackedMatchesCpuOnEveryShape fails
// on its first shape with a rounding in the chain (f32, M=1 N=1 K=7), and so
// do the other product tests; restoring the order makes them pass.
#include "lockstep/kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/gemm.h"

namespace lockstep::kernels {
namespace {

namespace emu = lockstep::gpu::emu;
namespace dev = lockstep::kernels::gpu::interp;
using dev::GemmLaunch;

const int64_t kSizes[] = {1, 7, 16, 17, 33, 64, 100};

// Block shapes: the default, small and odd tiles, a tile_k that does not
// divide K, tiles that are not a multiple of the 16-column panels.
const GemmLaunch kConfigs[] = {
    {},                  // 64 x 64 x 16, 4 x 4 outputs per thread: 256 threads
    {16, 16, 8, 2, 2},   // 64 threads
    {32, 16, 7, 4, 1},   // tile_k 7: 128 threads
    {8, 40, 32, 1, 4},   // 80 threads, panels split across column tiles
    {1, 16, 5, 1, 1},    // one row, 16 threads
    {24, 24, 64, 3, 3},  // 64 threads, the whole K = 64 in one stage
};

// A (rows, cols) matrix of f32 or bf16 with row stride ld in emulated device
// memory; every element, the padding between rows too, gets a value.
struct DevMat {
  DevMat(int64_t rows_, int64_t cols_, int64_t ld_, DType dt_, const char* what)
      : rows(rows_),
        cols(cols_),
        ld(ld_),
        dt(dt_),
        bytes(static_cast<size_t>(std::max<int64_t>(1, rows * ld)) * dtype_size(dt)),
        p(emu::device_alloc(bytes, what)) {}
  ~DevMat() { emu::device_free(p); }
  DevMat(const DevMat&) = delete;
  DevMat& operator=(const DevMat&) = delete;

  Tensor view() const {
    Tensor t;
    t.data = p;
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.stride[0] = ld;
    t.stride[1] = 1;
    return t;
  }
  void set(int64_t i, float v) {
    if (dt == DType::BF16) {
      static_cast<bf16_t*>(p)[i] = f32_to_bf16(v);
    } else {
      static_cast<float*>(p)[i] = v;
    }
  }
  int64_t elems() const { return std::max<int64_t>(1, rows * ld); }

  int64_t rows, cols, ld;
  DType dt;
  size_t bytes;
  void* p;
};

// Values for a test matrix: normal floats, and with `specials` also zeros of
// both signs, subnormals, tiny values whose products underflow, inf and NaN.
float draw(std::mt19937& g, bool specials) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  if (!specials) return nd(g);
  switch (std::uniform_int_distribution<int>(0, 15)(g)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return std::ldexp(nd(g), -130);  // subnormal
    case 3: return std::ldexp(nd(g), -70);   // products underflow to subnormals or +-0
    case 4: return std::numeric_limits<float>::infinity();
    case 5: return -std::numeric_limits<float>::infinity();
    case 6: return std::numeric_limits<float>::quiet_NaN();
    case 7: return std::ldexp(nd(g), 60);  // products near the top of the range
    default: return nd(g);
  }
}

void fill(DevMat& m, std::mt19937& g, bool specials = false) {
  for (int64_t i = 0; i < m.elems(); ++i) m.set(i, draw(g, specials));
}

// A random row stride for a matrix of `cols` columns: sometimes exact, sometimes padded.
int64_t pick_ld(std::mt19937& g, int64_t cols) {
  return cols + std::uniform_int_distribution<int64_t>(0, 2)(g) * 3;
}

// Bitwise equality of whole buffers (padding included: a kernel that writes
// between rows fails). NaN equals NaN whatever its payload and sign: the CPU
// returns the NaN of whichever operand x86 picks, a GPU its one canonical NaN.
void expect_same_bits(const float* want, const float* got, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    uint32_t a, b;
    std::memcpy(&a, want + i, 4);
    std::memcpy(&b, got + i, 4);
    ASSERT_EQ(a, b) << what << ": element " << i << " cpu " << want[i] << " gpu " << got[i];
  }
}

// The output twice: a host copy for the CPU, the device buffer for the GPU,
// both starting from the same bits.
struct OutPair {
  OutPair(int64_t rows, int64_t cols, int64_t ld, std::mt19937& g, bool specials = false)
      : dev(rows, cols, ld, DType::F32, "y") {
    fill(dev, g, specials);
    host.assign(static_cast<float*>(dev.p), static_cast<float*>(dev.p) + dev.elems());
  }
  Tensor cpu() {
    Tensor t = dev.view();
    t.data = host.data();
    return t;
  }
  void compare(const std::string& what) const {
    expect_same_bits(host.data(), static_cast<const float*>(dev.p), dev.elems(), what);
  }
  DevMat dev;
  std::vector<float> host;
};

std::string label(const char* fn, int64_t M, int64_t N, int64_t K, bool acc, int cfg, const char* kind) {
  return std::string(fn) + " " + kind + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
         " K=" + std::to_string(K) + (acc ? " accumulate" : "") + " config " + std::to_string(cfg);
}

enum class Storage { F32, BF16, Fp8Tensor, Fp8Block16, Fp8Bytes, Mxfp4 };
const char* storage_name(Storage s) {
  switch (s) {
    case Storage::F32: return "f32";
    case Storage::BF16: return "bf16";
    case Storage::Fp8Tensor: return "fp8 per-tensor";
    case Storage::Fp8Block16: return "fp8 16x16 blocks";
    case Storage::Mxfp4: return "mxfp4";
    default: return "fp8 raw bytes";
  }
}

// A packed (N, K) weight. Fp8Bytes packs random e4m3 bytes (every finite
// code, subnormals included) with random scales in (0, 256) in 8 x 8 blocks.
PackedWeight make_packed(const Context& cpu, Storage s, int64_t N, int64_t K, std::mt19937& g,
                         bool specials) {
  if (s == Storage::Fp8Bytes) {
    std::vector<fp8_t> q(static_cast<size_t>(N * K));
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& v : q) {
      do v = static_cast<fp8_t>(byte(g));
      while ((v & 0x7f) == 0x7f);  // e4m3 NaN
    }
    const int64_t B = 8, NB = (N + B - 1) / B, KB = (K + B - 1) / B;
    std::vector<float> sc(static_cast<size_t>(NB * KB));
    for (auto& v : sc) v = std::uniform_real_distribution<float>(1e-3f, 255.0f)(g);
    return pack_weight_fp8(cpu, Tensor(q.data(), DType::FP8E4M3, {N, K}),
                           Tensor(sc.data(), DType::F32, {NB, KB}), B);
  }
  // fp8 cannot hold inf/NaN: specials only for f32 and bf16.
  const bool sp = specials && (s == Storage::F32 || s == Storage::BF16);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (auto& v : w) v = draw(g, sp);
  const Tensor wt(w.data(), DType::F32, {N, K});
  if (s == Storage::Mxfp4) return pack_weight_mxfp4(cpu, wt);  // K a multiple of 32
  switch (s) {
    case Storage::F32: return pack_weight(cpu, wt, DType::F32);
    case Storage::BF16: return pack_weight(cpu, wt, DType::BF16);
    case Storage::Fp8Tensor: return pack_weight(cpu, wt, DType::FP8E4M3, 0);
    default: return pack_weight(cpu, wt, DType::FP8E4M3, 16);
  }
}

// Y = X·Wᵀ (+ Y) with a packed weight, CPU against GPU with config `cfg`.
void check_xwt_packed(const Context& gpu_ctx, Storage s, int64_t M, int64_t N, int64_t K, bool acc, int cfg,
                      uint32_t seed, bool specials = false) {
  std::mt19937 g(seed);
  const Context cpu;
  const PackedWeight w = make_packed(cpu, s, N, K, g, specials);
  DevMat x(M, K, pick_ld(g, K), DType::F32, "x");
  fill(x, g, specials);
  OutPair y(M, N, pick_ld(g, N), g, specials);
  gemm_xwt(cpu, y.cpu(), x.view(), w, acc);
  dev::gemm_xwt(gpu_ctx, y.dev.view(), x.view(), w, acc, kConfigs[cfg]);
  y.compare(label("gemm_xwt packed", M, N, K, acc, cfg, storage_name(s)));
}

// The three products with a plain operand, W/X of dtype `wt`.
enum class Product { Xwt, Dyw, Dytx };

void check_plain(const Context& gpu_ctx, Product pr, DType wt, int64_t M, int64_t N, int64_t K, bool acc,
                 int cfg, uint32_t seed, bool specials = false) {
  std::mt19937 g(seed);
  const Context cpu;
  const GemmLaunch& lc = kConfigs[cfg];
  if (pr == Product::Xwt) {
    DevMat x(M, K, pick_ld(g, K), DType::F32, "x"), w(N, K, pick_ld(g, K), wt, "w");
    fill(x, g, specials);
    fill(w, g, specials);
    OutPair y(M, N, pick_ld(g, N), g, specials);
    gemm_xwt(cpu, y.cpu(), x.view(), w.view(), acc);
    dev::gemm_xwt(gpu_ctx, y.dev.view(), x.view(), w.view(), acc, lc);
    y.compare(label("gemm_xwt", M, N, K, acc, cfg, dtype_name(wt)));
  } else if (pr == Product::Dyw) {
    DevMat dy(M, N, pick_ld(g, N), DType::F32, "dy"), w(N, K, pick_ld(g, K), wt, "w");
    fill(dy, g, specials);
    fill(w, g, specials);
    OutPair dx(M, K, pick_ld(g, K), g, specials);
    gemm_dyw(cpu, dx.cpu(), dy.view(), w.view(), acc);
    dev::gemm_dyw(gpu_ctx, dx.dev.view(), dy.view(), w.view(), acc, lc);
    dx.compare(label("gemm_dyw", M, N, K, acc, cfg, dtype_name(wt)));
  } else {
    DevMat dy(M, N, pick_ld(g, N), DType::F32, "dy"), x(M, K, pick_ld(g, K), DType::F32, "x");
    fill(dy, g, specials);
    fill(x, g, specials);
    OutPair dw(N, K, pick_ld(g, K), g, specials);
    gemm_dytx(cpu, dw.cpu(), dy.view(), x.view(), acc);
    dev::gemm_dytx(gpu_ctx, dw.dev.view(), dy.view(), x.view(), acc, lc);
    dw.compare(label("gemm_dytx", M, N, K, acc, cfg, "f32"));
  }
}

constexpr int kNumConfigs = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));

// Every (M, N, K) of kSizes, storage by storage; accumulate and the block
// shape vary with the case so each meets every size.
TEST(GpuGemm, XwtPackedMatchesCpuOnEveryShape) {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  int i = 0;
  for (Storage s : {Storage::F32, Storage::BF16, Storage::Fp8Block16})
    for (int64_t M : kSizes)
      for (int64_t N : kSizes)
        for (int64_t K : kSizes) {
          check_xwt_packed(ctx, s, M, N, K, i % 2 == 1, i % kNumConfigs, 1000u + uint32_t(i));
          if (HasFatalFailure()) return;
          ++i;
        }
}

TEST(GpuGemm, XwtPackedFp8ScalesAndSubnormalCodes) {
  Context ctx;
  int i = 0;
  for (Storage s : {Storage::Fp8Tensor, Storage::Fp8Block16, Storage::Fp8Bytes})
    for (int64_t M : {1, 17, 64})
      for (int64_t N : {7, 33, 100})
        for (int64_t K : {1, 16, 17, 100}) {
          check_xwt_packed(ctx, s, M, N, K, i % 2 == 0, (i + 3) % kNumConfigs, 2000u + uint32_t(i));
          if (HasFatalFailure()) return;
          ++i;
        }
}

// MXFP4 nibbles (both nibbles of a byte, every code, 1 x 32 scale blocks):
// the GPU's reading of the packing gives the CPU's bits.
TEST(GpuGemm, XwtPackedMxfp4) {
  Context ctx;
  int i = 0;
  for (int64_t M : {1, 9, 64})
    for (int64_t N : {7, 16, 33})
      for (int64_t K : {32, 64, 160}) {
        check_xwt_packed(ctx, Storage::Mxfp4, M, N, K, i % 2 == 0, (i + 1) % kNumConfigs,
                         2500u + uint32_t(i));
        if (HasFatalFailure()) return;
        ++i;
      }
}

// unpack_weight: the values the products multiply by (bf16/fp8 training's
// widened copy), GPU entry against the CPU at every storage, in-place f32
// rows too, padded output rows kept as they were.
TEST(GpuGemm, UnpackWeightMatchesCpu) {
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  const Context cpu;
  int i = 0;
  for (Storage s : {Storage::F32, Storage::BF16, Storage::Fp8Tensor, Storage::Fp8Block16, Storage::Fp8Bytes,
                    Storage::Mxfp4})
    for (int64_t N : {1, 7, 16, 33})
      for (int64_t K : {32, 64, 96}) {
        std::mt19937 g(3000u + uint32_t(i++));
        const PackedWeight w = make_packed(cpu, s, N, K, g, true);
        OutPair out(N, K, pick_ld(g, K), g);
        unpack_weight(cpu, out.cpu(), w);
        dev::unpack_weight(ctx, out.dev.view(), w);
        out.compare(std::string("unpack_weight ") + storage_name(s) + " N=" + std::to_string(N) +
                    " K=" + std::to_string(K));
        if (HasFatalFailure()) return;
      }
  std::mt19937 g(7);
  DevMat rows(9, 40, 43, DType::F32, "rows");
  fill(rows, g, true);
  std::vector<float> host_rows(static_cast<float*>(rows.p), static_cast<float*>(rows.p) + rows.elems());
  Tensor host_view = rows.view();
  host_view.data = host_rows.data();
  OutPair out(9, 40, 41, g);
  unpack_weight(cpu, out.cpu(), in_place_weight(host_view));
  dev::unpack_weight(ctx, out.dev.view(), in_place_weight(rows.view()));
  out.compare("unpack_weight in place");
}

// A sample of the size grid for the plain-operand products.
void for_sampled_shapes(uint32_t seed, int count,
                        const std::function<void(int64_t, int64_t, int64_t, int)>& fn) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> pick(0, 6);
  for (int i = 0; i < count; ++i) fn(kSizes[pick(g)], kSizes[pick(g)], kSizes[pick(g)], i);
}

TEST(GpuGemm, PlainProductsMatchCpu) {
  ThreadPool pool1(1), pool2(2);
  for (ThreadPool* pool : {&pool1, &pool2}) {
    Context ctx;
    ctx.pool = pool;
    for (Product pr : {Product::Xwt, Product::Dyw, Product::Dytx})
      for (DType wt : {DType::F32, DType::BF16}) {
        if (pr == Product::Dytx && wt == DType::BF16) continue;  // X is f32 only
        for_sampled_shapes(
            3000u + uint32_t(pr) * 10 + uint32_t(wt), 40, [&](int64_t M, int64_t N, int64_t K, int i) {
              check_plain(ctx, pr, wt, M, N, K, i % 2 == 0, i % kNumConfigs, 4000u + uint32_t(i));
            });
        if (HasFatalFailure()) return;
      }
  }
}

// Zeros of both signs, subnormals, underflowing products, inf and NaN in every
// operand (fp8 weights are finite by construction; its subnormal codes are in
// XwtPackedFp8ScalesAndSubnormalCodes).
TEST(GpuGemm, SpecialValuesMatchCpu) {
  Context ctx;
  int i = 0;
  for (int64_t M : {1, 17, 33})
    for (int64_t N : {7, 16, 100})
      for (int64_t K : {1, 17, 64}) {
        for (Storage s : {Storage::F32, Storage::BF16, Storage::Fp8Block16})
          check_xwt_packed(ctx, s, M, N, K, i % 2 == 0, i % kNumConfigs, 5000u + uint32_t(i), true);
        check_plain(ctx, Product::Xwt, DType::BF16, M, N, K, i % 2 == 1, i % kNumConfigs, 6000u + uint32_t(i),
                    true);
        check_plain(ctx, Product::Dyw, DType::F32, M, N, K, i % 2 == 0, i % kNumConfigs, 7000u + uint32_t(i),
                    true);
        check_plain(ctx, Product::Dytx, DType::F32, M, N, K, i % 2 == 1, i % kNumConfigs, 8000u + uint32_t(i),
                    true);
        if (HasFatalFailure()) return;
        ++i;
      }
}

// Every launch run in three thread orders, which must agree byte for byte.
TEST(GpuGemm, NoRacesInAnyThreadOrder) {
  emu::Options o;
  o.check_races = true;
  emu::ScopedOptions scoped(o);
  ThreadPool pool(2);
  Context ctx;
  ctx.pool = &pool;
  for (int cfg = 0; cfg < kNumConfigs; ++cfg) {
    check_xwt_packed(ctx, Storage::F32, 33, 17, 100, cfg % 2 == 0, cfg, 9000u + uint32_t(cfg));
    check_xwt_packed(ctx, Storage::BF16, 7, 40, 33, cfg % 2 == 1, cfg, 9100u + uint32_t(cfg));
    check_xwt_packed(ctx, Storage::Fp8Block16, 17, 33, 64, cfg % 2 == 0, cfg, 9200u + uint32_t(cfg));
    check_plain(ctx, Product::Xwt, DType::BF16, 16, 33, 17, cfg % 2 == 1, cfg, 9300u + uint32_t(cfg));
    check_plain(ctx, Product::Dyw, DType::F32, 33, 17, 7, cfg % 2 == 0, cfg, 9400u + uint32_t(cfg));
    check_plain(ctx, Product::Dytx, DType::F32, 64, 33, 17, true, cfg, 9500u + uint32_t(cfg));
    if (HasFatalFailure()) return;
  }
}

// The CPU entry points with ctx.gpu set forward to the interpret backend and
// give the CPU's bits, on 1 and 2 pool threads.
TEST(GpuGemm, DispatchFromTheCpuEntryPoints) {
  const GpuBackend& be = interpret_backend();
  for (const char* name : {"gemm_xwt_packed", "gemm_xwt", "gemm_dyw", "gemm_dytx"}) {
    const auto cov = be.covered();
    EXPECT_NE(std::find(cov.begin(), cov.end(), name), cov.end()) << name;
  }
  ThreadPool pool1(1), pool2(2);
  const Context cpu;
  int i = 0;
  for (ThreadPool* pool : {&pool1, &pool2}) {
    Context ctx;
    ctx.pool = pool;
    ctx.gpu = &be;
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 100, 33}, {17, 7, 64}, {100, 33, 17}}) {
      std::mt19937 g(10000u + uint32_t(i++));
      DevMat x(M, K, K + 1, DType::F32, "x"), w(N, K, K, DType::BF16, "w"), dy(M, N, N + 2, DType::F32, "dy");
      fill(x, g);
      fill(w, g);
      fill(dy, g);
      const PackedWeight pw = pack_weight(cpu, w.view(), DType::FP8E4M3, 16);
      OutPair y1(M, N, N, g), y2(M, N, N + 3, g), dx(M, K, K, g), dw(N, K, K + 1, g);
      gemm_xwt(cpu, y1.cpu(), x.view(), pw, true);
      gemm_xwt(ctx, y1.dev.view(), x.view(), pw, true);
      gemm_xwt(cpu, y2.cpu(), x.view(), w.view());
      gemm_xwt(ctx, y2.dev.view(), x.view(), w.view());
      gemm_dyw(cpu, dx.cpu(), dy.view(), w.view());
      gemm_dyw(ctx, dx.dev.view(), dy.view(), w.view());
      gemm_dytx(cpu, dw.cpu(), dy.view(), x.view());
      gemm_dytx(ctx, dw.dev.view(), dy.view(), x.view());
      y1.compare("dispatch gemm_xwt packed");
      y2.compare("dispatch gemm_xwt");
      dx.compare("dispatch gemm_dyw");
      dw.compare("dispatch gemm_dytx");
      if (HasFatalFailure()) return;
    }
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

// Bad arguments give the CPU's message, word for word, through the dispatch.
TEST(GpuGemm, SameErrorsAsTheCpu) {
  const Context cpu;
  Context gpu;
  gpu.gpu = &interpret_backend();
  std::vector<float> a(64), b(64), c(64);
  std::vector<int32_t> ints(64);
  const Tensor x(a.data(), DType::F32, {4, 8}), w(b.data(), DType::F32, {2, 8}),
      y(c.data(), DType::F32, {4, 2});
  const Tensor y_bad(c.data(), DType::F32, {4, 3}), w_i32(ints.data(), DType::I32, {2, 8});
  const Tensor x_1d(a.data(), DType::F32, {32});
  Tensor x_strided = Tensor(a.data(), DType::F32, {4, 8});
  x_strided.stride[0] = 5;  // rows overlap
  const PackedWeight pw = pack_weight(cpu, w, DType::BF16);
  using Call = std::function<void(const Context&)>;
  const std::vector<Call> calls = {
      [&](const Context& c) { gemm_xwt(c, y_bad, x, pw); },
      [&](const Context& c) { gemm_xwt(c, y, x_1d, pw); },
      [&](const Context& c) { gemm_xwt(c, y_bad, x, w); },
      [&](const Context& c) { gemm_xwt(c, y, x, w_i32); },
      [&](const Context& c) { gemm_xwt(c, y, x_strided, w); },
      [&](const Context& c) { gemm_dyw(c, x, y_bad, w); },
      [&](const Context& c) { gemm_dyw(c, x, y, w_i32); },
      [&](const Context& c) { gemm_dytx(c, w, y_bad, x); },
      [&](const Context& c) { gemm_dytx(c, w_i32, y, x); },
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string want = error_of([&] { calls[i](cpu); });
    EXPECT_NE(want, "(no error)") << i;
    EXPECT_EQ(error_of([&] { calls[i](gpu); }), want) << i;
  }
}

TEST(GpuGemm, LaunchConfigsThatDoNotFitThrow) {
  EXPECT_THROW(dev::check_gemm_launch({64, 64, 16, 3, 4}), Error);   // 3 does not divide 64
  EXPECT_THROW(dev::check_gemm_launch({64, 64, 16, 8, 4}), Error);   // 32 accumulators per thread
  EXPECT_THROW(dev::check_gemm_launch({64, 64, 128, 4, 4}), Error);  // 8192 floats of shared tile
  EXPECT_THROW(dev::check_gemm_launch({64, 64, 16, 1, 1}), Error);   // 4096 threads
  EXPECT_NO_THROW(dev::check_gemm_launch({}));
}

// What a 64 x 64 x 64 f32 product costs in interpret mode (printed, not checked).
TEST(GpuGemm, InterpretTimeOf64Cubed) {
  std::mt19937 g(11);
  const Context ctx;
  DevMat x(64, 64, 64, DType::F32, "x"), w(64, 64, 64, DType::F32, "w");
  fill(x, g);
  fill(w, g);
  const PackedWeight pw = pack_weight(ctx, w.view(), DType::F32);
  OutPair y(64, 64, 64, g);
  dev::gemm_xwt(ctx, y.dev.view(), x.view(), pw, false, GemmLaunch{});  // warm-up
  const int reps = 5;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) dev::gemm_xwt(ctx, y.dev.view(), x.view(), pw, false, GemmLaunch{});
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  gemm_xwt(ctx, y.cpu(), x.view(), pw, false);
  y.compare("64^3");
  std::printf("interpret mode: 64x64x64 f32 gemm_xwt, default launch (1 block of 256 threads): %.2f ms\n",
              ms);
  RecordProperty("interpret_ms_64cubed", std::to_string(ms));
}

}  // namespace
}  // namespace lockstep::kernels
