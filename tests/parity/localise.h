// Localising a rollout/trainer divergence (docs/alignment.md): the trainer's
// forward (every token new) is run with model::forward's capture hook and
// every named intermediate row is kept, keyed by (sample, position); then the
// rollout engine is run with a hook that compares each of its rows with the
// trainer's row for the same token. The report names the first intermediate,
// in computation order (embed, layer 0's attn_norm, q, ..., logits), at which
// any row's bits differ, and the earliest position where they do.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/model/forward.h"
#include "lockstep/rollout/engine.h"

namespace lockstep::parity {

// One sample as the trainer sees it: prompt + output tokens, and the id the
// engine's capture hook reports for it (rollout::capture_key).
struct SampleTokens {
  std::vector<int32_t> tokens;
  int32_t prompt_len = 1;
  uint64_t id = 0;
};

inline std::string sample_name(uint64_t id) {
  std::ostringstream os;
  os << "request " << (id >> 24) << " sample " << (id & 0xffffffu);
  return os.str();
}

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

  void record(const model::Captured& c) {
    Point& p = point(c.layer, c.name);
    p.dtype = c.data.dtype;
    p.cols = c.cols();
    const uint32_t* bits = static_cast<const uint32_t*>(c.data.data);  // f32 and i32: 4 bytes
    for (int64_t r = 0; r < c.rows(); ++r)
      p.rows[{c.id(r), c.pos[r]}].assign(bits + r * p.cols, bits + (r + 1) * p.cols);
  }
  const Point* find(int64_t layer, const char* name) const {
    auto it = points_.find({layer, name});
    return it == points_.end() ? nullptr : &it->second;
  }
  size_t num_points() const { return points_.size(); }

 private:
  Point& point(int64_t layer, const char* name) {
    auto [it, fresh] = points_.try_emplace({layer, name});
    if (fresh) {
      it->second.order = int(points_.size()) - 1;
      it->second.layer = layer;
      it->second.name = name;
    }
    return it->second;
  }
  std::map<std::pair<int64_t, std::string>, Point> points_;
};

// Runs the trainer's forward over `samples` the way Trainer::score does: one
// ragged batch, every token new, consecutive KV blocks, logits for the
// response positions; records every intermediate.
inline CaptureReference trainer_reference(const Context& ctx, const model::ModelWeights& weights,
                                          const std::vector<SampleTokens>& samples, int block_size = 16) {
  const ModelConfig& c = weights.config();
  model::RaggedBatch batch;
  std::vector<uint64_t> ids;
  int32_t max_blocks = 1, total_blocks = 0;
  for (const auto& s : samples)
    max_blocks =
        std::max<int32_t>(max_blocks, int32_t((s.tokens.size() + size_t(block_size) - 1) / block_size));
  batch.max_blocks = max_blocks;
  for (const auto& s : samples) {
    const int32_t row0 = int32_t(batch.tokens.size());
    const int32_t nb = int32_t((s.tokens.size() + size_t(block_size) - 1) / block_size);
    batch.tokens.insert(batch.tokens.end(), s.tokens.begin(), s.tokens.end());
    batch.n_ctx.push_back(0);
    batch.n_new.push_back(int32_t(s.tokens.size()));
    for (int32_t j = 0; j < max_blocks; ++j) batch.block_table.push_back(j < nb ? total_blocks + j : 0);
    total_blocks += nb;
    for (size_t p = size_t(s.prompt_len) - 1; p + 1 < s.tokens.size(); ++p)
      batch.logit_rows.push_back(row0 + int32_t(p));
    ids.push_back(s.id);
  }
  CaptureReference ref;
  model::CaptureFn fn = [&](const model::Captured& cap) { ref.record(cap); };
  model::ForwardOptions fo;
  fo.capture = &fn;
  fo.capture_ids = &ids;
  model::KvCache kv(c, std::max(1, total_blocks), block_size);
  model::Workspace ws;
  model::ForwardResult fr;
  model::forward(ctx, weights, kv, ws, batch, fo, &fr);
  return ref;
}

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

  std::string str() const {
    if (!found) return "no intermediate differs";
    std::ostringstream os;
    os << "first divergence: layer " << layer << " '" << name << "' at " << sample_name(id) << " position "
       << pos << ": max |diff| = " << max_abs_diff << " (" << rows_differing << " of " << rows_compared
       << " rows of this point differ)";
    return os.str();
  }
};

// The rollout-side hook: compares every row it is handed with the reference.
class CaptureComparer {
 public:
  explicit CaptureComparer(const CaptureReference& ref) : ref_(ref) {}

  void operator()(const model::Captured& c) {
    const CaptureReference::Point* p = ref_.find(c.layer, c.name);
    if (p == nullptr || p->cols != c.cols() || p->dtype != c.data.dtype) {
      ++unmatched_points_;
      return;
    }
    auto& counts = per_point_[p->order];
    const uint32_t* bits = static_cast<const uint32_t*>(c.data.data);
    for (int64_t r = 0; r < c.rows(); ++r) {
      auto it = p->rows.find({c.id(r), c.pos[r]});
      if (it == p->rows.end()) {
        ++missing_rows_;
        continue;
      }
      ++compared_rows_;
      ++counts.second;
      const uint32_t* got = bits + r * p->cols;
      if (std::memcmp(got, it->second.data(), size_t(p->cols) * 4) == 0) continue;
      ++counts.first;
      double diff = 0;
      for (int64_t j = 0; j < p->cols; ++j) {
        double a, b;
        if (p->dtype == DType::I32) {
          a = double(int32_t(got[j]));
          b = double(int32_t(it->second[size_t(j)]));
        } else {
          float fa, fb;
          std::memcpy(&fa, &got[j], 4);
          std::memcpy(&fb, &it->second[size_t(j)], 4);
          a = fa;
          b = fb;
        }
        diff = std::max(diff, std::fabs(a - b));
      }
      const bool earlier = !first_.found || p->order < first_.order ||
                           (p->order == first_.order &&
                            (c.pos[r] < first_.pos || (c.pos[r] == first_.pos && c.id(r) < first_.id)));
      if (earlier) {
        first_.found = true;
        first_.order = p->order;
        first_.layer = p->layer;
        first_.name = p->name;
        first_.id = c.id(r);
        first_.pos = c.pos[r];
        first_.max_abs_diff = diff;
      }
    }
  }

  Divergence first() const {
    Divergence d = first_;
    if (d.found) {
      auto it = per_point_.find(d.order);
      d.rows_differing = it->second.first;
      d.rows_compared = it->second.second;
    }
    return d;
  }
  int64_t compared_rows() const { return compared_rows_; }
  int64_t missing_rows() const { return missing_rows_; }          // rollout rows the trainer has no token for
  int64_t unmatched_points() const { return unmatched_points_; }  // points the reference lacks

 private:
  const CaptureReference& ref_;
  Divergence first_;
  std::map<int, std::pair<int64_t, int64_t>> per_point_;  // order -> (differing, compared)
  int64_t compared_rows_ = 0, missing_rows_ = 0, unmatched_points_ = 0;
};

// The trainer's view of an engine run's results (request ids are assigned 1,
// 2, ... in submission order by a fresh engine; results are in that order).
inline std::vector<SampleTokens> samples_of(const std::vector<rollout::RequestResult>& results) {
  std::vector<SampleTokens> out;
  for (const auto& r : results)
    for (size_t k = 0; k < r.samples.size(); ++k) {
      SampleTokens s;
      s.tokens = r.prompt_ids;
      s.tokens.insert(s.tokens.end(), r.samples[k].output_ids.begin(), r.samples[k].output_ids.end());
      s.prompt_len = int32_t(r.prompt_ids.size());
      s.id = rollout::capture_key(r.id, int64_t(k));
      out.push_back(std::move(s));
    }
  return out;
}

}  // namespace lockstep::parity
