// [critic] parsing (critic_config.h; every key in docs/configuration.md).
#include "lockstep/rl/critic_config.h"

namespace lockstep::rl {

CriticSection critic_section_from_toml(TomlSection& s, const train::TrainerConfig& policy) {
  CriticSection c;
  c.path = s.get_string("path", "");
  train::CriticConfig& k = c.critic;
  train::OptimizerConfig& o = k.optim;
  o = policy.optim;
  o.lr = s.get_double("lr", o.lr, 0.0, 10.0);
  o.min_lr = s.get_double("min_lr", o.min_lr, 0.0, 10.0);
  o.warmup_steps = s.get_int("warmup_steps", o.warmup_steps, 0);
  o.decay_steps = s.get_int("decay_steps", o.decay_steps, 0);
  o.weight_decay = s.get_double("weight_decay", o.weight_decay, 0.0, 10.0);
  o.grad_clip = s.get_double("grad_clip", o.grad_clip, 0.0);
  k.micro_batch_tokens = s.get_int("micro_batch_tokens", policy.micro_batch_tokens, 1);
  k.kv_block_size = policy.kv_block_size;
  k.recompute_activations = s.get_bool("recompute_activations", policy.recompute_activations);
  // verl's critic.cliprange_value.
  k.cliprange_value = s.get_double("cliprange_value", k.cliprange_value, 1e-9);
  return c;
}

}  // namespace lockstep::rl
