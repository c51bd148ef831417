// Packing of linear-layer weights into 16-column panels (f32, bf16 or fp8 e4m3
// with per-tensor or per-block scales, MXFP4 values in fp8 storage), their exact unpacking, and the panel
// staging helpers the GEMM drivers use for plain operands.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/gemm_microkernel.h"
#include "lockstep/kernels/cpu/transpose.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

using gemm_detail::BKind;
using gemm_detail::kPanel;

namespace gemm_detail {

void widen_panel(BKind kind, const void* src, const float* scales, int64_t block_k, int64_t t_count,
                 float* dst) {
  if (kind == BKind::F32) {
    std::memcpy(dst, src, static_cast<size_t>(t_count * kPanel) * sizeof(float));
    return;
  }
  const int64_t seg = (has_scales(kind) && block_k > 0) ? block_k : std::max<int64_t>(t_count, 1);
  int64_t kb = 0;
  for (int64_t t0 = 0; t0 < t_count; t0 += seg, ++kb) {
    const int64_t t1 = std::min(t_count, t0 + seg);
    const float* s = has_scales(kind) ? scales + kb * kPanel : nullptr;
#if LOCKSTEP_GEMM_AVX2
    const __m256 s_lo = s ? _mm256_loadu_ps(s) : _mm256_setzero_ps();
    const __m256 s_hi = s ? _mm256_loadu_ps(s + 8) : _mm256_setzero_ps();
    for (int64_t t = t0; t < t1; ++t) {
      __m256 lo, hi;
      if (kind == BKind::BF16) {
        load_b<BKind::BF16>(src, t * kPanel, s_lo, s_hi, lo, hi);
      } else if (kind == BKind::FP4) {
        load_b<BKind::FP4>(src, t * kPanel, s_lo, s_hi, lo, hi);
      } else {
        load_b<BKind::FP8>(src, t * kPanel, s_lo, s_hi, lo, hi);
      }
      _mm256_storeu_ps(dst + t * kPanel, lo);
      _mm256_storeu_ps(dst + t * kPanel + 8, hi);
    }
#else
    for (int64_t t = t0; t < t1; ++t)
      for (int j = 0; j < kPanel; ++j)
        dst[t * kPanel + j] = kind == BKind::BF16  ? load_b1<BKind::BF16>(src, t * kPanel, j, nullptr)
                              : kind == BKind::FP4 ? load_b1<BKind::FP4>(src, t * kPanel, j, s)
                                                   : load_b1<BKind::FP8>(src, t * kPanel, j, s);
#endif
  }
}

namespace {
// Copies 16 columns of one source row into a panel row (widening bf16);
// columns at or past `n` are zero.
inline void copy_panel_row(const void* src, bool is_bf16, int64_t off, int64_t n, float* d) {
#if LOCKSTEP_GEMM_AVX2
  if (n == kPanel) {
    if (is_bf16) {
      const __m256i h =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const bf16_t*>(src) + off));
      const __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
      const __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
      _mm256_store_ps(d, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
      _mm256_store_ps(d + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
    } else {
      const float* s = static_cast<const float*>(src) + off;
      _mm256_store_ps(d, _mm256_loadu_ps(s));
      _mm256_store_ps(d + 8, _mm256_loadu_ps(s + 8));
    }
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j)
    d[j] = is_bf16 ? bf16_to_f32(static_cast<const bf16_t*>(src)[off + j])
                   : static_cast<const float*>(src)[off + j];
  for (int64_t j = n; j < kPanel; ++j) d[j] = 0.0f;
}
}  // namespace

void pack_plain_panels(const void* src, bool is_bf16, int64_t ld, int64_t t_count, int64_t col0,
                       int64_t n_panels, int64_t cols, float* dst) {
  // Blocks of 16 source rows: their segments (at most a few KiB each) are read
  // from memory once and stay in L1 while each panel receives 16 consecutive
  // rows, so writes go out in 1 KiB runs instead of one line per panel per row
  // (panels a power-of-two apart would then share cache sets).
  constexpr int64_t kRowBlock = 16;
  for (int64_t t0 = 0; t0 < t_count; t0 += kRowBlock) {
    const int64_t t1 = std::min(t_count, t0 + kRowBlock);
    for (int64_t q = 0; q < n_panels; ++q) {
      const int64_t c = col0 + q * kPanel;
      const int64_t n = std::clamp<int64_t>(cols - c, 0, kPanel);
      for (int64_t t = t0; t < t1; ++t)
        copy_panel_row(src, is_bf16, t * ld + c, n, dst + (q * t_count + t) * kPanel);
    }
  }
}

void stage_row_panels(const float* rows, int64_t ld, int64_t t_count, int64_t col0, int64_t n_panels,
                      int64_t cols, float* dst) {
  // 16 x 16 blocks: the block's 16 row segments (1 KiB) stay in L1 while it
  // is written out as 16 panel rows of 16.
  constexpr int64_t kTBlock = 16;
  for (int64_t q = 0; q < n_panels; ++q) {
    const int64_t c = col0 + q * kPanel;
    const int64_t n = std::clamp<int64_t>(cols - c, 0, kPanel);
    float* panel = dst + q * t_count * kPanel;
    for (int64_t t0 = 0; t0 < t_count; t0 += kTBlock) {
      const int64_t t1 = std::min(t_count, t0 + kTBlock);
#if LOCKSTEP_GEMM_AVX2
      if (n == kPanel && t1 - t0 == kTBlock) {  // a whole block: four 8 x 8 transposes
        for (int64_t j0 = 0; j0 < kPanel; j0 += 8)
          for (int64_t u0 = t0; u0 < t1; u0 += 8)
            transpose8x8(rows + (c + j0) * ld + u0, ld, panel + u0 * kPanel + j0, kPanel);
        continue;
      }
#endif
      for (int64_t j = 0; j < kPanel; ++j) {
        if (j >= n) {
          for (int64_t t = t0; t < t1; ++t) panel[t * kPanel + j] = 0.0f;
          continue;
        }
        const float* src = rows + (c + j) * ld;
        for (int64_t t = t0; t < t1; ++t) panel[t * kPanel + j] = src[t];
      }
    }
  }
}

}  // namespace gemm_detail

namespace {

constexpr float kRebias = gemm_detail::kFp8Rebias;
// Largest allowed fp8 scale: scale * 2^120 must stay a finite f32 (see
// gemm_microkernel.h), i.e. scale < 2^8.
constexpr float kMaxFp8Scale = 256.0f;

// Position of column j of a panel inside a bf16 row (see PackedWeight).
inline int bf16_slot(int j) {
  return j < 8 ? 2 * j : 2 * (j - 8) + 1;
}

void check_weight(const Tensor& w, const char* fn) {
  if (w.ndim != 2) LS_THROW << fn << ": w must be 2-D (N, K), got " << w.shape_str();
  if (w.dtype != DType::F32 && w.dtype != DType::BF16)
    LS_THROW << fn << ": w must be f32 or bf16, got " << w.shape_str();
  if (w.shape[1] > 1 && w.stride[1] != 1)
    LS_THROW << fn << ": w rows must be contiguous, got " << w.shape_str();
  if (w.shape[0] > 1 && w.stride[0] < w.shape[1])
    LS_THROW << fn << ": w row stride " << w.stride[0] << " is smaller than its width, " << w.shape_str();
}

// Element (n, k) of an f32 or bf16 matrix, widened exactly.
inline float weight_at(const Tensor& w, int64_t n, int64_t k) {
  const int64_t i = n * w.stride[0] + k;
  return w.dtype == DType::F32 ? static_cast<const float*>(w.data)[i]
                               : bf16_to_f32(static_cast<const bf16_t*>(w.data)[i]);
}

// Packing is host code. Where the host may write the packing context's
// device memory (host, interpret mode with host access) the panels are packed
// there; otherwise into host memory, then copied in (to_device). Either way
// they are zeroed first: the padding rows of the last panel stay 0.
const Allocator& packing_memory(const Context& ctx) {
  const Allocator& memory = device_memory(ctx);
  return memory.host_visible() ? memory : host_allocator();
}

void allocate(const Allocator& memory, PackedWeight& pw) {
  const int64_t P = pw.panels();
  pw.data = Buffer(static_cast<size_t>(P * pw.k * pw.row_bytes()), memory, Fill::Zero, "packed weight");
  if (pw.storage == DType::FP8E4M3) {
    const int64_t NB = pw.scale_blocks_n(), KB = pw.scale_blocks_k();
    pw.panel_scales =
        Buffer(static_cast<size_t>(P * KB * kPanel) * sizeof(float), memory, Fill::Zero, "panel scales");
    pw.block_scales =
        Buffer(static_cast<size_t>(NB * KB) * sizeof(float), memory, Fill::Zero, "block scales");
  }
}

void allocate(const Context& ctx, PackedWeight& pw) {
  allocate(packing_memory(ctx), pw);
}

// Copies the host-packed buffers of pw into the device's memory, when it was
// packed on the host (packing_memory).
void to_device(const Context& ctx, PackedWeight& pw) {
  const Allocator& memory = device_memory(ctx);
  if (&packing_memory(ctx) == &memory) return;
  for (Buffer* b : {&pw.data, &pw.panel_scales, &pw.block_scales}) {
    if (b->size() == 0) continue;
    Buffer d(b->size(), memory, Fill::Undefined, b == &pw.data ? "packed weight" : "fp8 scales");
    memory.copy_in(d.data(), b->data(), b->size());
    *b = std::move(d);
  }
}

// The 2-D tensor t as host code may read it: t itself, or (device memory the
// host cannot touch) a copy of its rows in `keep`.
Tensor host_readable(const Context& ctx, const Tensor& t, std::vector<unsigned char>& keep) {
  const Allocator& memory = device_memory(ctx);
  if (memory.host_visible() || t.numel() == 0 || !memory.holds(t.data)) return t;
  const int64_t last = t.shape[0] > 1 ? (t.shape[0] - 1) * t.stride[0] : 0;
  keep.resize(static_cast<size_t>(last + t.shape[1]) * dtype_size(t.dtype));
  memory.copy_out(keep.data(), t.data, keep.size());
  Tensor h = t;
  h.data = keep.data();
  return h;
}

// Effective k-block size (a per-tensor scale is one block covering all of K).
inline int64_t eff_block_k(const PackedWeight& pw) {
  return pw.block_k > 0 ? pw.block_k : std::max<int64_t>(pw.k, 1);
}

// The first row of each row block of the scales (block_scales' rows), then n:
// blocks of block_n rows (all of a segment for 0), restarting at each segment.
std::vector<int64_t> row_block_starts(const PackedWeight& pw) {
  std::vector<int64_t> seg = pw.row_segments.empty() ? std::vector<int64_t>{0} : pw.row_segments;
  seg.push_back(pw.n);
  std::vector<int64_t> starts;
  for (size_t s = 0; s + 1 < seg.size(); ++s) {
    const int64_t step = pw.block_n > 0 ? pw.block_n : seg[s + 1] - seg[s];
    for (int64_t r = seg[s]; r < seg[s + 1]; r += step) starts.push_back(r);
  }
  if (starts.empty()) starts.push_back(0);  // n = 0: one empty block
  starts.push_back(pw.n);
  return starts;
}

// (N) the scale row block of every row.
std::vector<int64_t> row_blocks(const PackedWeight& pw) {
  const std::vector<int64_t> starts = row_block_starts(pw);
  std::vector<int64_t> of(static_cast<size_t>(pw.n));
  for (size_t b = 0; b + 1 < starts.size(); ++b)
    for (int64_t r = starts[b]; r < starts[b + 1]; ++r) of[static_cast<size_t>(r)] = static_cast<int64_t>(b);
  return of;
}

void check_row_segments(const std::vector<int64_t>& seg, int64_t n) {
  if (seg.empty()) return;
  bool ok = seg[0] == 0;
  for (size_t i = 1; i < seg.size(); ++i) ok = ok && seg[i] > seg[i - 1] && seg[i] < n;
  if (!ok) {
    std::string list;
    for (int64_t r : seg) list += (list.empty() ? "" : ", ") + std::to_string(r);
    LS_THROW << "pack_weight: row segments {" << list << "} must start at 0 and increase within the " << n
             << " rows";
  }
}

// Spreads block_scales (NB, KB) into panel_scales (P, KB, 16), times 2^120.
void fill_panel_scales(const PackedWeight& pw) {
  const int64_t P = pw.panels(), KB = pw.scale_blocks_k();
  const std::vector<int64_t> of = row_blocks(pw);
  const float* bs = pw.block_scales.as<float>();
  float* ps = pw.panel_scales.as<float>();
  for (int64_t p = 0; p < P; ++p)
    for (int64_t kb = 0; kb < KB; ++kb)
      for (int j = 0; j < kPanel; ++j) {
        const int64_t n = p * kPanel + j;
        ps[(p * KB + kb) * kPanel + j] = n < pw.n ? bs[of[static_cast<size_t>(n)] * KB + kb] * kRebias : 0.0f;
      }
}

// Computes block_scales from w and returns every block's rule (NB, KB);
// throws on non-finite weights or too large a scale.
std::vector<Fp8BlockScale> compute_fp8_scales(const Context& ctx, const PackedWeight& pw, const Tensor& w) {
  const int64_t NB = pw.scale_blocks_n(), KB = pw.scale_blocks_k();
  const int64_t bk = eff_block_k(pw);
  const std::vector<int64_t> starts = row_block_starts(pw);
  std::vector<Fp8BlockScale> rule(static_cast<size_t>(NB * KB));
  float* bs = pw.block_scales.as<float>();
  ctx.parallel_for(NB, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      for (int64_t kb = 0; kb < KB; ++kb) bs[nb * KB + kb] = 0.0f;
      for (int64_t n = starts[size_t(nb)]; n < starts[size_t(nb) + 1]; ++n)
        for (int64_t k = 0; k < pw.k; ++k) {
          const float v = weight_at(w, n, k);
          if (!std::isfinite(v))
            LS_THROW << "pack_weight: fp8 cannot hold the non-finite weight " << v << " at (" << n << ", "
                     << k << ") of " << w.shape_str();
          float& m = bs[nb * KB + k / bk];
          m = std::max(m, std::fabs(v));
        }
      for (int64_t kb = 0; kb < KB; ++kb) {
        const float amax = bs[nb * KB + kb];
        const Fp8BlockScale b = fp8_block_scale(amax);
        if (!(b.scale < kMaxFp8Scale))
          LS_THROW << "pack_weight: fp8 block (" << nb << ", " << kb << ") of " << w.shape_str()
                   << " has absmax " << amax
                   << "; the kernels support absmax <= " << kMaxFp8Scale / 2 * kFp8E4M3Max;
        bs[nb * KB + kb] = b.scale;
        rule[static_cast<size_t>(nb * KB + kb)] = b;
      }
    }
  });
  return rule;
}

// Writes pw.data (and fp8 scales) from w (N, K) f32|bf16.
void pack_into(const Context& ctx, PackedWeight& pw, const Tensor& w) {
  const int64_t K = pw.k, N = pw.n;
  std::vector<Fp8BlockScale> rule;
  std::vector<int64_t> of;
  if (pw.storage == DType::FP8E4M3) {
    rule = compute_fp8_scales(ctx, pw, w);
    fill_panel_scales(pw);
    of = row_blocks(pw);
  }
  const int64_t KB = pw.scale_blocks_k(), bk = eff_block_k(pw);
  ctx.parallel_for(pw.panels(), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int j = 0; j < kPanel; ++j) {
        const int64_t n = p * kPanel + j;
        const size_t base = static_cast<size_t>(p * K * kPanel);
        switch (pw.storage) {
          case DType::F32: {
            float* d = pw.data.as<float>() + base + j;
            for (int64_t k = 0; k < K; ++k) d[k * kPanel] = n < N ? weight_at(w, n, k) : 0.0f;
            break;
          }
          case DType::BF16: {
            bf16_t* d = pw.data.as<bf16_t>() + base + bf16_slot(j);
            if (n < N && w.dtype == DType::BF16) {
              const bf16_t* row = static_cast<const bf16_t*>(w.data) + n * w.stride[0];
              for (int64_t k = 0; k < K; ++k) d[k * kPanel] = row[k];
            } else {
              for (int64_t k = 0; k < K; ++k) d[k * kPanel] = n < N ? f32_to_bf16(weight_at(w, n, k)) : 0;
            }
            break;
          }
          default: {
            fp8_t* d = pw.data.as<fp8_t>() + base + j;
            for (int64_t k = 0; k < K; ++k) {
              if (n >= N) {
                d[k * kPanel] = 0;
                continue;
              }
              const Fp8BlockScale& b = rule[static_cast<size_t>(of[static_cast<size_t>(n)] * KB + k / bk)];
              d[k * kPanel] = fp8_block_code(weight_at(w, n, k), b);
            }
          }
        }
      }
    }
  });
}

// Writes pw.data, block_scales and panel_scales of an MXFP4 packing from w.
void pack_into_mxfp4(const Context& ctx, PackedWeight& pw, const Tensor& w) {
  constexpr int64_t kG = kMxfp4GroupSize;
  const int64_t K = pw.k, N = pw.n, G = K / kG;
  float* bs = pw.block_scales.as<float>();
  ctx.parallel_for(pw.panels(), [&](int64_t p0, int64_t p1) {
    float x[kG];
    uint8_t codes[kG];
    for (int64_t p = p0; p < p1; ++p)
      for (int j = 0; j < kPanel && p * kPanel + j < N; ++j) {
        const int64_t n = p * kPanel + j;
        // Column j's nibble of each row's 8 bytes (see PackedWeight).
        uint8_t* d = static_cast<uint8_t*>(pw.data.data()) + p * K * (kPanel / 2) + (j & 7);
        const int shift = j < 8 ? 0 : 4;
        for (int64_t g = 0; g < G; ++g) {
          for (int64_t i = 0; i < kG; ++i) {
            x[i] = weight_at(w, n, g * kG + i);
            if (!std::isfinite(x[i]))
              LS_THROW << "pack_weight_mxfp4: MXFP4 cannot hold the non-finite weight " << x[i] << " at ("
                       << n << ", " << g * kG + i << ") of " << w.shape_str();
          }
          const float scale = mxfp4_group_codes(x, codes);
          if (!(scale < kMaxFp8Scale))
            LS_THROW << "pack_weight_mxfp4: the group of row " << n << " at column " << g * kG << " of "
                     << w.shape_str() << " has a scale of " << scale
                     << "; the kernels support absmax <= " << kMaxFp8Scale / 2 * 6.0f;
          bs[n * G + g] = scale;
          for (int64_t i = 0; i < kG; ++i) {
            uint8_t& byte = d[(g * kG + i) * (kPanel / 2)];
            byte = static_cast<uint8_t>((byte & (0xF0 >> shift)) | (codes[i] << shift));
          }
        }
      }
  });
  fill_panel_scales(pw);
}

}  // namespace

int64_t PackedWeight::row_bytes() const {
  return mxfp4 ? kPanel / 2 : kPanel * int64_t(dtype_size(storage));
}

int64_t PackedWeight::scale_blocks_n() const {
  return static_cast<int64_t>(row_block_starts(*this).size()) - 1;
}
int64_t PackedWeight::scale_row_block(int64_t row) const {
  const std::vector<int64_t> starts = row_block_starts(*this);
  return static_cast<int64_t>(std::upper_bound(starts.begin(), starts.end() - 1, row) - starts.begin()) - 1;
}
int64_t PackedWeight::scale_blocks_k() const {
  const int64_t b = eff_block_k(*this);
  return std::max<int64_t>(1, (k + b - 1) / b);
}
float PackedWeight::fp8_scale(int64_t row, int64_t col) const {
  LS_CHECK(storage == DType::FP8E4M3) << "fp8_scale of a " << dtype_name(storage) << " packed weight";
  LS_CHECK(row >= 0 && row < n && col >= 0 && col < k)
      << "(" << row << ", " << col << ") outside (" << n << ", " << k << ")";
  return block_scales.as<float>()[scale_row_block(row) * scale_blocks_k() + col / eff_block_k(*this)];
}

PackedWeight pack_weight(const Context& ctx, const Tensor& w, DType storage, int64_t fp8_block,
                         std::vector<int64_t> row_segments) {
  check_weight(w, "pack_weight");
  if (storage != DType::F32 && storage != DType::BF16 && storage != DType::FP8E4M3)
    LS_THROW << "pack_weight: storage must be f32, bf16 or fp8_e4m3, got " << dtype_name(storage);
  if (fp8_block < 0) LS_THROW << "pack_weight: fp8_block must be >= 0, got " << fp8_block;
  PackedWeight pw;
  pw.storage = storage;
  pw.n = w.shape[0];
  pw.k = w.shape[1];
  if (storage == DType::FP8E4M3) {
    pw.block_n = pw.block_k = fp8_block;
    check_row_segments(row_segments, pw.n);
    pw.row_segments = std::move(row_segments);
  }
  std::vector<unsigned char> keep;
  allocate(ctx, pw);
  pack_into(ctx, pw, host_readable(ctx, w, keep));
  to_device(ctx, pw);
  return pw;
}

PackedWeight pack_weight_fp8(const Context& ctx, const Tensor& w_in, const Tensor& scales_in, int64_t block) {
  std::vector<unsigned char> keep_w, keep_scales;
  const Tensor w = w_in.ndim == 2 ? host_readable(ctx, w_in, keep_w) : w_in;
  const Tensor scales = scales_in.ndim == 2 ? host_readable(ctx, scales_in, keep_scales) : scales_in;
  if (w.ndim != 2 || w.dtype != DType::FP8E4M3 || (w.shape[1] > 1 && w.stride[1] != 1) ||
      (w.shape[0] > 1 && w.stride[0] < w.shape[1]))
    LS_THROW << "pack_weight_fp8: w must be a 2-D fp8_e4m3 (N, K) matrix with contiguous rows, got "
             << w.shape_str();
  if (block < 0) LS_THROW << "pack_weight_fp8: block must be >= 0, got " << block;
  PackedWeight pw;
  pw.storage = DType::FP8E4M3;
  pw.n = w.shape[0];
  pw.k = w.shape[1];
  pw.block_n = pw.block_k = block;
  const int64_t NB = pw.scale_blocks_n(), KB = pw.scale_blocks_k();
  check_dtype(scales, DType::F32, "pack_weight_fp8 scales");
  if (scales.ndim != 2 || scales.shape[0] != NB || scales.shape[1] != KB || !scales.is_contiguous())
    LS_THROW << "pack_weight_fp8: scales for w " << w.shape_str() << " with block " << block
             << " must be contiguous (" << NB << ", " << KB << ") f32, got " << scales.shape_str();
  allocate(ctx, pw);
  for (int64_t i = 0; i < NB * KB; ++i) {
    const float s = scales.f32()[i];
    if (!(s > 0.0f && s < kMaxFp8Scale))
      LS_THROW << "pack_weight_fp8: scale " << s << " at block " << i << " must be in (0, " << kMaxFp8Scale
               << ")";
    pw.block_scales.as<float>()[i] = s;
  }
  fill_panel_scales(pw);
  const fp8_t* q = static_cast<const fp8_t*>(w.data);
  const int64_t K = pw.k, N = pw.n;
  ctx.parallel_for(pw.panels(), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int j = 0; j < kPanel; ++j) {
        const int64_t n = p * kPanel + j;
        fp8_t* d = pw.data.as<fp8_t>() + p * K * kPanel + j;
        for (int64_t k = 0; k < K; ++k) {
          const fp8_t v = n < N ? q[n * w.stride[0] + k] : 0;
          if ((v & 0x7f) == 0x7f)
            LS_THROW << "pack_weight_fp8: NaN at (" << n << ", " << k << ") of " << w.shape_str();
          d[k * kPanel] = v;
        }
      }
  });
  to_device(ctx, pw);
  return pw;
}

PackedWeight pack_weight_mxfp4(const Context& ctx, const Tensor& w) {
  check_weight(w, "pack_weight_mxfp4");
  if (w.shape[1] % kMxfp4GroupSize != 0)
    LS_THROW << "pack_weight_mxfp4: MXFP4 needs a width that is a multiple of " << kMxfp4GroupSize << ", got "
             << w.shape_str();
  PackedWeight pw;
  pw.storage = DType::FP8E4M3;
  pw.n = w.shape[0];
  pw.k = w.shape[1];
  pw.block_n = 1;
  pw.block_k = kMxfp4GroupSize;
  pw.mxfp4 = true;
  std::vector<unsigned char> keep;
  allocate(ctx, pw);
  pack_into_mxfp4(ctx, pw, host_readable(ctx, w, keep));
  to_device(ctx, pw);
  return pw;
}

PackedWeight in_place_weight(const Tensor& w) {
  check_weight(w, "in_place_weight");
  if (w.dtype != DType::F32) LS_THROW << "in_place_weight: w must be f32, got " << dtype_name(w.dtype);
  PackedWeight pw;
  pw.storage = DType::F32;
  pw.n = w.shape[0];
  pw.k = w.shape[1];
  pw.rows = static_cast<const float*>(w.data);
  pw.rows_ld = w.shape[0] > 1 ? w.stride[0] : w.shape[1];
  return pw;
}

void repack_weight(const Context& ctx, PackedWeight& pw, const Tensor& w) {
  check_weight(w, "repack_weight");
  if (pw.in_place())
    LS_THROW << "repack_weight: an in-place weight reads its rows where they are; nothing to repack";
  if (w.shape[0] != pw.n || w.shape[1] != pw.k)
    LS_THROW << "repack_weight: w " << w.shape_str() << " does not match the packed (" << pw.n << ", " << pw.k
             << ") " << dtype_name(pw.storage);
  LS_CHECK(pw.data.size() == static_cast<size_t>(pw.panels() * pw.k * pw.row_bytes()))
      << "repack_weight: packed weight was not made by pack_weight";
  const Allocator& memory = device_memory(ctx);
  if (memory.host_visible() || !memory.holds(pw.data.data())) {
    if (pw.mxfp4) {
      pack_into_mxfp4(ctx, pw, w);
    } else {
      pack_into(ctx, pw, w);
    }
    return;
  }
  // Device memory the host cannot write: pack a host twin (zeroed, as the
  // device's buffers were at first) and copy it over them.
  PackedWeight h;
  h.storage = pw.storage;
  h.n = pw.n;
  h.k = pw.k;
  h.block_n = pw.block_n;
  h.block_k = pw.block_k;
  h.mxfp4 = pw.mxfp4;
  h.row_segments = pw.row_segments;
  allocate(host_allocator(), h);
  std::vector<unsigned char> keep;
  const Tensor hw = host_readable(ctx, w, keep);
  if (h.mxfp4) {
    pack_into_mxfp4(ctx, h, hw);
  } else {
    pack_into(ctx, h, hw);
  }
  memory.copy_in(pw.data.data(), h.data.data(), h.data.size());
  memory.copy_in(pw.panel_scales.data(), h.panel_scales.data(), h.panel_scales.size());
  memory.copy_in(pw.block_scales.data(), h.block_scales.data(), h.block_scales.size());
}

void unpack_weight(const Context& ctx, Tensor w_out, const PackedWeight& pw) {
  check_dtype(w_out, DType::F32, "unpack_weight w_out");
  if (w_out.ndim != 2 || w_out.shape[0] != pw.n || w_out.shape[1] != pw.k ||
      (pw.k > 1 && w_out.stride[1] != 1) || (pw.n > 1 && w_out.stride[0] < pw.k))
    LS_THROW << "unpack_weight: w_out must be (" << pw.n << ", " << pw.k << ") f32 with contiguous rows, got "
             << w_out.shape_str();
  LS_GPU_DISPATCH(ctx, unpack_weight, w_out, pw);
  if (pw.in_place()) {
    ctx.parallel_for(pw.n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::copy(pw.rows + r * pw.rows_ld, pw.rows + r * pw.rows_ld + pw.k,
                  static_cast<float*>(w_out.data) + r * w_out.stride[0]);
    });
    return;
  }
  const BKind kind = pw.storage == DType::F32    ? BKind::F32
                     : pw.storage == DType::BF16 ? BKind::BF16
                     : pw.mxfp4                  ? BKind::FP4
                                                 : BKind::FP8;
  const int64_t K = pw.k, KB = pw.scale_blocks_k();
  ctx.parallel_for(pw.panels(), [&](int64_t p0, int64_t p1) {
    std::vector<float> tmp(static_cast<size_t>(K * kPanel));  // (K, 16)
    for (int64_t p = p0; p < p1; ++p) {
      const float* sc =
          gemm_detail::has_scales(kind) ? pw.panel_scales.as<float>() + p * KB * kPanel : nullptr;
      gemm_detail::widen_panel(kind, static_cast<const char*>(pw.data.data()) + p * K * pw.row_bytes(), sc,
                               eff_block_k(pw), K, tmp.data());
      for (int j = 0; j < kPanel && p * kPanel + j < pw.n; ++j) {
        float* row = w_out.f32() + (p * kPanel + j) * w_out.stride[0];
        for (int64_t k = 0; k < K; ++k) row[k] = tmp[static_cast<size_t>(k * kPanel + j)];
      }
    }
  });
}

}  // namespace lockstep::kernels
