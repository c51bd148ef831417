// Where a Buffer's memory lives: host memory (the CPU kernels) or a device's
// (the GPU backends, kernels/gpu/backend.h). The engines allocate their
// weights, KV blocks, activations and scratch through the allocator of the
// device their Context names, so one code path serves every device.
#pragma once

#include <cstddef>

namespace lockstep {

// The contents of a new allocation. Zero: every byte 0 (what Buffer always
// gave). Undefined: the caller writes before it reads; interpret mode then
// poisons the memory (0xFF bytes, NaN as f32) so that a read of an unwritten
// element shows as a NaN in the result.
enum class Fill { Zero, Undefined };

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual const char* name() const = 0;  // "host", "interpret", "cuda", "hip"
  // `bytes` of memory aligned to kAlignment (64), filled as `fill`. `what`
  // names the allocation in errors (interpret mode's guard-zone reports).
  // Throws lockstep::Error when out of memory. Zero bytes gives nullptr.
  virtual void* allocate(size_t bytes, Fill fill, const char* what) const = 0;
  virtual void release(void* p) const noexcept = 0;
  // Whether host code may read and write this memory directly (host and
  // interpret mode: yes; a real device: no, use the copies below).
  virtual bool host_visible() const = 0;
  // Copies between this allocator's memory and host memory.
  virtual void copy_in(void* dst, const void* host_src, size_t bytes) const = 0;
  virtual void copy_out(void* host_dst, const void* src, size_t bytes) const = 0;
  // Whether p points into memory of this allocator (host: any pointer, as
  // host code can only hand out host memory there).
  virtual bool holds(const void* p) const = 0;
  // Copies within this allocator's memory (dst and src both from it).
  virtual void copy(void* dst, const void* src, size_t bytes) const = 0;
  // `rows` rows of `row_bytes` each within this allocator's memory, row r
  // from src + r * src_pitch to dst + r * dst_pitch (cudaMemcpy2D). The
  // default copies row by row.
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                       size_t rows) const;
  // Sets `bytes` bytes at dst (this allocator's memory) to `byte`
  // (cudaMemset's shape): how host code zeroes memory it may not touch. The
  // default copies in a bounded host block of `byte`s, chunk by chunk.
  virtual void fill(void* dst, unsigned char byte, size_t bytes) const;
};

// Aligned host memory (the CPU, and the default of every Buffer).
const Allocator& host_allocator();

}  // namespace lockstep
