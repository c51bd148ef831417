// The colocated rollout backend.
#include "lockstep/rl/rollout_backend.h"

#include <map>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/packed_checksum.h"
#include "lockstep/rl/rollout_device.h"
#include "lockstep/rollout/localise.h"

namespace lockstep::rl {

void RolloutBackend::submit(std::vector<rollout::Request>) {
  LS_THROW << "this rollout backend generates in the trainer's process and cannot run while it trains "
           << "(submit needs can_overlap())";
}

std::vector<rollout::RequestResult> RolloutBackend::collect(const RolloutProgress&, int64_t*) {
  LS_THROW << "this rollout backend cannot overlap training: nothing was submitted (collect needs can_overlap())";
}

void RolloutBackend::begin_stream() {
  LS_THROW << "this rollout backend cannot stream requests (begin_stream needs can_stream())";
}

std::future<rollout::RequestResult> RolloutBackend::stream(rollout::Request) {
  LS_THROW << "this rollout backend cannot stream requests (stream needs can_stream())";
}

void RolloutBackend::end_stream() {}

std::optional<std::string> RolloutBackend::localise(train::Trainer&, const train::TrainSequence&,
                                                    const rollout::SamplingParams&) {
  return std::nullopt;
}

LocalRollout::LocalRollout(train::Trainer& trainer, const rollout::RolloutSection& cfg, uint64_t seed)
    : ctx_(rollout_context(trainer, cfg)) {
  const DType storage = rollout::precision_dtype(cfg.precision);
  aligned_ = storage == trainer.trainer_config().precision;
  cross_device_ = crosses_devices(ctx_, trainer);
  // An expert-parallel trainer holds only its experts: the engine keeps the
  // whole model, all-gathered from the trainer's group at every sync (packed
  // in the same precision, the same bits as the trainer's, so still aligned).
  // So does a trainer that reads its master in place (no packed copy to
  // share), and an engine on another device (its packing lies there).
  own_weights_ =
      !aligned_ || trainer.expert_comm() != nullptr || trainer.weights().in_place() || cross_device_;
  if (trainer.expert_comm() != nullptr) {
    model_ = Buffer(trainer.model_layout().nbytes());
    trainer.gather_model(model_.as<float>(), true);
  }
  if (own_weights_) {
    float* params = model_.size() ? model_.as<float>() : trainer.params();
    fast_weights_ = std::make_unique<model::ModelWeights>(ctx_, trainer.model_layout(), params, storage,
                                                          storage == DType::FP8E4M3 ? cfg.fp8_block : 0);
    fast_weights_->refresh(ctx_, trainer.version());
    fast_weights_->set_lora(trainer.weights().lora());  // the trainer's adapters, read in place
  }
  if (cross_device_ && trainer.lora() != nullptr) {  // their copy in the engine's memory
    const train::LoraState& lora = *trainer.lora();
    engine_adapters_ = Buffer(size_t(lora.numel()) * sizeof(float), kernels::device_memory(ctx_), Fill::Zero,
                              "engine lora adapters");
    engine_lora_ = std::make_unique<model::LoraWeights>(lora.layout(), engine_adapters_.as<float>());
    copy_adapters(trainer);
    fast_weights_->set_lora(engine_lora_.get());
  }
  rollout::EngineConfig ec = cfg.engine;
  ec.seed = seed;
  engine_ = std::make_unique<rollout::Engine>(ctx_, weights(trainer), ec);
}

RolloutBackend::Memory LocalRollout::memory() const {
  return {model_.size(), own_weights_ ? model::packed_bytes(*fast_weights_) : 0, engine_->kv_bytes()};
}

const model::ModelWeights* LocalRollout::weights(train::Trainer& trainer) const {
  return own_weights_ ? fast_weights_.get() : &trainer.weights();
}

std::vector<rollout::RequestResult> LocalRollout::generate(std::vector<rollout::Request> requests,
                                                           const RolloutProgress& progress,
                                                           int64_t* generated_tokens) {
  const rollout::EngineStats before = engine_->stats();
  std::vector<uint64_t> ids;
  for (auto& r : requests) ids.push_back(engine_->submit(std::move(r)));
  while (engine_->step()) {
    if (!progress) continue;
    const rollout::EngineStats s = engine_->stats();
    progress(s.finished_samples - before.finished_samples, s.generated_tokens - before.generated_tokens);
  }
  std::map<uint64_t, rollout::RequestResult> done;
  for (auto& r : engine_->run_until_done(0)) done[r.id] = std::move(r);
  std::vector<rollout::RequestResult> out;
  for (uint64_t id : ids) {
    auto it = done.find(id);
    LS_CHECK(it != done.end()) << "rollout: request " << id << " did not finish";
    out.push_back(std::move(it->second));
  }
  if (generated_tokens) *generated_tokens = engine_->stats().generated_tokens - before.generated_tokens;
  return out;
}

std::optional<std::string> LocalRollout::localise(train::Trainer& trainer, const train::TrainSequence& seq,
                                                  const rollout::SamplingParams& params) {
  if (trainer.expert_comm() != nullptr) return std::nullopt;  // the trainer's forward is collective
  if (cross_device_) return std::nullopt;                     // one context runs both forwards there
  return rollout::localise_sample(ctx_, *weights(trainer), trainer.weights(), engine_->config(), seq.tokens,
                                  seq.prompt_len, params);
}

void LocalRollout::begin_stream() { engine_->start_background(); }

std::future<rollout::RequestResult> LocalRollout::stream(rollout::Request request) {
  return engine_->submit_async(std::move(request));
}

void LocalRollout::end_stream() { engine_->stop_background(); }

// Aligned with an expert-parallel trainer: the engine packed the gathered
// model itself, so its packed bits are compared with the trainer's over the
// trainer's shard of the experts (collective over the trainer's EP group,
// which stops together).
void LocalRollout::check_packed_bits(train::Trainer& trainer) const {
  const model::ExpertShard shard = trainer.weights().experts();
  const uint64_t mine = model::packed_checksum(*fast_weights_, shard);
  const uint64_t want = model::packed_checksum(trainer.weights(), shard);
  const int64_t differs = mine != want ? 1 : 0;
  if (trainer.expert_comm()->max(differs) == 0) return;
  LS_THROW << "weight sync: the colocated rollout engine's packed weights differ from the trainer's"
           << (differs ? " on this rank" : " on another rank of the expert-parallel group")
           << " after packing the same f32 master; aligned mode cannot hold";
}

void LocalRollout::copy_adapters(const train::Trainer& trainer) {
  const std::vector<float> adapters = trainer.lora()->host_params();
  kernels::device_memory(ctx_).copy_in(engine_adapters_.data(), adapters.data(), engine_adapters_.size());
}

void LocalRollout::sync(train::Trainer& trainer) {
  if (model_.size()) trainer.gather_model(model_.as<float>(), true);  // collective over the trainer's EP group
  if (engine_lora_) copy_adapters(trainer);
  // LoRA: the base is frozen, so the engine's packing of it stays valid and
  // only the version moves (the adapters are read in place, or from the
  // engine's copy on another device).
  if (own_weights_ && trainer.lora())
    fast_weights_->set_version(trainer.version());
  else if (own_weights_)
    fast_weights_->refresh(ctx_, trainer.version());
  if (aligned_ && trainer.expert_comm() != nullptr && !trainer.weights().in_place() && !cross_device_)
    check_packed_bits(trainer);
  // Aligned: the trainer repacked its weights in place; the engine reads
  // them as they are (no copy) and only drops KV state built on the old ones.
  engine_->update_weights(weights(trainer));
}

}  // namespace lockstep::rl
