// The trainer: owns the f32 master parameters, their gradients and the
// optimizer; scores sequences (per-token logprobs under the current weights)
// and accumulates gradients of any per-token loss over micro-batches cut by a
// token budget. It calls the same model::forward as the rollout engine.
// Scorer: a frozen model that only scores (RL's KL reference), on the same
// code path as Trainer::score.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/comm/exact_sum.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/train/lora_state.h"
#include "lockstep/train/optimizer.h"

namespace lockstep::train {

// A sequence to score or train on: the loss covers tokens[prompt_len..],
// those of them loss_mask keeps.
struct TrainSequence {
  std::vector<int32_t> tokens;
  int32_t prompt_len = 1;  // >= 1: the first token is never predicted
  // Optional routing replay (R3): (len, L_moe, K) experts for every token.
  std::vector<int32_t> routed_experts;
  // DeepSeek-V4's part of the replay: (len, L_csa, KI) the compressed entries
  // each token's indexer chose in every CSA layer (rollout::SampleResult).
  std::vector<int32_t> indexer_topk;
  // (num_targets) 1: the token is the model's and trains; 0: it is not (an
  // environment's observation and the chat template's tokens around it in a
  // multi-turn sample): scored, but no loss term, no gradient, left out of the
  // gap and mismatch metrics. Empty: every target trains.
  std::vector<uint8_t> loss_mask;
  int64_t num_targets() const { return int64_t(tokens.size()) - prompt_len; }
  // The targets that train (loss_mask's ones; num_targets() without a mask).
  int64_t num_loss_targets() const;
};

// Per response token of one sequence.
struct TokenScores {
  std::vector<float> logp;
  std::vector<float> entropy;  // empty unless asked for
  // ScoreOptions::mtp: MTP block 0's logprob of the token two places on, for
  // the response positions that have one (one fewer than logp), temperature 1.
  std::vector<float> mtp_logp;
};

// Per-sequence loss: given the response tokens' logp (and entropy, or null),
// writes dloss/dlogp (and dloss/dentropy when entropy is non-null) and
// returns the sequence's loss contribution.
using LossFn = std::function<double(size_t seq, const float* logp, const float* entropy, int64_t n,
                                    float* dlogp, float* dentropy)>;

struct TrainerConfig {
  OptimizerConfig optim;
  int64_t micro_batch_tokens = 4096;  // token budget of one forward/backward
  // The vocabulary projection and logprobs of at most this many logit rows
  // at once, so a long sequence never holds its whole (T, V) logits (at V =
  // 151,936, 608 KB per row): scoring, and training passes, whose LM head
  // backward takes row blocks for its input gradient and as many logits in
  // vocabulary-column blocks for its weight gradient (train/chunked_head.h;
  // for f32 and bf16 heads, on every device; fp8 heads train unchunked). The
  // same bits at every value; 0 takes all rows at once.
  // 256 rows hold 156 MB of logits at V = 151,936 (1,024 held 622 MB, more
  // than the rest of a recomputed 4,096-token step's activations); a row
  // block's projection still reuses each packed lm_head panel 256 times, so
  // it stays compute-bound.
  int64_t logits_chunk = 256;
  // Keep only each layer's input during the forward and recompute the rest in
  // backward, one layer at a time: activation memory of one layer instead of
  // all, for about one more forward's work. Its K/V too: the layers share one
  // K/V array, whose keys and values each layer's recompute writes again.
  // Gradients have the same bits.
  bool recompute_activations = false;
  int kv_block_size = 16;
  // The precision of the forward's projections (docs/alignment.md): F32, BF16
  // or FP8E4M3 (fp8_block x fp8_block power-of-two block scales). The master
  // weights, gradients and AdamW moments stay f32; backward multiplies by the
  // quantized weights (straight-through). A rollout engine packing the same
  // master in the same precision computes the same logprobs bit for bit.
  DType precision = DType::F32;
  int64_t fp8_block = 128;
  // At f32 on the CPU, the forward reads the projections from the master in
  // place rather than from a packed copy (model::ModelWeights in_place): 4
  // bytes per parameter less, the same bits. For a trainer no rollout engine
  // reads: SFT, or RL in fast mode. A colocated aligned rollout multiplies by
  // the trainer's packed weights (it then packs its own), and rollout ranks
  // check their packing against the trainer's, so aligned RL keeps the copy.
  bool in_place_weights = false;
  // DeepSeek-V4 with MTP blocks: accumulate() also trains them, adding
  // mtp_loss_coef x the mean cross-entropy of MTP block j's prediction (the
  // logit row of position p predicts token p + j + 2) over its targets in the
  // call's sequences, for each block j, to the loss (and its gradient). 0: the
  // MTP blocks are not run.
  double mtp_loss_coef = 0.0;
  // DeepSeek-V4: accumulate() also trains the lightning indexers, adding
  // indexer_loss_coef x the mean over (CSA layer, query row that sees a
  // compressed entry) of KL(teacher || indexer) over the call's sequences to
  // the loss (docs/deepseek-v4.md, "The indexer loss"); its gradient reaches
  // the indexers' own tensors only. 0: the indexers are frozen.
  double indexer_loss_coef = 0.0;
  // Data parallelism (parallel/data_parallel.h): when set, step() first replaces
  // the accumulated gradients grads[0, n) by their sum over all ranks. The
  // LossFn must then normalise by global counts (tokens of the global batch).
  // It is given host memory: a trainer whose gradients lie in device memory
  // calls it on host copies of consecutive chunks, in order (the same chunks
  // on every rank), so it must sum element by element; with expert
  // parallelism (whose reduction sums runs of tensors at their offsets) on
  // one host copy of the whole buffer.
  std::function<void(float* grads, size_t n)> grad_reduce;
  // [dist] world_invariant (docs/distributed.md): each micro-batch's gradient
  // is computed from zero and folded into an exact fixed-point sum
  // (comm/exact_sum.h), so the step's gradient does not depend on how the
  // micro-batches were shared out over ranks. grad_reduce is then unused;
  // exact_reduce (when set) sums the fixed-point buffer over the ranks.
  // With expert parallelism each expert's gradient is folded per source rank
  // of its rows (Activations::fold_expert_grads). Not with the MTP or the
  // indexer loss.
  bool world_invariant = false;
  std::function<void(comm::Fixed* sums, size_t n)> exact_reduce;
  // [lora] (docs/rl.md, "LoRA"): rank > 0 trains LoRA adapters only
  // (LoraState); the base stays frozen at `precision` and takes no gradient.
  model::LoraConfig lora;
};

struct ScoreOptions {
  float temperature = 1.0f;
  bool entropy = false;
  // Replay the rollout's choices: TrainSequence::routed_experts in the
  // non-hash MoE layers and, for DeepSeek-V4, TrainSequence::indexer_topk in
  // the CSA layers.
  bool replay = false;
  // DeepSeek-V4 with MTP blocks: also fill TokenScores::mtp_logp.
  bool mtp = false;
};

struct RunBuffers;  // trainer.cpp

// Token-budget micro-batches: [begin, end) index ranges into seqs, each
// closed before a sequence that would take it past micro_batch_tokens (a
// longer sequence is a micro-batch of its own).
std::vector<std::pair<size_t, size_t>> micro_batches(const std::vector<TrainSequence>& seqs,
                                                     int64_t micro_batch_tokens);

class Trainer {
 public:
  Trainer(const Context& ctx, const ModelConfig& config, Buffer params, TrainerConfig cfg);

  // Forward only.
  std::vector<TokenScores> score(const std::vector<TrainSequence>& seqs, const ScoreOptions& opt);
  // Forward + backward over micro-batches, gradients accumulate. Returns the
  // summed loss; the scores of the forward are written to *scores if given.
  double accumulate(const std::vector<TrainSequence>& seqs, const LossFn& loss, const ScoreOptions& opt,
                    std::vector<TokenScores>* scores = nullptr);
  // grad_reduce (if set), clip, AdamW, zero the gradients, repack the weights, version += 1.
  // world_invariant: exact_reduce (if set), the exact sums rounded to f32
  // (NaN everywhere when a term was refused, so the step is skipped), then the same.
  OptimizerStats step();
  // Drops the accumulated gradients (and the exact sums) without a step.
  void zero_grad();

  const Context& context() const { return ctx_; }
  const ModelConfig& config() const { return model_layout_.config(); }
  // The layout of params(), grads() and the optimizer state: the model's, or
  // with expert parallelism the model's without the other ranks' experts.
  const ParamLayout& layout() const { return layout_; }
  // The whole model's layout (checkpoints, the weight broadcast).
  const ParamLayout& model_layout() const { return model_layout_; }
  const model::ModelWeights& weights() const { return *weights_; }
  float* params() { return params_.as<float>(); }
  // Full fine-tuning's gradients (layout()); a LoRA trainer has none (null):
  // its adapters' gradients are lora()->grads().
  float* grads() { return grads_.as<float>(); }
  uint64_t version() const { return weights_->version(); }
  AdamW& optimizer() { return optimizer_; }
  TrainerConfig& trainer_config() { return cfg_; }
  const TrainerConfig& trainer_config() const { return cfg_; }
  // Expert parallelism (model/expert_parallel.h, docs/distributed.md): from
  // now on this trainer holds, packs and runs only its shard of every MoE
  // layer's experts (shard comm->rank() of comm->size()): its parameters,
  // gradients and AdamW moments cover the other tensors and its own experts
  // (layout()), and it exchanges expert rows with the group's ranks (null:
  // no expert parallelism). A trainer that gave up experts cannot take them
  // back. grad_reduce must then sum the
  // non-expert gradients over every trainer rank and the experts' over the
  // ranks holding the same experts (parallel::make_data_parallel). Every rank of
  // the group must make the same sequence of score(), accumulate(), step(),
  // gather_model(), stream_model() and prepare_checkpoint() calls (each
  // score/accumulate runs as many micro-batches as the group's largest,
  // empty ones included). Call before the first optimizer step; `comm` must
  // outlive the trainer's use of it.
  void set_expert_comm(model::ExpertComm* comm);
  model::ExpertComm* expert_comm() const { return experts_; }
  // The LoRA adapters this trainer trains ([lora] rank > 0), or null.
  LoraState* lora() { return lora_.get(); }
  const LoraState* lora() const { return lora_.get(); }
  // The whole model's f32 parameters (model_layout()) into `out` (host
  // memory, whatever memory the trainer's parameters lie in): on every
  // rank of the expert-parallel group (all), or on its rank 0 only (out may
  // be null elsewhere). Collective over the group; without expert
  // parallelism a copy of params().
  void gather_model(float* out, bool all);
  // The whole model's parameters in model_layout() order, piece by piece, to
  // `emit` on the group's rank 0, when `want` is set on some rank of the
  // group (collective over it; one MoE layer's experts in memory at a time).
  // Without expert parallelism: emit(params(), all) on this rank if `want`
  // (params in device memory: host copies of consecutive chunks, in order).
  void stream_model(bool want, const std::function<void(const float*, int64_t)>& emit);
  // Before a checkpoint: collective over the expert-parallel group (a no-op
  // without one). When `writer` is set on some rank of the group, its rank 0
  // (the writer) assembles the model (kept until save_optimizer) and gathers
  // the whole model's AdamW moments layer by layer into the file `scratch`
  // (one layer's experts in memory at a time).
  void prepare_checkpoint(bool writer, const std::string& scratch);
  // Writes the optimizer state of the whole model (AdamW::save's format):
  // with expert parallelism, moves prepare_checkpoint's file to `path` and
  // frees the assembled model.
  void save_optimizer(const std::string& path);
  // The parameters a checkpoint saves (model_layout()): params(), or with
  // expert parallelism those prepare_checkpoint assembled.
  const float* checkpoint_params() const;
  // After params() were overwritten (checkpoint load): repack, set version.
  void params_changed(uint64_t version);
  // Token-budget micro-batches: [begin, end) index ranges into seqs.
  std::vector<std::pair<size_t, size_t>> micro_batches(const std::vector<TrainSequence>& seqs) const;

 private:
  double run(const std::vector<TrainSequence>& seqs, const LossFn* loss, const ScoreOptions& opt,
             std::vector<TokenScores>* scores);

  double expert_grad_norm(const Context& ctx, const float* grads) const;
  double invariant_grad_norm(const Context& ctx, const float* grads) const;
  // world_invariant: grads() (one micro-batch's gradient) into exact_, grads()
  // zeroed (with expert parallelism, all but the experts': those were folded
  // per source by fold_expert_gradients).
  void fold_gradients();
  // [lora]: checks the settings, makes lora_ and attaches its adapters.
  void start_lora();
  // world_invariant with expert parallelism: exact_ allocated, and its
  // experts' sums zeroed when a step starts.
  void start_exact_sum();
  // One expert's gradient (one source's rows) into exact_, zeroed.
  void fold_expert_gradients(const MlpParams& g, const Context& ectx);
  // world_invariant: exact_ summed over the ranks and rounded into grads(); exact_ zeroed.
  void finish_exact_sum();
  // cfg_.grad_reduce on the gradients, through host copies on a device.
  void reduce_gradients();
  // Walks the model layout in order and hands `emit` the whole model's
  // values of a buffer laid out as layout() (params, a moment): shared
  // tensors from `local`, each MoE layer's expert blocks gathered from the
  // group. Collective; emit is called on the group's rank 0 only (all: on
  // every rank, from an all-gather).
  void assemble(const float* local, bool all, const std::function<void(const float*, int64_t)>& emit);

  Context ctx_;
  ParamLayout model_layout_, layout_;
  Buffer params_, grads_;
  ModelParams grad_views_;
  TrainerConfig cfg_;
  AdamW optimizer_;
  std::unique_ptr<model::ModelWeights> weights_;
  model::ExpertComm* experts_ = nullptr;
  // Expert parallelism: layout() ranges of this rank's experts and of
  // everything else (offset, floats); the model and optimizer file that
  // prepare_checkpoint assembled (group rank 0), until save_optimizer.
  std::vector<std::pair<int64_t, int64_t>> own_expert_ranges_, shared_ranges_;
  Buffer model_params_;
  std::string gathered_optimizer_;
  // run()'s workspace, KV cache, saved activations and logits (trainer.cpp),
  // kept from call to call: re-allocating them made every step fault in
  // fresh pages.
  std::shared_ptr<RunBuffers> buffers_;
  // world_invariant: (numel + 2) fixed-point sums: the gradient, then the
  // number of micro-batches folded and of terms refused (allocated on first
  // use). exact_empty_: nothing folded since the last step, so exact_ holds
  // stale values that the next fold overwrites instead of adding to.
  Buffer exact_;
  bool exact_empty_ = true;
  // Terms fold_expert_gradients refused since the last fold_gradients.
  std::atomic<int64_t> expert_refused_{0};
  std::unique_ptr<LoraState> lora_;  // [lora]: the adapters; grads_ then stays empty
};

// Weights that only score: the f32 parameters (held, not copied) and their
// packed form, no gradients, no optimizer moments. score() runs Trainer::score's
// own pass, so a Scorer and a Trainer on the same parameters and settings give
// the same bits.
class Scorer {
 public:
  // precision / fp8_block as TrainerConfig's: the reference scores in the
  // policy's precision.
  Scorer(const Context& ctx, const ModelConfig& config, Buffer params, int64_t micro_batch_tokens,
         int kv_block_size = TrainerConfig{}.kv_block_size, DType precision = DType::F32,
         int64_t fp8_block = 128, int64_t logits_chunk = TrainerConfig{}.logits_chunk);

  // As above on parameters it does not own: `params` must outlive the scorer
  // and stay as they are (a LoRA run's frozen base, shared rather than copied).
  Scorer(const Context& ctx, const ModelConfig& config, const float* params, int64_t micro_batch_tokens,
         int kv_block_size, DType precision, int64_t fp8_block, int64_t logits_chunk);

  std::vector<TokenScores> score(const std::vector<TrainSequence>& seqs, const ScoreOptions& opt);
  const model::ModelWeights& weights() const { return *weights_; }
  // The adapters the next score applies (null: none); not owned.
  void set_lora(const model::LoraWeights* lora) { weights_->set_lora(lora); }

 private:
  Context ctx_;
  ParamLayout layout_;
  Buffer params_;
  int64_t micro_batch_tokens_;
  int kv_block_size_;
  int64_t logits_chunk_;
  std::unique_ptr<model::ModelWeights> weights_;
  std::shared_ptr<RunBuffers> buffers_;  // as Trainer's: kept from call to call
};

}  // namespace lockstep::train
