// The MoE router, forward and backward: scores, biased (optionally
// group-limited) top-k selection with lower-index tie-breaking, routing replay,
// normalized and scaled weights. One token at a time, so threads split tokens.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

// Added to the normalizer as DeepSeek-V3 does, so a sum of zeros gives 0, not NaN.
constexpr float kNormEps = 1e-20f;

// Tokens per thread range: a token costs O(E); small batches stay on one thread.
constexpr int64_t kTokenGrain = 8;

bool absent(const Tensor& t) { return t.ndim == 0; }

// 2-D operands: unit column stride, row stride at least the width.
void check_rows(const Tensor& t, const char* what) {
  if ((t.shape[1] > 1 && t.stride[1] != 1) || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must be dense with row stride >= width, got " << t.shape_str() << " strides ("
             << t.stride[0] << ", " << t.stride[1] << ")";
}

template <typename T>
T* row(const Tensor& t, int64_t r) {
  return static_cast<T*>(t.data) + r * t.stride[0];
}

// Ranking used by every selection: larger value first, lower index on ties,
// NaN after every number (so a NaN row still yields valid, distinct indices).
inline bool ranks_before(float va, int32_t a, float vb, int32_t b) {
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na || nb) return (!na && nb) || (na && nb && a < b);
  return va > vb || (va == vb && a < b);
}

// Writes the k best of v[begin..end) (skipping indices whose `allowed` is
// false) to out[0..k) in rank order. Candidates arrive in index order, so a
// later candidate equal to a kept one ranks after it. Returns how many it found.
template <typename Allowed>
int select_topk(const float* v, int32_t begin, int32_t end, int k, Allowed allowed, int32_t* out) {
  int n = 0;
  for (int32_t e = begin; e < end; ++e) {
    if (!allowed(e)) continue;
    if (n == k && !ranks_before(v[e], e, v[out[k - 1]], out[k - 1])) continue;
    int pos = n < k ? n++ : k - 1;
    while (pos > 0 && ranks_before(v[e], e, v[out[pos - 1]], out[pos - 1])) {
      out[pos] = out[pos - 1];
      --pos;
    }
    out[pos] = e;
  }
  return n;
}

// Per-thread scratch for one token's selection.
struct Scratch {
  std::vector<float> choice;       // (E) p + bias
  std::vector<float> group_score;  // (n_group)
  std::vector<int32_t> groups;     // (topk_group) chosen groups
  std::vector<uint8_t> group_ok;   // (n_group)
  explicit Scratch(const RouterConfig& cfg)
      : choice(static_cast<size_t>(cfg.num_experts)),
        group_score(static_cast<size_t>(cfg.n_group)),
        groups(static_cast<size_t>(cfg.topk_group)),
        group_ok(static_cast<size_t>(cfg.n_group)) {}
};

// Selects K experts for one token from its scores p (E).
void select_token(const float* p, const float* bias, const RouterConfig& cfg, Scratch& s, int32_t* idx) {
  const int E = cfg.num_experts;
  const float* v = p;
  if (bias) {
    for (int e = 0; e < E; ++e) s.choice[static_cast<size_t>(e)] = p[e] + bias[e];
    v = s.choice.data();
  }
  auto any = [](int32_t) { return true; };
  if (cfg.n_group <= 1) {
    select_topk(v, 0, E, cfg.top_k, any, idx);
    return;
  }
  const int G = cfg.n_group, size = E / G;
  for (int g = 0; g < G; ++g) {
    int32_t best[2];
    const int n = select_topk(v, g * size, (g + 1) * size, size >= 2 ? 2 : 1, any, best);
    s.group_score[static_cast<size_t>(g)] = n == 2 ? v[best[0]] + v[best[1]] : v[best[0]];
  }
  select_topk(s.group_score.data(), 0, G, cfg.topk_group, any, s.groups.data());
  std::memset(s.group_ok.data(), 0, s.group_ok.size());
  for (int32_t g : s.groups) s.group_ok[static_cast<size_t>(g)] = 1;
  select_topk(v, 0, E, cfg.top_k, [&](int32_t e) { return s.group_ok[static_cast<size_t>(e / size)] != 0; }, idx);
}

// Past this logit softplus(x) = log(1 + e^x) equals x in f32 (e^-20 is below
// half an ulp of 20), and exp1 stays far from overflow (PyTorch's threshold too).
constexpr float kSoftplusLinear = 20.0f;

// sqrt(softplus(x)), the DeepSeek-V4 score. log1(u) >= 0 for every float u in
// [1, 1 + e^20], so the square root never sees a negative number.
inline float sqrt_softplus(float x) {
  const float sp = x > kSoftplusLinear ? x : log1(1.0f + exp1(x));
  return std::sqrt(sp);
}

// dp/dx of p = sqrt(softplus(x)) from p alone (the backward keeps no logits):
// sigmoid(x) / (2p), with sigmoid(x) = 1 - e^{-softplus(x)} = 1 - exp(-p^2).
// Where u = exp(-p^2) > 1/2, 1 - u would lose the small sigmoid of a negative
// logit to cancellation, so it is evaluated as (1 - u) * s / -log(u) (Kahan's
// expm1 trick: 1 - u is exact there and the rounding of u cancels in the
// ratio). 0 where p == 0, as the limit p/2 is below any gradient that matters.
inline float sqrt_softplus_grad(float p) {
  if (p == 0.0f) return 0.0f;
  const float s = p * p;     // softplus(x)
  const float u = exp1(-s);  // 1 - sigmoid(x)
  float sig;                 // sigmoid(x)
  if (u <= 0.5f) {
    sig = 1.0f - u;
  } else if (u == 1.0f) {
    sig = s;
  } else {
    sig = (1.0f - u) * (s / -log1(u));
  }
  return sig / (2.0f * p);
}

// p = softmax(z), sigmoid(z) or sqrt(softplus(z)) over one token's E logits.
void score_token(const float* z, float* p, const RouterConfig& cfg) {
  const int E = cfg.num_experts;
  switch (cfg.scoring) {
    case RouterScoring::Sigmoid:
      vsigmoid(z, p, E);
      return;
    case RouterScoring::SqrtSoftplus:
      for (int e = 0; e < E; ++e) p[e] = sqrt_softplus(z[e]);
      return;
    case RouterScoring::Softmax:
      break;
  }
  const float m = max_reduce(z, E);
  for (int e = 0; e < E; ++e) p[e] = z[e] - m;
  vexp(p, p, E);
  const float sum = canonical_sum(p, E);
  for (int e = 0; e < E; ++e) p[e] = p[e] / sum;
}

// Throws unless every index is in [0, E); with `distinct`, also unless each
// token lists K different experts.
void check_indices(const Tensor& idx_in, int E, bool distinct, const char* what) {
  std::vector<unsigned char> keep;
  const Tensor idx = host_readable(idx_in, keep);
  const int64_t T = idx.shape[0], K = idx.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* r = row<const int32_t>(idx, t);
    for (int64_t s = 0; s < K; ++s) {
      if (r[s] < 0 || r[s] >= E)
        LS_THROW << what << ": token " << t << " slot " << s << " has expert index " << r[s]
                 << ", not in [0, " << E << ")";
      if (!distinct) continue;
      for (int64_t q = 0; q < s; ++q)
        if (r[q] == r[s])
          LS_THROW << what << ": token " << t << " lists expert index " << r[s] << " twice (slots " << q << " and "
                   << s << ")";
    }
  }
}

}  // namespace

void RouterConfig::validate() const {
  if (num_experts < 1) LS_THROW << "RouterConfig: num_experts must be >= 1, got " << num_experts;
  if (top_k < 1 || top_k > num_experts)
    LS_THROW << "RouterConfig: top_k must be in [1, num_experts=" << num_experts << "], got " << top_k;
  if (scoring != RouterScoring::Softmax && scoring != RouterScoring::Sigmoid && scoring != RouterScoring::SqrtSoftplus)
    LS_THROW << "RouterConfig: scoring must be Softmax, Sigmoid or SqrtSoftplus, got " << static_cast<int>(scoring);
  if (!std::isfinite(routed_scaling)) LS_THROW << "RouterConfig: routed_scaling must be finite, got " << routed_scaling;
  if (n_group < 1 || num_experts % n_group != 0)
    LS_THROW << "RouterConfig: n_group must be >= 1 and divide num_experts=" << num_experts << ", got " << n_group;
  if (topk_group < 1 || topk_group > n_group)
    LS_THROW << "RouterConfig: topk_group must be in [1, n_group=" << n_group << "], got " << topk_group;
  if (static_cast<int64_t>(topk_group) * (num_experts / n_group) < top_k)
    LS_THROW << "RouterConfig: topk_group=" << topk_group << " groups of " << num_experts / n_group
             << " experts hold fewer than top_k=" << top_k << " experts";
}

void check_moe_route_args(const Tensor& topk_idx, const Tensor& topk_w, const Tensor& scores,
                          const Tensor& router_logits, const Tensor& bias, const Tensor& replay_idx,
                          const RouterConfig& cfg) {
  cfg.validate();
  const int E = cfg.num_experts, K = cfg.top_k;
  check_dtype(router_logits, DType::F32, "moe_route: router_logits");
  check_shape(router_logits, {-1, E}, "moe_route: router_logits");
  const int64_t T = router_logits.shape[0];
  check_dtype(topk_idx, DType::I32, "moe_route: topk_idx");
  check_shape(topk_idx, {T, K}, "moe_route: topk_idx");
  check_dtype(topk_w, DType::F32, "moe_route: topk_w");
  check_shape(topk_w, {T, K}, "moe_route: topk_w");
  check_dtype(scores, DType::F32, "moe_route: scores");
  check_shape(scores, {T, E}, "moe_route: scores");
  check_rows(router_logits, "moe_route: router_logits");
  check_rows(topk_idx, "moe_route: topk_idx");
  check_rows(topk_w, "moe_route: topk_w");
  check_rows(scores, "moe_route: scores");
  if (!absent(bias)) {
    check_dtype(bias, DType::F32, "moe_route: bias");
    check_shape(bias, {E}, "moe_route: bias");
    if (E > 1 && bias.stride[0] != 1) LS_THROW << "moe_route: bias must be contiguous, got " << bias.shape_str();
  }
  if (!absent(replay_idx)) {
    check_dtype(replay_idx, DType::I32, "moe_route: replay_idx");
    check_shape(replay_idx, {T, K}, "moe_route: replay_idx");
    check_rows(replay_idx, "moe_route: replay_idx");
    check_indices(replay_idx, E, /*distinct=*/true, "moe_route: replay_idx");
  }
}

void moe_route(const Context& ctx, Tensor topk_idx, Tensor topk_w, Tensor scores, const Tensor& router_logits,
               const Tensor& bias, const Tensor& replay_idx, const RouterConfig& cfg) {
  LS_GPU_DISPATCH(ctx, moe_route, topk_idx, topk_w, scores, router_logits, bias, replay_idx, cfg);
  check_moe_route_args(topk_idx, topk_w, scores, router_logits, bias, replay_idx, cfg);
  const int K = cfg.top_k;
  const int64_t T = router_logits.shape[0];
  const float* b = absent(bias) ? nullptr : bias.f32();
  const bool replay = !absent(replay_idx);

  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        Scratch scratch(cfg);
        for (int64_t t = begin; t < end; ++t) {
          float* p = row<float>(scores, t);  // (E)
          score_token(row<const float>(router_logits, t), p, cfg);
          int32_t* idx = row<int32_t>(topk_idx, t);  // (K)
          if (replay) {
            std::memcpy(idx, row<const int32_t>(replay_idx, t), static_cast<size_t>(K) * sizeof(int32_t));
          } else {
            select_token(p, b, cfg, scratch, idx);
          }
          float* w = row<float>(topk_w, t);  // (K)
          for (int s = 0; s < K; ++s) w[s] = p[idx[s]];
          if (cfg.normalize) {
            const float denom = canonical_sum(w, K) + kNormEps;
            for (int s = 0; s < K; ++s) w[s] = w[s] / denom;
          }
          for (int s = 0; s < K; ++s) w[s] = w[s] * cfg.routed_scaling;
        }
      },
      kTokenGrain);
}

void check_moe_route_backward_args(const Tensor& dlogits, const Tensor& dtopk_w, const Tensor& scores,
                                   const Tensor& topk_idx, const RouterConfig& cfg) {
  cfg.validate();
  const int E = cfg.num_experts, K = cfg.top_k;
  check_dtype(scores, DType::F32, "moe_route_backward: scores");
  check_shape(scores, {-1, E}, "moe_route_backward: scores");
  const int64_t T = scores.shape[0];
  check_dtype(dlogits, DType::F32, "moe_route_backward: dlogits");
  check_shape(dlogits, {T, E}, "moe_route_backward: dlogits");
  check_dtype(dtopk_w, DType::F32, "moe_route_backward: dtopk_w");
  check_shape(dtopk_w, {T, K}, "moe_route_backward: dtopk_w");
  check_dtype(topk_idx, DType::I32, "moe_route_backward: topk_idx");
  check_shape(topk_idx, {T, K}, "moe_route_backward: topk_idx");
  check_rows(dlogits, "moe_route_backward: dlogits");
  check_rows(dtopk_w, "moe_route_backward: dtopk_w");
  check_rows(scores, "moe_route_backward: scores");
  check_rows(topk_idx, "moe_route_backward: topk_idx");
  check_indices(topk_idx, E, /*distinct=*/false, "moe_route_backward: topk_idx");
}

void moe_route_backward(const Context& ctx, Tensor dlogits, const Tensor& dtopk_w, const Tensor& scores,
                        const Tensor& topk_idx, const RouterConfig& cfg) {
  LS_GPU_DISPATCH(ctx, moe_route_backward, dlogits, dtopk_w, scores, topk_idx, cfg);
  check_moe_route_backward_args(dlogits, dtopk_w, scores, topk_idx, cfg);
  const int E = cfg.num_experts, K = cfg.top_k;
  const int64_t T = scores.shape[0];

  ctx.parallel_for(
      T,
      [&](int64_t begin, int64_t end) {
        std::vector<float> dp(static_cast<size_t>(E));   // dL/dp, nonzero at the selected experts
        std::vector<float> sel(static_cast<size_t>(K));  // p of the selected experts
        for (int64_t t = begin; t < end; ++t) {
          const float* p = row<const float>(scores, t);
          const int32_t* idx = row<const int32_t>(topk_idx, t);
          const float* g = row<const float>(dtopk_w, t);
          std::fill(dp.begin(), dp.end(), 0.0f);
          const float c = cfg.routed_scaling;
          if (cfg.normalize) {
            // w_s = c p_s / D with D = sum_r p_r + eps, so
            // dL/dp_j = (c / D) * (g_j - (sum_r g_r p_r) / D). D has the forward's bits.
            for (int s = 0; s < K; ++s) sel[static_cast<size_t>(s)] = p[idx[s]];
            const float denom = canonical_sum(sel.data(), K) + kNormEps;
            const float q = canonical_dot(g, sel.data(), K) / denom;
            const float scale = c / denom;
            for (int s = 0; s < K; ++s) dp[static_cast<size_t>(idx[s])] += scale * (g[s] - q);
          } else {
            for (int s = 0; s < K; ++s) dp[static_cast<size_t>(idx[s])] += c * g[s];
          }
          float* dz = row<float>(dlogits, t);  // (E)
          switch (cfg.scoring) {
            case RouterScoring::Softmax: {
              // dz_j = p_j (dp_j - sum_k p_k dp_k)
              const float dot = canonical_dot(p, dp.data(), E);
              for (int e = 0; e < E; ++e) dz[e] = p[e] * (dp[static_cast<size_t>(e)] - dot);
              break;
            }
            case RouterScoring::Sigmoid:
              // dz_j = dp_j p_j (1 - p_j)
              for (int e = 0; e < E; ++e) dz[e] = dp[static_cast<size_t>(e)] * (p[e] * (1.0f - p[e]));
              break;
            case RouterScoring::SqrtSoftplus:
              // dz_j = dp_j sigmoid(z_j) / (2 p_j)
              for (int e = 0; e < E; ++e) dz[e] = dp[static_cast<size_t>(e)] * sqrt_softplus_grad(p[e]);
              break;
          }
        }
      },
      kTokenGrain);
}

}  // namespace lockstep::kernels
