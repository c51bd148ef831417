// Drivers of the three GEMM products: argument checks, the static split of output
// panels/rows over threads, cache blocking over rows and panels (and over the
// reduction for the wide f32 tiles, carrying each partial chain through memory
// so it stays one chain), staging of operands into f32 panels, and dispatch to
// the register-blocked micro-kernels (gemm_microkernel.h).
#include "lockstep/kernels/cpu/gemm.h"

#include <algorithm>
#include <memory>
#include <new>
#include <sstream>
#include <string>

#include "lockstep/kernels/cpu/gemm_microkernel.h"
#include "lockstep/kernels/cpu/wide.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

using namespace gemm_detail;

namespace {

// 6 rows x 16 columns = 12 ymm accumulators, leaving 4 of the 16 registers for
// two B vectors and the broadcast A value.
constexpr int kMaxTileRows = 6;
// bf16 is always widened inside the kernel (a shift and a mask per 8 weights,
// half the f32 traffic: measured as fast as or faster than f32 at every M).
// fp8's widening costs more (shift, mask, scale multiply per 8 weights), so
// past this many rows per task a panel is widened once to f32 and reused by
// every row tile; at or below it the packed bytes are streamed once.
constexpr int64_t kFp8DirectMaxRows = 8;
// In-kernel fp8 widening keeps two scale vectors in registers besides the
// widened pair and the broadcast: 4 x 16 tiles (8 accumulators) fit; bf16
// (a shift and a mask) fits the full 6 x 16 tile.
constexpr int kFp8TileRows = 4;
// Bytes of B panels kept hot per N block while all row tiles walk over them:
// half of a 512 KiB L2, leaving room for the A rows streaming through.
constexpr int64_t kBlockBytes = 256 << 10;
// Bytes of A rows kept in L3 while all N blocks pass over them (a share of a
// 32 MiB L3 that leaves room for the other thread and for W streaming through).
constexpr int64_t kABlockBytes = 8 << 20;
// A panel at most this big is kept in L1 (half of 32 KiB) while row tiles
// stream past it, with A rows in blocks of kAL2Bytes (half of L2).
constexpr int64_t kL1PanelBytes = 16 << 10;
constexpr int64_t kAL2Bytes = 256 << 10;
// Bytes of f32 panels staged (widened or gathered from a plain matrix) at once.
constexpr int64_t kStageBytes = 4 << 20;
// ... and at most this many when that spares packing A again per chunk.
constexpr int64_t kStageAllBytes = 32 << 20;
// k-blocking of the wide f32 tiles (GemmKBlocking): the default, and what
// the products use now.
GemmKBlocking& kblocking() {
  static GemmKBlocking k;
  return k;
}
// Below this many flops (~50-100 us of one core) waking a second thread costs
// more than it saves (measured: M=16, N=K=256 ran faster on one thread)...
constexpr int64_t kMinParallelFlops = int64_t{1} << 23;
// ...unless B is this large: a few-row product is bound by reading B from
// memory, not by its flops (decode's (1,024 x 3,072) down projection, 12 MB
// at 2 x 4 x 1,024 x 3,072 flops, ran alone at one core's read bandwidth).
constexpr int64_t kMinParallelBBytes = int64_t{1} << 20;

// Row tiles of the 16-wide f32 kernels: up to 12 rows x 2 panels (24 of the
// 32 zmm registers accumulate); from 4 rows up (fewer rows take the 8-wide
// tiles, whose several panels give them enough chains).
constexpr int kWideTileRows = 12;
constexpr int kWideMinRows = 4;

// Panels per tile by tile rows: few rows take several panels so there are
// at least 8 independent FMA chains (2 FMA ports x 4 cycles latency).
inline int preferred_panels(int rows, bool wide) {
  if (wide && rows >= kWideMinRows) return 2;
  return rows == 1 ? 4 : rows <= 3 ? 2 : 1;
}

#if LOCKSTEP_GEMM_AVX2
template <BKind kB, ALayout kA, int NP>
TileFn wide_tile_fn(int rows) {
  switch (rows) {
    case 4: return &micro_tile_wide<kB, kA, 4, NP>;
    case 5: return &micro_tile_wide<kB, kA, 5, NP>;
    case 6: return &micro_tile_wide<kB, kA, 6, NP>;
    case 7: return &micro_tile_wide<kB, kA, 7, NP>;
    case 8: return &micro_tile_wide<kB, kA, 8, NP>;
    case 9: return &micro_tile_wide<kB, kA, 9, NP>;
    case 10: return &micro_tile_wide<kB, kA, 10, NP>;
    case 11: return &micro_tile_wide<kB, kA, 11, NP>;
    default: return &micro_tile_wide<kB, kA, 12, NP>;
  }
}
#endif

template <BKind kB, ALayout kA>
TileFn tile_fn(int rows, int panels) {
  if (panels > 1) {
    switch (rows) {
      case 1: return &micro_tile<kB, kA, 1, 4>;
      case 2: return &micro_tile<kB, kA, 2, 2>;
      case 3: return &micro_tile<kB, kA, 3, 2>;
      default: break;
    }
  }
  switch (rows) {
    case 1: return &micro_tile<kB, kA, 1, 1>;
    case 2: return &micro_tile<kB, kA, 2, 1>;
    case 3: return &micro_tile<kB, kA, 3, 1>;
    case 4: return &micro_tile<kB, kA, 4, 1>;
    case 5: return &micro_tile<kB, kA, 5, 1>;
    default: return &micro_tile<kB, kA, 6, 1>;
  }
}

TileFn pick_tile(BKind kind, ALayout layout, int rows, int panels, bool wide) {
#if LOCKSTEP_GEMM_AVX2
  if (wide && kind == BKind::F32 && rows >= kWideMinRows) {
    if (layout == ALayout::RowsContiguous)
      return panels > 1 ? wide_tile_fn<BKind::F32, ALayout::RowsContiguous, 2>(rows)
                        : wide_tile_fn<BKind::F32, ALayout::RowsContiguous, 1>(rows);
    return panels > 1 ? wide_tile_fn<BKind::F32, ALayout::RowsAlongT, 2>(rows)
                      : wide_tile_fn<BKind::F32, ALayout::RowsAlongT, 1>(rows);
  }
  if (wide && kind == BKind::BF16 && layout == ALayout::RowsAlongT && rows >= kWideMinRows)
    return panels > 1 ? wide_tile_fn<BKind::BF16, ALayout::RowsAlongT, 2>(rows)
                      : wide_tile_fn<BKind::BF16, ALayout::RowsAlongT, 1>(rows);
#else
  (void)wide;
#endif
  if (layout == ALayout::RowsContiguous) return tile_fn<BKind::F32, ALayout::RowsContiguous>(rows, panels);
  switch (kind) {
    case BKind::F32: return tile_fn<BKind::F32, ALayout::RowsAlongT>(rows, panels);
    case BKind::BF16: return tile_fn<BKind::BF16, ALayout::RowsAlongT>(rows, panels);
    case BKind::FP4: return tile_fn<BKind::FP4, ALayout::RowsAlongT>(rows, panels);
    default: return tile_fn<BKind::FP8, ALayout::RowsAlongT>(rows, panels);
  }
}

// C (R, C) = A (R, T) · B (T, C), one chain over t per element. B is either a
// PackedWeight (its panels are exactly B's 16-column panels, t = k) or a plain
// (T, C) f32/bf16 matrix that is staged into f32 panels on the fly.
struct Problem {
  int64_t R = 0, T = 0, C = 0;
  const float* a = nullptr;
  int64_t a_stride = 0;  // row stride (RowsAlongT) or t stride (RowsContiguous)
  ALayout layout = ALayout::RowsAlongT;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  const PackedWeight* packed = nullptr;
  const void* plain = nullptr;
  bool plain_bf16 = false;
  int64_t plain_ld = 0;
};

struct AlignedFree {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using Scratch = std::unique_ptr<float[], AlignedFree>;
Scratch make_scratch(int64_t n) {
  return Scratch(static_cast<float*>(::operator new[](static_cast<size_t>(n) * sizeof(float), std::align_val_t(64))));
}

// One thread's staging buffers (slot 0: B panels, slot 1: packed A rows,
// slot 2: k-blocking's partial chains),
// kept between products and grown as needed: a fresh multi-MiB allocation per
// call is fresh pages, whose faults cost a few percent of a training step.
float* thread_scratch(int slot, int64_t n) {
  struct Buffer {
    Scratch buf;
    int64_t size = 0;
  };
  thread_local Buffer buffers[3];
  Buffer& b = buffers[slot];
  if (n > b.size) {
    b.buf = make_scratch(n);
    b.size = n;
  }
  return b.buf.get();
}

// Row tiles of [r0, r1), at most `max_rows` each; the last two share the
// remainder evenly (8 rows -> 4 + 4 rather than 6 + 2) for better register use.
template <typename Fn>
void for_row_tiles(int64_t r0, int64_t r1, int max_rows, Fn&& fn) {
  const int64_t n = r1 - r0;
  if (n <= 0) return;
  int64_t r = r0;
  const int64_t rem = n % max_rows;
  const int64_t full = n / max_rows;
  const int64_t plain_tiles = rem == 0 ? full : full - 1;
  for (int64_t i = 0; i < plain_tiles; ++i, r += max_rows) fn(r, max_rows);
  if (rem != 0) {
    const int64_t last = r1 - r;  // max_rows + rem, or just rem when n < max_rows
    const int64_t first = (last + 1) / 2;
    if (last <= max_rows) {
      fn(r, static_cast<int>(last));
    } else {
      fn(r, static_cast<int>(first));
      fn(r + first, static_cast<int>(last - first));
    }
  }
}

// How the kernels read B: a plain operand is staged as f32 panels.
BKind stored_kind(const PackedWeight* pw) {
  if (!pw || pw->storage == DType::F32) return BKind::F32;
  if (pw->storage == DType::BF16) return BKind::BF16;
  return pw->mxfp4 ? BKind::FP4 : BKind::FP8;
}

// Stages panels [c0, c1) of B as f32 panels in `out`: rows of an in-place
// weight, widened packed panels, or a plain matrix.
void stage_chunk(const Problem& pb, BKind stored, int64_t KB, int64_t block_k, int64_t c0, int64_t c1,
                 float* out) {
  const PackedWeight* pw = pb.packed;
  const int64_t T = pb.T;
  const int64_t panel_elems = T * kPanel;
  if (pw && pw->in_place()) {
    stage_row_panels(pw->rows, pw->rows_ld, T, c0 * kPanel, c1 - c0, pb.C, out);
  } else if (pw) {
    const int64_t stored_panel_bytes = T * pw->row_bytes();
    for (int64_t p = c0; p < c1; ++p) {
      const float* sc = has_scales(stored) ? pw->panel_scales.as<float>() + p * KB * kPanel : nullptr;
      widen_panel(stored, static_cast<const char*>(pw->data.data()) + p * stored_panel_bytes, sc, block_k, T,
                  out + (p - c0) * panel_elems);
    }
  } else {
    pack_plain_panels(pb.plain, pb.plain_bf16, pb.plain_ld, T, c0 * kPanel, c1 - c0, pb.C, out);
  }
}

// A rows [m0, m1) of a RowsContiguous operand as (T, rows) per row tile: read
// transposed (dY columns, a power-of-two row stride apart) they would
// otherwise map every t to the same cache sets.
// Only t in [t0, t1): each tile is then (t1 - t0, rows).
void pack_a_tiles(const Problem& pb, int64_t m0, int64_t m1, int max_rows, int64_t t0, int64_t t1,
                  float* out) {
  const int64_t tn = t1 - t0;
  for (int64_t t = t0; t < t1; ++t) {
    const float* src = pb.a + t * pb.a_stride;
    for_row_tiles(m0, m1, max_rows, [&](int64_t r, int rows) {
      float* dst = out + (r - m0) * tn + (t - t0) * rows;
      for (int i = 0; i < rows; ++i) dst[i] = src[r + i];
    });
  }
}

// Whether run_range_kblocked takes the product: wide f32 tiles on a B staged
// from rows (an in-place weight or a plain matrix), long chains, rows enough
// for the wide tiles, and partial chains of few enough panels that a row
// block holds all the rows or at least GemmKBlocking::min_rows of them. Each
// row block stages all of B again: a 151,936-column lm_head (304 KB of
// partial chains a row and thread) got row blocks of 12 and staged its 1.2 GB
// of weights 22 times for 256 rows, at 82 GFLOP/s (290 with whole chains).
int64_t kblock_rows(int64_t n_panels) {
  return std::max<int64_t>(1, kblocking().carry_bytes / (n_panels * kPanel * 4) / kWideTileRows) *
         kWideTileRows;
}
bool takes_kblocks(const Problem& pb, int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
  return wide_vectors() && (!pb.packed || pb.packed->in_place()) && pb.T >= kblocking().min_t &&
         r1 - r0 >= kWideMinRows && kblock_rows(p1 - p0) >= std::min(r1 - r0, kblocking().min_rows);
}

// Stages t in [k0, k0 + kn) of panels [c0, c1) of an in-place weight or a
// plain B: (c1 - c0, kn, 16) f32.
void stage_k_block(const Problem& pb, int64_t k0, int64_t kn, int64_t c0, int64_t c1, float* out) {
  const PackedWeight* pw = pb.packed;
  if (pw) {
    stage_row_panels(pw->rows + k0, pw->rows_ld, kn, c0 * kPanel, c1 - c0, pb.C, out);
  } else {
    const size_t esize = pb.plain_bf16 ? sizeof(bf16_t) : sizeof(float);
    const void* src = static_cast<const char*>(pb.plain) + static_cast<size_t>(k0 * pb.plain_ld) * esize;
    pack_plain_panels(src, pb.plain_bf16, pb.plain_ld, kn, c0 * kPanel, c1 - c0, pb.C, out);
  }
}

// Long chains on the wide f32 tiles, cut along t into blocks of kKBlock: a
// block's B panels are staged few enough to stay in L2 while every row tile
// of a row block passes over them, and each row tile's A rows of the block
// stay in L1 while it walks those panels. Between blocks the partial chains
// wait in `carry` (see TileArgs), so every output is still one chain over t.
void run_range_kblocked(const Problem& pb, int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
  const GemmKBlocking kb = kblocking();
  const int64_t T = pb.T, n_panels = p1 - p0, kKBlock = kb.block;
  const bool pack_a = pb.layout == ALayout::RowsContiguous;
  const int64_t kc_elems = kKBlock * kPanel;  // one panel's block
  const int64_t chunk = std::max<int64_t>(2, kb.stage_bytes / (kc_elems * 4));
  const int64_t cld = n_panels * kPanel;
  const int64_t m_rows = kblock_rows(n_panels);
  float* const stage = thread_scratch(0, std::min(chunk, n_panels) * kc_elems);
  // A row block takes a remainder too short for the wide tiles (4 rows).
  const int64_t max_block = std::min(m_rows + kWideMinRows, r1 - r0);
  float* const apack = pack_a ? thread_scratch(1, max_block * kKBlock) : nullptr;
  float* const carry = thread_scratch(2, max_block * cld);
  for (int64_t m0 = r0, m1 = r0; m0 < r1; m0 = m1) {
    m1 = r1 - (m0 + m_rows) < kWideMinRows ? r1 : m0 + m_rows;
    for (int64_t k0 = 0; k0 < T; k0 += kKBlock) {
      const int64_t kn = std::min(T - k0, kKBlock);
      if (pack_a) pack_a_tiles(pb, m0, m1, kWideTileRows, k0, k0 + kn, apack);
      for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
        const int64_t c1 = std::min(p1, c0 + chunk);
        stage_k_block(pb, k0, kn, c0, c1, stage);
        for_row_tiles(m0, m1, kWideTileRows, [&](int64_t r, int rows) {
          for (int64_t p = c0; p < c1;) {
            const int np = c1 - p >= 2 ? 2 : 1;
            TileArgs g;
            g.a = pack_a ? apack + (r - m0) * kn : pb.a + r * pb.a_stride + k0;
            g.as = pack_a ? rows : pb.a_stride;
            g.b = stage + (p - c0) * kn * kPanel;  // staged (c1 - c0, kn, 16)
            g.bps = kn * kPanel;
            g.t_count = kn;
            g.c = pb.c + r * pb.ldc + p * kPanel;
            g.ldc = pb.ldc;
            g.ncols = pb.C - p * kPanel;
            g.accumulate = pb.accumulate;
            g.pf = static_cast<const char*>(g.b);
            g.carry = carry + (r - m0) * cld + (p - p0) * kPanel;
            g.cld = cld;
            g.carry_in = k0 > 0;
            g.carry_out = k0 + kn < T;
            pick_tile(BKind::F32, pb.layout, rows, np, true)(g);
            p += np;
          }
        });
      }
    }
  }
}

// The sizes run_range's walk over one row block and chunk of panels needs.
struct BlockWalk {
  int64_t T = 0, block = 0, row_bytes = 0, stored_panel_bytes = 0;
  int max_rows = 0;
  bool wide = false, direct = false;
};

// Rows [m0, m1) over panels [c0, c1) of [.., p1), in blocks of w.block panels
// that every row tile walks before the next block: one kernel call per row
// tile and group of panels, tile(r, rows, p, np, pf, pf_step, pf_ps), with
// the prefetch that keeps memory streaming when the panels are read in place.
template <typename PanelFn, typename TileCall>
void walk_blocks(const BlockWalk& w, int64_t c0, int64_t c1, int64_t p1, int64_t m0, int64_t m1,
                 PanelFn&& panel, TileCall&& tile) {
  for (int64_t b0 = c0; b0 < c1; b0 += w.block) {
    const int64_t b1 = std::min(c1, b0 + w.block);
    // Decode of a batch: several row tiles walk each block, the ones after
    // the first from L2. Every call prefetches an equal share of the next
    // block, line by line as it walks its own panels, so memory streams
    // the next block all the while (the last tile alone prefetching left
    // memory idle through the others: 13 GB/s at 16 rows, 22 at 8).
    const bool prefetch_next = w.direct && m1 - m0 > w.max_rows && b1 < c1;
    int64_t share_step = 0, call = 0;  // bytes of the next block per t of one call; the call's index
    if (prefetch_next) {
      int64_t calls = 0;
      for_row_tiles(m0, m1, w.max_rows, [&](int64_t, int rows) {
        const int want = preferred_panels(rows, w.wide);
        calls += (b1 - b0) / want + (b1 - b0) % want;
      });
      const int64_t next_bytes = (std::min(c1, b1 + w.block) - b1) * w.stored_panel_bytes;
      share_step = (next_bytes + calls * w.T - 1) / std::max<int64_t>(1, calls * w.T);
    }
    // Decode with one row tile reads each panel once: each call prefetches
    // the next group's panels, line for line as it reads its own, so the
    // memory system always has the next streams in flight.
    const bool prefetch_group = w.direct && m1 - m0 <= w.max_rows;
    for_row_tiles(m0, m1, w.max_rows, [&](int64_t r, int rows) {
      const int want = preferred_panels(rows, w.wide);
      for (int64_t p = b0; p < b1;) {
        const int np = b1 - p >= want ? want : 1;
        const char* here = static_cast<const char*>(panel(p));
        if (prefetch_next) {
          // The next block starts where this one ends (a contiguous run
          // of panels); a share over 64 bytes a t takes np lines a t.
          const char* next = static_cast<const char*>(panel(b1)) + call * share_step * w.T;
          if (share_step <= 64)
            tile(r, rows, p, np, next, share_step, 0);
          else
            tile(r, rows, p, np, next, np * 64, 64);
          ++call;
        } else if (prefetch_group && p + np < p1) {
          const int64_t next = std::min<int64_t>(np, p1 - (p + np));
          tile(r, rows, p, np, here + np * w.stored_panel_bytes, w.row_bytes,
               next == np ? w.stored_panel_bytes : 0);
        } else {
          tile(r, rows, p, np, nullptr, 0, 0);
        }
        p += np;
      }
    });
  }
}

void run_range(const Problem& pb, int64_t p0, int64_t p1, int64_t r0, int64_t r1) {
  if (takes_kblocks(pb, p0, p1, r0, r1)) return run_range_kblocked(pb, p0, p1, r0, r1);
  const int64_t T = pb.T;
  const PackedWeight* pw = pb.packed;
  const BKind stored = stored_kind(pw);
  // direct: kernels read the packed weight in place; staged: f32 panels in scratch.
  const bool direct = pw && !pw->in_place() && (!has_scales(stored) || r1 - r0 <= kFp8DirectMaxRows);
  const BKind kind = direct ? stored : BKind::F32;
  // Bytes of one panel row of 16 as stored (f32 staging when not direct).
  const int64_t row_bytes = pw ? pw->row_bytes() : kPanel * int64_t(sizeof(float));
  const int64_t panel_elems = T * kPanel;
  const int64_t stored_panel_bytes = T * row_bytes;
  const int64_t panel_bytes = std::max<int64_t>(1, direct ? stored_panel_bytes : panel_elems * 4);
  // bf16 panels widen to f32 as they load, on either width.
  const bool wide =
      (kind == BKind::F32 || (kind == BKind::BF16 && pb.layout == ALayout::RowsAlongT)) && wide_vectors();
  const int max_rows = has_scales(kind) ? kFp8TileRows : wide ? kWideTileRows : kMaxTileRows;
  // Blocks of panels that every row tile walks before the next block, so the
  // tiles after the first read them from L2. Wide tiles want two panels:
  // blocks of at least two, even past kBlockBytes (long chains: the L2 of CPUs
  // with AVX-512 holds 1-2 MiB). One row tile (decode) reads each panel once,
  // so it has nothing to keep in L2: one block, and every tile takes its
  // preferred panels (blocks of one or two panels gave a chain of 2,048 or
  // more one-panel tiles, one stream at a time).
  const int64_t block = r1 - r0 <= max_rows ? std::max<int64_t>(1, p1 - p0)
                                            : std::max<int64_t>(wide ? 2 : 1, kBlockBytes / panel_bytes);
  const int64_t KB = pw && pw->storage == DType::FP8E4M3 ? pw->scale_blocks_k() : 0;
  const int64_t block_k = pw && pw->storage == DType::FP8E4M3 ? (pw->block_k > 0 ? pw->block_k : std::max<int64_t>(T, 1)) : 0;
  const bool pack_a = pb.layout == ALayout::RowsContiguous;
  // Staged panels are prepared a chunk at a time: wide enough that plain rows
  // are read in long contiguous runs, small enough to stay in L3. A packed A
  // (transposed rows, as costly as staging) is packed once per chunk, so it
  // takes one chunk for all panels where they are not too many.
  const int64_t stage_bytes =
      pack_a && (p1 - p0) * panel_elems * 4 <= kStageAllBytes ? kStageAllBytes : kStageBytes;
  const int64_t chunk =
      direct ? p1 - p0 : std::max<int64_t>(1, stage_bytes / std::max<int64_t>(1, panel_elems * 4));
  float* const scratch =
      direct ? nullptr : thread_scratch(0, std::max<int64_t>(1, std::min(chunk, p1 - p0) * panel_elems));
  // Short chains (a panel fits in L1, several row tiles): panel-outer order
  // with A blocks sized to L2. Otherwise rows in blocks whose A rows stay in
  // L3 while every panel of the chunk walks over them; without it a large
  // (M, K) A would stream from DRAM once per panel.
  const bool panel_outer = panel_bytes <= kL1PanelBytes && r1 - r0 > 2 * max_rows;
  const int64_t a_rows =
      std::max<int64_t>(max_rows, (panel_outer ? kAL2Bytes : kABlockBytes) / std::max<int64_t>(1, T * 4)) /
      max_rows * max_rows;

  float* const apack =
      pack_a ? thread_scratch(1, std::max<int64_t>(1, std::min(a_rows, r1 - r0) * T)) : nullptr;
  const BlockWalk walk{T, block, row_bytes, stored_panel_bytes, max_rows, wide, direct};

  for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
    const int64_t c1 = std::min(p1, c0 + chunk);
    if (!direct) stage_chunk(pb, stored, KB, block_k, c0, c1, scratch);
    // Panel p of this chunk, as the kernels read it.
    auto panel = [&](int64_t p) -> const void* {
      return direct ? static_cast<const void*>(static_cast<const char*>(pw->data.data()) +
                                               p * stored_panel_bytes)
                    : static_cast<const void*>(scratch + (p - c0) * panel_elems);
    };
    for (int64_t m0 = r0; m0 < r1; m0 += a_rows) {
      const int64_t m1 = std::min(r1, m0 + a_rows);
      if (pack_a) pack_a_tiles(pb, m0, m1, max_rows, 0, T, apack);
      // One kernel call: rows [r, r + rows) x panels [p, p + np).
      auto tile = [&](int64_t r, int rows, int64_t p, int np, const char* pf, int64_t pf_step,
                      int64_t pf_ps) {
        TileArgs g;
        g.a = pack_a ? apack + (r - m0) * T : pb.a + r * pb.a_stride;
        g.as = pack_a ? rows : pb.a_stride;
        g.b = panel(p);
        g.bps = panel_elems;
        g.t_count = T;
        g.c = pb.c + r * pb.ldc + p * kPanel;
        g.ldc = pb.ldc;
        g.ncols = pb.C - p * kPanel;
        g.accumulate = pb.accumulate;
        g.pf = pf ? pf : static_cast<const char*>(g.b);
        g.pf_step = pf ? pf_step : 0;
        g.pf_ps = pf ? pf_ps : 0;
        if (has_scales(kind)) {
          g.scales = pw->panel_scales.as<float>() + p * KB * kPanel;
          g.sps = KB * kPanel;
          g.block_k = block_k;
        }
        pick_tile(kind, pb.layout, rows, np, wide)(g);
      };
      if (panel_outer) {
        // A panel fits in L1: it stays there while the row tiles of the
        // (L2-sized) row block stream past it.
        for (int64_t p = c0; p < c1; ++p)
          for_row_tiles(m0, m1, max_rows, [&](int64_t r, int rows) { tile(r, rows, p, 1, nullptr, 0, 0); });
        continue;
      }
      walk_blocks(walk, c0, c1, p1, m0, m1, panel, tile);
    }
  }
}

// Splits the outputs statically (a pure function of the sizes) and runs.
void run(const Context& ctx, const Problem& pb) {
  if (pb.R == 0 || pb.C == 0) return;
  const int64_t P = (pb.C + kPanel - 1) / kPanel;
  const int64_t flops = 2 * pb.R * pb.C * std::max<int64_t>(pb.T, 1);
  const int64_t b_bytes = std::max<int64_t>(pb.T, 1) * P *
                          (pb.packed ? pb.packed->row_bytes() : kPanel * (pb.plain_bf16 ? 2 : 4));
  int tasks = flops >= kMinParallelFlops || b_bytes >= kMinParallelBBytes ? ctx.threads() : 1;
  const int64_t row_tiles = (pb.R + kMaxTileRows - 1) / kMaxTileRows;
  const bool split_panels = P >= tasks || P >= row_tiles;
  tasks = static_cast<int>(std::min<int64_t>(tasks, split_panels ? P : row_tiles));
  if (tasks <= 1 || !ctx.pool) {
    run_range(pb, 0, P, 0, pb.R);
    return;
  }
  ctx.pool->run_on_workers(tasks, [&](int t) {
    if (split_panels) {
      run_range(pb, P * t / tasks, P * (t + 1) / tasks, 0, pb.R);
    } else {
      const int64_t a = row_tiles * t / tasks * kMaxTileRows, b = row_tiles * (t + 1) / tasks * kMaxTileRows;
      run_range(pb, 0, P, a, std::min(b, pb.R));
    }
  });
}

// 2-D with contiguous rows (a row stride at least the width is allowed).
void check_matrix(const Tensor& t, const char* fn, const char* name) {
  if (t.ndim != 2) LS_THROW << fn << ": " << name << " must be 2-D, got " << t.shape_str();
  if ((t.shape[1] > 1 && t.stride[1] != 1) || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << fn << ": " << name << " must have contiguous rows and a row stride >= its width, got "
             << t.shape_str() << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

std::string packed_str(const PackedWeight& w) {
  std::ostringstream os;
  os << "(" << w.n << ", " << w.k << ") packed " << dtype_name(w.storage);
  return os.str();
}

}  // namespace

void check_gemm_xwt(const Tensor& y, const Tensor& x, const PackedWeight& w) {
  check_matrix(y, "gemm_xwt", "y");
  check_matrix(x, "gemm_xwt", "x");
  check_dtype(y, DType::F32, "gemm_xwt y");
  check_dtype(x, DType::F32, "gemm_xwt x");
  if (x.shape[1] != w.k || y.shape[0] != x.shape[0] || y.shape[1] != w.n)
    LS_THROW << "gemm_xwt: shapes do not match: y " << y.shape_str() << ", x " << x.shape_str() << ", w "
             << packed_str(w) << "; need y (M, N), x (M, K), w (N, K)";
}

void check_gemm_xwt(const Tensor& y, const Tensor& x, const Tensor& w) {
  check_matrix(w, "gemm_xwt", "w");
  check_matrix(y, "gemm_xwt", "y");
  check_matrix(x, "gemm_xwt", "x");
  if (x.shape[1] != w.shape[1] || y.shape[0] != x.shape[0] || y.shape[1] != w.shape[0])
    LS_THROW << "gemm_xwt: shapes do not match: y " << y.shape_str() << ", x " << x.shape_str() << ", w "
             << w.shape_str() << "; need y (M, N), x (M, K), w (N, K)";
  // What pack_weight and the packed form check next, in that order.
  if (w.dtype != DType::F32 && w.dtype != DType::BF16)
    LS_THROW << "pack_weight: w must be f32 or bf16, got " << w.shape_str();
  check_dtype(y, DType::F32, "gemm_xwt y");
  check_dtype(x, DType::F32, "gemm_xwt x");
}

void check_gemm_dyw(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  check_matrix(dx, "gemm_dyw", "dx");
  check_matrix(dy, "gemm_dyw", "dy");
  check_matrix(w, "gemm_dyw", "w");
  check_dtype(dx, DType::F32, "gemm_dyw dx");
  check_dtype(dy, DType::F32, "gemm_dyw dy");
  if (w.dtype != DType::F32 && w.dtype != DType::BF16)
    LS_THROW << "gemm_dyw: w must be f32 or bf16, got " << w.shape_str();
  if (dy.shape[1] != w.shape[0] || dx.shape[0] != dy.shape[0] || dx.shape[1] != w.shape[1])
    LS_THROW << "gemm_dyw: shapes do not match: dx " << dx.shape_str() << ", dy " << dy.shape_str() << ", w "
             << w.shape_str() << "; need dx (M, K), dy (M, N), w (N, K)";
}

void check_gemm_dytx(const Tensor& dw, const Tensor& dy, const Tensor& x) {
  check_matrix(dw, "gemm_dytx", "dw");
  check_matrix(dy, "gemm_dytx", "dy");
  check_matrix(x, "gemm_dytx", "x");
  check_dtype(dw, DType::F32, "gemm_dytx dw");
  check_dtype(dy, DType::F32, "gemm_dytx dy");
  check_dtype(x, DType::F32, "gemm_dytx x");
  if (dy.shape[0] != x.shape[0] || dw.shape[0] != dy.shape[1] || dw.shape[1] != x.shape[1])
    LS_THROW << "gemm_dytx: shapes do not match: dw " << dw.shape_str() << ", dy " << dy.shape_str() << ", x "
             << x.shape_str() << "; need dw (N, K), dy (M, N), x (M, K)";
}

GemmKBlocking gemm_kblocking() {
  return kblocking();
}

void set_gemm_kblocking(const GemmKBlocking& k) {
  if (k.block < 1 || k.min_t < 1 || k.stage_bytes < 1 || k.carry_bytes < 1 || k.min_rows < 1)
    LS_THROW << "set_gemm_kblocking: every field must be positive (block " << k.block << ", min_t " << k.min_t
             << ", stage_bytes " << k.stage_bytes << ", carry_bytes " << k.carry_bytes << ", min_rows "
             << k.min_rows << ")";
  kblocking() = k;
}

void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const PackedWeight& w, bool accumulate) {
  if (w.in_place() && ctx.gpu != nullptr) {  // the device's plain form reads the rows
    Tensor rows(const_cast<float*>(w.rows), DType::F32, {w.n, w.k});
    rows.stride[0] = w.rows_ld;
    gemm_xwt(ctx, y, x, rows, accumulate);
    return;
  }
  LS_GPU_DISPATCH(ctx, gemm_xwt_packed, y, x, w, accumulate);
  check_gemm_xwt(y, x, w);
  Problem pb;
  pb.R = x.shape[0];
  pb.T = w.k;
  pb.C = w.n;
  pb.a = static_cast<const float*>(x.data);
  pb.a_stride = x.stride[0];
  pb.c = static_cast<float*>(y.data);
  pb.ldc = y.stride[0];
  pb.accumulate = accumulate;
  pb.packed = &w;
  run(ctx, pb);
}

void gemm_xwt(const Context& ctx, Tensor y, const Tensor& x, const Tensor& w, bool accumulate) {
  LS_GPU_DISPATCH(ctx, gemm_xwt, y, x, w, accumulate);
  check_gemm_xwt(y, x, w);
  // bf16 weights stay bf16 (exact either way; half the bytes to stream).
  gemm_xwt(ctx, y, x, pack_weight(ctx, w, w.dtype == DType::BF16 ? DType::BF16 : DType::F32), accumulate);
}

void gemm_dyw(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& w, bool accumulate) {
  LS_GPU_DISPATCH(ctx, gemm_dyw, dx, dy, w, accumulate);
  check_gemm_dyw(dx, dy, w);
  Problem pb;
  pb.R = dy.shape[0];
  pb.T = w.shape[0];
  pb.C = w.shape[1];
  pb.a = static_cast<const float*>(dy.data);
  pb.a_stride = dy.stride[0];
  pb.c = static_cast<float*>(dx.data);
  pb.ldc = dx.stride[0];
  pb.accumulate = accumulate;
  pb.plain = w.data;
  pb.plain_bf16 = w.dtype == DType::BF16;
  pb.plain_ld = w.stride[0];
  run(ctx, pb);
}

void gemm_dytx(const Context& ctx, Tensor dw, const Tensor& dy, const Tensor& x, bool accumulate) {
  LS_GPU_DISPATCH(ctx, gemm_dytx, dw, dy, x, accumulate);
  check_gemm_dytx(dw, dy, x);
  Problem pb;
  pb.R = dw.shape[0];
  pb.T = x.shape[0];
  pb.C = x.shape[1];
  pb.a = static_cast<const float*>(dy.data);
  pb.a_stride = dy.stride[0];
  pb.layout = ALayout::RowsContiguous;
  pb.c = static_cast<float*>(dw.data);
  pb.ldc = dw.stride[0];
  pb.accumulate = accumulate;
  pb.plain = x.data;
  pb.plain_ld = x.stride[0];
  run(ctx, pb);
}

}  // namespace lockstep::kernels
