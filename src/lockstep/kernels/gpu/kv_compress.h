// The GPU entries of DeepSeek-V4's KV compressor and lightning-indexer
// selection (kernels/cpu/kv_compress.h), with the launch geometry as a
// parameter so tests can run several block shapes. Same arguments, errors
// and bits as the CPU kernels; every tensor is device memory (the index
// tensors are copied out for the range checks only).
#pragma once

#include "lockstep/kernels/cpu/kv_compress.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

struct KvCompressLaunch {
  // Compressor: one thread per (entry, channel) in the forward, per channel in
  // the backward. Indexer: one block per query, its threads splitting the
  // candidates. Any count in [1, 1024] gives the same bits.
  int threads = 128;
  // 0: one pass (up to 2048 blocks for the kernels with a scratch row per
  // block); else a grid-stride loop over at most this many blocks.
  int max_blocks = 0;
};

void compress_forward(const Context& ctx, Tensor out, const Tensor& store, const Tensor& rows,
                      const Tensor& ape, int ratio, bool overlap, const KvCompressLaunch& cfg);
void compress_backward(const Context& ctx, Tensor dstore, Tensor dape, const Tensor& dout,
                       const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio, bool overlap,
                       const KvCompressLaunch& cfg);
void indexer_select(const Context& ctx, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                    const Tensor& keys, const Tensor& cand, const KvCompressLaunch& cfg);

// The backend table's entries: the calls above with KvCompressLaunch{}.
void compress_forward(const Context& ctx, Tensor out, const Tensor& store, const Tensor& rows,
                      const Tensor& ape, int ratio, bool overlap);
void compress_backward(const Context& ctx, Tensor dstore, Tensor dape, const Tensor& dout,
                       const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio, bool overlap);
void indexer_select(const Context& ctx, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                    const Tensor& keys, const Tensor& cand);

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
