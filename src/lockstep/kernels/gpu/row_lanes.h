// Rows reduced by 16 threads each, thread l owning the canonical lane l
// (elements l, l + 16, ... in index order): the block shape shared by the
// row kernels (rmsnorm.cu, softmax.cu) and the tree that combines a row's
// lane partials.
#pragma once

#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

constexpr int kLanes = num::kLanes;
// Rows per block at most: (16, 64) is 1024 threads, the per-block limit.
constexpr int kMaxRows = 64;
constexpr int kSlots = kLanes * kMaxRows;  // lane partials a block holds, (kMaxRows, 16)

// The row's 16 lane partials (shared memory) combined by the canonical tree.
LS_DEVICE inline float tree_of(const float* part) {
  float lanes[kLanes];
  for (int j = 0; j < kLanes; ++j) lanes[j] = part[j];
  return num::tree16(lanes);
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
