// [rollout] parsing.
#include "lockstep/rollout/rollout_config.h"

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep::rollout {

DType precision_dtype(const std::string& p) {
  if (p == "f32" || p == "fp32") return DType::F32;
  if (p == "bf16") return DType::BF16;
  if (p == "fp8") return DType::FP8E4M3;
  LS_THROW << "rollout precision must be f32, bf16 or fp8, got '" << excerpt(p) << "'";
}

RolloutSection rollout_section_from_toml(TomlSection& s) {
  RolloutSection r;
  EngineConfig& e = r.engine;
  e.num_blocks = s.get_int("kv_blocks", e.num_blocks, 1);
  e.block_size = int(s.get_int("block_size", e.block_size, 1, 4096));
  e.max_batch_tokens = s.get_int("max_batch_tokens", e.max_batch_tokens, 1);
  e.max_running = s.get_int("max_running", e.max_running, 1);
  e.max_prefill_chunk = s.get_int("max_prefill_chunk", e.max_prefill_chunk, 1);
  e.prefix_cache = s.get_bool("prefix_cache", e.prefix_cache);
  e.seed = uint64_t(s.get_int("seed", 0, 0));
  const std::string policy = s.get_enum("update_policy", "finish", {"finish", "abort"});
  e.update_policy = policy == "abort" ? EngineConfig::UpdatePolicy::Abort : EngineConfig::UpdatePolicy::Finish;
  SamplingParams& p = r.sampling;
  p.n = s.get_int("n", 8, 1, 1024);
  p.temperature = float(s.get_double("temperature", 1.0, 0.0, 100.0));
  p.top_p = float(s.get_double("top_p", 1.0, 0.0, 1.0));
  p.top_k = s.get_int("top_k", 0, 0);
  p.min_p = float(s.get_double("min_p", 0.0, 0.0, 1.0));
  p.max_new_tokens = s.get_int("max_new_tokens", 256, 1);
  // The processors reshape only the sampling distribution (logit_processors.h).
  p.frequency_penalty = float(s.get_double("frequency_penalty", 0.0, -2.0, 2.0));
  p.presence_penalty = float(s.get_double("presence_penalty", 0.0, -2.0, 2.0));
  p.repetition_penalty = float(s.get_double("repetition_penalty", 1.0, 0.0, 100.0));
  if (!(p.repetition_penalty > 0.0f)) s.fail("repetition_penalty", "must be > 0");
  p.min_new_tokens = s.get_int("min_new_tokens", 0, 0);
  for (const char* key : {"precision", "fp8_block"})
    if (s.has(key))
      s.fail(key, std::string("moved to [model] ") + key +
                      ": the policy's precision, used by the rollout engine and the trainer alike "
                      "(add [model] trainer_precision = \"f32\" for fast mode)");
  if (s.has("device")) {
    r.device = s.get_enum("device", "cpu", {"cpu", "interpret", "cuda", "hip"});
    r.device_where = s.source() + ": [rollout] device";
  }
  p.validate();
  return r;
}

}  // namespace lockstep::rollout
