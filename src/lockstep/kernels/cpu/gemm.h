// Matrix products of a linear layer: Y = X·Wᵀ (forward, W pre-packed), dX = dY·W
// and dW += dYᵀ·X (backward). Every output element is one fp32 FMA chain over the
// reduction index in order, so results do not depend on M, tiling or threads.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// Columns of W (rows of the (N,K) matrix) per packed panel: two 8-float vectors.
constexpr int64_t kGemmPanel = 16;

// W (N,K) re-laid out for the X·Wᵀ product. Panel p holds rows n = 16p..16p+15
// of W interleaved along k, so the inner loop reads one contiguous run per k:
//   F32     data: (P, K, 16) f32, element [p][k][j] = W[16p + j, k]
//   BF16    data: (P, K, 16) bf16, 32-bit word j of row k = W[16p+j, k] in its low
//                 half and W[16p+8+j, k] in its high half (so a shift and a mask
//                 widen a whole row to two f32 vectors)
//   FP8E4M3 data: (P, K, 16) e4m3fn bytes, [p][k][j] = q(W[16p + j, k])
// with P = ceil(N/16); rows past N are zero. The effective fp8 weight is
// fp8_to_f32(q) * scale of its (block_n x block_k) block, one f32 multiply.
// The row blocks restart at each row segment's first row: a fused matrix
// (q | k | v, gate | up) gets the scale blocks its constituent tensors would
// have on their own, as a Hugging Face FP8 checkpoint stores them.
//   MXFP4   data: (P, K, 8) bytes (pack_weight_mxfp4; storage FP8E4M3 with
//                 mxfp4 set): byte i of row k holds the e2m1 code of
//                 W[16p+i, k] in its low nibble and of W[16p+8+i, k] in its
//                 high one; 1 x 32 scale blocks by the MXFP4 rule, so the
//                 kernels multiply by exactly an MXFP4 checkpoint's values
//                 (each code widened as its e4m3 byte, times its scale).
struct PackedWeight {
  DType storage = DType::F32;
  int64_t n = 0, k = 0;
  int64_t block_n = 0, block_k = 0;  // fp8 scale blocks; 0 = one scale per row segment and all of K
  bool mxfp4 = false;                // MXFP4 nibbles (block_n 1, block_k 32), see above
  // fp8 only: the first row of each row segment, increasing, from 0 (empty: one segment).
  std::vector<int64_t> row_segments;
  Buffer data;
  // fp8 only: (P, KB, 16) f32, KB = ceil(K / block_k): the scale of column j's
  // k-block times 2^120 (the kernels widen e4m3 bits with a 2^-120 bias, see gemm.cpp).
  Buffer panel_scales;
  // fp8 only: (NB, KB) f32 scales; NB = the sum over row segments of
  // ceil(rows / block_n), the blocks of each segment in order (1 x 1 per-tensor).
  Buffer block_scales;
  // In place (in_place_weight): W (N, K) f32 read where it lives, row i at
  // rows + i * rows_ld; `data` is empty and each product stages W's panels
  // from the rows as it goes (the same chains, so the same bits as the
  // packed F32 copy, without the copy).
  const float* rows = nullptr;
  int64_t rows_ld = 0;

  bool in_place() const { return rows != nullptr; }
  int64_t panels() const { return (n + kGemmPanel - 1) / kGemmPanel; }
  // Bytes of one packed row of 16 elements: 64 (f32), 32 (bf16), 16 (fp8), 8 (MXFP4).
  int64_t row_bytes() const;
  int64_t scale_blocks_n() const;
  int64_t scale_blocks_k() const;
  // fp8: the row of block_scales holding row `row`'s scales.
  int64_t scale_row_block(int64_t row) const;
  // fp8: the scale that multiplies element (row, col) of W.
  float fp8_scale(int64_t row, int64_t col) const;
};

// Packs w (N,K) f32 or bf16 (row stride allowed) into `storage` (F32, BF16 or
// FP8E4M3). f32 -> bf16 rounds to nearest even; bf16 -> f32 is exact. For fp8,
// `fp8_block` = 0 uses one scale per row segment, b > 0 one per (b x b) block
// of each segment; per block, scale and codes follow fp8_block_scale
// (fp8_quant.h): the values are e4m3(w / s) * s with s the smallest power of
// two with absmax / s <= 448 (1 for an all-zero block), the bytes those of
// DeepSeek's checkpoint writer. `row_segments`: the first rows of the row
// segments (PackedWeight), fp8 only; empty for one.
// Throws Error on NaN/inf weights in fp8 (e4m3 cannot hold them), an absmax
// above 2^7 * 448 (the kernels need scale < 256), or bad row segments.
PackedWeight pack_weight(const Context& ctx, const Tensor& w, DType storage, int64_t fp8_block = 0,
                         std::vector<int64_t> row_segments = {});

// Packs an already-quantized checkpoint weight: w (N,K) fp8, scales (NB, KB) f32
// with NB = ceil(N/block), KB = ceil(K/block), or (1, 1) with block = 0.
PackedWeight pack_weight_fp8(const Context& ctx, const Tensor& w, const Tensor& scales, int64_t block);

// Packs w (N,K) f32 or bf16 as MXFP4 values (PackedWeight::mxfp4): per row
// and group of 32 columns, the scale and e2m1 codes of mxfp4_group_codes
// (fp8_quant.h), the values DeepSeek's MXFP4 checkpoint writer gives w.
// Throws Error unless K is a multiple of 32, on NaN/inf weights, or on a
// group absmax above 6 * 128 (the kernels need scale < 256).
PackedWeight pack_weight_mxfp4(const Context& ctx, const Tensor& w);

// W (N,K) f32 with contiguous rows, read in place by the products (PackedWeight::rows):
// no copy and no packing. w must outlive the result; its values may change
// between products (the trainer's master, updated by the optimizer). For
// products of many rows (training), where staging W costs little next to the
// FMAs; the rollout's few-row decode wants the packed copy.
PackedWeight in_place_weight(const Tensor& w);

// Refreshes pw from w (same shape; same storage, fp8 blocking and row segments,
// MXFP4 or not) after an update.
void repack_weight(const Context& ctx, PackedWeight& pw, const Tensor& w);

// w_out (N,K) f32 = the exact weights the kernels multiply by (widened storage;
// an in-place weight's rows).
void unpack_weight(const Context& ctx, Tensor w_out, const PackedWeight& pw);

// Y (M,N) f32 = X (M,K) f32 · Wᵀ; with accumulate, Y = Y + (X·Wᵀ).
void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const PackedWeight& w, bool accumulate = false);
// Same, with W (N,K) f32 or bf16 packed internally (in its own dtype, exact).
void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const Tensor& w, bool accumulate = false);

// dX (M,K) f32 = dY (M,N) f32 · W (N,K) f32|bf16; chain over n = 0..N-1.
void gemm_dyw(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& w, bool accumulate = false);

// dW (N,K) f32 (+)= dYᵀ·X: dW[n,k] (+)= sum over m = 0..M-1 of dY[m,n] X[m,k].
void gemm_dytx(const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x, bool accumulate = true);

// Long chains on the 16-wide f32 tiles (wide_vectors(); B an in-place weight
// or a plain matrix) run cut along t: chains of at least `min_t` go in blocks
// of `block`, a block's staged B panels take at most `stage_bytes` (a share of
// L2) and the partial chains waiting between blocks at most `carry_bytes`.
// Each block of rows whose partial chains fit there stages all of B again, so
// a product is cut only where such a block holds all its rows or at least
// `min_rows` of them (a wide product of few rows, such as a logits chunk
// against a 151,936-row lm_head, runs whole chains instead).
// The bits never depend on it (a cut chain is the same chain); tests shrink
// it to reach every path at small sizes. Not to be changed while products run.
struct GemmKBlocking {
  int64_t block = 512;
  int64_t min_t = 2048;
  int64_t stage_bytes = int64_t{1} << 20;
  int64_t carry_bytes = int64_t{4} << 20;
  int64_t min_rows = 96;
};
GemmKBlocking gemm_kblocking();
void set_gemm_kblocking(const GemmKBlocking& k);

// The argument checks of the entries above, throwing Error with the message the
// entry throws for the first bad argument; the GPU backend runs the same ones.
void check_gemm_xwt(const Tensor& y, const Tensor& x, const PackedWeight& w);
// The Tensor-W form, including W's dtype (f32 or bf16, as pack_weight needs).
void check_gemm_xwt(const Tensor& y, const Tensor& x, const Tensor& w);
void check_gemm_dyw(const Tensor& dx, const Tensor& dy, const Tensor& w);
void check_gemm_dytx(const Tensor& dw, const Tensor& dy, const Tensor& x);

}  // namespace lockstep::kernels
