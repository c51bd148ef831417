// The trainer's host code on memory it may not touch: a trainer on a device
// keeps its activations, gradients and optimizer moments in device memory
// (kernels::device_memory), which host code reads and writes only through
// the allocator's copies and fills. Host memory takes the direct paths.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/model/params.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::train {

// One micro-batch's per-token rows as the losses read and write them: copies
// of the logprobs and entropies the kernels wrote, and the gradients the
// losses write, zero where a loss leaves a token, copied back in one go.
struct HostTokenRows {
  std::vector<float> logp, ent;    // (R)
  std::vector<float> dlogp, dent;  // (R), zeroed by read()
  // ent may be an empty Tensor (no entropy asked for): `ent` stays empty.
  void read(const Allocator& memory, const Tensor& logp_rows, const Tensor& ent_rows);
  void write_grads(const Allocator& memory, Tensor dlogp_rows, Tensor dent_rows) const;
};

// Calls emit(chunk, count) over n floats at `data` (memory's), in order, with
// at most `chunk` floats a call: `data` itself where host code may read it,
// else a host copy of each chunk. A checkpoint writes a model-sized buffer
// through it with a bounded host copy.
void for_each_host_chunk(const Allocator& memory, const float* data, int64_t n, int64_t chunk,
                         const std::function<void(const float*, int64_t)>& emit);

// Fills n floats at `data` (memory's) from `read(dst, count)`, in order, at
// most `chunk` floats a call: straight into `data` where host code may write
// it, else through a host chunk copied in.
void fill_from_host(const Allocator& memory, float* data, int64_t n, int64_t chunk,
                    const std::function<void(float*, int64_t)>& read);

// Every byte of `bytes` at `data` (memory's) zero: on every thread in host
// memory (one thread does not saturate memory bandwidth on hundreds of MB),
// the allocator's fill on a device.
void zero_memory(const Context& ctx, const Allocator& memory, void* data, size_t bytes);

// kernels::global_grad_norm of n gradients in `memory`: the same chunk sums
// in the same order (chunks of kernels::kNormChunk; a host copy holds a whole
// number of them), so the same bits on every device.
double grad_norm(const Context& ctx, const Allocator& memory, const float* grads, int64_t n);

// kernels::norm_chunk_sums of `segments` in `memory`, segment by segment
// (each from its own start, so the same sums as on the host): on host copies
// of bounded chunks where the host may not read the memory.
std::vector<double> norm_chunk_sums(const Context& ctx, const Allocator& memory,
                                    const std::vector<kernels::FloatSegment>& segments);

// grad_reduce (TrainerConfig) on n gradients in `memory`: in place in host
// memory; else on host copies of consecutive chunks (the same chunks on
// every rank, as each rank's buffer has the same n), each copied back.
void reduce_through_host(const Allocator& memory, float* grads, int64_t n,
                         const std::function<void(float*, size_t)>& reduce);

// kernels::scale_grads on n gradients in `memory` (one f32 multiply each, so
// any order gives the same bits): in place, or on host copies of bounded chunks.
void scale_gradients(const Context& ctx, const Allocator& memory, float* grads, int64_t n, float factor);

// load_params of `layout` from `dir` into params in `memory`: in place in
// host memory; in device memory read into a host copy, then one copy in
// (the checkpoint's f32 values, so the same bits).
void load_params_into(const Context& ctx, const Allocator& memory, const std::string& dir,
                      const ParamLayout& layout, float* params);

}  // namespace lockstep::train
