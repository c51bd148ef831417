// Backward of paged-cache attention for the training case (every token new).
// Two passes that recompute P = exp(s - lse) instead of storing (T, T) matrices:
// pass 1 owns dq rows (and the row terms D = dout . out), pass 2 owns dk/dv rows.
#include <algorithm>
#include <string>
#include <vector>

#include "lockstep/kernels/cpu/attention.h"
#include "lockstep/kernels/cpu/attention_impl.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

// With s_tj = scale * q_t . k_j, P = softmax_j(s), out_t = Σ_j P_tj v_j:
//   dP_tj = dout_t . v_j,  dS_tj = P_tj (dP_tj - D_t),  D_t = dout_t . out_t
//   dq_t = scale Σ_j dS_tj k_j,  dk_j = scale Σ_{h in group} Σ_t dS_tj q_t,
//   dv_j = Σ_{h in group} Σ_t P_tj dout_t.
// Each sum runs in a fixed order (keys ascending; heads, then queries ascending).
void attention_backward(const Context& ctx, Tensor dq, Tensor dk, Tensor dv, const Tensor& dout,
                        const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const AttentionBatch& batch, float scale) {
  LS_GPU_DISPATCH(ctx, attention_backward, dq, dk, dv, dout, out, lse, q, k_cache, v_cache, batch, scale);
  const attn::BatchPlan p =
      attn::plan_attention_backward(dq, dk, dv, dout, out, lse, q, k_cache, v_cache, batch);
  const int64_t T = p.T, H = q.shape[1], Dh = p.Dh, Hkv = p.Hkv;
  if (T == 0) return;

  const int64_t G = H / Hkv;
  const attn::CacheView cache{k_cache.data, v_cache.data, k_cache.dtype == DType::BF16, p.BS, Hkv, Dh};
  auto q_row = [&](int64_t t, int64_t h) { return q.ptr<float>() + t * q.stride[0] + h * Dh; };
  auto do_row = [&](int64_t t, int64_t h) { return dout.ptr<float>() + t * dout.stride[0] + h * Dh; };
  auto lse_at = [&](int64_t t, int64_t h) { return lse.ptr<float>()[t * lse.stride[0] + h]; };
  std::vector<float> dsum(static_cast<size_t>(T * H));  // (T, H): D = dout . out

  // Pass 1: item (t, h) visits keys 0..pos(t) and writes dq[t, h] and D[t, h].
  const std::vector<int64_t> r1 =
      attn::balanced_ranges(T * H, ctx.threads(), [&](int64_t i) { return int64_t{p.pos[i / H]} + 1; });
  ctx.parallel_for(
      static_cast<int64_t>(r1.size()) - 1,
      [&](int64_t rb, int64_t re) {
        std::vector<float> acc(static_cast<size_t>(Dh));  // (Dh)
        std::vector<float> tiles(cache.bf16 ? static_cast<size_t>(2 * kKeyBlock * Dh)
                                            : 0);  // (2, kKeyBlock, Dh)
        const float* kp[kKeyBlock];
        const float* vp[kKeyBlock];
        float pr[kKeyBlock + 8], dp[kKeyBlock + 8], ds[kKeyBlock];  // scores() may write 8 past n
        for (int64_t i = r1[rb]; i < r1[re]; ++i) {
          const int64_t t = i / H, h = i % H, kvh = h / G, pos = p.pos[t];
          const int32_t* row = p.table + p.seq[t] * p.table_stride;
          const float* qt = q_row(t, h);
          const float* dor = do_row(t, h);
          const float l = lse_at(t, h);
          const float D = attn::dot(dor, out.ptr<float>() + t * out.stride[0] + h * Dh, Dh);
          dsum[t * H + h] = D;
          for (int64_t j = 0; j * kKeyBlock <= pos; ++j) {
            const int64_t p0 = j * kKeyBlock;
            const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, pos + 1 - p0));
            cache.gather(row, p0, n, kvh, kp, vp, tiles.data(), tiles.data() + kKeyBlock * Dh);
            attn::scores(qt, kp, n, Dh, scale, pr);
            for (int k = 0; k < n; ++k) pr[k] = pr[k] - l;
            vexp(pr, pr, n);
            attn::scores(dor, vp, n, Dh, 1.0f, dp);
            for (int k = 0; k < n; ++k) ds[k] = pr[k] * (dp[k] - D);
            attn::scale_and_accumulate(acc.data(), Dh, j == 0, 1.0f, ds, kp, n);
          }
          attn::scale_row(dq.ptr<float>() + t * dq.stride[0] + h * Dh, acc.data(), scale, /*divide=*/false,
                          Dh);
        }
      },
      1);

  // Pass 2: item (t, kvh) is key row t; it visits the queries t..end of its
  // sequence for each head of the group and writes dk[t, kvh], dv[t, kvh].
  const std::vector<int64_t> r2 = attn::balanced_ranges(T * Hkv, ctx.threads(), [&](int64_t i) {
    const int64_t t = i / Hkv;
    return (p.first[p.seq[t] + 1] - t) * G;
  });
  ctx.parallel_for(
      static_cast<int64_t>(r2.size()) - 1,
      [&](int64_t rb, int64_t re) {
        std::vector<float> kacc(static_cast<size_t>(Dh)), vacc(static_cast<size_t>(Dh));  // (Dh) each
        std::vector<float> tiles(cache.bf16 ? static_cast<size_t>(2 * Dh) : 0);           // (2, Dh)
        const float* qp[kKeyBlock];
        const float* dop[kKeyBlock];
        float pr[kKeyBlock + 8], dpv[kKeyBlock + 8], ds[kKeyBlock];  // scores() may write 8 past n
        for (int64_t i = r2[rb]; i < r2[re]; ++i) {
          const int64_t t = i / Hkv, kvh = i % Hkv, end = p.first[p.seq[t] + 1];
          const int32_t* row = p.table + p.seq[t] * p.table_stride;
          const float* kj;
          const float* vj;
          cache.gather(row, p.pos[t], 1, kvh, &kj, &vj, tiles.data(), tiles.data() + Dh);
          bool first = true;
          for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
            for (int64_t u0 = t; u0 < end; u0 += kKeyBlock) {
              const int n = static_cast<int>(std::min<int64_t>(kKeyBlock, end - u0));
              for (int k = 0; k < n; ++k) {
                qp[k] = q_row(u0 + k, h);
                dop[k] = do_row(u0 + k, h);
              }
              // k_j . q_u has the bits of q_u . k_j: fma's product is symmetric.
              attn::scores(kj, qp, n, Dh, scale, pr);
              for (int k = 0; k < n; ++k) pr[k] = pr[k] - lse_at(u0 + k, h);
              vexp(pr, pr, n);
              attn::scores(vj, dop, n, Dh, 1.0f, dpv);
              for (int k = 0; k < n; ++k) ds[k] = pr[k] * (dpv[k] - dsum[(u0 + k) * H + h]);
              attn::scale_and_accumulate(vacc.data(), Dh, first, 1.0f, pr, dop, n);
              attn::scale_and_accumulate(kacc.data(), Dh, first, 1.0f, ds, qp, n);
              first = false;
            }
          }
          attn::scale_row(dk.ptr<float>() + t * dk.stride[0] + kvh * Dh, kacc.data(), scale, /*divide=*/false,
                          Dh);
          std::copy(vacc.begin(), vacc.end(), dv.ptr<float>() + t * dv.stride[0] + kvh * Dh);
        }
      },
      1);
}

}  // namespace lockstep::kernels
