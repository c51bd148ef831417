// [train] parsing.
#include "lockstep/train/train_config.h"

namespace lockstep::train {

TrainSection train_section_from_toml(TomlSection& s) {
  TrainSection t;
  OptimizerConfig& o = t.trainer.optim;
  o.lr = s.get_double("lr", 1e-4, 0.0, 10.0);
  o.min_lr = s.get_double("min_lr", 0.0, 0.0, 10.0);
  o.warmup_steps = s.get_int("warmup_steps", 0, 0);
  o.decay_steps = s.get_int("decay_steps", 0, 0);
  o.beta1 = s.get_double("beta1", 0.9, 0.0, 1.0);
  o.beta2 = s.get_double("beta2", 0.95, 0.0, 1.0);
  o.eps = s.get_double("eps", 1e-8, 0.0, 1.0);
  o.weight_decay = s.get_double("weight_decay", 0.0, 0.0, 10.0);
  o.grad_clip = s.get_double("grad_clip", 1.0, 0.0);
  t.trainer.micro_batch_tokens = s.get_int("micro_batch_tokens", 4096, 1);
  t.trainer.logits_chunk = s.get_int("logits_chunk", TrainerConfig{}.logits_chunk, 0);
  t.trainer.recompute_activations = s.get_bool("recompute_activations", false);
  t.trainer.mtp_loss_coef = s.get_double("mtp_loss_coef", 0.0, 0.0, 100.0);
  t.trainer.indexer_loss_coef = s.get_double("indexer_loss_coef", 0.0, 0.0, 100.0);
  t.sft.steps = s.get_int("steps", 100, 0);
  t.sft.batch_size = s.get_int("batch_size", 8, 1);
  t.sft.seed = uint64_t(s.get_int("seed", 0, 0));
  t.sft.shuffle = s.get_bool("shuffle", true);
  t.sft.save_interval = s.get_int("save_interval", 0, 0);
  t.sft.keep_last = int(s.get_int("keep_last", 2, 0, 1000));
  t.sft.log_interval = s.get_int("log_interval", 1, 0);
  t.out_dir = s.get_string("out_dir", t.out_dir);
  t.threads = s.get_int("threads", 0, 0, 1024);
  return t;
}

}  // namespace lockstep::train
