// Partial rollouts' gap at each token's own version: the kept copies of the
// trainer's parameters and the rescoring of older tokens on them.
#include "lockstep/rl/partial_gap.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/params.h"

namespace lockstep::rl {

nlohmann::json PartialGapStats::to_json(const VersionScorers* kept) const {
  nlohmann::json m = nlohmann::json::object();
  m["train/partial_gap_left_out_tokens"] = left_out;
  if (!kept) return m;
  m["train/partial_gap_rescored_tokens"] = rescored;
  m["train/partial_gap_versions_kept"] = int64_t(kept->versions().size());
  m["train/partial_gap_rescored_abs_diff"] = older.abs_diff_mean;
  m["train/partial_gap_rescored_abs_diff_max"] = older.abs_diff_max;
  return m;
}

std::vector<std::vector<float>> older_tokens(const std::vector<std::vector<float>>& lp,
                                             const std::vector<std::vector<uint64_t>>& versions,
                                             uint64_t version) {
  LS_CHECK(lp.size() == versions.size())
      << lp.size() << " sequences vs " << versions.size() << " version lists";
  std::vector<std::vector<float>> out(lp.size());
  for (size_t i = 0; i < lp.size(); ++i) {
    if (versions[i].empty()) continue;
    LS_CHECK(versions[i].size() == lp[i].size())
        << "sequence " << i << ": " << lp[i].size() << " logprobs vs " << versions[i].size() << " versions";
    for (size_t t = 0; t < lp[i].size(); ++t)
      if (versions[i][t] != version) out[i].push_back(lp[i][t]);
  }
  return out;
}

VersionScorers::VersionScorers(const train::Trainer& trainer)
    : ctx_(trainer.context()),
      config_(trainer.config()),
      micro_batch_tokens_(trainer.trainer_config().micro_batch_tokens),
      fp8_block_(trainer.trainer_config().fp8_block),
      logits_chunk_(trainer.trainer_config().logits_chunk),
      kv_block_size_(trainer.trainer_config().kv_block_size),
      precision_(trainer.trainer_config().precision) {
  if (const train::LoraState* lora = trainer.lora()) lora_layout_ = &lora->layout();
}

void VersionScorers::keep(train::Trainer& trainer, const std::set<uint64_t>& held) {
  release_unheld(held);
  const uint64_t v = trainer.version();
  if (!held.count(v) || scorers_.count(v)) return;
  if (train::LoraState* lora = trainer.lora()) {  // only the adapters differ between versions
    // Made here, not in the constructor: a resume loads the base after that.
    if (!base_scorer_)
      base_scorer_ = std::make_unique<train::Scorer>(ctx_, config_, trainer.params(), micro_batch_tokens_,
                                                     kv_block_size_, precision_, fp8_block_, logits_chunk_);
    add_adapters(v, lora->host_params());
    return;
  }
  // In the memory the trainer's kernels use (device memory on a GPU backend).
  const ParamLayout layout(config_);
  const Allocator& memory = kernels::device_memory(ctx_);
  Buffer copy(layout.nbytes(), memory, Fill::Undefined, "kept parameters");
  if (trainer.expert_comm() != nullptr) {  // the whole model, gathered on the host
    Buffer host = alloc_params(layout);
    trainer.gather_model(host.as<float>(), /*all=*/true);
    if (memory.host_visible()) return add(v, std::move(host));
    memory.copy_in(copy.data(), host.data(), layout.nbytes());
  } else {
    memory.copy(copy.data(), trainer.params(), layout.nbytes());
  }
  add(v, std::move(copy));
}

void VersionScorers::release_unheld(const std::set<uint64_t>& held) {
  for (auto it = scorers_.begin(); it != scorers_.end();)
    it = held.count(it->first) ? std::next(it) : scorers_.erase(it);
}

void VersionScorers::release_stale(uint64_t version, int64_t max_staleness) {
  if (version < uint64_t(max_staleness)) return;
  scorers_.erase(scorers_.begin(), scorers_.lower_bound(version - uint64_t(max_staleness)));
}

void VersionScorers::add(uint64_t version, Buffer params) {
  LS_CHECK(!lora_layout_) << "partial gap: a LoRA trainer's versions keep their adapters only";
  Kept k;
  k.scorer = std::make_unique<train::Scorer>(ctx_, config_, std::move(params), micro_batch_tokens_,
                                             kv_block_size_, precision_, fp8_block_, logits_chunk_);
  scorers_[version] = std::move(k);
}

void VersionScorers::add_adapters(uint64_t version, std::vector<float> adapters) {
  LS_CHECK(lora_layout_) << "partial gap: adapters kept for a trainer without [lora]";
  LS_CHECK(int64_t(adapters.size()) == lora_layout_->numel())
      << "partial gap: " << adapters.size() << " adapter values, the LoRA layout has "
      << lora_layout_->numel();
  LS_CHECK(base_scorer_) << "partial gap: adapters added before keep() saw the trainer's base";
  Kept k;
  const Allocator& memory = kernels::device_memory(ctx_);
  k.adapters = Buffer(adapters.size() * sizeof(float), memory, Fill::Undefined, "kept lora adapters");
  memory.copy_in(k.adapters.data(), adapters.data(), k.adapters.size());
  k.lora = std::make_unique<model::LoraWeights>(*lora_layout_, k.adapters.as<float>());
  scorers_[version] = std::move(k);  // moving the buffer keeps its data, so the views stay valid
}

train::Scorer& VersionScorers::scorer_of(Kept& k) {
  if (k.scorer) return *k.scorer;
  base_scorer_->set_lora(k.lora.get());
  return *base_scorer_;
}

std::vector<uint64_t> VersionScorers::versions() const {
  std::vector<uint64_t> out;
  for (const auto& [v, s] : scorers_) out.push_back(v);
  return out;
}

namespace {

// Sequence `seq` cut after its response token `last` (its prompt kept).
train::TrainSequence cut_after(const train::TrainSequence& seq, size_t last) {
  train::TrainSequence out;
  out.prompt_len = seq.prompt_len;
  out.tokens.assign(seq.tokens.begin(), seq.tokens.begin() + long(size_t(seq.prompt_len) + last + 1));
  if (!seq.loss_mask.empty())
    out.loss_mask.assign(seq.loss_mask.begin(), seq.loss_mask.begin() + long(last + 1));
  return out;
}

}  // namespace

VersionRescore VersionScorers::rescore(const std::vector<train::TrainSequence>& seqs,
                                       const std::vector<std::vector<uint64_t>>& versions,
                                       std::vector<std::vector<float>> current, uint64_t version,
                                       const train::ScoreOptions& opt) {
  LS_CHECK(seqs.size() == versions.size() && seqs.size() == current.size())
      << "partial gap: " << seqs.size() << " sequences, " << versions.size() << " version lists, "
      << current.size() << " logprob lists";
  LS_CHECK(!opt.replay) << "partial gap: routing replay is not combined with partial rollouts";
  // Per older version: the sequences holding its tokens and the last of them.
  std::map<uint64_t, std::vector<std::pair<size_t, size_t>>> older;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (versions[i].empty()) continue;
    LS_CHECK(versions[i].size() == current[i].size())
        << "partial gap: sequence " << i << " has " << current[i].size() << " logprobs, "
        << versions[i].size() << " versions";
    std::map<uint64_t, size_t> last;
    for (size_t t = 0; t < versions[i].size(); ++t)
      if (versions[i][t] != version) last[versions[i][t]] = t;
    for (const auto& [v, t] : last) older[v].push_back({i, t});
  }
  VersionRescore out;
  for (const auto& [v, seq_last] : older) {
    const auto it = scorers_.find(v);
    LS_CHECK(it != scorers_.end()) << "partial gap: sequence " << seq_last.front().first
                                   << " has tokens of weight "
                                   << "version " << v << ", whose parameters were not kept (trainer version "
                                   << version << ")";
    std::vector<train::TrainSequence> cut;
    for (const auto& [i, t] : seq_last) cut.push_back(cut_after(seqs[i], t));
    const std::vector<train::TokenScores> sc = scorer_of(it->second).score(cut, opt);
    for (size_t k = 0; k < seq_last.size(); ++k) {
      const size_t i = seq_last[k].first;
      for (size_t t = 0; t < sc[k].logp.size(); ++t)
        if (versions[i][t] == v) {
          current[i][t] = sc[k].logp[t];
          ++out.rescored;
        }
    }
  }
  out.logprobs = std::move(current);
  return out;
}

}  // namespace lockstep::rl
