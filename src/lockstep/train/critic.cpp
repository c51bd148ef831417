// The critic: value passes over the body's final hidden states, the head's
// forward and backward, the joint optimizer step, save and load (critic.h).
#include "lockstep/train/critic.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <tuple>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/model/safetensors.h"
#include "lockstep/train/host_copies.h"

namespace lockstep::train {

// What the value passes keep from call to call (as the trainer's RunBuffers).
struct CriticBuffers {
  explicit CriticBuffers(const Allocator& memory) : memory(memory), ws(memory) {}
  const Allocator& memory;
  model::Workspace ws;
  model::KvCache kv;        // training passes: every layer's keys, for backward
  model::KvCache score_kv;  // value scoring: KvCache::scoring_scratch
  model::Activations acts;
  model::ForwardResult fr;
  OwnedTensor dhead;  // (R, D)
};

namespace {

int32_t blocks_of(const TrainSequence& s, int bs) {
  return int32_t((s.tokens.size() + size_t(bs) - 1) / size_t(bs));
}

// Sequences [b0, b1), every token new, on consecutive KV blocks; the head
// rows are the positions prompt_len - 1 .. len - 2 (the state before each
// response token), each sequence's first in first_row.
model::RaggedBatch value_batch(const std::vector<TrainSequence>& seqs, size_t b0, size_t b1, int bs,
                               std::vector<int64_t>& first_row) {
  int32_t max_blocks = 1;
  for (size_t i = b0; i < b1; ++i) max_blocks = std::max(max_blocks, blocks_of(seqs[i], bs));
  model::RaggedBatch batch(max_blocks);
  std::vector<int32_t> blocks;
  first_row.assign(b1 - b0, 0);
  int32_t next_block = 0;
  for (size_t i = b0; i < b1; ++i) {
    const TrainSequence& s = seqs[i];
    if (s.prompt_len < 1 || s.prompt_len > int64_t(s.tokens.size()))
      LS_THROW << "critic: sequence " << i << ": prompt_len " << s.prompt_len << " outside [1, "
               << s.tokens.size() << "]";
    blocks.resize(size_t(blocks_of(s, bs)));
    std::iota(blocks.begin(), blocks.end(), next_block);
    next_block += int32_t(blocks.size());
    const int32_t row0 = batch.add_sequence(s.tokens.data(), int32_t(s.tokens.size()), 0, blocks.data(),
                                            int32_t(blocks.size()));
    first_row[i - b0] = int64_t(batch.logit_rows.size());
    for (size_t p = size_t(s.prompt_len) - 1; p + 1 < s.tokens.size(); ++p)
      batch.logit_rows.push_back(row0 + int32_t(p));
  }
  return batch;
}

// values (R) = h (R, D) · w + b, each a double chain over d in order.
void head_forward(const Context& ctx, const float* head, const Tensor& h, float* values) {
  const int64_t R = h.dim(0), D = h.dim(1);
  const float* x = h.f32();
  ctx.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += double(head[d]) * double(x[r * D + d]);
      values[r] = float(acc + double(head[D]));
    }
  });
}

// The head's backward: dh (R, D) = dv ⊗ w, and grad[w] += Σ_r dv_r h_r,
// grad[b] += Σ_r dv_r (double chains over r in order, rounded once).
void head_backward(const Context& ctx, const float* head, const Tensor& h, const float* dv, Tensor dh,
                   float* grad) {
  const int64_t R = h.dim(0), D = h.dim(1);
  const float* x = h.f32();
  float* out = dh.f32();
  ctx.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t d = 0; d < D; ++d) out[r * D + d] = float(double(dv[r]) * double(head[d]));
  });
  ctx.parallel_for(D, [&](int64_t d0, int64_t d1) {
    for (int64_t d = d0; d < d1; ++d) {
      double acc = 0;
      for (int64_t r = 0; r < R; ++r) acc += double(dv[r]) * double(x[r * D + d]);
      grad[d] = float(double(grad[d]) + acc);
    }
  });
  double db = 0;
  for (int64_t r = 0; r < R; ++r) db += double(dv[r]);
  grad[D] = float(double(grad[D]) + db);
}

TrainerConfig body_config(const CriticConfig& cfg) {
  TrainerConfig tc;
  tc.optim = cfg.optim;
  tc.micro_batch_tokens = cfg.micro_batch_tokens;
  tc.kv_block_size = cfg.kv_block_size;
  tc.recompute_activations = cfg.recompute_activations;
  tc.precision = DType::F32;
  // No rollout engine reads the critic's weights: the forward reads the f32
  // master in place, without a packed copy.
  tc.in_place_weights = true;
  return tc;
}

}  // namespace

double value_loss(const float* vpred, const float* old_values, const double* returns, const uint8_t* mask,
                  int64_t n, double cliprange, double token_weight, float* dvpred, ValueLossStats* stats) {
  double loss = 0;
  for (int64_t t = 0; t < n; ++t) {
    dvpred[t] = 0.0f;
    if (mask != nullptr && mask[t] == 0) continue;
    const double v = vpred[t], old = old_values[t], ret = returns[t];
    const double vclip = old + std::clamp(v - old, -cliprange, cliprange);
    const double l1 = (v - ret) * (v - ret), l2 = (vclip - ret) * (vclip - ret);
    const bool clipped = l2 > l1;
    loss += token_weight * 0.5 * std::max(l1, l2);
    dvpred[t] = clipped ? 0.0f : float(token_weight * (v - ret));
    if (stats) {
      stats->clipped += clipped ? 1 : 0;
      stats->vpred_sum += v;
    }
  }
  if (stats) stats->loss += loss;
  return loss;
}

Critic::Critic(const Context& ctx, const ModelConfig& config, Buffer params, CriticConfig cfg)
    : ctx_(ctx), host_(kernels::cpu_context(ctx)), cfg_(cfg) {
  if (config.is_v4()) LS_THROW << "[critic]: DeepSeek-V4 models are not supported as a critic";
  if (!(cfg_.cliprange_value > 0))
    LS_THROW << "[critic] cliprange_value must be > 0, got " << cfg_.cliprange_value;
  body_ = std::make_unique<Trainer>(ctx, config, std::move(params), body_config(cfg_));
  const size_t n = size_t(config.hidden_size) + 1;
  head_.assign(n, 0.0f);
  head_grad_.assign(n, 0.0f);
  head_m_.assign(n, 0.0f);
  head_v_.assign(n, 0.0f);
  buffers_ = std::make_shared<CriticBuffers>(kernels::device_memory(ctx));
}

std::vector<std::vector<float>> Critic::values(const std::vector<TrainSequence>& seqs) {
  std::vector<std::vector<float>> out;
  run(seqs, nullptr, &out);
  return out;
}

double Critic::accumulate(const std::vector<TrainSequence>& seqs, const ValueLossFn& loss,
                          std::vector<std::vector<float>>* vpred) {
  return run(seqs, &loss, vpred);
}

double Critic::run(const std::vector<TrainSequence>& seqs, const ValueLossFn* loss,
                   std::vector<std::vector<float>>* vpred) {
  const ModelConfig& c = body_->config();
  const int bs = cfg_.kv_block_size;
  const int64_t D = c.hidden_size;
  CriticBuffers& rb = *buffers_;
  if (vpred) vpred->assign(seqs.size(), {});
  const auto mbs = micro_batches(seqs, cfg_.micro_batch_tokens);
  int64_t max_blocks_total = 1;
  for (auto [b0, b1] : mbs) {
    int64_t nb = 0;
    for (size_t i = b0; i < b1; ++i) nb += blocks_of(seqs[i], bs);
    max_blocks_total = std::max(max_blocks_total, nb);
  }
  // As the trainer's passes: only a training pass without recompute keeps
  // every layer's keys; scoring and recompute (which writes a layer's keys
  // again in its backward) share one layer's K/V array.
  const bool every_layer_kv = loss != nullptr && !cfg_.recompute_activations;
  model::KvCache& kv = every_layer_kv ? rb.kv : rb.score_kv;
  if (kv.num_blocks() < max_blocks_total || kv.block_size() != bs)
    kv = every_layer_kv ? model::KvCache(c, max_blocks_total, bs, DType::F32, rb.memory)
                        : model::KvCache::scoring_scratch(c, max_blocks_total, bs, rb.memory);
  if (!every_layer_kv) rb.kv = model::KvCache();  // a full cache left by an earlier pass
  const ModelParams grads = bind(body_->layout(), body_->grads());
  double total = 0;
  std::vector<float> v, dv;
  for (auto [b0, b1] : mbs) {
    std::vector<int64_t> first_row;
    const model::RaggedBatch batch = value_batch(seqs, b0, b1, bs, first_row);
    const int64_t R = int64_t(batch.logit_rows.size());
    model::ForwardOptions fo;
    fo.save_activations = loss != nullptr;
    fo.recompute = cfg_.recompute_activations;
    fo.lm_head = false;  // the value head reads the final norm's rows instead
    model::forward(ctx_, body_->weights(), kv, rb.ws, batch, fo, &rb.fr, loss ? &rb.acts : nullptr);
    // The value head runs on the host (double chains, so the bits do not
    // depend on where): a copy of the head's input rows where they lie in
    // device memory, the input's gradient copied back.
    std::vector<unsigned char> keep;
    const Tensor h = kernels::host_readable(rb.fr.head_input.view(), keep);  // (R, D)
    v.assign(size_t(R), 0.0f);
    dv.assign(size_t(R), 0.0f);
    if (R > 0) head_forward(host_, head_.data(), h, v.data());
    for (size_t i = b0; i < b1; ++i) {
      const int64_t r0 = first_row[i - b0], n = seqs[i].num_targets();
      if (vpred) (*vpred)[i].assign(v.begin() + r0, v.begin() + r0 + n);
      if (loss) total += (*loss)(i, v.data() + r0, n, dv.data() + r0);
    }
    if (!loss || R == 0) continue;
    const Tensor dh = model::reuse(ctx_, rb.dhead, DType::F32, {R, D});
    std::vector<float> dh_host(size_t(R * D));  // (R, D)
    head_backward(host_, head_.data(), h, dv.data(), Tensor(dh_host.data(), DType::F32, {R, D}),
                  head_grad_.data());
    rb.memory.copy_in(dh.data, dh_host.data(), dh_host.size() * sizeof(float));
    model::backward_from_head_input(ctx_, body_->weights(), kv, rb.ws, batch, rb.acts, dh, grads);
  }
  return total;
}

OptimizerStats Critic::step() {
  const int64_t D = body_->config().hidden_size, n_head = D + 1;
  // The body's gradients lie in the device's memory, the head's on the host.
  const GradNormFn norm = [&](const Context& ctx, const float* g) {
    const double body = grad_norm(ctx, buffers_->memory, g, body_->layout().numel());
    const double head = kernels::global_grad_norm(host_, head_grad_.data(), n_head);
    return std::sqrt(body * body + head * head);
  };
  AdamW& opt = body_->optimizer();
  const OptimizerStats s = opt.step(ctx_, body_->params(), body_->grads(), norm);
  if (!s.skipped) {
    const OptimizerConfig& o = cfg_.optim;
    if (o.grad_clip > 0 && s.grad_norm > o.grad_clip)
      kernels::scale_grads(host_, {kernels::FloatSegment{head_grad_.data(), n_head}},
                           float(o.grad_clip / s.grad_norm));
    kernels::AdamWParams p;
    p.lr = float(s.lr);
    p.beta1 = float(o.beta1);
    p.beta2 = float(o.beta2);
    p.eps = float(o.eps);
    p.step = opt.steps_done();
    p.weight_decay = float(o.weight_decay);  // the weight decays as a matrix, the bias does not
    kernels::adamw_step(host_, head_.data(), head_grad_.data(), head_m_.data(), head_v_.data(), D, p);
    p.weight_decay = 0.0f;
    kernels::adamw_step(host_, head_.data() + D, head_grad_.data() + D, head_m_.data() + D,
                        head_v_.data() + D, 1, p);
    body_->params_changed(body_->version() + 1);
  }
  zero_grad();
  return s;
}

void Critic::zero_grad() {
  body_->zero_grad();
  std::fill(head_grad_.begin(), head_grad_.end(), 0.0f);
}

namespace {

constexpr const char* kHeadFile = "value_head.safetensors";
constexpr const char* kHeadOptimizerFile = "value_head_optimizer.safetensors";

// The (D + 1) floats of `buf` as "<prefix>weight<suffix>" (1, D) and
// "<prefix>bias<suffix>" (1).
std::vector<SafetensorsTensor> head_tensors(const float* buf, int64_t D, const std::string& suffix) {
  return {{"score.weight" + suffix, {1, D}, buf}, {"score.bias" + suffix, {1}, buf + D}};
}

void read_head_tensors(const std::string& path, float* buf, int64_t D, const std::string& suffix) {
  SafetensorsFile f(path);
  for (const auto& [name, n, off] : {std::tuple{"score.weight" + suffix, D, int64_t(0)},
                                     std::tuple{"score.bias" + suffix, int64_t(1), D}}) {
    const SafetensorsEntry* e = f.find(name);
    if (e == nullptr) LS_THROW << path << ": no tensor '" << name << "' (the critic's value head)";
    if (e->numel != n)
      LS_THROW << path << ": tensor '" << name << "' has " << e->numel << " values, the critic's value head "
               << n;
    f.read_f32(*e, buf + off);
  }
}

}  // namespace

void Critic::save(const std::string& dir) {
  const int64_t D = body_->config().hidden_size;
  std::filesystem::create_directories(dir);
  save_pretrained(dir, body_->config(), body_->model_layout(), body_->params(), DType::F32);
  write_safetensors(dir + "/" + kHeadFile, head_tensors(head_.data(), D, ""), DType::F32);
  body_->optimizer().save(dir + "/optimizer.bin");
  std::vector<SafetensorsTensor> moments = head_tensors(head_m_.data(), D, ".exp_avg");
  for (auto& t : head_tensors(head_v_.data(), D, ".exp_avg_sq")) moments.push_back(t);
  write_safetensors(dir + "/" + kHeadOptimizerFile, moments, DType::F32);
}

void Critic::load(const std::string& dir) {
  const ModelConfig saved = load_hf_config(dir + "/config.json");
  if (!ParamLayout(saved).same_as(body_->model_layout()))
    LS_THROW << dir
             << ": the saved critic's model does not match the critic's ([critic] path or the policy's)";
  const int64_t D = body_->config().hidden_size;
  load_params_into(ctx_, buffers_->memory, dir, body_->layout(), body_->params());
  read_head_tensors(dir + "/" + kHeadFile, head_.data(), D, "");
  body_->optimizer().load(dir + "/optimizer.bin");
  read_head_tensors(dir + "/" + kHeadOptimizerFile, head_m_.data(), D, ".exp_avg");
  read_head_tensors(dir + "/" + kHeadOptimizerFile, head_v_.data(), D, ".exp_avg_sq");
  body_->params_changed(body_->version() + 1);
  zero_grad();
}

void Critic::load_head_if_present(const std::string& dir) {
  const std::string path = dir + "/" + kHeadFile;
  if (std::filesystem::is_regular_file(path))
    read_head_tensors(path, head_.data(), body_->config().hidden_size, "");
}

}  // namespace lockstep::train
