// Checkpoint save/load with atomic publication.
#include "lockstep/train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/log.h"
#include "lockstep/base/pause_point.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/train/checkpoint_integrity.h"
#include "lockstep/train/host_copies.h"

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

// Removes a checkpoint directory so that a crash cannot leave it half removed
// under its own name: it is renamed to "<name>.old" (which no reader takes for
// a checkpoint) and then removed.
void discard_checkpoint_dir(const fs::path& dir) {
  const fs::path doomed = dir.string() + ".old";
  std::error_code ec;
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  if (ec) LS_THROW << dir.string() << ": cannot move aside to remove it: " << ec.message();
  pause_point("checkpoint.discard", dir.string());
  fs::remove_all(doomed, ec);
}

// What a crash left in checkpoints/: step_N.old directories half removed,
// step_N.tmp directories half written, and temporary files of AtomicFile.
// Called at the start of a save and by remove_crash_leftovers (the process is
// the directory's one writer then).
void sweep_crash_leftovers(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    const bool dir_leftover = n.rfind("step_", 0) == 0 && (n.ends_with(".old") || n.ends_with(".tmp"));
    if (dir_leftover || n.find(".tmp.") != std::string::npos) stale.push_back(e.path());
  }
  for (const auto& p : stale) fs::remove_all(p, ec);
}

void prune_checkpoints(const fs::path& root, int64_t step, int keep_last) {
  std::vector<std::pair<int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(root)) {
    const int64_t s = checkpoint_step_of(e.path().filename().string());
    if (e.is_directory() && s >= 0) all.emplace_back(s, e.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i)
    if (all[i].first != step) discard_checkpoint_dir(all[i].second);
}

}  // namespace

int64_t checkpoint_step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  try {
    return std::stoll(name.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, Trainer& trainer, nlohmann::json state,
                            const std::string& tokenizer_dir, int keep_last,
                            const std::function<void(const std::string& dir)>& extra) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  sweep_crash_leftovers(root);
  const std::string name = "step_" + std::to_string(step);
  const fs::path final_dir = root / name, tmp_dir = root / (name + ".tmp");
  fs::create_directories(tmp_dir);
  save_pretrained(tmp_dir.string(), trainer.config(), trainer.model_layout(), trainer.checkpoint_params(), DType::F32);
  copy_tokenizer(tokenizer_dir, tmp_dir.string());
  trainer.save_optimizer((tmp_dir / "optimizer.bin").string());
  // LoRA: the adapters in PEFT's layout beside the (frozen) base.
  if (LoraState* lora = trainer.lora())
    save_adapter(tmp_dir.string(), lora->layout(), lora->host_params().data());
  state["step"] = step;
  state["weight_version"] = trainer.version();
  state["optimizer_steps"] = trainer.lora() ? trainer.lora()->steps_done() : trainer.optimizer().steps_done();
  write_file_atomic((tmp_dir / "trainer_state.json").string(), state.dump(2) + "\n");
  if (extra) extra(tmp_dir.string());
  write_checksum_manifest(tmp_dir.string());  // last: it covers every other file but the weights
  sync_directory(tmp_dir.string());
  // A step_N of an earlier attempt (crashed before `latest` named it): never
  // the checkpoint `latest` names, which is older than any step saved again.
  if (fs::exists(final_dir)) discard_checkpoint_dir(final_dir);
  fs::rename(tmp_dir, final_dir);
  sync_directory(root.string());
  pause_point("checkpoint.published", final_dir.string());  // in place, `latest` still names the previous one
  write_file_atomic((root / "latest").string(), name + "\n");
  sync_directory(root.string());
  if (keep_last > 0) prune_checkpoints(root, step, keep_last);
  return final_dir.string();
}

void refuse_existing_run(const std::string& run_dir) {
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  std::error_code ec;
  if (std::filesystem::exists(metrics_path, ec) && std::filesystem::file_size(metrics_path, ec) > 0 && !ec)
    LS_THROW << run_dir << " already holds a run (" << metrics_path
             << "); continue it with --resume or choose another output directory";
}

void remove_crash_leftovers(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (fs::is_directory(root)) sweep_crash_leftovers(root);
  // Expert parallelism gathers the optimizer state here just before a save
  // moves it into step_N (Trainer::prepare_checkpoint): left over only by a
  // kill in between.
  std::error_code ec;
  fs::remove(root / "optimizer.gathered", ec);
  for (const char* sub : {"", "samples", "eval"}) remove_stale_temporaries((fs::path(run_dir) / sub).string());
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

namespace {

// Runs read(dst) that writes n floats: straight into `dst` where host code may
// write the trainer's memory, else into a host copy then copied in (a trainer
// on a device: the host cannot touch its parameters).
void read_into(const Allocator& memory, float* dst, int64_t n, const std::function<void(float*)>& read) {
  if (memory.host_visible() ||
      !memory.holds(dst)) {  // host memory, or a buffer the trainer keeps on the host
    read(dst);
    return;
  }
  std::vector<float> host(static_cast<size_t>(n));
  read(host.data());
  memory.copy_in(dst, host.data(), host.size() * sizeof(float));
}

}  // namespace

CheckpointInfo load_checkpoint(const CheckpointInfo& info, Trainer& trainer) {
  ModelConfig saved = load_hf_config((fs::path(info.dir) / "config.json").string());
  if (!(ParamLayout(saved).same_as(trainer.model_layout())))
    LS_THROW << info.dir << ": checkpoint model does not match the configured model";
  const Allocator& memory = kernels::device_memory(trainer.context());
  read_into(memory, trainer.params(), trainer.layout().numel(),
            [&](float* dst) { load_params(info.dir, trainer.layout(), dst, &trainer.context()); });
  if (LoraState* lora = trainer.lora()) {
    const LoraSpec saved_spec = read_adapter_config(info.dir);
    if (saved_spec.rank != lora->layout().rank() ||
        saved_spec.target_modules != lora->layout().spec().target_modules)
      LS_THROW << info.dir << ": its adapter (r = " << saved_spec.rank
               << ") does not match [lora] (r = " << lora->layout().rank() << ", or other target_modules)";
    read_into(memory, lora->params(), lora->numel(),
              [&](float* dst) { read_adapter_weights(info.dir, lora->layout(), dst); });
    lora->load_optimizer((fs::path(info.dir) / "optimizer.bin").string());
  } else {
    trainer.optimizer().load((fs::path(info.dir) / "optimizer.bin").string());
  }
  trainer.params_changed(info.state.value("weight_version", uint64_t(0)));
  LS_LOG(Info) << "resumed from " << info.dir << " (step " << info.step << ")";
  return info;
}

}  // namespace lockstep::train
