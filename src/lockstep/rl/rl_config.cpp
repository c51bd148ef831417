// `lockstep rl`'s TOML config: the sections but [model], [data] and [dist]
// (their readers are the command's), then the checks and defaults that
// span sections.
#include "lockstep/rl/rl_config.h"

#include <algorithm>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/model/lora.h"
#include "lockstep/model/model_source.h"
#include "lockstep/train/train_config.h"

namespace lockstep::rl {
namespace {

// Every top-level key is a known section.
void check_sections(const toml::table& root, const std::string& source) {
  static const std::vector<std::string> kSections = {"model", "data", "rollout", "train", "algo", "reward",
                                                     "eval",  "log",  "sync",    "dist",  "rl",   "critic", "lora"};
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (std::find(kSections.begin(), kSections.end(), key) == kSections.end())
      LS_THROW << source << ": unknown section [" << excerpt(key)
               << "] (rl reads [model] [data] [rollout] [train] [algo] "
               << "[reward] [eval] [log] [dist] [rl] [critic] [lora])";
    if (!v.is_table()) LS_THROW << source << ": '" << excerpt(key) << "' must be a section";
  }
  // [dist] is read by the command that launches the ranks (cli/cmd_rl.cpp).
  if (const auto* t = root["sync"].as_table(); t && !t->empty())
    LS_THROW << source << ": [sync] is not supported by this build of `lockstep rl` yet "
             << "(weights go to colocated engines in memory and to rollout ranks by [dist]; see "
                "docs/distributed.md)";
}

// [model] precision, trainer_precision, fp8_block: the engine packs its
// weights in `precision`, the trainer runs its forward in `trainer_precision`.
void read_precision(const toml::table& root, const std::string& source, RlConfig& c) {
  const PrecisionConfig p = precision_from_toml(root, source);
  c.rollout.precision = p.precision;
  c.rollout.trainer_precision = p.trainer_precision;
  c.rollout.fp8_block = p.fp8_block;
  c.rollout.engine.bf16_kv = !p.aligned();  // fast mode keeps the engine's cache in bf16
  c.trainer.precision = rollout::precision_dtype(p.trainer_precision);
  c.trainer.fp8_block = p.fp8_block;
}

// [train]: SFT's section, less batch_size (rl's batch is [rollout]'s).
void read_train(const toml::table& root, const std::string& source, RlConfig& c) {
  TomlSection s(root["train"].as_table(), source, "train");
  if (s.has("batch_size"))
    s.fail("batch_size",
           "not used by rl: prompts per step are [rollout] batch_size, samples per prompt "
           "[rollout] n, optimizer steps per batch [algo] num_steps_per_rollout");
  const train::TrainSection t = train::train_section_from_toml(s);
  s.not_saved("batch_size");  // SFT's, refused here
  s.finish();
  c.trainer = t.trainer;
  c.steps = t.sft.steps;
  c.seed = t.sft.seed;
  c.shuffle = t.sft.shuffle;
  c.save_interval = t.sft.save_interval;
  c.keep_last = t.sft.keep_last;
  c.log_interval = t.sft.log_interval;
  c.out_dir = root["train"]["out_dir"].value_or(std::string("runs/rl"));
  c.threads = t.threads;
}

LogConfig read_log(const toml::table& root, const std::string& source) {
  LogConfig l;
  TomlSection s(root["log"].as_table(), source, "log");
  l.report_interval = s.get_int("report_interval", l.report_interval, 0);
  l.samples_interval = s.get_int("samples_interval", l.samples_interval, 0);
  l.samples_per_step = s.get_int("samples_per_step", l.samples_per_step, 0);
  l.progress = s.get_bool("progress", l.progress);
  l.metrics = metrics::read_logger_options(s, /*with_names=*/true);
  s.finish();
  return l;
}

// Defaults and checks that need more than one section.
void finish_config(RlConfig& c, const std::string& source) {
  if (c.algo.loss_agg == LossAgg::SeqMeanTokenSumNorm && c.algo.loss_agg_norm_len == 0)
    c.algo.loss_agg_norm_len = c.rollout.sampling.max_new_tokens;
  if (c.algo.overlong_buffer_len >= c.rollout.sampling.max_new_tokens)
    LS_THROW << source << ": [algo] overlong_buffer_len (" << c.algo.overlong_buffer_len
             << ") must be below [rollout] max_new_tokens (" << c.rollout.sampling.max_new_tokens << ")";
  if (c.env.enabled() && c.algo.routing_replay)
    LS_THROW << source << ": [algo] routing_replay is not supported with multi-turn rollouts ([rollout] env)";
  check_partial_config(c.partial, source, c.rollout.sampling, c.algo.dynamic_sampling, c.algo.routing_replay,
                       c.env.enabled());
  const bool batch_baseline =
      c.algo.advantage == Advantage::ReinforcePP || c.algo.advantage == Advantage::Gae;
  if (c.rollout.sampling.n < 2 && !batch_baseline)
    LS_THROW << source << ": [rollout] n must be >= 2 for group advantages (" << to_string(c.algo.advantage)
             << "); use advantage = \"reinforce++\" or \"gae\" for one sample per prompt";
  if (c.env.enabled() && c.algo.advantage == Advantage::Gae)
    LS_THROW << source << ": [algo] advantage = \"gae\" is not supported with multi-turn rollouts ([rollout] "
             << "env): the critic would need values only at the model's tokens; use a group advantage";
}

}  // namespace

RlConfig rl_config_from_toml(const toml::table& root, const std::string& source) {
  check_sections(root, source);
  RlConfig c;
  {
    TomlSection s(root["rollout"].as_table(), source, "rollout");
    c.batch_size = s.get_int("batch_size", c.batch_size, 1, 1 << 20);
    c.rollout = rollout::rollout_section_from_toml(s);
    c.env = env_config_from_toml(s);
    c.partial = partial_config_from_toml(s);
    s.finish();
  }
  read_train(root, source, c);
  c.trainer.lora = model::lora_config_from_root(root, source);
  read_precision(root, source, c);
  {
    TomlSection s(root["rl"].as_table(), source, "rl");
    c.on_gap = s.get_enum("on_gap", "abort", {"abort", "warn"}) == "abort" ? RlConfig::OnGap::Abort
                                                                           : RlConfig::OnGap::Warn;
    s.finish();
  }
  {
    TomlSection s(root["algo"].as_table(), source, "algo");
    c.algo = algo_config_from_toml(s);
    s.finish();
  }
  {
    TomlSection s(root["eval"].as_table(), source, "eval");
    c.eval = eval::eval_section_from_toml(s);
    s.finish();
  }
  // Read only for GAE, so other runs' resolved configs hold no [critic].
  if (c.algo.advantage == Advantage::Gae) {
    TomlSection s(root["critic"].as_table(), source, "critic");
    c.critic = critic_section_from_toml(s, c.trainer);
    s.finish();
  } else if (root["critic"].as_table() != nullptr) {
    LS_THROW << source
             << ": [critic] is read only with [algo] advantage = \"gae\" (PPO with a learned critic)";
  }
  c.reward = eval::reward_options_from_toml(root["reward"].as_table(), source);
  c.eval.config.reward = c.reward;
  c.log = read_log(root, source);
  finish_config(c, source);
  return c;
}

}  // namespace lockstep::rl
