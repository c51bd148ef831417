// The seam between the engines and a GPU backend. Context::gpu points at one
// GpuBackend table (or is null: the CPU). Each CPU kernel entry point starts
// with LS_GPU_DISPATCH: when the table has an entry of its name, the call goes
// there, with the same arguments, and must return the same bits.
//
// An entry left null runs the CPU kernel. That is only correct in interpret
// mode, where device memory is host memory; backends on a real device fill
// every entry the engines reach (GpuBackend::missing lists the others).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

struct PackedWeight;
struct RopeTable;
struct AttentionBatch;
struct MoeDispatch;
struct RouterConfig;
struct AdamWParams;
struct SampleSpec;
struct MhcMix;
struct MhcConfig;

struct GpuBackend {
  const char* name = "";  // "interpret", "cuda", "hip"
  // The device's memory: the engines allocate weights, KV blocks,
  // activations and scratch from it (device_memory below).
  const Allocator* memory = nullptr;

  // gemm.h
  void (*gemm_xwt_packed)(const Context&, Tensor y, const Tensor& x, const PackedWeight& w, bool accumulate) = nullptr;
  void (*gemm_xwt)(const Context&, Tensor y, const Tensor& x, const Tensor& w, bool accumulate) = nullptr;
  void (*gemm_dyw)(const Context&, Tensor dx, const Tensor& dy, const Tensor& w, bool accumulate) = nullptr;
  void (*gemm_dytx)(const Context&, Tensor dw, const Tensor& dy, const Tensor& x, bool accumulate) = nullptr;
  // gemm_pack.cpp: the values a packed weight's products multiply by (bf16/fp8 training's widened copy)
  void (*unpack_weight)(const Context&, Tensor w_out, const PackedWeight& pw) = nullptr;
  // embedding.h
  void (*embedding_forward)(const Context&, Tensor out, const Tensor& table, const Tensor& ids) = nullptr;
  void (*embedding_backward)(const Context&, Tensor dtable, const Tensor& dout, const Tensor& ids) = nullptr;
  // rmsnorm.h
  void (*rmsnorm_forward)(const Context&, Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps) = nullptr;
  void (*add_rmsnorm_forward)(const Context&, Tensor y, Tensor h_out, Tensor rstd, const Tensor& x, const Tensor& r,
                              const Tensor& w, float eps) = nullptr;
  void (*rmsnorm_backward)(const Context&, Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                           const Tensor& rstd) = nullptr;
  // rope.h (table forms)
  void (*rope_forward)(const Context&, Tensor x, const Tensor& positions, const RopeTable& table) = nullptr;
  void (*rope_backward)(const Context&, Tensor dx, const Tensor& positions, const RopeTable& table) = nullptr;
  void (*rope_interleaved_forward)(const Context&, Tensor x, const Tensor& positions,
                                   const RopeTable& table) = nullptr;
  void (*rope_interleaved_inverse)(const Context&, Tensor x, const Tensor& positions,
                                   const RopeTable& table) = nullptr;
  // swiglu.h
  void (*swiglu_forward)(const Context&, Tensor out, const Tensor& gate, const Tensor& up) = nullptr;
  void (*swiglu_backward)(const Context&, Tensor dgate, Tensor dup, const Tensor& dout, const Tensor& gate,
                          const Tensor& up) = nullptr;
  // rows.h
  void (*add_row_bias)(const Context&, Tensor y, const Tensor& b) = nullptr;
  void (*add_rows)(const Context&, Tensor out, const Tensor& a, const Tensor& b) = nullptr;
  void (*add_scaled_rows)(const Context&, Tensor y, const Tensor& x, const Tensor& s) = nullptr;
  void (*sigmoid_forward)(const Context&, Tensor y, const Tensor& x) = nullptr;
  // fp8_quant.h
  void (*fp8_quantize_rows)(const Context&, Tensor x, int64_t group) = nullptr;
  // softmax.h
  void (*token_logprob_forward)(const Context&, Tensor logp, Tensor entropy, Tensor lse, const Tensor& logits,
                                const Tensor& targets, float temperature) = nullptr;
  void (*token_logprob_backward)(const Context&, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                                 const Tensor& logits, const Tensor& targets, float temperature) = nullptr;
  void (*token_logprob_stats)(const Context&, Tensor stats, const Tensor& logits, float temperature,
                              bool entropy) = nullptr;
  void (*token_logprob_backward_cols)(const Context&, Tensor dlogits, const Tensor& dlogp,
                                      const Tensor& dentropy, const Tensor& logits, const Tensor& targets,
                                      const Tensor& stats, int64_t col0, float temperature) = nullptr;
  // attention.h
  void (*kv_cache_write)(const Context&, Tensor k_cache, Tensor v_cache, const Tensor& k_new, const Tensor& v_new,
                         const AttentionBatch& batch) = nullptr;
  void (*attention_forward)(const Context&, Tensor out, Tensor lse, const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionBatch& batch, float scale) = nullptr;
  void (*attention_backward)(const Context&, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const AttentionBatch& batch, float scale) = nullptr;
  // moe.h
  void (*moe_route)(const Context&, Tensor topk_idx, Tensor topk_w, Tensor scores, const Tensor& router_logits,
                    const Tensor& bias, const Tensor& replay_idx, const RouterConfig& cfg) = nullptr;
  void (*moe_gather)(const Context&, Tensor xe, const Tensor& x, const MoeDispatch& plan) = nullptr;
  void (*moe_combine)(const Context&, Tensor y, const Tensor& ye, const Tensor& topk_w,
                      const MoeDispatch& plan) = nullptr;
  void (*moe_route_backward)(const Context&, Tensor dlogits, const Tensor& dtopk_w, const Tensor& scores,
                             const Tensor& topk_idx, const RouterConfig& cfg) = nullptr;
  void (*moe_gather_backward)(const Context&, Tensor dx, const Tensor& dxe, const MoeDispatch& plan) = nullptr;
  void (*moe_combine_backward)(const Context&, Tensor dye, Tensor dtopk_w, const Tensor& dy, const Tensor& ye,
                               const Tensor& topk_w, const MoeDispatch& plan) = nullptr;
  // adamw.h
  void (*adamw_step)(const Context&, float* param, const float* grad, float* m, float* v, int64_t n,
                     const AdamWParams& hp) = nullptr;
  // v4_rows.h
  void (*scale_values)(const Context&, Tensor x, float s) = nullptr;
  void (*moe_row_weights)(const Context&, Tensor w_rows, const Tensor& topk_w,
                          const MoeDispatch& plan) = nullptr;
  void (*moe_row_weights_backward)(const Context&, Tensor dtopk_w, const Tensor& dw_rows,
                                   const MoeDispatch& plan) = nullptr;
  // moe.h, DeepSeek-V4's routed experts (v4_rows.cu)
  void (*moe_scale_rows)(const Context&, Tensor y, const Tensor& x, const Tensor& topk_w,
                         const MoeDispatch& plan) = nullptr;
  void (*moe_scale_rows_backward)(const Context&, Tensor dx, Tensor dtopk_w, const Tensor& dy,
                                  const Tensor& x, const Tensor& topk_w, const MoeDispatch& plan) = nullptr;
  void (*moe_sum)(const Context&, Tensor y, const Tensor& ye, const MoeDispatch& plan) = nullptr;
  void (*moe_sum_backward)(const Context&, Tensor dye, const Tensor& dy, const MoeDispatch& plan) = nullptr;
  // sampling.h
  void (*sample_rows)(const Context&, Tensor tokens_out, const Tensor& logits,
                      const std::vector<SampleSpec>& rows) = nullptr;
  // mhc.h (DeepSeek-V4 hyper-connections), streams.h, swiglu.h's clamped forms
  void (*mhc_mix_forward)(const Context&, const MhcMix& out, const Tensor& x, const Tensor& fn,
                          const Tensor& base, const Tensor& scale, const MhcConfig& cfg) = nullptr;
  void (*mhc_mix_backward)(const Context&, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                           const Tensor& dpre, const Tensor& dpost, const Tensor& dcomb, const Tensor& x,
                           const MhcMix& saved, const Tensor& fn, const Tensor& base, const Tensor& scale,
                           const MhcConfig& cfg) = nullptr;
  void (*mhc_pre_apply)(const Context&, Tensor u, const Tensor& x, const Tensor& pre, int n) = nullptr;
  void (*mhc_pre_apply_backward)(const Context&, Tensor dx, Tensor dpre, const Tensor& du, const Tensor& x,
                                 const Tensor& pre, int n) = nullptr;
  void (*mhc_post)(const Context&, Tensor y, const Tensor& f, const Tensor& x, const Tensor& post,
                   const Tensor& comb, int n) = nullptr;
  void (*mhc_post_backward)(const Context&, Tensor dx, Tensor df, Tensor dpost, Tensor dcomb,
                            const Tensor& dy, const Tensor& f, const Tensor& x, const Tensor& post,
                            const Tensor& comb, int n) = nullptr;
  void (*mhc_head_forward)(const Context&, Tensor h, Tensor w, Tensor raw, Tensor rstd, const Tensor& x,
                           const Tensor& fn, const Tensor& base, const Tensor& scale,
                           const MhcConfig& cfg) = nullptr;
  void (*mhc_head_backward)(const Context&, Tensor dx, Tensor dfn, Tensor dbase, Tensor dscale,
                            const Tensor& dh, const Tensor& x, const Tensor& w, const Tensor& raw,
                            const Tensor& rstd, const Tensor& fn, const Tensor& base, const Tensor& scale,
                            const MhcConfig& cfg) = nullptr;
  void (*add_to_streams)(const Context&, Tensor x, const Tensor& e, int64_t n) = nullptr;
  void (*repeat_streams)(const Context&, Tensor x, const Tensor& e, int64_t n) = nullptr;
  void (*sum_streams)(const Context&, Tensor de, const Tensor& dx, int64_t n) = nullptr;
  void (*swiglu_clamped_forward)(const Context&, Tensor out, const Tensor& gate, const Tensor& up,
                                 float limit) = nullptr;
  void (*swiglu_clamped_backward)(const Context&, Tensor dgate, Tensor dup, const Tensor& dout,
                                  const Tensor& gate, const Tensor& up, float limit) = nullptr;
  // kv_compress.h, sparse_attention.h (DeepSeek-V4)
  void (*compress_forward)(const Context&, Tensor out, const Tensor& store, const Tensor& rows,
                           const Tensor& ape, int ratio, bool overlap) = nullptr;
  void (*compress_backward)(const Context&, Tensor dstore, Tensor dape, const Tensor& dout,
                            const Tensor& store, const Tensor& rows, const Tensor& ape, int ratio,
                            bool overlap) = nullptr;
  void (*indexer_select)(const Context&, Tensor selected, Tensor scores, const Tensor& qi, const Tensor& w,
                         const Tensor& keys, const Tensor& cand) = nullptr;
  void (*sparse_attention_forward)(const Context&, Tensor out, Tensor lse, const Tensor& q,
                                   const Tensor& store, const Tensor& cand, const Tensor& sink,
                                   float scale) = nullptr;
  void (*sparse_attention_backward)(const Context&, Tensor dq, Tensor dstore, Tensor dsink,
                                    const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& q,
                                    const Tensor& store, const Tensor& cand, const Tensor& sink,
                                    float scale) = nullptr;

  // Names of the entries left null (the kernels this backend does not cover).
  std::vector<std::string> missing() const;
  std::vector<std::string> covered() const;
};

// The interpret-mode backend: the GPU kernel sources compiled by the host
// compiler and run by the emulator (kernels/gpu/interp/emu.h).
const GpuBackend& interpret_backend();

// The memory a context's kernels read and write: its backend's device
// memory, or host memory for the CPU.
inline const Allocator& device_memory(const Context& ctx) {
  return ctx.gpu != nullptr && ctx.gpu->memory != nullptr ? *ctx.gpu->memory : host_allocator();
}

// t as host code may read it: t itself, or, when t lies in device memory
// that the host cannot touch (strict interpret mode), a view of a copy of
// its elements in `keep` (same strides). For the checks the CPU and GPU
// entries share (token ids, targets, positions, expert indices: small) and
// for host code that packs weights.
Tensor host_readable(const Tensor& t, std::vector<unsigned char>& keep);
// Adds a device backend's allocator to those host_readable knows (interpret
// mode's is always there); device_backend() calls it when it opens a device.
void note_device_memory(const Allocator* memory);

// The context to run a CPU kernel from inside a GPU entry (no re-dispatch).
inline Context cpu_context(const Context& ctx) {
  Context c = ctx;
  c.gpu = nullptr;
  return c;
}

}  // namespace lockstep::kernels

// First statement of a CPU kernel entry point: forwards the call to the GPU
// backend's entry `entry` when the context has one.
#define LS_GPU_DISPATCH(ctx, entry, ...)              \
  do {                                                \
    if ((ctx).gpu != nullptr && (ctx).gpu->entry) {   \
      (ctx).gpu->entry((ctx), __VA_ARGS__);           \
      return;                                         \
    }                                                 \
  } while (0)
