// `lockstep rl`: RL post-training (GRPO, Dr.GRPO, DAPO, GSPO, CISPO, RLOO,
// REINFORCE++) from a TOML config.
#include <filesystem>
#include <iostream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/model_source.h"
#include "lockstep/data/dataset.h"
#include "lockstep/model/file_util.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/run_report.h"

namespace lockstep::cli {
namespace {

int run_rl_cmd(const Args& args) {
  args.check_known({"config", "resume", "out", "check-config"});
  const bool check_only = args.has("check-config");
  const std::string cfg_path = check_only ? args.require("check-config") : args.require("config");
  toml::table root = load_toml_with_overrides(cfg_path, args.sets());
  rl::RlConfig cfg = rl::rl_config_from_toml(root, cfg_path);
  TomlSection data_s(root["data"].as_table(), cfg_path, "data");
  data::DataConfig dc = data::data_config_from_toml(data_s);
  data_s.finish();
  if (dc.train_file.empty()) LS_THROW << cfg_path << ": [data] train_file is required";
  if (args.has("out")) cfg.out_dir = args.get("out", cfg.out_dir);
  if (check_only) {  // every section but the model's weights, which are not loaded
    std::cout << cfg_path << ": OK (" << cfg.steps << " steps of " << cfg.batch_size << " prompts x "
              << cfg.rollout.sampling.n << " samples; " << rl::to_string(cfg.algo.advantage) << ", "
              << rl::to_string(cfg.algo.policy_loss) << ", " << rl::to_string(cfg.algo.loss_agg) << "; rollout "
              << cfg.rollout.precision << "; out " << cfg.out_dir << ")" << std::endl;
    return 0;
  }

  auto pool = make_pool(cfg.threads);
  Context ctx{pool.get(), 0};
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  if (!m.tokenizer) LS_THROW << cfg_path << ": the model has no tokenizer.json (make one with `lockstep init`)";
  rl::RlInputs in;
  in.tok = &*m.tokenizer;
  in.train = data::load_prompts(dc.train_file, dc, *m.tokenizer);
  if (!dc.eval_file.empty()) in.eval = data::load_prompts(dc.eval_file, dc, *m.tokenizer);
  in.tokenizer_dir = m.dir;
  const int64_t ctx_len = m.config.max_position_embeddings;
  for (const auto& p : in.train)
    if (int64_t(p.prompt_ids.size()) + cfg.rollout.sampling.max_new_tokens > ctx_len)
      LS_THROW << dc.train_file << ":" << p.line << ": prompt of " << p.prompt_ids.size() << " tokens + "
               << "[rollout] max_new_tokens " << cfg.rollout.sampling.max_new_tokens
               << " exceeds the model's max_position_embeddings " << ctx_len;
  Buffer ref;
  if (cfg.algo.kl_coef > 0) {  // the reference is the model as loaded (before any resume)
    ref = alloc_params(ParamLayout(m.config));
    std::copy(m.params.as<float>(), m.params.as<float>() + ParamLayout(m.config).numel(), ref.as<float>());
    in.ref_params = ref.as<float>();
  }
  std::filesystem::create_directories(cfg.out_dir);
  write_file_atomic(cfg.out_dir + "/config.toml", [&] {
    std::ostringstream os;
    os << root;
    return os.str() + "\n";
  }());
  rl::attach_reports(in, cfg);
  std::cout << "rl: " << in.train.size() << " prompts" << (in.eval.empty() ? "" : ", ") 
            << (in.eval.empty() ? "" : std::to_string(in.eval.size()) + " eval problems") << "; " << cfg.steps
            << " steps of " << cfg.batch_size << " prompts x " << cfg.rollout.sampling.n << " samples ("
            << rl::to_string(cfg.algo.advantage) << ", " << rl::to_string(cfg.algo.policy_loss) << ", rollout "
            << cfg.rollout.precision << "), " << ctx.threads() << " threads -> " << cfg.out_dir << std::endl;
  train::Trainer trainer(ctx, m.config, std::move(m.params), cfg.trainer);
  const rl::RlResult r = rl::run_rl(trainer, in, cfg, args.flag("resume"));
  rl::finish_report(cfg);
  std::cout << "rl: done in " << r.seconds << " s; mean seconds per step:";
  for (const auto& [k, v] : r.phase_seconds) std::cout << " " << k << " " << v;
  std::cout << "\nrl: checkpoints in " << cfg.out_dir << "/checkpoints/, report " << cfg.out_dir << "/report.html"
            << std::endl;
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "rl", "RL post-training (GRPO family) with rollout, rewards, eval and checkpoints",
    "usage: lockstep rl --config FILE [--resume] [--out DIR] [--set section.key=value ...]\n"
    "       lockstep rl --check-config FILE [--set ...]   (validate the config, load nothing)\n\n"
    "Each step draws [rollout] batch_size prompts from [data] train_file, samples [rollout] n\n"
    "responses to each with the rollout engine, scores them with the [reward] verifier,\n"
    "computes advantages and updates the policy ([algo]: grpo, drgrpo, rloo, reinforce++;\n"
    "ppo-clip, gspo, cispo; KL, entropy, TIS/MIS, dynamic sampling, overlong penalty), then\n"
    "publishes the new weights to the engine. Every [eval] interval steps it evaluates\n"
    "[data] eval_file (pass@1, pass@k), and it checkpoints every [train] save_interval steps.\n"
    "Writes OUT/config.toml (resolved), OUT/metrics.jsonl, OUT/samples/, OUT/eval/,\n"
    "OUT/checkpoints/step_N (Hugging Face layout + optimizer state) and OUT/report.html.\n"
    "--resume continues from OUT/checkpoints/latest (metrics lines after it are dropped).\n"
    "Sections: [model] [data] [rollout] [train] [algo] [reward] [eval] [log]; see\n"
    "docs/rl.md and docs/configuration.md. Recipes: configs/demo/rl.toml, configs/recipes/.\n",
    {"resume"}, run_rl_cmd});

}  // namespace
}  // namespace lockstep::cli
