// `lockstep sft`: supervised fine-tuning from a TOML config.
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/number_text.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/mpi_launch.h"
#include "lockstep/cli/run_config.h"
#include "lockstep/data/dataset.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/model/model_source.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/dist_config.h"
#include "lockstep/parallel/parallel_trainer.h"
#include "lockstep/parallel/role_comms.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/sft.h"
#include "lockstep/train/train_config.h"

namespace lockstep::cli {
namespace {

// [dist] of an sft run: trainer ranks only.
parallel::DistConfig read_dist(const toml::table& root, const std::string& path, bool* present) {
  const parallel::DistConfig d = read_dist_section(root, path, present);
  if (d.rollout_ranks > 0)
    LS_THROW << path << ": [dist] rollout_ranks = " << d.rollout_ranks
             << ": sft generates nothing, every rank trains (remove rollout_ranks)";
  if (d.max_weight_staleness > 0)
    LS_THROW << path << ": [dist] max_weight_staleness is an rl setting; sft has no rollout (remove it)";
  return d;
}

// The training part; rc is null in a single-process run.
int train_sft(const Args& args, const toml::table& root, const std::string& cfg_path, train::TrainSection ts,
              const data::DataConfig& dc, bool world_invariant, const TomlRecorder& rec,
              parallel::RoleComms* rc) {
  const bool writer = !rc || rc->roles.is_trainer_root();
  auto pool = make_pool(ts.threads);
  Context ctx{pool.get(), 0};
  set_device(ctx, args, device_from_toml(root, cfg_path));
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  if (!m.tokenizer)
    LS_THROW << cfg_path << ": the model has no tokenizer.json (make one with `lockstep init`)";
  auto examples = data::load_sft_examples(dc.train_file, dc, *m.tokenizer);
  std::vector<train::TrainSequence> seqs;
  for (const auto& e : examples) {
    train::TrainSequence s;
    s.tokens = e.prompt_ids;
    s.tokens.insert(s.tokens.end(), e.response_ids.begin(), e.response_ids.end());
    s.prompt_len = int32_t(e.prompt_ids.size());
    if (int64_t(s.tokens.size()) > m.config.max_position_embeddings)
      LS_THROW << dc.train_file << ":" << e.line << ": " << s.tokens.size()
               << " tokens exceed the model's max_position_embeddings";
    seqs.push_back(std::move(s));
  }
  const bool resume = args.flag("resume") || args.has("resume-from");  // --resume-from implies --resume
  if (writer) {
    if (!resume) train::refuse_existing_run(ts.out_dir);  // before config.toml is replaced
    std::filesystem::create_directories(ts.out_dir);
    if (resume) train::remove_crash_leftovers(ts.out_dir);  // what a killed run left behind
    write_file_atomic(ts.out_dir + "/config.toml", saved_config_text(root, rec, ts.out_dir, nullptr));
    std::cout << "sft: " << count_of(int64_t(seqs.size()), "example") << ", "
              << count_of(ts.sft.steps, "step") << " of " << count_of(ts.sft.batch_size, "sequence") << ", "
              << count_of(ctx.threads(), "thread") << " -> " << ts.out_dir << std::endl;
  }
  train::TrainerConfig tc = ts.trainer;
  const PrecisionConfig precision = precision_from_toml(root, cfg_path);  // sft trains in trainer_precision
  tc.precision = rollout::precision_dtype(precision.trainer_precision);
  tc.fp8_block = precision.fp8_block;
  tc.world_invariant = world_invariant;
  tc.in_place_weights = true;  // no rollout engine reads an SFT trainer's packed weights
  train::Trainer trainer(ctx, m.config, std::move(m.params), tc);
  train::SftRanks ranks;
  std::unique_ptr<model::ExpertComm> experts;
  if (rc) {
    const parallel::Roles& r = rc->roles;
    experts = parallel::make_parallel_trainer(trainer, *rc, cfg_path);
    comm::Communicator* trainers = &rc->trainers;
    ranks.step = [trainers](train::Trainer& t, const std::vector<train::TrainSequence>& batch) {
      return parallel::dp_sft_step(t, *trainers, batch);
    };
    ranks.writer = writer;
    if (writer)
      std::cout << "sft: MPI job of " << r.world_size << " data-parallel trainer ranks"
                << (r.ep_size > 1 ? " as " + std::to_string(r.dp_size) + " expert-parallel groups of " +
                                        std::to_string(r.ep_size)
                                  : "")
                << (trainer.trainer_config().world_invariant
                        ? "; each step's micro-batches are shared out over them (world_invariant)"
                        : "; each step's batch is split over them by tokens")
                << std::endl;
  }
  train::run_sft(trainer, seqs, ts.out_dir, ts.sft, resume, m.dir, {}, ranks, args.get("resume-from", ""));
  if (writer) std::cout << "sft: done; final checkpoint in " << ts.out_dir << "/checkpoints/" << std::endl;
  return 0;
}

int run_sft_cmd(const Args& args) {
  args.check_known({"config", "resume", "resume-from", "out", "threads"});
  const std::string cfg_path = args.require("config");
  TomlRecorder rec;  // every key's value, defaults included, for OUT/config.toml
  toml::table root = load_toml_with_overrides(cfg_path, args.sets());
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "model" && key != "data" && key != "train" && key != "log" && key != "dist" && key != "lora")
      LS_THROW << cfg_path << ": section [" << key
               << "] is not used by sft (expected [model] [data] [train] [log] [dist] [lora])";
  }
  bool has_dist = false;
  const parallel::DistConfig dcfg = read_dist(root, cfg_path, &has_dist);
  TomlSection train_s(root["train"].as_table(), cfg_path, "train");
  train::TrainSection ts = train::train_section_from_toml(train_s);
  train_s.finish();
  ts.trainer.lora = model::lora_config_from_root(root, cfg_path);
  if (ts.trainer.lora.enabled() && dcfg.expert_parallel > 1)
    LS_THROW << cfg_path
             << ": [lora] with [dist] expert_parallel > 1 is not supported yet (data parallelism is)";
  TomlSection data_s(root["data"].as_table(), cfg_path, "data");
  data::DataConfig dc = data::data_config_from_toml(data_s);
  data_s.finish();
  TomlSection log_s(root["log"].as_table(), cfg_path, "log");
  ts.sft.log = metrics::read_logger_options(log_s, /*with_names=*/false);
  log_s.finish();
  if (dc.train_file.empty()) LS_THROW << cfg_path << ": [data] train_file is required";
  if (args.has("out")) ts.out_dir = args.get("out", ts.out_dir);
  ts.out_dir = absolute_path(ts.out_dir);  // a default or --out: the current folder's
  if (args.has("threads")) ts.threads = threads_flag(args);

  return run_as_job("sft", dcfg, has_dist, [&](parallel::RoleComms* rc) {
    return train_sft(args, root, cfg_path, ts, dc, dcfg.world_invariant, rec, rc);
  });
}

LS_REGISTER_COMMAND(Command{
    "sft", "supervised fine-tuning on prompt/response JSONL",
    "usage: lockstep sft --config FILE [--resume | --resume-from step_N] [--out DIR] [--threads N]\n"
    "                    [--set section.key=value ...]\n\n"
    "Trains with token cross-entropy on the response tokens of [data] train_file (lines with\n"
    "prompt + response, or messages ending with the assistant's reply). Writes\n"
    "OUT/metrics.jsonl, OUT/config.toml (every key, defaults included, paths absolute) and\n"
    "OUT/checkpoints/step_N (Hugging Face\n"
    "layout + optimizer state). --resume continues from OUT/checkpoints/latest, also after a kill -9\n"
    "(docs/rl.md, \"Crash safety\"; it first removes what a killed run left behind). A checkpoint\n"
    "that fails verification (checksums, truncation, missing files) is never resumed from:\n"
    "--resume falls back to the newest intact one, saying why; --resume-from step_N (or N, or a\n"
    "checkpoint directory) picks one, and is an error if it is not intact.\n"
    "Sections: [model] (path = HF dir, or an inline architecture), [data], [train], [log],\n"
    "[dist], [lora] (LoRA adapters on a frozen base; data parallelism, no expert_parallel yet);\n"
    "see docs/configuration.md. Paths in FILE are taken from FILE's folder, paths in\n"
    "--set and --out from the current one. --threads N overrides [train] threads (0: all cores).\n\n"
    "Under mpirun (or with a [dist] section) every rank trains: each step's batch is split\n"
    "over the ranks by tokens and the gradients are summed; [dist] expert_parallel splits the\n"
    "experts; [dist] world_invariant = true makes the result the same bits on any number of\n"
    "ranks and any expert_parallel (docs/distributed.md).\n",
    {"resume"},
    run_sft_cmd});

}  // namespace
}  // namespace lockstep::cli
