// The three GEMM products on the GPU: one shared-memory tiled kernel computes
// C (R, C) (+)= A (R, T) · B (T, C) with each output one fp32 FMA chain over
// t = 0..T-1, the CPU's chain (kernels/cpu/gemm_microkernel.h), so it gives the
// CPU's bits for every tile shape. B is a packed weight (f32, bf16, fp8) or a
// plain f32/bf16 matrix, read in place and widened exactly as the CPU does.
#include "lockstep/kernels/gpu/gemm.h"
#include "lockstep/kernels/gpu/registry.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

using ::lockstep::gpu::blocks_for;
using ::lockstep::gpu::ls_add;
using ::lockstep::gpu::ls_fma;
using ::lockstep::gpu::ls_mul;

namespace {

// Where B comes from. Plain: B(t, c) at b[t * b_ts + c * b_cs]. Packed: the
// PackedWeight panels (kernels/cpu/gemm.h), T = K, C = N.
enum BSource : int { kPlainF32, kPlainBF16, kPackedF32, kPackedBF16, kPackedFP8, kPackedFP4 };

constexpr int64_t kPanelCols = 16;  // kGemmPanel, for device code

// fp8 widening of the CPU (gemm_microkernel.h): the e4m3 byte sign-extended and
// shifted left by 20, bits 30..27 cleared, is exactly fp8_to_f32(q) * 2^-120.
constexpr uint32_t kFp8KeepBits = 0x87FFFFFFu;

struct GemmArgs {
  int64_t R = 0, T = 0, C = 0;
  const float* a = nullptr;  // A(r, t) at a[r * a_rs + t * a_ts]
  int64_t a_rs = 0, a_ts = 0;
  const void* b = nullptr;
  int64_t b_ts = 0, b_cs = 0;     // plain B only
  const float* scales = nullptr;  // packed fp8: (P, KB, 16) scales times 2^120
  int64_t scale_kb = 0;           // KB
  int64_t block_k = 1;            // t per fp8 scale block
  float* c = nullptr;             // C(r, c) at c[r * ldc + c]
  int64_t ldc = 0;
  int accumulate = 0;  // C = C + chain instead of C = chain
  // Which index of a staged tile runs fastest over the threads (the one that
  // is contiguous in memory, so neighbouring threads read neighbouring words).
  int a_t_fastest = 1, b_t_fastest = 0;
  int tile_m = 0, tile_n = 0, tile_k = 0, thread_m = 0, thread_n = 0;
};

LS_DEVICE LS_INLINE float f32_from_bits(uint32_t u) {
#if defined(LOCKSTEP_GPU_INTERP)
  return __builtin_bit_cast(float, u);
#else
  return __uint_as_float(u);
#endif
}

LS_DEVICE LS_INLINE int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// The e4m3 byte of an e2m1 code's value (bit 3 the sign): 0, 0.5, 1, 1.5, 2,
// 3, 4, 6 are e4m3 exponents 6..9 with one mantissa bit.
LS_DEVICE LS_INLINE uint32_t e2m1_as_e4m3(uint32_t code) {
  const uint32_t m = code & 7u, sign = (code & 8u) << 4;
  const uint32_t mag = m == 0 ? 0u : m == 1 ? 0x30u : ((((m >> 1) + 6u) << 3) | ((m & 1u) << 2));
  return sign | mag;
}

// B(t, c) as the CPU's micro-kernel multiplies it.
template <int kB>
LS_DEVICE LS_INLINE float load_b(const GemmArgs& g, int64_t t, int64_t c) {
  if constexpr (kB == kPlainF32) {
    return static_cast<const float*>(g.b)[t * g.b_ts + c * g.b_cs];
  } else if constexpr (kB == kPlainBF16) {
    const uint16_t h = static_cast<const uint16_t*>(g.b)[t * g.b_ts + c * g.b_cs];
    return f32_from_bits(static_cast<uint32_t>(h) << 16);
  } else {
    const int64_t p = c / kPanelCols, j = c % kPanelCols;
    const int64_t row = (p * g.T + t) * kPanelCols;  // element [p][t][0] of the (P, T, 16) panels
    if constexpr (kB == kPackedF32) {
      return static_cast<const float*>(g.b)[row + j];
    } else if constexpr (kB == kPackedBF16) {
      // Word j of a row holds column j (low half) and column j + 8 (high half).
      const int64_t slot = j < 8 ? 2 * j : 2 * (j - 8) + 1;
      const uint16_t h = static_cast<const uint16_t*>(g.b)[row + slot];
      return f32_from_bits(static_cast<uint32_t>(h) << 16);
    } else {
      int32_t q = 0;
      if constexpr (kB == kPackedFP4) {
        // Byte i of a row's 8 holds column i (low nibble) and i + 8 (high).
        const uint8_t byte = static_cast<const uint8_t*>(g.b)[row / 2 + (j & 7)];
        q = static_cast<int8_t>(e2m1_as_e4m3(j < 8 ? byte & 0x0F : byte >> 4));
      } else {
        q = static_cast<int8_t>(static_cast<const uint8_t*>(g.b)[row + j]);
      }
      const float biased = f32_from_bits((static_cast<uint32_t>(q) << 20) & kFp8KeepBits);
      const float scale = g.scales[(p * g.scale_kb + t / g.block_k) * kPanelCols + j];
      return ls_mul(biased, scale);  // the one rounding of the CPU's widening
    }
  }
}

// a_tile (tile_m, tile_k) = A(r0 + i, k0 + kk) for kk < kn; rows past R are 0
// (their outputs are never stored).
LS_DEVICE void stage_a(const GemmArgs& g, float* a_tile, int64_t r0, int64_t k0, int kn) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int total = g.tile_m * kn;
  for (int idx = tid; idx < total; idx += nthreads) {
    const int i = g.a_t_fastest ? idx / kn : idx % g.tile_m;
    const int kk = g.a_t_fastest ? idx % kn : idx / g.tile_m;
    const int64_t r = r0 + i;
    a_tile[i * g.tile_k + kk] = r < g.R ? g.a[r * g.a_rs + (k0 + kk) * g.a_ts] : 0.0f;
  }
}

// b_tile (tile_k, tile_n) = B(k0 + kk, c0 + j) for kk < kn; columns past C are 0.
template <int kB>
LS_DEVICE void stage_b(const GemmArgs& g, float* b_tile, int64_t c0, int64_t k0, int kn) {
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int total = kn * g.tile_n;
  for (int idx = tid; idx < total; idx += nthreads) {
    const int j = g.b_t_fastest ? idx / kn : idx % g.tile_n;
    const int kk = g.b_t_fastest ? idx % kn : idx / g.tile_n;
    const int64_t c = c0 + j;
    b_tile[kk * g.tile_n + j] = c < g.C ? load_b<kB>(g, k0 + kk, c) : 0.0f;
  }
}

// Block (x: column tile, y: row tile). Thread (ty, tx) owns outputs
// (ty + i * threads_m, tx + j * threads_n) of the tile: strided, so the threads
// of a row read consecutive b_tile words.
template <int kB>
LS_GLOBAL void gemm_tiled_kernel(GemmArgs g) {
  LS_SHARED(float, a_tile, kGemmSharedFloats);  // (tile_m, tile_k)
  LS_SHARED(float, b_tile, kGemmSharedFloats);  // (tile_k, tile_n)
  const int tid = static_cast<int>(threadIdx.x);
  const int threads_m = g.tile_m / g.thread_m, threads_n = g.tile_n / g.thread_n;
  const int ty = tid / threads_n, tx = tid % threads_n;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * g.tile_m;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * g.tile_n;
  float acc[kGemmMaxThreadOutputs];  // (thread_m, thread_n)
  for (int i = 0; i < kGemmMaxThreadOutputs; ++i) acc[i] = 0.0f;
  for (int64_t k0 = 0; k0 < g.T; k0 += g.tile_k) {
    // Only the kn real steps: a padded step would add 0 * 0 and turn a -0 chain into +0.
    const int kn = static_cast<int>(min64(g.tile_k, g.T - k0));
    stage_a(g, a_tile, r0, k0, kn);
    stage_b<kB>(g, b_tile, c0, k0, kn);
    __syncthreads();
    for (int kk = 0; kk < kn; ++kk) {
      float bv[kGemmMaxThreadOutputs];
      for (int j = 0; j < g.thread_n; ++j) bv[j] = b_tile[kk * g.tile_n + tx + j * threads_n];
      for (int i = 0; i < g.thread_m; ++i) {
        const float av = a_tile[(ty + i * threads_m) * g.tile_k + kk];
        for (int j = 0; j < g.thread_n; ++j)
          acc[i * g.thread_n + j] = ls_fma(av, bv[j], acc[i * g.thread_n + j]);
      }
    }
    __syncthreads();  // the tiles are restaged next step
  }
  for (int i = 0; i < g.thread_m; ++i) {
    const int64_t r = r0 + ty + i * threads_m;
    if (r >= g.R) continue;
    for (int j = 0; j < g.thread_n; ++j) {
      const int64_t c = c0 + tx + j * threads_n;
      if (c >= g.C) continue;
      float* out = g.c + r * g.ldc + c;
      const float v = acc[i * g.thread_n + j];
      *out = g.accumulate ? ls_add(*out, v) : v;  // the CPU's c + acc
    }
  }
}

// out(r, t) = B(t, r): every value a product multiplies by, one thread per
// element (each is one exact widening, or the fp8/MXFP4 one rounding, of load_b).
template <int kB>
LS_GLOBAL void unpack_weight_kernel(GemmArgs g, float* out, int64_t ldo) {
  const int64_t n = g.C * g.T;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t r = i / g.T, t = i % g.T;
    out[r * ldo + t] = load_b<kB>(g, t, r);
  }
}

// CUDA's limit on gridDim.y (row tiles).
constexpr int64_t kMaxGridY = 65535;

void launch(const Context& ctx, BSource src, GemmArgs g, const GemmLaunch& cfg) {
  check_gemm_launch(cfg);
  if (g.R == 0 || g.C == 0) return;
  g.tile_m = cfg.tile_m;
  g.tile_n = cfg.tile_n;
  g.tile_k = cfg.tile_k;
  g.thread_m = cfg.thread_m;
  g.thread_n = cfg.thread_n;
  const int64_t row_tiles = blocks_for(g.R, cfg.tile_m);
  if (row_tiles > kMaxGridY)
    LS_THROW << "gemm (gpu): " << g.R << " rows in tiles of " << cfg.tile_m << " need " << row_tiles
             << " row blocks, more than the grid allows (" << kMaxGridY << "); use a larger tile_m";
  const dim3 grid(blocks_for(g.C, cfg.tile_n), static_cast<unsigned>(row_tiles));
  const dim3 block(static_cast<unsigned>(cfg.threads()));
  switch (src) {
    case kPlainF32: LS_LAUNCH(ctx, gemm_tiled_kernel<kPlainF32>, grid, block)(g); break;
    case kPlainBF16: LS_LAUNCH(ctx, gemm_tiled_kernel<kPlainBF16>, grid, block)(g); break;
    case kPackedF32: LS_LAUNCH(ctx, gemm_tiled_kernel<kPackedF32>, grid, block)(g); break;
    case kPackedBF16: LS_LAUNCH(ctx, gemm_tiled_kernel<kPackedBF16>, grid, block)(g); break;
    case kPackedFP8: LS_LAUNCH(ctx, gemm_tiled_kernel<kPackedFP8>, grid, block)(g); break;
    case kPackedFP4: LS_LAUNCH(ctx, gemm_tiled_kernel<kPackedFP4>, grid, block)(g); break;
  }
}

BSource plain_source(const Tensor& t) {
  return t.dtype == DType::BF16 ? kPlainBF16 : kPlainF32;
}

}  // namespace

void check_gemm_launch(const GemmLaunch& cfg) {
  const bool ok = cfg.tile_m > 0 && cfg.tile_n > 0 && cfg.tile_k > 0 && cfg.thread_m > 0 &&
                  cfg.thread_n > 0 && cfg.tile_m % cfg.thread_m == 0 && cfg.tile_n % cfg.thread_n == 0 &&
                  cfg.thread_m * cfg.thread_n <= kGemmMaxThreadOutputs &&
                  cfg.tile_m * cfg.tile_k <= kGemmSharedFloats &&
                  cfg.tile_k * cfg.tile_n <= kGemmSharedFloats && cfg.threads() <= 1024;
  if (!ok)
    LS_THROW << "gemm (gpu): launch tile " << cfg.tile_m << " x " << cfg.tile_n << " x " << cfg.tile_k
             << " with " << cfg.thread_m << " x " << cfg.thread_n
             << " outputs per thread does not fit: need thread_m | tile_m, thread_n | tile_n, thread_m * "
                "thread_n <= "
             << kGemmMaxThreadOutputs << ", tile_m * tile_k and tile_k * tile_n <= " << kGemmSharedFloats
             << ", at most 1024 threads";
}

namespace {

// The B side of products with a packed weight: its source and arguments.
BSource packed_source(const PackedWeight& w, GemmArgs& g) {
  g.T = w.k;
  g.C = w.n;
  if (w.in_place()) {  // f32 rows read in place: B(t, c) = rows[c * rows_ld + t]
    g.b = w.rows;
    g.b_ts = 1;
    g.b_cs = w.rows_ld;
    g.b_t_fastest = 1;
    return kPlainF32;
  }
  g.b = w.data.data();
  g.b_t_fastest = 0;  // a panel row holds 16 columns of one t
  BSource src = kPackedF32;
  if (w.storage == DType::BF16) {
    src = kPackedBF16;
  } else if (w.storage == DType::FP8E4M3) {
    src = w.mxfp4 ? kPackedFP4 : kPackedFP8;
    g.scales = w.panel_scales.as<float>();
    g.scale_kb = w.scale_blocks_k();
    g.block_k = w.block_k > 0 ? w.block_k : (w.k > 1 ? w.k : 1);  // as the CPU's run_range
  } else {
    LS_CHECK(w.storage == DType::F32) << "gemm (gpu): packed storage " << dtype_name(w.storage);
  }
  return src;
}

}  // namespace

void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const PackedWeight& w, bool accumulate,
              const GemmLaunch& cfg) {
  check_gemm_xwt(y, x, w);
  GemmArgs g;
  const BSource src = packed_source(w, g);
  g.R = x.shape[0];
  g.a = static_cast<const float*>(x.data);
  g.a_rs = x.stride[0];
  g.a_ts = 1;
  g.c = static_cast<float*>(y.data);
  g.ldc = y.stride[0];
  g.accumulate = accumulate ? 1 : 0;
  launch(ctx, src, g, cfg);
}

void unpack_weight(const Context& ctx, Tensor w_out, const PackedWeight& pw) {
  GemmArgs g;
  const BSource src = packed_source(pw, g);
  if (pw.n == 0 || pw.k == 0) return;
  float* out = static_cast<float*>(w_out.data);
  const int64_t ldo = w_out.stride[0];
  const dim3 grid(blocks_for(pw.n * pw.k, 256)), block(256);
  switch (src) {
    case kPlainF32: LS_LAUNCH(ctx, unpack_weight_kernel<kPlainF32>, grid, block)(g, out, ldo); break;
    case kPlainBF16: LS_LAUNCH(ctx, unpack_weight_kernel<kPlainBF16>, grid, block)(g, out, ldo); break;
    case kPackedF32: LS_LAUNCH(ctx, unpack_weight_kernel<kPackedF32>, grid, block)(g, out, ldo); break;
    case kPackedBF16: LS_LAUNCH(ctx, unpack_weight_kernel<kPackedBF16>, grid, block)(g, out, ldo); break;
    case kPackedFP8: LS_LAUNCH(ctx, unpack_weight_kernel<kPackedFP8>, grid, block)(g, out, ldo); break;
    case kPackedFP4: LS_LAUNCH(ctx, unpack_weight_kernel<kPackedFP4>, grid, block)(g, out, ldo); break;
  }
}

void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const Tensor& w, bool accumulate,
              const GemmLaunch& cfg) {
  check_gemm_xwt(y, x, w);
  GemmArgs g;
  g.R = x.shape[0];
  g.T = w.shape[1];
  g.C = w.shape[0];
  g.a = static_cast<const float*>(x.data);
  g.a_rs = x.stride[0];
  g.a_ts = 1;
  g.b = w.data;
  g.b_ts = 1;  // B(k, n) = W[n, k]
  g.b_cs = w.stride[0];
  g.b_t_fastest = 1;
  g.c = static_cast<float*>(y.data);
  g.ldc = y.stride[0];
  g.accumulate = accumulate ? 1 : 0;
  launch(ctx, plain_source(w), g, cfg);
}

void gemm_dyw(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& w, bool accumulate,
              const GemmLaunch& cfg) {
  check_gemm_dyw(dx, dy, w);
  GemmArgs g;
  g.R = dy.shape[0];
  g.T = w.shape[0];
  g.C = w.shape[1];
  g.a = static_cast<const float*>(dy.data);
  g.a_rs = dy.stride[0];
  g.a_ts = 1;
  g.b = w.data;
  g.b_ts = w.stride[0];  // B(n, k) = W[n, k]
  g.b_cs = 1;
  g.c = static_cast<float*>(dx.data);
  g.ldc = dx.stride[0];
  g.accumulate = accumulate ? 1 : 0;
  launch(ctx, plain_source(w), g, cfg);
}

void gemm_dytx(const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x, bool accumulate,
               const GemmLaunch& cfg) {
  check_gemm_dytx(dw, dy, x);
  GemmArgs g;
  g.R = dw.shape[0];
  g.T = x.shape[0];
  g.C = x.shape[1];
  g.a = static_cast<const float*>(dy.data);
  g.a_rs = 1;  // A(n, m) = dY[m, n]
  g.a_ts = dy.stride[0];
  g.a_t_fastest = 0;
  g.b = x.data;
  g.b_ts = x.stride[0];  // B(m, k) = X[m, k]
  g.b_cs = 1;
  g.c = static_cast<float*>(dw.data);
  g.ldc = dw.stride[0];
  g.accumulate = accumulate ? 1 : 0;
  launch(ctx, kPlainF32, g, cfg);
}

void register_gemm(GpuBackend& b) {
  b.gemm_xwt_packed = [](const Context& ctx, Tensor y, const Tensor& x, const PackedWeight& w, bool acc) {
    gemm_xwt(ctx, y, x, w, acc, GemmLaunch{});
  };
  b.unpack_weight = unpack_weight;
  b.gemm_xwt = [](const Context& ctx, Tensor y, const Tensor& x, const Tensor& w, bool acc) {
    gemm_xwt(ctx, y, x, w, acc, GemmLaunch{});
  };
  b.gemm_dyw = [](const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& w, bool acc) {
    gemm_dyw(ctx, dx, dy, w, acc, GemmLaunch{});
  };
  b.gemm_dytx = [](const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x, bool acc) {
    gemm_dytx(ctx, dw, dy, x, acc, GemmLaunch{});
  };
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
