// Trainer: micro-batching, the logprob/loss/backward chain, optimizer steps.
#include "lockstep/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/v4_forward.h"
#include "lockstep/model/v4_util.h"
#include "lockstep/train/chunked_head.h"
#include "lockstep/train/host_copies.h"

namespace lockstep::train {

// What run() keeps from one micro-batch to the next, and from call to call:
// the forward/backward workspace, the KV cache (the keys and values of the
// largest micro-batch, which attention and its backward read), the saved
// activations and the logits, so a micro-batch no larger than an earlier one
// allocates nothing.
// In the device memory of the trainer's context (kernels::device_memory).
struct RunBuffers {
  explicit RunBuffers(const Allocator& memory) : memory(memory), ws(memory) {}
  const Allocator& memory;
  model::Workspace ws;
  model::KvCache kv;        // training passes: every layer's keys, for backward
  model::KvCache score_kv;  // scoring and recompute passes: KvCache::scoring_scratch
  model::Activations acts;
  model::ForwardResult fr;
  OwnedTensor logp, ent, tgt, dlogp, dent;  // (R)
  OwnedTensor chunk_logits;                 // (logits_chunk, V) when scoring in chunks
  ChunkedHeadBuffers head;                  // training in chunks
};

Trainer::Trainer(const Context& ctx, const ModelConfig& config, Buffer params, TrainerConfig cfg)
    : ctx_(ctx),
      model_layout_(config),
      layout_(model_layout_),
      params_(in_memory(std::move(params), kernels::device_memory(ctx), "parameters")),
      // A LoRA trainer takes no base gradient: no buffer for one.
      grads_(cfg.lora.enabled() ? 0 : layout_.nbytes(), kernels::device_memory(ctx), Fill::Zero, "gradients"),
      grad_views_(cfg.lora.enabled() ? ModelParams{} : bind(layout_, grads_.as<float>())),
      cfg_(cfg),
      optimizer_(layout_, cfg.optim, nullptr, kernels::device_memory(ctx)) {
  LS_CHECK(params_.size() >= layout_.nbytes())
      << "parameter buffer of " << params_.size() << " bytes, model needs " << layout_.nbytes();
  LS_CHECK(cfg_.micro_batch_tokens >= 1) << "micro_batch_tokens must be >= 1";
  LS_CHECK(cfg_.logits_chunk >= 0) << "logits_chunk must be >= 0";
  LS_CHECK(cfg_.mtp_loss_coef == 0 || config.num_nextn_predict_layers > 0)
      << "[train] mtp_loss_coef = " << cfg_.mtp_loss_coef
      << " needs a model with MTP blocks (num_nextn_predict_layers > 0)";
  if (cfg_.world_invariant && cfg_.mtp_loss_coef != 0)
    LS_THROW << "[dist] world_invariant = true does not cover the MTP loss ([train] mtp_loss_coef = "
             << cfg_.mtp_loss_coef << "): set one of them off";
  if (!(cfg_.indexer_loss_coef >= 0))
    LS_THROW << "[train] indexer_loss_coef must be >= 0, got " << cfg_.indexer_loss_coef;
  if (cfg_.indexer_loss_coef > 0 && (!config.is_v4() || model::num_csa_layers(config) == 0))
    LS_THROW
        << "[train] indexer_loss_coef = " << cfg_.indexer_loss_coef
        << " needs a DeepSeek-V4 model with CSA layers (compress_ratios of 4): this model has no indexer";
  if (cfg_.world_invariant && cfg_.indexer_loss_coef > 0)
    LS_THROW << "[dist] world_invariant = true does not cover the indexer loss ([train] indexer_loss_coef = "
             << cfg_.indexer_loss_coef << "): set one of them off";
  if (cfg_.indexer_loss_coef > 0) layout_.train_indexers();
  weights_ = std::make_unique<model::ModelWeights>(ctx_, layout_, params_.as<float>(), cfg_.precision,
                                                   cfg_.fp8_block, model::ExpertShard{}, /*effective=*/true,
                                                   cfg_.in_place_weights);
  if (cfg_.lora.enabled()) start_lora();
}

void Trainer::start_lora() {
  if (cfg_.world_invariant) LS_THROW << "[lora] does not support [dist] world_invariant = true yet";
  if (cfg_.mtp_loss_coef != 0 || cfg_.indexer_loss_coef != 0)
    LS_THROW << "[lora] trains adapters only: set [train] mtp_loss_coef and indexer_loss_coef to 0";
  lora_ = std::make_unique<LoraState>(ctx_, layout_, cfg_.lora);
  grad_views_ = lora_->base_grads();
  weights_->set_lora(&lora_->weights());
}

void Trainer::params_changed(uint64_t version) {
  weights_->refresh(ctx_, version);
}

namespace {
// Floats of a buffer in device memory that host code (the exact sums' fold
// and unfold, the weight stream) handles through one host copy (16 MiB).
constexpr int64_t kHostChunk = int64_t{1} << 22;

// Adjacent (offset, n) ranges merged.
void add_range(std::vector<std::pair<int64_t, int64_t>>& r, int64_t offset, int64_t n) {
  if (!r.empty() && r.back().first + r.back().second == offset)
    r.back().second += n;
  else
    r.emplace_back(offset, n);
}

std::vector<kernels::FloatSegment> segments(const std::vector<std::pair<int64_t, int64_t>>& r,
                                            const float* base) {
  std::vector<kernels::FloatSegment> out;
  for (auto [o, n] : r) out.push_back({const_cast<float*>(base) + o, n});
  return out;
}

}  // namespace

void Trainer::set_expert_comm(model::ExpertComm* comm) {
  const ModelConfig& c = config();
  LS_CHECK(optimizer_.steps_done() == 0)
      << "set_expert_comm after optimizer steps would lose the optimizer state";
  if (lora_) LS_THROW << "[lora]: LoRA adapters do not support expert parallelism yet";
  LS_CHECK(layout_.all_experts() || comm == experts_)
      << "set_expert_comm: this trainer already holds only some experts; build it again from the whole model";
  model::ExpertShard shard;
  if (comm != nullptr && c.num_experts > 0)
    shard = model::ExpertShard::of_rank(c.num_experts, comm->size(), comm->rank());
  experts_ = shard.all() ? nullptr : comm;
  if (!shard.all()) {
    // Keep this rank's tensors only: the other experts' parameters go.
    ParamLayout mine(c, shard.first, shard.count);
    const Allocator& memory = kernels::device_memory(ctx_);
    Buffer p(mine.nbytes(), memory, Fill::Zero, "parameters");
    for (const ParamInfo& q : mine.params())
      memory.copy(p.as<float>() + q.offset, params_.as<float>() + layout_.at(q.name).offset,
                  size_t(q.numel) * sizeof(float));
    layout_ = std::move(mine);
    if (cfg_.indexer_loss_coef > 0) layout_.train_indexers();
    params_ = std::move(p);
  }
  grads_ = Buffer(layout_.nbytes(), kernels::device_memory(ctx_), Fill::Zero, "gradients");
  grad_views_ = bind(layout_, grads_.as<float>());
  optimizer_ = AdamW(layout_, optimizer_.config(), &model_layout_, kernels::device_memory(ctx_));
  own_expert_ranges_.clear();
  shared_ranges_.clear();
  for (const ParamInfo& p : layout_.params())
    add_range(p.routed_expert() ? own_expert_ranges_ : shared_ranges_, p.offset, p.numel);
  model_params_ = Buffer();
  gathered_optimizer_.clear();
  const uint64_t version = weights_->version();
  weights_ =
      std::make_unique<model::ModelWeights>(ctx_, layout_, params_.as<float>(), cfg_.precision,
                                            cfg_.fp8_block, shard, /*effective=*/true, cfg_.in_place_weights);
  weights_->refresh(ctx_, version);
}

// sqrt(|shared|^2 + sum over the group of |own experts|^2): the shared
// gradients are the same on every rank after grad_reduce, each expert's are
// on one rank of the group.
double Trainer::expert_grad_norm(const Context& ctx, const float* grads) const {
  const Allocator& memory = grads_.memory();
  const double a = kernels::norm_of_chunk_sums(norm_chunk_sums(ctx, memory, segments(shared_ranges_, grads)));
  const double b =
      kernels::norm_of_chunk_sums(norm_chunk_sums(ctx, memory, segments(own_expert_ranges_, grads)));
  return std::sqrt(a * a + experts_->sum(b * b));
}

// The norm over the model layout's parameters one by one (kNormChunk
// chunks of each), the chunk sums added in model-layout order: the same
// segments and order on any layout, so the same bits. With expert
// parallelism the chunk sums of the other ranks' experts come from the group
// (one all-gather of a double per chunk).
double Trainer::invariant_grad_norm(const Context& ctx, const float* grads) const {
  std::vector<kernels::FloatSegment> shared, own;
  for (const ParamInfo& p : layout_.params())
    (experts_ != nullptr && p.routed_expert() ? own : shared)
        .push_back({const_cast<float*>(grads) + p.offset, p.numel});
  const std::vector<double> mine = norm_chunk_sums(ctx, grads_.memory(), shared);
  if (experts_ == nullptr) return kernels::norm_of_chunk_sums(mine);
  const std::vector<double> own_sums = norm_chunk_sums(ctx, grads_.memory(), own);
  const int P = experts_->size();
  const size_t per_rank = own_sums.size();
  std::vector<double> group(per_rank * size_t(P));
  experts_->all_gather(own_sums.data(), per_rank * sizeof(double), group.data());
  // Model-layout order: shared tensors from `mine`, expert e's from its
  // owner's list (each rank's experts are in the same order as in the model).
  const int64_t per_expert = layout_.expert_count();
  std::vector<double> sums;
  sums.reserve(mine.size() + group.size());
  size_t at_shared = 0;
  std::vector<size_t> at(size_t(P), 0);
  for (const ParamInfo& p : model_layout_.params()) {
    const size_t chunks = size_t((p.numel + kernels::kNormChunk - 1) / kernels::kNormChunk);
    const double* from = nullptr;
    if (p.routed_expert()) {
      const size_t r = size_t(p.expert / per_expert);
      LS_CHECK(at[r] + chunks <= per_rank) << "expert norm chunks out of step with the group";
      from = group.data() + r * per_rank + at[r];
      at[r] += chunks;
    } else {
      LS_CHECK(at_shared + chunks <= mine.size()) << "norm chunks out of step with the layout";
      from = mine.data() + at_shared;
      at_shared += chunks;
    }
    sums.insert(sums.end(), from, from + chunks);
  }
  return kernels::norm_of_chunk_sums(sums);
}

// In model-layout order, a MoE layer's routed experts are two blocks: every
// expert's gate|up rows, then every expert's down rows (ExpertBlocks), and
// shard r's experts are part r of each, so one gather per block assembles it.
// `local` may lie in device memory: then the tensors reach `emit` and the
// group through host copies.
void Trainer::assemble(const float* local, bool all, const std::function<void(const float*, int64_t)>& emit) {
  const bool receiver = all || experts_->rank() == 0;
  const Allocator& memory = kernels::device_memory(ctx_);
  std::vector<float> block, shard;
  for (const ParamInfo& p : model_layout_.params()) {
    if (!p.routed_expert()) {
      if (receiver) for_each_host_chunk(memory, local + layout_.at(p.name).offset, p.numel, kHostChunk, emit);
      continue;
    }
    // Each block goes out at its first tensor; the layer's other expert
    // tensors lie inside the two blocks.
    const ExpertBlocks& whole = model_layout_.expert_blocks(p.layer);
    const bool gate_up = p.offset == whole.gate_up.offset;
    if (!gate_up && p.offset != whole.down.offset) continue;
    const ParamRange& mine =
        gate_up ? layout_.expert_blocks(p.layer).gate_up : layout_.expert_blocks(p.layer).down;
    const int64_t n = gate_up ? whole.gate_up.numel : whole.down.numel;
    LS_CHECK(n == mine.numel * experts_->size()) << "expert shards of unequal size";
    const size_t bytes = size_t(mine.numel) * sizeof(float);
    if (receiver) block.resize(size_t(n));
    const float* send = local + mine.offset;
    if (!memory.host_visible()) {
      shard.resize(size_t(mine.numel));
      memory.copy_out(shard.data(), send, bytes);
      send = shard.data();
    }
    if (all)
      experts_->all_gather(send, bytes, block.data());
    else
      experts_->gather(send, bytes, block.data(), 0);
    if (receiver) emit(block.data(), n);
  }
}

void Trainer::gather_model(float* out, bool all) {
  if (experts_ == nullptr) {
    params_.memory().copy_out(out, params_.data(), layout_.nbytes());
    return;
  }
  int64_t at = 0;
  assemble(params_.as<float>(), all, [&](const float* d, int64_t n) {
    std::copy(d, d + n, out + at);
    at += n;
  });
}

void Trainer::stream_model(bool want, const std::function<void(const float*, int64_t)>& emit) {
  if (experts_ == nullptr) {
    // In device memory, through host copies of bounded chunks.
    if (want) for_each_host_chunk(params_.memory(), params_.as<float>(), layout_.numel(), kHostChunk, emit);
    return;
  }
  if (experts_->max(want ? 1 : 0) == 0) return;
  assemble(params_.as<float>(), false, emit);
}

const float* Trainer::checkpoint_params() const {
  if (experts_ == nullptr) return params_.as<float>();
  LS_CHECK(model_params_.size() == model_layout_.nbytes())
      << "checkpoint_params: prepare_checkpoint(true, ...) first (expert parallelism)";
  return model_params_.as<float>();
}

void Trainer::prepare_checkpoint(bool writer, const std::string& scratch) {
  if (experts_ == nullptr) return;
  if (experts_->max(writer ? 1 : 0) == 0) return;  // nobody in this group writes
  const bool root = experts_->rank() == 0;
  LS_CHECK(!writer || root) << "prepare_checkpoint: the writer must be rank 0 of its expert-parallel group";
  if (root && model_params_.size() != model_layout_.nbytes()) model_params_ = Buffer(model_layout_.nbytes());
  gather_model(root ? model_params_.as<float>() : nullptr, false);
  if (root) std::filesystem::create_directories(std::filesystem::path(scratch).parent_path());
  std::unique_ptr<OptimizerStateWriter> out;
  if (root)
    out = std::make_unique<OptimizerStateWriter>(scratch, optimizer_.steps_done(), model_layout_.numel());
  for (const float* moment : {optimizer_.m(), optimizer_.v()})
    assemble(moment, false, [&](const float* d, int64_t n) { out->write(d, n); });
  if (out) {
    out->commit();
    gathered_optimizer_ = scratch;
  }
}

void Trainer::save_optimizer(const std::string& path) {
  if (lora_) return lora_->save_optimizer(path);  // the adapters' moments only
  if (experts_ == nullptr) return optimizer_.save(path);
  LS_CHECK(!gathered_optimizer_.empty())
      << "save_optimizer: prepare_checkpoint(true, ...) first (expert parallelism)";
  std::filesystem::rename(gathered_optimizer_, path);
  gathered_optimizer_.clear();
  model_params_ = Buffer();  // the model was saved before (save_checkpoint)
}

int64_t TrainSequence::num_loss_targets() const {
  if (loss_mask.empty()) return num_targets();
  LS_CHECK(int64_t(loss_mask.size()) == num_targets()) << "TrainSequence: loss_mask has " << loss_mask.size()
                                                       << " entries for " << num_targets() << " targets";
  int64_t n = 0;
  for (uint8_t m : loss_mask) n += m ? 1 : 0;
  return n;
}

std::vector<std::pair<size_t, size_t>> micro_batches(const std::vector<TrainSequence>& seqs,
                                                     int64_t micro_batch_tokens) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n = int64_t(seqs[i].tokens.size());
    if (i > begin && tokens + n > micro_batch_tokens) {
      out.emplace_back(begin, i);
      begin = i;
      tokens = 0;
    }
    tokens += n;
  }
  if (begin < seqs.size()) out.emplace_back(begin, seqs.size());
  return out;
}

std::vector<std::pair<size_t, size_t>> Trainer::micro_batches(const std::vector<TrainSequence>& seqs) const {
  return train::micro_batches(seqs, cfg_.micro_batch_tokens);
}

namespace {

// What one scoring or training pass runs on: the weights, and for training
// the gradients backward accumulates into.
struct RunSpec {
  const Context& ctx;
  const model::ModelWeights& weights;
  int64_t micro_batch_tokens;
  int kv_block_size;
  int64_t logits_chunk = 0;  // TrainerConfig::logits_chunk (0: all rows at once)
  bool recompute = false;
  model::ExpertComm* experts = nullptr;
  const ModelParams* grads = nullptr;  // null: forward only (the loss must be null too)
  const model::LoraParams* lora_grads = nullptr;  // the adapters' gradients (LoRA trainer)
  double mtp_loss_coef = 0.0;          // TrainerConfig::mtp_loss_coef
  double indexer_loss_coef = 0.0;      // TrainerConfig::indexer_loss_coef
  // Called after each micro-batch's backward (world_invariant: the fold).
  const std::function<void()>* after_backward = nullptr;
  // Expert parallelism with world_invariant: Activations::fold_expert_grads.
  const std::function<void(const MlpParams&, const Context&)>* fold_expert_grads = nullptr;
};

// The rows the indexer loss averages over in seqs: in every CSA layer, each
// position that sees a compressed entry (position >= 3: entry b covers
// positions 4b .. 4b + 3 and is visible from its last one on).
int64_t indexer_loss_rows(const ModelConfig& c, const std::vector<TrainSequence>& seqs) {
  int64_t n = 0;
  for (const TrainSequence& s : seqs) n += std::max<int64_t>(0, int64_t(s.tokens.size()) - 3);
  return n * model::num_csa_layers(c);
}

// Whether the token at position `pos` (>= prompt_len) trains: loss_mask
// keeps it (every response token without a mask). Multi-turn sequences mask
// the environment's tokens out of the MTP loss as out of the main one.
bool mtp_trains(const TrainSequence& s, int64_t pos) {
  return s.loss_mask.empty() || s.loss_mask[size_t(pos - s.prompt_len)] != 0;
}

// MTP block j's targets in seqs: the logit rows p (prompt_len - 1 .. len - 2)
// whose token p + j + 2 exists and trains.
int64_t mtp_targets(const std::vector<TrainSequence>& seqs, int64_t j) {
  int64_t n = 0;
  for (const auto& s : seqs)
    for (int64_t t = s.prompt_len + 1 + j; t < int64_t(s.tokens.size()); ++t) n += mtp_trains(s, t) ? 1 : 0;
  return n;
}

// The i32 targets of `rows` logit rows in ctx's memory (a host copy in one go).
OwnedTensor device_targets(const Context& ctx, const std::vector<int32_t>& rows) {
  return model::device_i32(ctx, rows, {int64_t(rows.size())});
}

// TokenScores::mtp_logp of the micro-batch's sequences from MTP block 0's
// logits. The targets go in, the logprobs come out, by copies: the logits
// may lie in device memory.
void mtp_scores(const RunSpec& r, const model::ForwardResult& fr, const std::vector<TrainSequence>& seqs,
                size_t b0, size_t b1, const std::vector<int64_t>& first_row,
                std::vector<TokenScores>& scores) {
  const Tensor logits = fr.mtp_logits.at(0).view();
  const int64_t R = logits.dim(0);
  std::vector<int32_t> targets(size_t(R), 0);
  for (size_t i = b0; i < b1; ++i) {
    const auto& s = seqs[i];
    for (int64_t k = 0; k + 2 < int64_t(s.tokens.size()) - s.prompt_len + 1; ++k)
      targets[size_t(first_row[i - b0] + k)] = s.tokens[size_t(s.prompt_len + 1 + k)];
  }
  const OwnedTensor tgt = device_targets(r.ctx, targets);
  const OwnedTensor lp = model::device_tensor(r.ctx, DType::F32, {R});
  kernels::token_logprob_forward(r.ctx, lp.view(), Tensor(), Tensor(), logits, tgt.view(), 1.0f);
  std::vector<float> host(static_cast<size_t>(R));
  kernels::device_memory(r.ctx).copy_out(host.data(), lp.view().data, host.size() * sizeof(float));
  for (size_t i = b0; i < b1; ++i) {
    const int64_t r0 = first_row[i - b0], n = std::max<int64_t>(0, seqs[i].num_targets() - 1);
    scores[i].mtp_logp.assign(host.data() + r0, host.data() + r0 + n);
  }
}

// The MTP loss of one micro-batch: for every block j, coef / N_j x the
// cross-entropy of its valid rows, whose gradient is written over
// fr.mtp_logits (into dmtp). Returns the loss. The loss and its gradient
// rows are host work on a copy of the logprobs, as run_pass's losses are.
double mtp_loss(const RunSpec& r, model::ForwardResult& fr, const std::vector<TrainSequence>& seqs, size_t b0,
                size_t b1, const std::vector<int64_t>& first_row, const std::vector<int64_t>& norm,
                std::vector<Tensor>& dmtp) {
  const Allocator& memory = kernels::device_memory(r.ctx);
  double total = 0;
  dmtp.clear();
  for (size_t j = 0; j < fr.mtp_logits.size(); ++j) {
    Tensor logits = fr.mtp_logits[j].view();
    const int64_t R = logits.dim(0);
    std::vector<int32_t> targets(size_t(R), 0);
    std::vector<char> valid(size_t(R), 0);
    for (size_t i = b0; i < b1; ++i) {
      const auto& s = seqs[i];
      for (int64_t p = s.prompt_len - 1; p + 1 < int64_t(s.tokens.size()); ++p) {
        const int64_t row = first_row[i - b0] + p - (s.prompt_len - 1), target = p + int64_t(j) + 2;
        if (target >= int64_t(s.tokens.size()) || !mtp_trains(s, target)) continue;
        targets[size_t(row)] = s.tokens[size_t(target)];
        valid[size_t(row)] = 1;
      }
    }
    const OwnedTensor tgt = device_targets(r.ctx, targets);
    const OwnedTensor lp = model::device_tensor(r.ctx, DType::F32, {R});
    const OwnedTensor dlp = model::device_tensor(r.ctx, DType::F32, {R});
    kernels::token_logprob_forward(r.ctx, lp.view(), Tensor(), Tensor(), logits, tgt.view(), 1.0f);
    std::vector<float> host_lp(static_cast<size_t>(R)), host_dlp(static_cast<size_t>(R), 0.0f);
    memory.copy_out(host_lp.data(), lp.view().data, host_lp.size() * sizeof(float));
    const double w = norm[j] > 0 ? r.mtp_loss_coef / double(norm[j]) : 0.0;
    for (int64_t row = 0; row < R; ++row) {
      if (!valid[size_t(row)]) continue;
      total -= w * double(host_lp[size_t(row)]);
      host_dlp[size_t(row)] = float(-w);
    }
    memory.copy_in(dlp.view().data, host_dlp.data(), host_dlp.size() * sizeof(float));
    kernels::token_logprob_backward(r.ctx, logits, dlp.view(), Tensor(), logits, tgt.view(), 1.0f);
    dmtp.push_back(logits);
  }
  return total;
}

void check_sequences(const RunSpec& r, const std::vector<TrainSequence>& seqs, const ScoreOptions& opt) {
  const ModelConfig& c = r.weights.config();
  const size_t route_row = size_t(c.num_moe_layers() * c.num_experts_per_tok);
  const size_t indexer_row = size_t(model::num_csa_layers(c) * c.index_topk);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    if (s.prompt_len < 1 || s.prompt_len > int64_t(s.tokens.size()))
      LS_THROW << "sequence " << i << ": prompt_len " << s.prompt_len << " outside [1, " << s.tokens.size()
               << "]";
    if (!opt.replay) continue;
    if (s.routed_experts.size() != s.tokens.size() * route_row)
      LS_THROW << "sequence " << i << ": routing replay needs " << s.tokens.size() * route_row
               << " expert ids, got " << s.routed_experts.size();
    if (s.indexer_topk.size() != s.tokens.size() * indexer_row)
      LS_THROW << "sequence " << i << ": indexer replay needs " << s.tokens.size() * indexer_row
               << " indexer_topk entries (tokens * L_csa * index_topk = " << s.tokens.size() << " * "
               << model::num_csa_layers(c) << " * " << c.index_topk << "), got " << s.indexer_topk.size();
  }
}

// The micro-batch's replayed choices, its sequences' in batch order.
struct ReplayRows {
  std::vector<int32_t> experts;  // (T, L_moe, K)
  std::vector<int32_t> indexer;  // (T, L_csa, KI)
};

// KV blocks a sequence of the trainer's batch takes (every token new).
int32_t blocks_of(const TrainSequence& s, int bs) {
  return int32_t((s.tokens.size() + size_t(bs) - 1) / size_t(bs));
}

// Every token new, sequences [b0, b1) on consecutive KV blocks from block 0; the logit
// rows and targets of their response tokens, and each sequence's first row.
model::RaggedBatch build_batch(const std::vector<TrainSequence>& seqs, size_t b0, size_t b1, int bs,
                               bool replay, std::vector<int32_t>& targets, ReplayRows& replay_rows,
                               std::vector<int64_t>& first_row) {
  int32_t max_blocks = 1;
  for (size_t i = b0; i < b1; ++i) max_blocks = std::max(max_blocks, blocks_of(seqs[i], bs));
  model::RaggedBatch batch(max_blocks);
  std::vector<int32_t> blocks;
  first_row.assign(b1 - b0, 0);
  int32_t next_block = 0;
  for (size_t i = b0; i < b1; ++i) {
    const auto& s = seqs[i];
    blocks.resize(size_t(blocks_of(s, bs)));
    std::iota(blocks.begin(), blocks.end(), next_block);
    next_block += int32_t(blocks.size());
    const int32_t row0 = batch.add_sequence(s.tokens.data(), int32_t(s.tokens.size()), 0, blocks.data(),
                                            int32_t(blocks.size()));
    first_row[i - b0] = int64_t(batch.logit_rows.size());
    for (size_t p = size_t(s.prompt_len) - 1; p + 1 < s.tokens.size(); ++p) {
      batch.logit_rows.push_back(row0 + int32_t(p));
      targets.push_back(s.tokens[p + 1]);
    }
    if (replay) {
      replay_rows.experts.insert(replay_rows.experts.end(), s.routed_experts.begin(), s.routed_experts.end());
      replay_rows.indexer.insert(replay_rows.indexer.end(), s.indexer_topk.begin(), s.indexer_topk.end());
    }
  }
  return batch;
}

// Scoring without a loss, in chunks of `chunk` logit rows: the vocabulary
// projection and the token logprobs (and entropy) of rows [r0, r0 + chunk)
// at a time, from the forward's head_input, so that at most (chunk, V)
// logits exist at once. Each row's logits and reductions are its own, so
// every logprob has the bits of the unchunked pass.
void chunked_token_logprobs(const RunSpec& r, RunBuffers& rb, int64_t R, int64_t chunk,
                            const ScoreOptions& opt) {
  const int64_t V = r.weights.config().vocab_size;
  const Tensor whole = model::reuse(r.ctx, rb.chunk_logits, DType::F32, {chunk, V});
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t r1 = std::min(R, r0 + chunk);
    const Tensor logits = whole.slice_rows(0, r1 - r0);
    model::lm_head_forward(r.ctx, r.weights, logits, rb.fr.head_input.view().slice_rows(r0, r1));
    kernels::token_logprob_forward(r.ctx, rb.logp.view().slice_rows(r0, r1),
                                   opt.entropy ? rb.ent.view().slice_rows(r0, r1) : Tensor(), Tensor(),
                                   logits, rb.tgt.view().slice_rows(r0, r1), opt.temperature);
  }
}

// The one scoring and training pass of Trainer and Scorer: micro-batch by
// micro-batch, forward, token logprobs (and entropy), then with a loss its
// gradient through the model into r.grads. Returns the summed loss.
double run_pass(const RunSpec& r, RunBuffers& rb, const std::vector<TrainSequence>& seqs, const LossFn* loss,
                const ScoreOptions& opt, std::vector<TokenScores>* scores) {
  const ModelConfig& c = r.weights.config();
  const int bs = r.kv_block_size;
  if (scores) scores->assign(seqs.size(), {});
  check_sequences(r, seqs, opt);
  auto mbs = micro_batches(seqs, r.micro_batch_tokens);
  // Expert parallelism: the group's ranks exchange rows in every MoE layer of
  // every micro-batch, so all run as many as the largest (empty ones too).
  if (r.experts != nullptr)
    mbs.resize(size_t(r.experts->max(int64_t(mbs.size()))), {seqs.size(), seqs.size()});
  int64_t max_blocks_total = 1;
  for (auto [b0, b1] : mbs) {
    int64_t nb = 0;
    for (size_t i = b0; i < b1; ++i) nb += blocks_of(seqs[i], bs);
    max_blocks_total = std::max(max_blocks_total, nb);
  }
  // Scoring keeps no layer's keys past that layer, and recompute rewrites a
  // layer's keys in its backward: one K/V array serves all layers.
  const bool every_layer_kv = loss && !r.recompute;
  model::KvCache& kv = every_layer_kv ? rb.kv : rb.score_kv;
  if (kv.num_blocks() < max_blocks_total || kv.block_size() != bs)
    kv = every_layer_kv ? model::KvCache(c, max_blocks_total, bs, DType::F32, rb.memory)
                        : model::KvCache::scoring_scratch(c, max_blocks_total, bs, rb.memory);
  if (!every_layer_kv) rb.kv = model::KvCache();  // a full cache left by an earlier pass
  OwnedTensor &logp = rb.logp, &ent = rb.ent, &tgt = rb.tgt, &dlogp = rb.dlogp, &dent = rb.dent;
  const bool mtp = loss != nullptr && r.mtp_loss_coef > 0;
  std::vector<int64_t> mtp_norm;
  for (int64_t j = 0; mtp && j < c.num_nextn_predict_layers; ++j) mtp_norm.push_back(mtp_targets(seqs, j));
  const bool indexer_loss = loss != nullptr && r.indexer_loss_coef > 0;
  const double indexer_rows = indexer_loss ? double(indexer_loss_rows(c, seqs)) : 0.0;
  double total = 0;
  for (auto [b0, b1] : mbs) {
    std::vector<int32_t> targets;
    ReplayRows replay;
    std::vector<int64_t> first_row;
    const model::RaggedBatch batch = build_batch(seqs, b0, b1, bs, opt.replay, targets, replay, first_row);
    const int64_t R = int64_t(targets.size());
    model::ForwardOptions fo;
    fo.save_activations = loss != nullptr;
    fo.recompute = r.recompute;
    if (opt.replay) fo.replay_experts = &replay.experts;
    if (opt.replay && model::num_csa_layers(c) > 0) fo.replay_indexer = &replay.indexer;
    fo.experts = r.experts;
    fo.mtp = mtp || (opt.mtp && scores != nullptr);
    fo.indexer_loss = indexer_loss && indexer_rows > 0;
    // The logits in chunks: scoring, and training where the chunked head's
    // kernels run (chunked_head_trains).
    const bool chunked =
        r.logits_chunk > 0 && R > r.logits_chunk && (loss == nullptr || chunked_head_trains(r.weights));
    const bool train_chunked = chunked && loss != nullptr;
    fo.lm_head = !chunked;
    model::forward(r.ctx, r.weights, kv, rb.ws, batch, fo, &rb.fr, loss ? &rb.acts : nullptr);

    model::reuse(r.ctx, logp, DType::F32, {R});
    model::reuse(r.ctx, ent, DType::F32, {R});
    model::reuse(r.ctx, tgt, DType::I32, {R});
    rb.memory.copy_in(tgt.view().data, targets.data(), size_t(R) * 4);
    if (chunked) model::drop(rb.fr.logits);  // an unchunked pass's (R, V) logits would stay beside the chunks
    if (train_chunked) {
      model::drop(rb.chunk_logits);
      chunked_head_forward(r.ctx, r.weights, rb.head, rb.fr.head_input.view(), tgt.view(), logp.view(),
                           opt.entropy ? ent.view() : Tensor(), r.logits_chunk, opt.temperature);
    } else if (chunked) {
      model::drop(rb.head.logits);
      chunked_token_logprobs(r, rb, R, r.logits_chunk, opt);
    } else {
      kernels::token_logprob_forward(r.ctx, logp.view(), opt.entropy ? ent.view() : Tensor(), Tensor(),
                                     rb.fr.logits.view(), tgt.view(), opt.temperature);
    }
    // The losses run on host copies; their gradients start zeroed (a loss may
    // leave the gradient of tokens it ignores unwritten).
    HostTokenRows h;
    h.read(rb.memory, logp.view(), opt.entropy ? ent.view() : Tensor());
    for (size_t i = b0; i < b1; ++i) {
      const int64_t r0 = first_row[i - b0], n = seqs[i].num_targets();
      if (scores) {
        auto& sc = (*scores)[i];
        sc.logp.assign(h.logp.data() + r0, h.logp.data() + r0 + n);
        if (opt.entropy) sc.entropy.assign(h.ent.data() + r0, h.ent.data() + r0 + n);
      }
      if (loss) {
        total += (*loss)(i, h.logp.data() + r0, opt.entropy ? h.ent.data() + r0 : nullptr, n,
                         h.dlogp.data() + r0, opt.entropy ? h.dent.data() + r0 : nullptr);
      }
    }
    h.write_grads(rb.memory, model::reuse(r.ctx, dlogp, DType::F32, {R}),
                  model::reuse(r.ctx, dent, DType::F32, {R}));
    if (opt.mtp && scores) mtp_scores(r, rb.fr, seqs, b0, b1, first_row, *scores);
    if (!loss || (R == 0 && r.experts == nullptr)) continue;
    // The logits are not needed once their gradient is known: the kernel
    // writes dlogits over them (it allows the aliasing), saving an (R, V)
    // buffer. Chunked: the gradient of the head's input instead (lm_head's
    // weight gradient taken first, as backward takes it).
    Tensor dlogits = rb.fr.logits.view();
    if (train_chunked) {
      dlogits = chunked_head_backward(r.ctx, r.weights, *r.grads, rb.head, rb.fr.head_input.view(),
                                      tgt.view(), dlogp.view(), opt.entropy ? dent.view() : Tensor(),
                                      r.logits_chunk, opt.temperature);
    } else {
      kernels::token_logprob_backward(r.ctx, dlogits, dlogp.view(), opt.entropy ? dent.view() : Tensor(),
                                      dlogits, tgt.view(), opt.temperature);
    }
    std::vector<Tensor> dmtp;
    if (mtp) total += mtp_loss(r, rb.fr, seqs, b0, b1, first_row, mtp_norm, dmtp);
    rb.acts.fold_expert_grads = r.fold_expert_grads ? *r.fold_expert_grads : nullptr;
    rb.acts.lora_grads = r.lora_grads;
    rb.acts.indexer_loss_scale = 0;
    if (fo.indexer_loss) {
      rb.acts.indexer_loss_scale = r.indexer_loss_coef / indexer_rows;
      total += rb.acts.indexer_loss_scale * rb.fr.indexer_kl;
    }
    if (train_chunked) {
      model::backward_from_head_input(r.ctx, r.weights, kv, rb.ws, batch, rb.acts, dlogits, *r.grads, dmtp);
    } else {
      model::backward(r.ctx, r.weights, kv, rb.ws, batch, rb.acts, dlogits, *r.grads, dmtp);
    }
    if (r.after_backward) (*r.after_backward)();
  }
  return total;
}

}  // namespace

std::vector<TokenScores> Trainer::score(const std::vector<TrainSequence>& seqs, const ScoreOptions& opt) {
  std::vector<TokenScores> out;
  run(seqs, nullptr, opt, &out);
  return out;
}

double Trainer::accumulate(const std::vector<TrainSequence>& seqs, const LossFn& loss,
                           const ScoreOptions& opt, std::vector<TokenScores>* scores) {
  return run(seqs, &loss, opt, scores);
}

double Trainer::run(const std::vector<TrainSequence>& seqs, const LossFn* loss, const ScoreOptions& opt,
                    std::vector<TokenScores>* scores) {
  if (!buffers_) buffers_ = std::make_shared<RunBuffers>(kernels::device_memory(ctx_));
  RunSpec r{ctx_, *weights_, cfg_.micro_batch_tokens, cfg_.kv_block_size, cfg_.logits_chunk};
  r.recompute = cfg_.recompute_activations;
  r.experts = experts_;
  r.grads = &grad_views_;
  r.lora_grads = lora_ ? &lora_->grad_views() : nullptr;
  r.mtp_loss_coef = cfg_.mtp_loss_coef;
  r.indexer_loss_coef = cfg_.indexer_loss_coef;
  const std::function<void()> fold = [this] { fold_gradients(); };
  const std::function<void(const MlpParams&, const Context&)> fold_expert =
      [this](const MlpParams& g, const Context& ectx) { fold_expert_gradients(g, ectx); };
  if (cfg_.world_invariant && loss) {
    r.after_backward = &fold;
    if (experts_ != nullptr) {
      start_exact_sum();
      r.fold_expert_grads = &fold_expert;
    }
  }
  return run_pass(r, *buffers_, seqs, loss, opt, scores);
}

void Trainer::start_exact_sum() {
  const int64_t n = layout_.numel();
  if (exact_.size() == 0) exact_ = Buffer(size_t(n + 2) * sizeof(comm::Fixed));
  if (!exact_empty_ || experts_ == nullptr) return;
  // The experts' sums are added to from the first micro-batch on (several
  // folds per micro-batch, one per source rank), so they start at zero.
  comm::Fixed* acc = exact_.as<comm::Fixed>();
  for (auto [o, k] : own_expert_ranges_) std::fill(acc + o, acc + o + k, comm::Fixed(0));
}

void Trainer::fold_expert_gradients(const MlpParams& g, const Context& ectx) {
  float* base = grads_.as<float>();
  comm::Fixed* acc = exact_.as<comm::Fixed>();
  const Allocator& memory = grads_.memory();
  for (const Tensor* t : {&g.w_gate_up, &g.w_down}) {
    float* x = t->f32();
    const int64_t off = x - base, n = int64_t(t->numel());
    LS_CHECK(off >= 0 && off + n <= layout_.numel()) << "an expert gradient outside the gradient buffer";
    std::vector<float> host;  // device memory: fold a host copy, then zero the tensor there
    if (!memory.host_visible()) {
      host.resize(size_t(n));
      memory.copy_out(host.data(), x, size_t(n) * sizeof(float));
      memory.fill(x, 0, size_t(n) * sizeof(float));
      x = host.data();
    }
    ectx.parallel_for(
        n,
        [&](int64_t b0, int64_t b1) {
          const int64_t bad = comm::fold_into(x + b0, acc + off + b0, size_t(b1 - b0), false);
          if (bad) expert_refused_ += bad;
        },
        int64_t{1} << 16);
  }
}

void Trainer::fold_gradients() {
  const int64_t n = layout_.numel();
  if (exact_.size() == 0) exact_ = Buffer(size_t(n + 2) * sizeof(comm::Fixed));
  comm::Fixed* acc = exact_.as<comm::Fixed>();
  float* g = grads_.as<float>();
  const Allocator& memory = grads_.memory();
  std::atomic<int64_t> refused{expert_refused_.exchange(0)};
  // Frozen slots may hold integer bits (an Index table): never read as floats.
  for (const ParamInfo& p : layout_.params())
    if (p.frozen) zero_memory(ctx_, memory, g + p.offset, size_t(p.numel) * sizeof(float));
  const bool first = exact_empty_;
  // fold_into adds x[0, m) to the sums from acc + at on, zeroing x.
  const auto fold = [&](float* x, int64_t m, int64_t at) {
    ctx_.parallel_for(
        m,
        [&](int64_t b0, int64_t b1) {
          const int64_t bad = comm::fold_into(x + b0, acc + at + b0, size_t(b1 - b0), first);
          if (bad) refused += bad;
        },
        int64_t{1} << 16);
  };
  // With expert parallelism the experts' gradients were folded per source
  // during backward (fold_expert_gradients); the rest is folded here. In
  // device memory through host copies of bounded chunks, the range then
  // zeroed there.
  const std::vector<std::pair<int64_t, int64_t>> whole{{0, n}};
  std::vector<float> host;
  for (auto [o, k] : experts_ != nullptr ? shared_ranges_ : whole) {
    if (memory.host_visible()) {
      fold(g + o, k, o);
      continue;
    }
    host.resize(size_t(std::min(kHostChunk, k)));
    for (int64_t at = o; at < o + k; at += kHostChunk) {
      const int64_t m = std::min(kHostChunk, o + k - at);
      memory.copy_out(host.data(), g + at, size_t(m) * sizeof(float));
      fold(host.data(), m, at);
    }
    memory.fill(g + o, 0, size_t(k) * sizeof(float));
  }
  acc[n] = first ? 1 : comm::fixed_add(acc[n], 1);
  acc[n + 1] = first ? comm::Fixed(refused.load()) : comm::fixed_add(acc[n + 1], comm::Fixed(refused.load()));
  exact_empty_ = false;
}

void Trainer::finish_exact_sum() {
  const int64_t n = layout_.numel();
  if (exact_.size() == 0) exact_ = Buffer(size_t(n + 2) * sizeof(comm::Fixed));
  comm::Fixed* acc = exact_.as<comm::Fixed>();
  // A rank that folded nothing this step (fewer micro-batches than ranks) adds zeros.
  if (exact_empty_) std::memset(exact_.data(), 0, exact_.size());
  exact_empty_ = true;  // the next fold starts the next step's sums
  if (cfg_.exact_reduce) cfg_.exact_reduce(acc, size_t(n + 2));
  const int64_t folds = int64_t(acc[n]), refused = int64_t(acc[n + 1]);
  if (folds > comm::kFixedMaxTerms)
    LS_THROW << "[dist] world_invariant: " << folds
             << " micro-batches in one optimizer step; the exact gradient sum "
             << "holds at most " << comm::kFixedMaxTerms << " (raise [train] micro_batch_tokens)";
  int64_t at = 0;
  fill_from_host(grads_.memory(), grads_.as<float>(), n, kHostChunk, [&](float* g, int64_t m) {
    if (refused > 0) {
      std::fill(g, g + m, std::numeric_limits<float>::quiet_NaN());
    } else {
      ctx_.parallel_for(
          m, [&](int64_t b0, int64_t b1) { comm::unfold_into(acc + at + b0, g + b0, size_t(b1 - b0)); },
          int64_t{1} << 16);
    }
    at += m;
  });
}

void Trainer::reduce_gradients() {
  const Allocator& memory = grads_.memory();
  if (experts_ == nullptr || memory.host_visible())
    return reduce_through_host(memory, grads_.as<float>(), layout_.numel(), cfg_.grad_reduce);
  // With expert parallelism the reduction sums each run of tensors over its
  // own group, at its offsets in the buffer: one host copy of the whole
  // buffer (this rank's shard), reduced and copied back.
  std::vector<float> host(size_t(layout_.numel()));
  memory.copy_out(host.data(), grads_.data(), layout_.nbytes());
  cfg_.grad_reduce(host.data(), host.size());
  memory.copy_in(grads_.data(), host.data(), layout_.nbytes());
}

void Trainer::zero_grad() {
  if (lora_) return lora_->zero_grad();
  zero_memory(ctx_, grads_.memory(), grads_.data(), layout_.nbytes());
  exact_empty_ = true;
  expert_refused_ = 0;
}

namespace {
// p's floats, checked to hold config's whole model before anything reads them.
const float* whole_model(const Buffer& p, const ModelConfig& config) {
  const size_t need = ParamLayout(config).nbytes();
  LS_CHECK(p.size() >= need) << "parameter buffer of " << p.size() << " bytes, model needs " << need;
  return p.as<float>();
}
}  // namespace

Scorer::Scorer(const Context& ctx, const ModelConfig& config, Buffer params, int64_t micro_batch_tokens,
               int kv_block_size, DType precision, int64_t fp8_block, int64_t logits_chunk)
    : Scorer(ctx, config, whole_model(params, config), micro_batch_tokens, kv_block_size, precision,
             fp8_block, logits_chunk) {
  params_ = std::move(params);  // the views made above point into it; moving keeps the memory
}

Scorer::Scorer(const Context& ctx, const ModelConfig& config, const float* params, int64_t micro_batch_tokens,
               int kv_block_size, DType precision, int64_t fp8_block, int64_t logits_chunk)
    : ctx_(ctx),
      layout_(config),
      micro_batch_tokens_(micro_batch_tokens),
      kv_block_size_(kv_block_size),
      logits_chunk_(logits_chunk),
      buffers_(std::make_shared<RunBuffers>(kernels::device_memory(ctx))) {
  LS_CHECK(micro_batch_tokens_ >= 1) << "micro_batch_tokens must be >= 1";
  // Nothing else reads a scorer's weights: the kernels read its f32 master in
  // place, and nothing writes through it (refresh is never called).
  weights_ = std::make_unique<model::ModelWeights>(ctx_, layout_, const_cast<float*>(params), precision,
                                                   fp8_block, model::ExpertShard{}, /*effective=*/false,
                                                   /*in_place=*/true);
}

std::vector<TokenScores> Scorer::score(const std::vector<TrainSequence>& seqs, const ScoreOptions& opt) {
  std::vector<TokenScores> out;
  run_pass(RunSpec{ctx_, *weights_, micro_batch_tokens_, kv_block_size_, logits_chunk_}, *buffers_, seqs,
           nullptr, opt, &out);
  return out;
}

OptimizerStats Trainer::step() {
  if (lora_) {  // only the adapters change: the packed base stays as it is
    const OptimizerStats s = lora_->step(ctx_, optimizer_.config(), cfg_.grad_reduce);
    if (!s.skipped) weights_->set_version(weights_->version() + 1);
    return s;
  }
  if (cfg_.world_invariant)
    finish_exact_sum();
  else if (cfg_.grad_reduce)
    reduce_gradients();
  GradNormFn norm;
  if (cfg_.world_invariant)
    norm = [this](const Context& ctx, const float* g) { return invariant_grad_norm(ctx, g); };
  else if (experts_)
    norm = [this](const Context& ctx, const float* g) { return expert_grad_norm(ctx, g); };
  OptimizerStats s = optimizer_.step(ctx_, params_.as<float>(), grads_.as<float>(), norm);
  zero_memory(ctx_, grads_.memory(), grads_.data(), layout_.nbytes());
  if (!s.skipped) weights_->refresh(ctx_, weights_->version() + 1);
  return s;
}

}  // namespace lockstep::train
