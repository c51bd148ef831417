// Checkpoint save/load with atomic publication.
#include "lockstep/train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/base/file_util.h"
#include "lockstep/model/pretrained.h"

namespace fs = std::filesystem;

namespace lockstep::train {

namespace {
const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                 "generation_config.json"};

void copy_tokenizer(const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (const char* f : kTokenizerFiles) {
    fs::path src = fs::path(from) / f;
    if (fs::exists(src)) fs::copy_file(src, fs::path(to) / f, fs::copy_options::overwrite_existing);
  }
}
}  // namespace

std::string save_checkpoint(const std::string& run_dir, int64_t step, Trainer& trainer, nlohmann::json state,
                            const std::string& tokenizer_dir, int keep_last) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = "step_" + std::to_string(step);
  const fs::path final_dir = root / name, tmp_dir = root / (name + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir);
  save_pretrained(tmp_dir.string(), trainer.config(), trainer.model_layout(), trainer.checkpoint_params(), DType::F32);
  copy_tokenizer(tokenizer_dir, tmp_dir.string());
  trainer.save_optimizer((tmp_dir / "optimizer.bin").string());
  state["step"] = step;
  state["weight_version"] = trainer.version();
  state["optimizer_steps"] = trainer.optimizer().steps_done();
  write_file_atomic((tmp_dir / "trainer_state.json").string(), state.dump(2) + "\n");
  sync_directory(tmp_dir.string());
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir);
  sync_directory(root.string());
  write_file_atomic((root / "latest").string(), name + "\n");
  sync_directory(root.string());

  if (keep_last > 0) {
    std::vector<std::pair<int64_t, fs::path>> all;
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos) {
        try {
          all.emplace_back(std::stoll(n.substr(5)), e.path());
        } catch (const std::exception&) {
        }
      }
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i)
      if (all[i].first != step) fs::remove_all(all[i].second, ec);
  }
  return final_dir.string();
}

std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path latest = root / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::string name = read_file_text(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const fs::path dir = root / name;
  const fs::path state_path = dir / "trainer_state.json";
  if (!fs::exists(state_path) || !fs::exists(dir / "optimizer.bin"))
    LS_THROW << latest.string() << " names " << name << ", which is missing or incomplete";
  CheckpointInfo info;
  info.dir = dir.string();
  try {
    info.state = nlohmann::json::parse(read_file_text(state_path.string()));
    info.step = info.state.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    LS_THROW << state_path.string() << ": " << e.what();
  }
  return info;
}

CheckpointInfo load_checkpoint(const CheckpointInfo& info, Trainer& trainer) {
  ModelConfig saved = load_hf_config((fs::path(info.dir) / "config.json").string());
  if (!(ParamLayout(saved).same_as(trainer.model_layout())))
    LS_THROW << info.dir << ": checkpoint model does not match the configured model";
  load_params(info.dir, trainer.layout(), trainer.params(), &trainer.context());
  trainer.optimizer().load((fs::path(info.dir) / "optimizer.bin").string());
  trainer.params_changed(info.state.value("weight_version", uint64_t(0)));
  LS_LOG(Info) << "resumed from " << info.dir << " (step " << info.step << ")";
  return info;
}

}  // namespace lockstep::train
