// `lockstep sft`: supervised fine-tuning from a TOML config.
#include <filesystem>
#include <iostream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/model_source.h"
#include "lockstep/data/dataset.h"
#include "lockstep/model/file_util.h"
#include "lockstep/train/train_config.h"

namespace lockstep::cli {
namespace {

int run_sft_cmd(const Args& args) {
  args.check_known({"config", "resume", "out"});
  const std::string cfg_path = args.require("config");
  toml::table root = load_toml_with_overrides(cfg_path, args.sets());
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "model" && key != "data" && key != "train" && key != "log")
      LS_THROW << cfg_path << ": section [" << key << "] is not used by sft (expected [model] [data] [train] [log])";
  }
  TomlSection train_s(root["train"].as_table(), cfg_path, "train");
  train::TrainSection ts = train::train_section_from_toml(train_s);
  train_s.finish();
  TomlSection data_s(root["data"].as_table(), cfg_path, "data");
  data::DataConfig dc = data::data_config_from_toml(data_s);
  data_s.finish();
  TomlSection log_s(root["log"].as_table(), cfg_path, "log");
  log_s.finish();
  if (dc.train_file.empty()) LS_THROW << cfg_path << ": [data] train_file is required";
  if (args.has("out")) ts.out_dir = args.get("out", ts.out_dir);

  auto pool = make_pool(ts.threads);
  Context ctx{pool.get(), 0};
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  if (!m.tokenizer) LS_THROW << cfg_path << ": the model has no tokenizer.json (make one with `lockstep init`)";
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
  std::filesystem::create_directories(ts.out_dir);
  write_file_atomic(ts.out_dir + "/config.toml", [&] {
    std::ostringstream os;
    os << root;
    return os.str() + "\n";
  }());
  std::cout << "sft: " << seqs.size() << " examples, " << ts.sft.steps << " steps of " << ts.sft.batch_size
            << " sequences, " << ctx.threads() << " threads -> " << ts.out_dir << std::endl;
  train::Trainer trainer(ctx, m.config, std::move(m.params), ts.trainer);
  train::run_sft(trainer, seqs, ts.out_dir, ts.sft, args.flag("resume"), m.dir);
  std::cout << "sft: done; final checkpoint in " << ts.out_dir << "/checkpoints/" << std::endl;
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "sft", "supervised fine-tuning on prompt/response JSONL",
    "usage: lockstep sft --config FILE [--resume] [--out DIR] [--set section.key=value ...]\n\n"
    "Trains with token cross-entropy on the response tokens of [data] train_file (lines with\n"
    "prompt + response, or messages ending with the assistant's reply). Writes\n"
    "OUT/metrics.jsonl, OUT/config.toml (resolved) and OUT/checkpoints/step_N (Hugging Face\n"
    "layout + optimizer state). --resume continues from OUT/checkpoints/latest.\n"
    "Sections: [model] (path = HF dir, or an inline architecture), [data], [train], [log];\n"
    "see docs/configuration.md.\n",
    {"resume"}, run_sft_cmd});

}  // namespace
}  // namespace lockstep::cli
