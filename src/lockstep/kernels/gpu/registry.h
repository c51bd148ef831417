// Each GPU kernel source registers its host entry points in the backend table;
// backend.cu calls every register_* below, for whichever build it is
// (interpret, CUDA or HIP: LS_GPU_NS, kernels/gpu/portable.h).
#pragma once

#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/portable.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

void register_elementwise(GpuBackend& b);  // swiglu.cu, embedding.cu, rope.cu
void register_embedding(GpuBackend& b);    // embedding.cu
void register_gemm(GpuBackend& b);         // gemm.cu
void register_rmsnorm(GpuBackend& b);      // rmsnorm.cu
void register_softmax(GpuBackend& b);      // softmax.cu
void register_attention(GpuBackend& b);    // attention.cu
void register_moe(GpuBackend& b);          // moe.cu
void register_adamw(GpuBackend& b);        // adamw.cu
void register_rows(GpuBackend& b);         // rows.cu, fp8_quant.cu
void register_v4_rows(GpuBackend& b);      // v4_rows.cu
void register_memory(GpuBackend& b);       // memory.cu: the device allocator
void register_sampling(GpuBackend& b);     // sampling.cu
void register_mhc(GpuBackend& b);          // mhc.cu, streams.cu, swiglu.cu's clamped forms
// kv_compress.h, sparse_attention.h
void register_kv_compress(GpuBackend& b);       // kv_compress.cu
void register_sparse_attention(GpuBackend& b);  // sparse_attention.cu

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
