// Mismatch metrics between rollout and trainer logprobs, routings and indexer choices.
#include "lockstep/train/mismatch.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/v4_forward.h"

namespace lockstep::train {

nlohmann::json MismatchStats::to_json(const std::string& p) const {
  nlohmann::json j = {{p + "train_rollout_logprob_abs_diff", abs_diff_mean},
                      {p + "train_rollout_logprob_abs_diff_max", abs_diff_max},
                      {p + "train_rollout_kl", kl_k3},
                      {p + "train_rollout_logprob_bitwise_equal_frac", bitwise_equal_frac}};
  for (size_t l = 0; l < router_disagreement.size(); ++l)
    j[p + "router_topk_disagreement/layer_" + std::to_string(l)] = router_disagreement[l];
  if (!router_disagreement.empty()) {
    double m = 0;
    for (double d : router_disagreement) m += d;
    j[p + "router_topk_disagreement"] = m / double(router_disagreement.size());
  }
  if (indexer_disagreement) j[p + "indexer_topk_disagreement"] = *indexer_disagreement;
  return j;
}

MismatchStats compute_mismatch(const std::vector<std::vector<float>>& rollout,
                               const std::vector<std::vector<float>>& train) {
  LS_CHECK(rollout.size() == train.size()) << rollout.size() << " rollout samples vs " << train.size();
  MismatchStats s;
  double kl = 0, sample_sum = 0;
  int64_t equal = 0;
  for (size_t i = 0; i < rollout.size(); ++i) {
    LS_CHECK(rollout[i].size() == train[i].size())
        << "sample " << i << ": " << rollout[i].size() << " rollout logprobs vs " << train[i].size();
    if (rollout[i].empty()) continue;
    double sum = 0;
    for (size_t j = 0; j < rollout[i].size(); ++j) {
      const double d = double(train[i][j]) - double(rollout[i][j]);
      sum += std::fabs(d);
      s.abs_diff_max = std::max(s.abs_diff_max, std::fabs(d));
      kl += std::expm1(d) - d;
      equal += std::memcmp(&train[i][j], &rollout[i][j], 4) == 0 ? 1 : 0;
      ++s.tokens;
    }
    sample_sum += sum / double(rollout[i].size());
    ++s.samples;
  }
  if (s.samples > 0) s.abs_diff_mean = sample_sum / double(s.samples);
  if (s.tokens > 0) {
    s.kl_k3 = kl / double(s.tokens);
    s.bitwise_equal_frac = double(equal) / double(s.tokens);
  }
  return s;
}

std::vector<double> router_disagreement(const std::vector<std::vector<int32_t>>& a,
                                        const std::vector<std::vector<int32_t>>& b, int64_t n_moe, int64_t k) {
  LS_CHECK(a.size() == b.size()) << "routings of different sample counts";
  std::vector<double> out(size_t(n_moe), 0.0);
  std::vector<int64_t> count(size_t(n_moe), 0);
  for (size_t i = 0; i < a.size(); ++i) {
    LS_CHECK(a[i].size() == b[i].size()) << "sample " << i << ": routings of different lengths";
    const int64_t len = int64_t(a[i].size()) / (n_moe * k);
    for (int64_t l = 0; l < n_moe; ++l) {
      std::vector<int32_t> ra, rb;
      for (int64_t t = 0; t + 1 < len; ++t)
        for (int64_t s = 0; s < k; ++s) {
          ra.push_back(a[i][size_t((t * n_moe + l) * k + s)]);
          rb.push_back(b[i][size_t((t * n_moe + l) * k + s)]);
        }
      if (ra.empty()) continue;
      Tensor ta(ra.data(), DType::I32, {int64_t(ra.size()) / k, k}), tb(rb.data(), DType::I32, {int64_t(rb.size()) / k, k});
      out[size_t(l)] += kernels::topk_disagreement(ta, tb) * double(ra.size() / size_t(k));
      count[size_t(l)] += int64_t(ra.size()) / k;
    }
  }
  for (size_t l = 0; l < out.size(); ++l) out[l] = count[l] ? out[l] / double(count[l]) : 0.0;
  return out;
}

double indexer_disagreement(const std::vector<std::vector<int32_t>>& a,
                            const std::vector<std::vector<int32_t>>& b, int64_t n_csa, int64_t ki) {
  LS_CHECK(a.size() == b.size()) << "indexer records of different sample counts";
  if (n_csa * ki == 0) return 0.0;
  double differ = 0;
  int64_t rows = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    LS_CHECK(a[i].size() == b[i].size()) << "sample " << i << ": indexer records of different lengths";
    const int64_t len = int64_t(a[i].size()) / (n_csa * ki);
    if (len < 2) continue;
    // Rows (token, CSA layer) are consecutive: the first (len-1)*n_csa of them.
    const int64_t n = (len - 1) * n_csa;
    const Tensor ta(const_cast<int32_t*>(a[i].data()), DType::I32, {n, ki});
    const Tensor tb(const_cast<int32_t*>(b[i].data()), DType::I32, {n, ki});
    differ += kernels::topk_disagreement(ta, tb) * double(n);
    rows += n;
  }
  return rows ? differ / double(rows) : 0.0;
}

std::vector<int32_t> trainer_routing(const Context& ctx, const model::ModelWeights& weights,
                                     const std::vector<int32_t>& tokens, const std::vector<int32_t>* replay) {
  return trainer_choices(ctx, weights, tokens, replay, nullptr).experts;
}

TrainerChoices trainer_choices(const Context& ctx, const model::ModelWeights& weights,
                               const std::vector<int32_t>& tokens, const std::vector<int32_t>* replay_experts,
                               const std::vector<int32_t>* replay_indexer) {
  const ModelConfig& c = weights.config();
  const int bs = 16;
  std::vector<int32_t> blocks((tokens.size() + bs - 1) / bs);
  std::iota(blocks.begin(), blocks.end(), 0);
  model::RaggedBatch b(int32_t(blocks.size()));
  b.add_sequence(tokens.data(), int32_t(tokens.size()), 0, blocks.data(), int32_t(blocks.size()));
  model::KvCache kv(c, int64_t(blocks.size()), bs);
  model::Workspace ws;
  model::ForwardOptions fo;
  fo.record_experts = true;
  fo.replay_experts = replay_experts;
  fo.record_indexer = model::num_csa_layers(c) > 0;
  fo.replay_indexer = replay_indexer;
  model::ForwardResult fr;
  model::forward(ctx, weights, kv, ws, b, fo, &fr);
  return {std::move(fr.routed_experts), std::move(fr.indexer_topk)};
}

}  // namespace lockstep::train
