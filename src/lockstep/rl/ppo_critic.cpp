// The critic's part of a PPO step: old values, GAE, the value update
// (ppo_critic.h; formulas in docs/rl.md, "PPO with a critic").
#include "lockstep/rl/ppo_critic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "lockstep/base/error.h"
#include "lockstep/base/timer.h"
#include "lockstep/model/model_source.h"
#include "lockstep/rl/gae.h"

namespace lockstep::rl {

namespace {

std::unique_ptr<train::Critic> make_critic(const Context& ctx, const ModelConfig& policy_config,
                                           const float* policy, const CriticSection& cfg) {
  if (cfg.path.empty()) {
    const ParamLayout layout(policy_config);
    Buffer p = alloc_params(layout);
    std::copy(policy, policy + layout.numel(), p.as<float>());
    return std::make_unique<train::Critic>(ctx, policy_config, std::move(p), cfg.critic);
  }
  LoadedModel m = load_model_dir(cfg.path, ctx);
  if (m.config.vocab_size != policy_config.vocab_size)
    LS_THROW << "[critic] path = " << cfg.path << ": a vocabulary of " << m.config.vocab_size
             << " tokens, the policy's has " << policy_config.vocab_size
             << " (the critic reads the policy's tokens)";
  auto critic = std::make_unique<train::Critic>(ctx, m.config, std::move(m.params), cfg.critic);
  critic->load_head_if_present(resolve_model_dir(cfg.path));
  return critic;
}

// Unbiased variance, as torch.var.
double variance(const std::vector<double>& x) {
  if (x.size() < 2) return 0.0;
  double mean = 0;
  for (double v : x) mean += v;
  mean /= double(x.size());
  double ss = 0;
  for (double v : x) ss += (v - mean) * (v - mean);
  return ss / double(x.size() - 1);
}

}  // namespace

PpoCritic::PpoCritic(const Context& ctx, const ModelConfig& policy_config, const float* policy,
                     const CriticSection& cfg, const AlgoConfig& algo)
    : algo_(algo), critic_(make_critic(ctx, policy_config, policy, cfg)) {}

void PpoCritic::advantages(const std::vector<train::TrainSequence>& seqs, const std::vector<double>& rewards,
                           std::vector<std::vector<double>>& adv) {
  LS_CHECK(rewards.size() == seqs.size())
      << "PpoCritic: " << rewards.size() << " rewards for " << seqs.size() << " sequences";
  Timer timer;
  old_values_ = critic_->values(seqs);
  adv.assign(seqs.size(), {});
  returns_.assign(seqs.size(), {});
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n = seqs[i].num_targets();
    adv[i].resize(size_t(n));
    returns_[i].resize(size_t(n));
    gae_advantages(old_values_[i].data(), n, rewards[i], algo_.gamma, algo_.lam, adv[i].data(),
                   returns_[i].data());
  }
  whiten_token_advantages(adv);
  seconds_ = timer.seconds();
}

nlohmann::json PpoCritic::update(const std::vector<train::TrainSequence>& seqs, int64_t num_minibatches) {
  LS_CHECK(old_values_.size() == seqs.size()) << "PpoCritic::update: advantages() first, on the same batch";
  const int64_t n = int64_t(seqs.size());
  const int64_t n_mb = std::max<int64_t>(1, std::min(num_minibatches, n));
  Timer timer;
  const double cliprange = critic_->config().cliprange_value;
  train::ValueLossStats st;
  double grad_norm_sum = 0, lr = 0;
  int64_t tokens = 0, steps = 0;
  for (int64_t mb = 0; mb < n_mb; ++mb) {
    const size_t lo = size_t(n * mb / n_mb), hi = size_t(n * (mb + 1) / n_mb);
    const std::vector<train::TrainSequence> part(seqs.begin() + long(lo), seqs.begin() + long(hi));
    int64_t part_tokens = 0;
    for (const auto& s : part) part_tokens += s.num_targets();
    const double w = 1.0 / double(std::max<int64_t>(part_tokens, 1));  // token-mean over the mini-batch
    const train::ValueLossFn loss = [&](size_t i, const float* vpred, int64_t nt, float* dv) {
      return train::value_loss(vpred, old_values_[lo + i].data(), returns_[lo + i].data(), nullptr, nt,
                               cliprange, w, dv, &st);
    };
    const double l = critic_->accumulate(part, loss);
    tokens += part_tokens;
    if (!std::isfinite(l)) {  // as the policy: no step on a non-finite loss
      critic_->zero_grad();
      continue;
    }
    const train::OptimizerStats os = critic_->step();
    if (os.skipped) continue;
    grad_norm_sum += os.grad_norm;
    lr = os.lr;
    ++steps;
  }
  std::vector<double> ret, err;
  double values_sum = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t t = 0; t < returns_[i].size(); ++t) {
      ret.push_back(returns_[i][t]);
      err.push_back(returns_[i][t] - double(old_values_[i][t]));
      values_sum += double(old_values_[i][t]);
    }
  const double tt = double(std::max<int64_t>(tokens, 1));
  nlohmann::json m = nlohmann::json::object();
  m["critic/vf_loss"] = st.loss / double(n_mb);
  m["critic/vf_clipfrac"] = double(st.clipped) / tt;
  m["critic/vpred_mean"] = st.vpred_sum / tt;
  m["critic/vf_explained_var"] = 1.0 - variance(err) / (variance(ret) + 1e-5);
  m["critic/grad_norm"] = grad_norm_sum / double(std::max<int64_t>(steps, 1));
  m["critic/lr"] = lr;
  m["critic/values_mean"] = values_sum / tt;
  m["critic/returns_mean"] =
      ret.empty() ? 0.0 : std::accumulate(ret.begin(), ret.end(), 0.0) / double(ret.size());
  m["critic/skipped"] = n_mb - steps;
  m["perf/critic_time_s"] = seconds_ + timer.seconds();
  return m;
}

void PpoCritic::save(const std::string& checkpoint_dir) {
  critic_->save(checkpoint_dir + "/critic");
}

void PpoCritic::load(const std::string& checkpoint_dir) {
  const std::string dir = checkpoint_dir + "/critic";
  if (!std::filesystem::is_directory(dir))
    LS_THROW << checkpoint_dir
             << ": no critic/ folder, so this checkpoint cannot resume PPO with a critic ([algo] "
             << "advantage = \"gae\"); it was saved by a run without one";
  critic_->load(dir);
}

}  // namespace lockstep::rl
