// Partial rollouts: the bookkeeping of samples paused at a step's token
// budget and resumed on the next step's weights (the [rollout] keys are read
// in partial_config.cpp).
#include "lockstep/rl/partial_rollout.h"

#include <algorithm>
#include <utility>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"

namespace lockstep::rl {

bool PartialGroup::finished() const {
  return std::all_of(samples.begin(), samples.end(), [](const PartialSample& s) { return s.finished(); });
}

uint64_t PartialGroup::oldest_version(uint64_t current) const {
  uint64_t v = current;
  for (const auto& s : samples)
    if (!s.versions.empty()) v = std::min(v, s.versions.front());
  return v;
}

int64_t sample_seed(int64_t group_seed, int64_t i) {
  return int64_t(mix_seed(uint64_t(group_seed), uint64_t(i)) >> 1);
}

nlohmann::json PartialStats::to_json() const {
  nlohmann::json m = nlohmann::json::object();
  m["rollout/partial_new_groups"] = new_groups;
  m["rollout/partial_paused"] = paused;
  m["rollout/partial_resumed_tokens"] = resumed_tokens;
  m["rollout/partial_share_tokens"] = share;
  m["rollout/partial_rounds"] = rounds;
  m["rollout/partial_discarded_groups"] = discarded_groups;
  m["rollout/partial_discarded_samples"] = discarded_samples;
  m["rollout/partial_finished_groups"] = finished_groups;
  m["rollout/partial_in_flight_groups"] = in_flight_groups;
  int64_t total = 0, max = 0;
  double sum = 0;
  for (size_t k = 0; k < staleness_tokens.size(); ++k) {
    m["rollout/token_staleness_" + std::to_string(k)] = staleness_tokens[k];
    total += staleness_tokens[k];
    sum += double(k) * double(staleness_tokens[k]);
    if (staleness_tokens[k] > 0) max = int64_t(k);
  }
  m["rollout/token_staleness_mean"] = total > 0 ? sum / double(total) : 0.0;
  m["rollout/token_staleness_max"] = max;
  return m;
}

std::vector<std::vector<float>> tokens_of_version(const std::vector<std::vector<float>>& lp,
                                                  const std::vector<std::vector<uint64_t>>& versions,
                                                  uint64_t v, int64_t* left_out) {
  LS_CHECK(lp.size() == versions.size())
      << lp.size() << " sequences vs " << versions.size() << " version lists";
  std::vector<std::vector<float>> out(lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    if (versions[i].empty()) {
      out[i] = lp[i];
      continue;
    }
    LS_CHECK(versions[i].size() == lp[i].size())
        << "sequence " << i << ": " << lp[i].size() << " logprobs vs " << versions[i].size() << " versions";
    for (size_t t = 0; t < lp[i].size(); ++t) {
      if (versions[i][t] == v)
        out[i].push_back(lp[i][t]);
      else if (left_out)
        ++*left_out;
    }
  }
  return out;
}

std::vector<std::vector<float>> other_versions_as_rollout(const std::vector<std::vector<float>>& trainer,
                                                          const std::vector<std::vector<float>>& rollout,
                                                          const std::vector<std::vector<uint64_t>>& versions,
                                                          uint64_t v) {
  LS_CHECK(trainer.size() == rollout.size() && trainer.size() == versions.size())
      << trainer.size() << " trainer, " << rollout.size() << " rollout sequences, " << versions.size()
      << " version lists";
  std::vector<std::vector<float>> out = trainer;
  for (size_t i = 0; i < out.size(); ++i) {
    if (versions[i].empty()) continue;
    LS_CHECK(versions[i].size() == out[i].size() && rollout[i].size() == out[i].size())
        << "sequence " << i << ": " << out[i].size() << " trainer logprobs, " << rollout[i].size()
        << " rollout logprobs, " << versions[i].size() << " versions";
    for (size_t t = 0; t < out[i].size(); ++t)
      if (versions[i][t] != v) out[i][t] = rollout[i][t];
  }
  return out;
}

PartialRollout::PartialRollout(PartialConfig cfg, int64_t max_new_tokens, int64_t max_position_embeddings)
    : cfg_(cfg), max_new_tokens_(max_new_tokens), max_positions_(max_position_embeddings) {
  LS_CHECK(cfg_.enabled && cfg_.token_budget > 0) << "partial rollouts: no token budget";
}

std::set<uint64_t> PartialRollout::versions_of(const std::vector<PartialGroup>& groups) {
  std::set<uint64_t> out;
  for (const auto& g : groups)
    for (const auto& s : g.samples) out.insert(s.versions.begin(), s.versions.end());
  return out;
}

int64_t PartialRollout::unfinished_samples() const {
  int64_t n = 0;
  for (const auto& g : groups_)
    for (const auto& s : g.samples) n += s.finished() ? 0 : 1;
  return n;
}

void PartialRollout::add(size_t prompt, rollout::Request request) {
  PartialGroup g;
  g.prompt = prompt;
  g.samples.resize(size_t(request.params.n));
  for (size_t i = 0; i < g.samples.size(); ++i)
    g.samples[i].seed = sample_seed(request.params.seed, int64_t(i));
  g.request = std::move(request);
  groups_.push_back(std::move(g));
  ++added_;
}

std::vector<PartialGroup> PartialRollout::round(RolloutBackend& backend, uint64_t version,
                                                const RolloutProgress& progress) {
  stats_ = PartialStats{};
  stats_.new_groups = std::exchange(added_, 0);
  stats_.staleness_tokens.assign(size_t(cfg_.max_staleness + 1), 0);
  discard_stale(version);
  // Sub-rounds on the same weights until the budget is spent: what samples
  // that stopped early left of their share goes to the others (a sample
  // continued within the step is the sample generated at once).
  int64_t left = cfg_.token_budget;
  for (;;) {
    std::vector<PartialSample*> live;
    const int64_t n_live = unfinished_samples();
    if (n_live == 0) break;
    int64_t share = left / n_live;
    if (share == 0 && stats_.rounds > 0) break;
    share = std::max<int64_t>(share, 1);  // the first sub-round moves every sample
    if (stats_.rounds == 0) stats_.share = share;
    std::vector<rollout::Request> reqs = requests(share, live);
    int64_t tokens = 0;
    const int64_t before = stats_.generated_tokens;
    const RolloutProgress sub = [&](int64_t, int64_t t) {
      if (progress) progress(before + t, before + t);
    };
    const std::vector<rollout::RequestResult> results = backend.generate(std::move(reqs), sub, &tokens);
    append(results, live, version);
    stats_.generated_tokens += tokens;
    left -= tokens;
    ++stats_.rounds;
  }
  return take_finished(version);
}

// A group whose oldest token already lags `version` by more than the bound
// cannot train within it, whenever it finishes: it goes now, unfinished
// samples and finished ones alike (their advantages need the whole group).
void PartialRollout::discard_stale(uint64_t version) {
  std::vector<PartialGroup> kept;
  for (auto& g : groups_) {
    if (version - g.oldest_version(version) <= uint64_t(cfg_.max_staleness)) {
      kept.push_back(std::move(g));
      continue;
    }
    ++stats_.discarded_groups;
    stats_.discarded_samples += int64_t(g.samples.size());
  }
  groups_ = std::move(kept);
}

// One request per unfinished sample: its prompt + output so far, at most
// `share` new tokens (and no more than max_new_tokens in all).
std::vector<rollout::Request> PartialRollout::requests(int64_t share, std::vector<PartialSample*>& live) {
  std::vector<rollout::Request> out;
  live.clear();
  for (auto& g : groups_)
    for (auto& s : g.samples) {
      if (s.finished()) continue;
      rollout::Request r;
      r.prompt_ids = g.request.prompt_ids;
      r.prompt_ids.insert(r.prompt_ids.end(), s.output_ids.begin(), s.output_ids.end());
      r.params = g.request.params;
      r.params.n = 1;
      r.params.seed = s.seed;
      r.params.max_new_tokens = std::min(share, max_new_tokens_ - int64_t(s.output_ids.size()));
      r.params.return_logprobs = true;
      LS_CHECK(r.params.max_new_tokens > 0) << "partial rollouts: a sample at max_new_tokens left unfinished";
      out.push_back(std::move(r));
      live.push_back(&s);
    }
  return out;
}

// Each live sample's new tokens; it finishes on a stop, an abort, or at
// max_new_tokens or the context's end ("length"), and is paused when only
// its share ran out.
void PartialRollout::append(const std::vector<rollout::RequestResult>& results,
                            const std::vector<PartialSample*>& live, uint64_t version) {
  LS_CHECK(results.size() == live.size())
      << "partial rollouts: " << results.size() << " results for " << live.size() << " requests";
  for (size_t i = 0; i < live.size(); ++i) {
    LS_CHECK(results[i].samples.size() == 1)
        << "partial rollouts: a request of one sample returned " << results[i].samples.size();
    const rollout::SampleResult& r = results[i].samples.front();
    PartialSample& s = *live[i];
    if (!r.output_ids.empty() && (r.weight_version != version || r.weight_version_end != version))
      LS_THROW << "partial rollouts: the rollout generated with weight versions " << r.weight_version << ".."
               << r.weight_version_end << ", the trainer's are " << version
               << " (a paused sample resumes on the weights of the step that continues it)";
    if (s.paused) stats_.resumed_tokens += int64_t(r.output_ids.size());
    s.output_ids.insert(s.output_ids.end(), r.output_ids.begin(), r.output_ids.end());
    s.logprobs.insert(s.logprobs.end(), r.logprobs.begin(), r.logprobs.end());
    s.versions.resize(s.output_ids.size(), version);
    const int64_t len = int64_t(results[i].prompt_ids.size()) + int64_t(r.output_ids.size());
    const bool at_end = int64_t(s.output_ids.size()) >= max_new_tokens_ || len >= max_positions_;
    if (r.finish_reason != "length" || at_end) s.finish_reason = r.finish_reason;
  }
}

// The finished groups leave (with their tokens' staleness counted); the
// others stay in flight, their unfinished samples paused.
std::vector<PartialGroup> PartialRollout::take_finished(uint64_t version) {
  std::vector<PartialGroup> done, kept;
  for (auto& g : groups_) {
    if (!g.finished()) {
      for (auto& s : g.samples) {
        s.paused = !s.finished();
        stats_.paused += s.paused ? 1 : 0;
      }
      kept.push_back(std::move(g));
      continue;
    }
    for (const auto& s : g.samples)
      for (uint64_t v : s.versions) {
        const uint64_t lag = version - v;
        LS_CHECK(lag <= uint64_t(cfg_.max_staleness))
            << "partial rollouts: a token " << lag << " versions stale";
        ++stats_.staleness_tokens[size_t(lag)];
      }
    done.push_back(std::move(g));
  }
  groups_ = std::move(kept);
  stats_.finished_groups = int64_t(done.size());
  stats_.in_flight_groups = int64_t(groups_.size());
  return done;
}

}  // namespace lockstep::rl
