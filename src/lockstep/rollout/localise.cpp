// The capture-based localiser of rollout/trainer divergences.
#include "lockstep/rollout/localise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace lockstep::rollout {

std::string sample_name(uint64_t id) {
  std::ostringstream os;
  os << "request " << (id >> 24) << " sample " << (id & 0xffffffu);
  return os.str();
}

void CaptureReference::record(const model::Captured& c) {
  Point& p = point(c.layer, c.name);
  p.dtype = c.data.dtype;
  p.cols = c.cols();
  const uint32_t* bits = static_cast<const uint32_t*>(c.data.data);  // f32 and i32: 4 bytes
  for (int64_t r = 0; r < c.rows(); ++r)
    p.rows[{c.id(r), c.pos[r]}].assign(bits + r * p.cols, bits + (r + 1) * p.cols);
}

const CaptureReference::Point* CaptureReference::find(int64_t layer, const char* name) const {
  auto it = points_.find({layer, name});
  return it == points_.end() ? nullptr : &it->second;
}

CaptureReference::Point& CaptureReference::point(int64_t layer, const char* name) {
  auto [it, fresh] = points_.try_emplace({layer, name});
  if (fresh) {
    it->second.order = int(points_.size()) - 1;
    it->second.layer = layer;
    it->second.name = name;
  }
  return it->second;
}

CaptureReference trainer_reference(const Context& ctx, const model::ModelWeights& weights,
                                   const std::vector<SampleTokens>& samples, int block_size) {
  const ModelConfig& c = weights.config();
  auto blocks_of = [&](const SampleTokens& s) {
    return int32_t((s.tokens.size() + size_t(block_size) - 1) / size_t(block_size));
  };
  int32_t max_blocks = 1, total_blocks = 0;
  for (const auto& s : samples) max_blocks = std::max(max_blocks, blocks_of(s));
  model::RaggedBatch batch(max_blocks);
  std::vector<uint64_t> ids;
  std::vector<int32_t> blocks;
  for (const auto& s : samples) {
    blocks.resize(size_t(blocks_of(s)));
    for (size_t j = 0; j < blocks.size(); ++j) blocks[j] = total_blocks + int32_t(j);
    total_blocks += int32_t(blocks.size());
    const int32_t row0 =
        batch.add_sequence(s.tokens.data(), int32_t(s.tokens.size()), 0, blocks.data(), int32_t(blocks.size()));
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

std::string Divergence::str() const {
  if (!found) return "no intermediate differs";
  std::ostringstream os;
  os << "first divergence: layer " << layer << " '" << name << "' at " << sample_name(id) << " position " << pos
     << ": max |diff| = " << max_abs_diff << " (" << rows_differing << " of " << rows_compared
     << " rows of this point differ)";
  return os.str();
}

void CaptureComparer::operator()(const model::Captured& c) {
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
    if (std::memcmp(bits + r * p->cols, it->second.data(), size_t(p->cols) * 4) == 0) continue;
    ++counts.first;
    note(*p, c, r, it->second.data());
  }
}

// Row r of c differs from the reference's `want`: keep it if it is the
// earliest difference so far (computation order, then position, then id).
void CaptureComparer::note(const CaptureReference::Point& p, const model::Captured& c, int64_t r,
                           const uint32_t* want) {
  const uint32_t* got = static_cast<const uint32_t*>(c.data.data) + r * p.cols;
  double diff = 0;
  for (int64_t j = 0; j < p.cols; ++j) {
    double a, b;
    if (p.dtype == DType::I32) {
      a = double(int32_t(got[j]));
      b = double(int32_t(want[j]));
    } else {
      float fa, fb;
      std::memcpy(&fa, &got[j], 4);
      std::memcpy(&fb, &want[j], 4);
      a = fa;
      b = fb;
    }
    diff = std::max(diff, std::fabs(a - b));
  }
  const bool earlier =
      !first_.found || p.order < first_.order ||
      (p.order == first_.order && (c.pos[r] < first_.pos || (c.pos[r] == first_.pos && c.id(r) < first_.id)));
  if (!earlier) return;
  first_.found = true;
  first_.order = p.order;
  first_.layer = p.layer;
  first_.name = p.name;
  first_.id = c.id(r);
  first_.pos = c.pos[r];
  first_.max_abs_diff = diff;
}

Divergence CaptureComparer::first() const {
  Divergence d = first_;
  if (d.found) {
    auto it = per_point_.find(d.order);
    d.rows_differing = it->second.first;
    d.rows_compared = it->second.second;
  }
  return d;
}

std::vector<SampleTokens> samples_of(const std::vector<RequestResult>& results) {
  std::vector<SampleTokens> out;
  for (const auto& r : results)
    for (size_t k = 0; k < r.samples.size(); ++k) {
      SampleTokens s;
      s.tokens = r.prompt_ids;
      s.tokens.insert(s.tokens.end(), r.samples[k].output_ids.begin(), r.samples[k].output_ids.end());
      s.prompt_len = int32_t(r.prompt_ids.size());
      s.id = capture_key(r.id, int64_t(k));
      out.push_back(std::move(s));
    }
  return out;
}

std::string localise_sample(const Context& ctx, const model::ModelWeights& rollout_weights,
                            const model::ModelWeights& trainer_weights, EngineConfig config,
                            const std::vector<int32_t>& tokens, int32_t prompt_len, SamplingParams params) {
  LS_CHECK(prompt_len >= 1 && size_t(prompt_len) < tokens.size()) << "localise: the sample has no response tokens";
  Request req;
  req.prompt_ids.assign(tokens.begin(), tokens.begin() + prompt_len);
  req.forced_output.assign(tokens.begin() + prompt_len, tokens.end());
  params.n = 1;
  params.max_new_tokens = int64_t(req.forced_output.size());
  params.min_new_tokens = 0;
  params.ignore_eos = true;
  params.stop.clear();
  params.stop_token_ids.clear();
  req.params = params;
  const SampleTokens sample{tokens, prompt_len, capture_key(1, 0)};  // a fresh engine's first request
  const CaptureReference ref = trainer_reference(ctx, trainer_weights, {sample}, config.block_size);
  CaptureComparer cmp(ref);
  config.capture = [&](const model::Captured& c) { cmp(c); };
  config.prefix_cache = false;
  Engine engine(ctx, &rollout_weights, config);
  engine.generate({req});
  std::ostringstream os;
  os << cmp.first().str() << " [" << cmp.compared_rows() << " rows compared]";
  return os.str();
}

}  // namespace lockstep::rollout
