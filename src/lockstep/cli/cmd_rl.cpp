// `lockstep rl`: RL post-training (GRPO, Dr.GRPO, DAPO, GSPO, CISPO, RLOO,
// REINFORCE++) from a TOML config, in one process or as an MPI job of
// trainer and rollout ranks ([dist], docs/distributed.md).
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/number_text.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/mpi_launch.h"
#include "lockstep/cli/run_config.h"
#include "lockstep/data/dataset.h"
#include "lockstep/eval/eval_config.h"
#include "lockstep/kernels/gpu/device.h"
#include "lockstep/model/model_source.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/dist_config.h"
#include "lockstep/parallel/parallel_trainer.h"
#include "lockstep/parallel/role_comms.h"
#include "lockstep/rl/dist_group.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/mpi_rollout.h"
#include "lockstep/rl/report_hook.h"
#include "lockstep/train/checkpoint.h"

namespace lockstep::cli {
namespace {

parallel::DistConfig read_dist(const toml::table& root, const std::string& path, bool* present) {
  const parallel::DistConfig d = read_dist_section(root, path, present);
  // Checked here, before any rank starts: the layout alone decides it.
  if (d.max_weight_staleness > 0 && d.rollout_ranks == 0 && d.trainer_ranks > 1)
    LS_THROW << path << ": [dist] max_weight_staleness = " << d.max_weight_staleness
             << " with several colocated trainers (rollout_ranks = 0, trainer_ranks = " << d.trainer_ranks
             << "): generating ahead needs rollout ranks ([dist] rollout_ranks > 0) or a single process";
  return d;
}

// What each row needs: the reward's label, unless a multi-turn environment
// may score the episodes itself.
data::PromptNeeds rl_prompt_needs(const rl::RlConfig& cfg) {
  return cfg.env.enabled() ? data::PromptNeeds{} : eval::prompt_needs(cfg.reward);
}

// --check-config reads the data files' rows (no tokenizer: fields and labels
// only); a file that is not there yet is said, not an error.
std::string check_data(const data::DataConfig& dc, const rl::RlConfig& cfg) {
  std::string out;
  for (const std::string* f : {&dc.train_file, &dc.eval_file}) {
    if (f->empty()) continue;
    if (!out.empty()) out += ", ";
    if (!std::filesystem::exists(*f)) {
      out += *f + " not found, not checked";
      continue;
    }
    out += std::to_string(data::check_prompt_rows(*f, dc, rl_prompt_needs(cfg))) + " rows in " + *f;
  }
  return out;
}

// The trainer side; rc is null in a single-process run.
// "bf16 (aligned)" or "rollout bf16, trainer f32 (fast mode)".
std::string precision_summary(const rollout::RolloutSection& r) {
  if (r.aligned()) return r.precision + " (aligned)";
  return "rollout " + r.precision + ", trainer " + r.trainer_precision + " (fast mode)";
}

int run_trainer(const Args& args, const toml::table& root, const std::string& cfg_path,
                const rl::RlConfig& cfg, const data::DataConfig& dc, const TomlRecorder& rec,
                parallel::RoleComms* rc) {
  const bool writer = !rc || rc->roles.is_trainer_root();
  auto pool = make_pool(cfg.threads);
  Context ctx{pool.get(), 0};
  set_device(ctx, args, device_from_toml(root, cfg_path));
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  if (!m.tokenizer)
    LS_THROW << cfg_path << ": the model has no tokenizer.json (make one with `lockstep init`)";
  rl::RlInputs in;
  in.tok = &*m.tokenizer;
  const data::PromptNeeds needs = rl_prompt_needs(cfg);
  in.train = data::load_prompts(dc.train_file, dc, *m.tokenizer, needs);
  if (!dc.eval_file.empty()) in.eval = data::load_prompts(dc.eval_file, dc, *m.tokenizer, needs);
  in.tokenizer_dir = m.dir;
  const int64_t ctx_len = m.config.max_position_embeddings;
  for (const auto& p : in.train)
    if (int64_t(p.prompt_ids.size()) + cfg.rollout.sampling.max_new_tokens > ctx_len)
      LS_THROW << dc.train_file << ":" << p.line << ": prompt of " << p.prompt_ids.size() << " tokens + "
               << "[rollout] max_new_tokens " << cfg.rollout.sampling.max_new_tokens
               << " exceeds the model's max_position_embeddings " << ctx_len;
  if (cfg.algo.kl_coef > 0) {  // the reference is the model as loaded (before any resume): its one copy
    const ParamLayout layout(m.config);
    Buffer ref = alloc_params(layout);
    std::copy(m.params.as<float>(), m.params.as<float>() + layout.numel(), ref.as<float>());
    in.reference = std::make_shared<train::Scorer>(
        ctx, m.config, std::move(ref), cfg.trainer.micro_batch_tokens, cfg.trainer.kv_block_size,
        cfg.trainer.precision, cfg.trainer.fp8_block, cfg.trainer.logits_chunk);
  }
  const bool resume = args.flag("resume") || args.has("resume-from");  // --resume-from implies --resume
  if (writer) {
    if (!resume) train::refuse_existing_run(cfg.out_dir);  // before config.toml is replaced
    std::filesystem::create_directories(cfg.out_dir);
    if (resume) train::remove_crash_leftovers(cfg.out_dir);  // what a killed run left behind
    const nlohmann::json reward = cfg.reward.to_json();
    write_file_atomic(cfg.out_dir + "/config.toml", saved_config_text(root, rec, cfg.out_dir, &reward));
    rl::attach_reports(in, cfg);
    std::cout << "rl: " << count_of(int64_t(in.train.size()), "prompt") << (in.eval.empty() ? "" : ", ")
              << (in.eval.empty() ? "" : count_of(int64_t(in.eval.size()), "eval problem")) << "; "
              << count_of(cfg.steps, "step") << " of " << count_of(cfg.batch_size, "prompt") << " x "
              << count_of(cfg.rollout.sampling.n, "sample") << " (" << rl::to_string(cfg.algo.advantage)
              << ", " << rl::to_string(cfg.algo.policy_loss) << ", " << precision_summary(cfg.rollout)
              << "), " << count_of(ctx.threads(), "thread") << " -> " << cfg.out_dir << std::endl;
    if (!rc && cfg.max_weight_staleness > 0) {
      const int64_t t = cfg.rollout_threads > 0 ? cfg.rollout_threads : ctx.threads();
      std::cout << "rl: rollout one step ahead of training on " << t << " thread" << (t == 1 ? "" : "s")
                << " of its own (max_weight_staleness = " << cfg.max_weight_staleness
                << (cfg.max_weight_staleness > 1 ? ", runs as 1)" : ")") << std::endl;
    }
  }
  train::TrainerConfig tc = cfg.trainer;
  // Fast mode: the rollout packs its own weights in its precision, so the
  // trainer's f32 forward reads the master in place.
  tc.in_place_weights = !cfg.rollout.aligned();
  train::Trainer trainer(ctx, m.config, std::move(m.params), tc);
  std::shared_ptr<rl::MpiRollout> remote;
  std::unique_ptr<model::ExpertComm> experts;
  if (rc) {
    const parallel::Roles& r = rc->roles;
    if (tc.lora.enabled() && (r.trainer_ranks > 1 || r.ep_size > 1))
      LS_THROW << cfg_path
               << ": [lora] in rl runs on one trainer rank (with rollout ranks, which receive only the "
                  "adapters) for now: several trainer ranks are not supported with it yet";
    in.group = rl::make_trainer_group(rc->trainers, writer);
    experts = parallel::make_parallel_trainer(trainer, *rc, cfg_path);
    if (!r.colocated) {
      remote = std::make_shared<rl::MpiRollout>(trainer, writer ? &rc->weight_sync : nullptr, &rc->trainers,
                                                cfg.rollout, cfg.seed);
      in.rollout = remote;
    } else if (r.trainer_ranks > 1) {
      in.rollout = std::make_shared<rl::SpreadRollout>(trainer, rc->trainers, cfg.rollout, cfg.seed);
    }
    if (writer)
      std::cout << "rl: MPI job of " << r.world_size << " ranks: " << r.trainer_ranks << " trainer"
                << (r.trainer_ranks == 1 ? "" : "s (data parallel)")
                << (r.ep_size > 1 ? " as " + std::to_string(r.dp_size) + " expert-parallel groups of " +
                                        std::to_string(r.ep_size)
                                  : "")
                << ", "
                << (r.colocated ? "colocated rollout (each trainer generates a share)"
                                : std::to_string(r.rollout_ranks) + " rollout rank" +
                                      (r.rollout_ranks == 1 ? "" : "s"))
                << (cfg.max_weight_staleness > 0
                        ? ", rollout one step ahead of training (max_weight_staleness = " +
                              std::to_string(cfg.max_weight_staleness) +
                              (cfg.max_weight_staleness > 1 ? ", runs as 1)" : ")")
                        : std::string())
                << std::endl;
  }
  in.resume_from = args.get("resume-from", "");
  const rl::RlResult res = rl::run_rl(trainer, in, cfg, resume);
  if (remote) remote->shutdown();
  if (!writer) return 0;
  rl::finish_report(cfg);
  std::cout << "rl: done in " << res.seconds << " s; mean seconds per step:";
  for (const auto& [k, v] : res.phase_seconds) std::cout << " " << k << " " << v;
  std::cout << "\nrl: checkpoints in " << cfg.out_dir << "/checkpoints/, report " << cfg.out_dir
            << "/report.html" << std::endl;
  return 0;
}

// A rollout rank: the engine on its own copy of the weights until the trainer root says stop.
int run_rollout_rank(const toml::table& root, const std::string& cfg_path, const rl::RlConfig& cfg,
                     parallel::RoleComms& rc) {
  auto pool = make_pool(cfg.threads);
  Context ctx{pool.get(), 0};
  // [rollout] device, when set, is this rank's device: it runs only the engine.
  const bool own = !cfg.rollout.device.empty();
  const std::string where = cfg_path + (own ? ": [rollout] device" : ": [model] device");
  const std::string device = own ? cfg.rollout.device : device_from_toml(root, cfg_path);
  ctx.gpu = kernels::device_backend(kernels::parse_device(device, where), where);
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  const rl::ServeStats st =
      rl::serve_rollout(rc.weight_sync, ctx, m.config, m.params.as<float>(), cfg.rollout, cfg.seed,
                        cfg.trainer.lora);
  std::cout << "rl: " << parallel::describe(rc.roles) << ": served " << st.generate_calls << " rollouts ("
            << st.requests << " prompts, " << st.generated_tokens << " tokens, " << st.generate_seconds
            << " s) and " << st.syncs << " weight syncs (" << st.sync_seconds << " s), last version "
            << st.version << std::endl;
  return 0;
}

int run_rl_cmd(const Args& args) {
  args.check_known({"config", "resume", "resume-from", "out", "check-config", "threads"});
  const bool check_only = args.has("check-config");
  const std::string cfg_path = check_only ? args.require("check-config") : args.require("config");
  TomlRecorder rec;  // every key's value, defaults included, for OUT/config.toml
  toml::table root = load_toml_with_overrides(cfg_path, args.sets());
  rl::RlConfig cfg = rl::rl_config_from_toml(root, cfg_path);
  bool has_dist = false;
  const parallel::DistConfig dcfg = read_dist(root, cfg_path, &has_dist);
  cfg.max_weight_staleness = dcfg.max_weight_staleness;
  cfg.rollout_threads = dcfg.rollout_threads;
  cfg.trainer.world_invariant = dcfg.world_invariant;
  if (cfg.trainer.lora.enabled() && cfg.max_weight_staleness > 0)
    LS_THROW << cfg_path << ": [lora] with max_weight_staleness > 0 is not supported yet";
  TomlSection data_s(root["data"].as_table(), cfg_path, "data");
  data::DataConfig dc = data::data_config_from_toml(data_s);
  data_s.finish();
  if (dc.train_file.empty()) LS_THROW << cfg_path << ": [data] train_file is required";
  if (args.has("out")) cfg.out_dir = args.get("out", cfg.out_dir);
  cfg.out_dir = absolute_path(cfg.out_dir);  // a default or --out: the current folder's
  if (args.has("threads")) cfg.threads = threads_flag(args);
  if (check_only) {  // every section and the data's rows, but not the model, which is not loaded
    const std::string data_summary = check_data(dc, cfg);
    std::cout << cfg_path << ": OK (" << count_of(cfg.steps, "step") << " of "
              << count_of(cfg.batch_size, "prompt") << " x " << count_of(cfg.rollout.sampling.n, "sample")
              << "; " << rl::to_string(cfg.algo.advantage) << ", " << rl::to_string(cfg.algo.policy_loss)
              << ", " << rl::to_string(cfg.algo.loss_agg) << "; " << precision_summary(cfg.rollout)
              << "; data: " << data_summary << "; out " << cfg.out_dir;
    if (has_dist)
      std::cout << "; dist: "
                << (dcfg.trainer_ranks ? std::to_string(dcfg.trainer_ranks) : std::string("all other"))
                << " trainer + " << dcfg.rollout_ranks << " rollout ranks"
                << (dcfg.max_weight_staleness > 0 ? ", rollout one step ahead" : "");
    std::cout << ")" << std::endl;
    return 0;
  }
  return run_as_job("rl", dcfg, has_dist, [&](parallel::RoleComms* rc) {
    if (rc && rc->roles.is_rollout) return run_rollout_rank(root, cfg_path, cfg, *rc);
    return run_trainer(args, root, cfg_path, cfg, dc, rec, rc);
  });
}

LS_REGISTER_COMMAND(Command{
    "rl",
    "RL post-training (GRPO family) with rollout, rewards, eval and checkpoints",
    "usage: lockstep rl --config FILE [--resume | --resume-from step_N] [--out DIR] [--threads N]\n"
    "                   [--set section.key=value ...]\n"
    "       lockstep rl --check-config FILE [--set ...]   (validate the config and the data's rows; no "
    "model)\n"
    "       mpirun -np N lockstep rl --config FILE        (trainer and rollout ranks, [dist])\n\n"
    "Each step draws [rollout] batch_size prompts from [data] train_file, samples [rollout] n\n"
    "responses to each with the rollout engine, scores them with the [reward] verifier,\n"
    "computes advantages and updates the policy ([algo]: grpo, drgrpo, rloo, reinforce++, or\n"
    "gae: PPO with a learned [critic]; ppo-clip, gspo, cispo; KL, entropy, TIS/MIS, dynamic\n"
    "sampling, overlong penalty), then\n"
    "publishes the new weights to the engine. Every [eval] interval steps it evaluates\n"
    "[data] eval_file (pass@1, pass@k), and it checkpoints every [train] save_interval steps.\n"
    "[rollout] partial = true caps the response tokens of a step ([rollout] partial_token_budget):\n"
    "responses still running are paused and resume on the next step's weights; a step trains on\n"
    "the groups that finished and draws prompts to keep batch_size in flight (docs/rl.md).\n"
    "Paths in FILE are taken from FILE's folder, paths in --set and --out from the current one.\n"
    "--threads N overrides [train] threads (0: all cores).\n"
    "Writes OUT/config.toml (every key, defaults included, paths absolute), OUT/metrics.jsonl, OUT/samples/, "
    "OUT/eval/,\n"
    "OUT/checkpoints/step_N (Hugging Face layout + optimizer state) and OUT/report.html.\n"
    "--resume continues from OUT/checkpoints/latest (metrics lines after it are dropped), also\n"
    "after a kill -9 (docs/rl.md, \"Crash safety\"; it first removes what a killed run left behind).\n"
    "Every checkpoint is verified first (tensor and file checksums, truncation, missing files):\n"
    "when latest is not intact, --resume says why and falls back to the newest intact one that\n"
    "[train] keep_last kept. --resume-from step_N (or N, or a checkpoint directory) resumes from\n"
    "exactly that checkpoint, and is an error if it is not intact.\n"
    "Under mpirun/srun, [dist] trainer_ranks / rollout_ranks split the ranks into data-parallel\n"
    "trainers and rollout ranks that receive the weights after every step (docs/distributed.md);\n"
    "[dist] max_weight_staleness = 1 lets the rollout generate one step ahead of training (on the\n"
    "rollout ranks, or in one process on its own threads, [dist] rollout_threads);\n"
    "[dist] expert_parallel = N splits each MoE layer's experts over groups of N trainers.\n"
    "[dist] world_invariant = true makes the result the same bits for any number of\n"
    "trainer ranks and any expert_parallel (canonical micro-batches, an exact gradient sum).\n"
    "[model] precision = f32|bf16|fp8 runs both engines in that precision (aligned: a gap of\n"
    "exactly 0; [rl] on_gap = \"abort\" stops a step whose logprobs differ at all);\n"
    "[model] trainer_precision = \"f32\" with a bf16/fp8 precision is fast mode.\n"
    "[lora] rank > 0 trains LoRA adapters on the frozen base (one trainer rank; rollout ranks\n"
    "receive only the adapters).\n"
    "Sections: [model] [data] [rollout] [train] [algo] [critic] [reward] [eval] [log] [dist] [rl]\n"
    "[lora]; see docs/rl.md and docs/configuration.md. Recipes: configs/demo/rl.toml, configs/recipes/.\n",
    {"resume"},
    run_rl_cmd});

}  // namespace
}  // namespace lockstep::cli
