// Localising a rollout/trainer divergence (docs/alignment.md, "Localising a
// divergence"): the trainer's forward (every token new) is run with
// model::forward's capture hook and every named intermediate row is kept,
// keyed by (sample, position); then the rollout engine is run with a hook that
// compares each of its rows with the trainer's row for the same token. The
// first intermediate, in computation order (embed, layer 0's attn_norm, q, ...,
// logits), at which any row's bits differ is the divergence's source.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/model/forward.h"
#include "lockstep/rollout/engine.h"

namespace lockstep::rollout {

// One sample as the trainer sees it: prompt + output tokens, and the id the
// engine's capture hook reports for it (capture_key).
struct SampleTokens {
  std::vector<int32_t> tokens;
  int32_t prompt_len = 1;
  uint64_t id = 0;
};

// "request R sample S" of a capture_key id.
std::string sample_name(uint64_t id);

// Every captured row of one forward, by capture point and (sample id, position).
class CaptureReference {
 public:
  struct Point {
    int order = 0;  // rank of the point in computation order
    int64_t layer = 0;
    std::string name;
    DType dtype = DType::F32;
    int64_t cols = 0;
    std::map<std::pair<uint64_t, int32_t>, std::vector<uint32_t>> rows;  // bits of each row
  };

  void record(const model::Captured& c);
  const Point* find(int64_t layer, const char* name) const;
  size_t num_points() const { return points_.size(); }

 private:
  Point& point(int64_t layer, const char* name);
  std::map<std::pair<int64_t, std::string>, Point> points_;
};

// Runs the trainer's forward over `samples` the way Trainer::score does: one
// ragged batch, every token new, consecutive KV blocks, logits for the
// response positions; records every intermediate.
CaptureReference trainer_reference(const Context& ctx, const model::ModelWeights& weights,
                                   const std::vector<SampleTokens>& samples, int block_size = 16);

// The first divergence the comparer saw.
struct Divergence {
  bool found = false;
  int order = 0;
  int64_t layer = 0;
  std::string name;
  uint64_t id = 0;
  int32_t pos = 0;
  double max_abs_diff = 0;     // over that row's columns
  int64_t rows_differing = 0;  // rows of that point that differ (all samples, all steps)
  int64_t rows_compared = 0;   // rows of that point compared

  std::string str() const;
};

// The rollout-side hook: compares every row it is handed with the reference.
class CaptureComparer {
 public:
  explicit CaptureComparer(const CaptureReference& ref) : ref_(ref) {}

  void operator()(const model::Captured& c);
  Divergence first() const;
  int64_t compared_rows() const { return compared_rows_; }
  int64_t missing_rows() const { return missing_rows_; }          // rollout rows the trainer has no token for
  int64_t unmatched_points() const { return unmatched_points_; }  // points the reference lacks

 private:
  void note(const CaptureReference::Point& p, const model::Captured& c, int64_t r, const uint32_t* want);
  const CaptureReference& ref_;
  Divergence first_;
  std::map<int, std::pair<int64_t, int64_t>> per_point_;  // order -> (differing, compared)
  int64_t compared_rows_ = 0, missing_rows_ = 0, unmatched_points_ = 0;
};

// Replays one recorded sample (prompt + response tokens) through the rollout
// engine's decode path, teacher-forced (Request::forced_output) in a fresh
// engine built with `config` and `params` (the sample's sampling options; the
// stop rules are turned off so that every recorded token is decoded), and
// compares every intermediate with the trainer's forward over the same tokens:
// "first divergence: ..." or "no intermediate differs", with the rows compared.
std::string localise_sample(const Context& ctx, const model::ModelWeights& rollout_weights,
                            const model::ModelWeights& trainer_weights, EngineConfig config,
                            const std::vector<int32_t>& tokens, int32_t prompt_len, SamplingParams params);

// The trainer's view of an engine run's results (request ids are assigned 1,
// 2, ... in submission order by a fresh engine; results are in that order).
std::vector<SampleTokens> samples_of(const std::vector<RequestResult>& results);

}  // namespace lockstep::rollout
