// Sampling: the parameters of a draw for the sampling kernel
// (kernels/cpu/sampling.h, which defines the choice); the reported logprob
// comes from token_logprob_forward.
#include "lockstep/rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/kernels/cpu/sampling.h"
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::rollout {

uint64_t sample_stream(uint64_t request_seed, int64_t sample_index) {
  return mix_seed(request_seed, uint64_t(sample_index));
}

kernels::SampleSpec sample_spec(const SamplingParams& p, uint64_t request_seed, int64_t sample_index,
                                int64_t position, int64_t logit_row) {
  kernels::SampleSpec s;
  s.logit_row = logit_row;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.seed = request_seed;
  s.stream = sample_stream(request_seed, sample_index);
  s.counter = uint64_t(position);
  return s;
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, double u) {
  return kernels::sample_row(logits, V, sample_spec(p, 0, 0, 0, 0), u);
}

void token_logprobs(const Context& ctx, const Tensor& logits, const std::vector<int32_t>& tokens, float temperature,
                    std::vector<float>* out) {
  const int64_t R = logits.dim(0);
  LS_CHECK(int64_t(tokens.size()) == R) << tokens.size() << " tokens for " << R << " logit rows";
  out->assign(size_t(R), 0.0f);
  if (R == 0) return;
  // The kernel reads and writes the device memory of ctx (logits are there).
  const Allocator& memory = kernels::device_memory(ctx);
  Buffer targets(size_t(R) * sizeof(int32_t), memory, Fill::Undefined, "logprob targets");
  Buffer logp(size_t(R) * sizeof(float), memory, Fill::Undefined, "logprobs");
  memory.copy_in(targets.data(), tokens.data(), targets.size());
  kernels::token_logprob_forward(ctx, Tensor(logp.data(), DType::F32, {R}), Tensor(), Tensor(), logits,
                                 Tensor(targets.data(), DType::I32, {R}), temperature);
  memory.copy_out(out->data(), logp.data(), logp.size());
}

void top_logprobs(const Context& ctx, const Tensor& logits, int64_t k, float temperature,
                  std::vector<TopLogprobs>* out) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  out->assign(size_t(R), {});
  if (R == 0 || k <= 0) return;
  k = std::min(k, V);
  // The ranking on the host: every token's logprob from a host copy of the
  // logits where they lie in device memory (the CPU kernel, so the same order
  // on every device; the values come from the backend below).
  Buffer all(static_cast<size_t>(R * V) * sizeof(float));  // (R, V) every token's logprob
  std::vector<unsigned char> keep;
  kernels::log_softmax_forward(kernels::cpu_context(ctx), Tensor(all.as<float>(), DType::F32, {R, V}),
                               kernels::host_readable(logits, keep), temperature);
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
  std::vector<float> values;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t r = 0; r < R; ++r) targets[size_t(r)] = (*out)[size_t(r)][size_t(i)].first;
    token_logprobs(ctx, logits, targets, temperature, &values);
    for (int64_t r = 0; r < R; ++r) (*out)[size_t(r)][size_t(i)].second = values[size_t(r)];
  }
  for (TopLogprobs& t : *out)
    std::stable_sort(t.begin(), t.end(), [](const auto& a, const auto& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    });
}

}  // namespace lockstep::rollout
