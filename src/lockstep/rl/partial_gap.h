// Partial rollouts' gap at each token's own weight version ([rollout]
// partial_gap = "all"): a sample resumed across steps holds tokens of older
// versions than the trainer's, so the loop keeps a copy of the trainer's f32
// parameters for every version a token in flight still has, and scores those
// tokens on it. In aligned mode each token then equals its rollout logprob
// bit for bit, whatever its version. With [lora] only the adapters change
// from version to version: a version keeps a copy of them alone, and every
// version's scoring runs on one scorer over the trainer's frozen base (read
// in place, not copied) with that version's adapters attached.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/config.h"
#include "lockstep/tensor/tensor.h"
#include "lockstep/train/mismatch.h"
#include "lockstep/train/trainer.h"

namespace lockstep::rl {

// Every token's logprob under its own version, and how many were not the
// trainer's current version (scored on a kept copy).
struct VersionRescore {
  std::vector<std::vector<float>> logprobs;  // per sequence, per response token
  int64_t rescored = 0;
};

class VersionScorers;

// What the gap of one update covered (the train/partial_gap_* metrics).
struct PartialGapStats {
  int64_t left_out = 0;        // "current": tokens of older versions, not compared
  int64_t rescored = 0;        // "all": tokens of older versions, compared at their own
  train::MismatchStats older;  // "all": the mismatch over the rescored tokens only
  // kept: "all"'s copies (their count is reported), null with "current".
  nlohmann::json to_json(const VersionScorers* kept) const;
};

// Per sequence, the entries of lp[i] whose token's version is not `version`
// (none when versions[i] is empty).
std::vector<std::vector<float>> older_tokens(const std::vector<std::vector<float>>& lp,
                                             const std::vector<std::vector<uint64_t>>& versions,
                                             uint64_t version);

class VersionScorers {
 public:
  // Copies score like the trainer (its model, micro-batch token budget, KV
  // block size, precision, fp8_block, logits_chunk): the same pass as
  // Trainer::score on the same parameters, so the same bits.
  explicit VersionScorers(const train::Trainer& trainer);

  // Before the trainer steps: keeps a copy of its current parameters when a
  // token in flight has its version (in `held`), and releases the versions
  // no longer held. With expert parallelism the copy is the whole model,
  // gathered: collective over the expert-parallel group.
  void keep(train::Trainer& trainer, const std::set<uint64_t>& held);
  // Releases every kept version not in `held`.
  void release_unheld(const std::set<uint64_t>& held);
  // After the trainer stepped to `version`: releases the versions older than
  // version - max_staleness, whose groups the next round discards.
  void release_stale(uint64_t version, int64_t max_staleness);
  // Takes `params` (the whole model's f32 parameters) as version `version`.
  void add(uint64_t version, Buffer params);
  // [lora]: takes `adapters` (the LoRA layout's f32 parameters) as version
  // `version`, scored on the trainer's frozen base (after a first keep()).
  void add_adapters(uint64_t version, std::vector<float> adapters);

  // `current`: the trainer's logprobs of seqs' response tokens, at its
  // version `version`. Each token whose version (versions[i][t]; none when
  // versions[i] is empty) is another gets its own version's logprob instead.
  // Only the sequences holding such tokens are scored, cut after the last of
  // them (causal: the logprobs before the cut do not change), one batch per
  // version.
  VersionRescore rescore(const std::vector<train::TrainSequence>& seqs,
                         const std::vector<std::vector<uint64_t>>& versions,
                         std::vector<std::vector<float>> current, uint64_t version,
                         const train::ScoreOptions& opt);

  // The versions kept, oldest first.
  std::vector<uint64_t> versions() const;

 private:
  // One kept version: its own scorer (full fine-tuning), or its adapters for
  // the shared base scorer (LoRA).
  struct Kept {
    std::unique_ptr<train::Scorer> scorer;
    Buffer adapters;                           // (LoRA numel) f32, in the scorers' memory
    std::unique_ptr<model::LoraWeights> lora;  // views over adapters
  };
  // The scorer of version v's kept entry, its adapters attached.
  train::Scorer& scorer_of(Kept& k);

  Context ctx_;
  ModelConfig config_;
  int64_t micro_batch_tokens_, fp8_block_, logits_chunk_;
  int kv_block_size_;
  DType precision_;
  std::map<uint64_t, Kept> scorers_;
  // [lora]: the trainer's adapter layout (null: full fine-tuning), and the
  // one scorer over its frozen base, made at the first keep.
  const LoraLayout* lora_layout_ = nullptr;
  std::unique_ptr<train::Scorer> base_scorer_;
};

}  // namespace lockstep::rl
