// Sampling: the distribution is computed in double from the f32 logits (only
// the choice depends on it; the reported logprob comes from the kernel).
#include "lockstep/rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/kernels/cpu/softmax.h"

namespace lockstep::rollout {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    LS_THROW << "sampling_params.temperature must be >= 0, got " << temperature;
  if (!(top_p > 0.0f && top_p <= 1.0f)) LS_THROW << "sampling_params.top_p must be in (0, 1], got " << top_p;
  if (!(min_p >= 0.0f && min_p <= 1.0f)) LS_THROW << "sampling_params.min_p must be in [0, 1], got " << min_p;
  if (max_new_tokens < 1) LS_THROW << "sampling_params.max_new_tokens must be >= 1, got " << max_new_tokens;
  if (n < 1 || n > 1024) LS_THROW << "sampling_params.n must be in [1, 1024], got " << n;
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs)
    LS_THROW << "sampling_params.top_logprobs must be in [0, " << kMaxTopLogprobs << "], got " << top_logprobs;
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    LS_THROW << "sampling_params.frequency_penalty must be in [-2, 2], got " << frequency_penalty;
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    LS_THROW << "sampling_params.presence_penalty must be in [-2, 2], got " << presence_penalty;
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    LS_THROW << "sampling_params.repetition_penalty must be > 0, got " << repetition_penalty;
  if (min_new_tokens < 0) LS_THROW << "sampling_params.min_new_tokens must be >= 0, got " << min_new_tokens;
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) LS_THROW << "sampling_params.logit_bias: token id " << id << " is negative";
    if (!(bias >= -100.0f && bias <= 100.0f))
      LS_THROW << "sampling_params.logit_bias[" << id << "] must be in [-100, 100], got " << bias;
  }
}

uint64_t sample_stream(uint64_t request_seed, int64_t sample_index) {
  return mix_seed(request_seed, uint64_t(sample_index));
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, double u) {
  LS_CHECK(V >= 1) << "empty vocabulary";
  if (p.temperature == 0.0f || p.top_k == 1) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  const double inv_t = 1.0 / double(p.temperature);
  // No truncation: the inverse CDF over token ids in order, no sort needed.
  if ((p.top_k <= 0 || p.top_k >= V) && p.top_p >= 1.0f && p.min_p <= 0.0f) {
    float mx = logits[0];
    for (int64_t i = 1; i < V; ++i) mx = std::max(mx, logits[i]);
    const double zmax = double(mx) * inv_t;
    std::vector<double> w(static_cast<size_t>(V));
    double total = 0;
    for (int64_t i = 0; i < V; ++i) {
      w[size_t(i)] = std::exp(double(logits[i]) * inv_t - zmax);
      total += w[size_t(i)];
    }
    const double target = u * total;
    double cum = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (w[size_t(i)] <= 0.0) continue;
      cum += w[size_t(i)];
      last = i;
      if (target < cum) return int32_t(i);
    }
    return int32_t(last);  // rounding: u * total beyond the summed mass
  }
  // Candidates sorted by logit descending, ties by id (a stable order).
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = V;
  if (p.top_k > 0 && p.top_k < V) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  } else {
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  const double zmax = double(logits[idx[0]]) * inv_t;
  std::vector<double> w(static_cast<size_t>(keep));
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    w[size_t(i)] = std::exp(double(logits[idx[size_t(i)]]) * inv_t - zmax);
    total += w[size_t(i)];
  }
  // min-p: drop tokens whose probability is below min_p * p_max (p_max = w[0] / total).
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * w[0];
    int64_t k = 1;
    while (k < keep && w[size_t(k)] >= floor) ++k;
    for (int64_t i = k; i < keep; ++i) total -= w[size_t(i)];
    keep = k;
    total = 0;
    for (int64_t i = 0; i < keep; ++i) total += w[size_t(i)];
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (p.top_p < 1.0f) {
    double cum = 0;
    int64_t k = 0;
    while (k < keep) {
      cum += w[size_t(k)] / total;
      ++k;
      if (cum >= double(p.top_p)) break;
    }
    keep = k;
    total = 0;
    for (int64_t i = 0; i < keep; ++i) total += w[size_t(i)];
  }
  double target = u * total, cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += w[size_t(i)];
    if (target < cum) return idx[size_t(i)];
  }
  return idx[size_t(keep - 1)];
}

void token_logprobs(const Context& ctx, const Tensor& logits, const std::vector<int32_t>& tokens, float temperature,
                    std::vector<float>* out) {
  const int64_t R = logits.dim(0);
  LS_CHECK(int64_t(tokens.size()) == R) << tokens.size() << " tokens for " << R << " logit rows";
  out->assign(size_t(R), 0.0f);
  if (R == 0) return;
  std::vector<int32_t> t = tokens;
  Tensor tt(t.data(), DType::I32, {R});
  Tensor lp(out->data(), DType::F32, {R});
  kernels::token_logprob_forward(ctx, lp, Tensor(), Tensor(), logits, tt, temperature);
}

void top_logprobs(const Context& ctx, const Tensor& logits, int64_t k, float temperature,
                  std::vector<TopLogprobs>* out) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  out->assign(size_t(R), {});
  if (R == 0 || k <= 0) return;
  k = std::min(k, V);
  Buffer all(static_cast<size_t>(R * V) * sizeof(float));  // (R, V) every token's logprob
  kernels::log_softmax_forward(ctx, Tensor(all.as<float>(), DType::F32, {R, V}), logits, temperature);
  ctx.parallel_for(R, [&](int64_t r0, int64_t r1) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t r = r0; r < r1; ++r) {
      const float* lp = all.as<float>() + r * V;
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
      TopLogprobs& t = (*out)[size_t(r)];
      for (int64_t i = 0; i < k; ++i) t.emplace_back(idx[size_t(i)], lp[idx[size_t(i)]]);
    }
  });
  // The values themselves from token_logprob_forward, one call per rank, so
  // they are its bits on whichever backend `ctx` selects (on the CPU,
  // log_softmax_forward's already are; then the order cannot change).
  std::vector<int32_t> targets(static_cast<size_t>(R));
  std::vector<float> values(static_cast<size_t>(R));
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t r = 0; r < R; ++r) targets[size_t(r)] = (*out)[size_t(r)][size_t(i)].first;
    kernels::token_logprob_forward(ctx, Tensor(values.data(), DType::F32, {R}), Tensor(), Tensor(), logits,
                                   Tensor(targets.data(), DType::I32, {R}), temperature);
    for (int64_t r = 0; r < R; ++r) (*out)[size_t(r)][size_t(i)].second = values[size_t(r)];
  }
  for (TopLogprobs& t : *out)
    std::stable_sort(t.begin(), t.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
}

}  // namespace lockstep::rollout
