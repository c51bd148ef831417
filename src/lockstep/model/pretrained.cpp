// Flat parameter buffers <-> safetensors by Hugging Face name, and the
// save_pretrained / load_pretrained directory helpers (staged, then swapped in).
#include "lockstep/model/pretrained.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/model/safetensors.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checkpoint tensors that are not parameters of the layout but harmless.
bool tolerated_extra(const std::string& name, const ModelConfig& c) {
  if (name == "lm_head.weight" && c.tie_word_embeddings) return true;  // tied: the embedding is used
  return ends_with(name, ".rotary_emb.inv_freq");                      // old Llama checkpoints store it
}

// Files save_pretrained writes itself; an old copy must not be carried over.
bool written_by_save(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
         is_shard_file_name(name);
}

std::atomic<uint64_t> g_stage_counter{0};

}  // namespace

void save_params(const std::string& dir, const ParamLayout& layout, const float* base, DType dtype,
                 uint64_t max_shard_bytes) {
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(layout.params().size());
  for (const ParamInfo& p : layout.params()) tensors.push_back({p.name, p.shape, base + p.offset});
  write_safetensors_sharded(dir, tensors, dtype, max_shard_bytes);
}

namespace {
// A routed expert's tensor that a layout of some experts only (expert
// parallelism) leaves to another rank.
bool other_rank_expert(const std::string& name, const ParamLayout& layout) {
  return !layout.all_experts() && name.find(".mlp.experts.") != std::string::npos;
}
}  // namespace

void load_params(const std::string& path, const ParamLayout& layout, float* base, const Context* ctx) {
  SafetensorsCheckpoint ckpt(path);
  const ModelConfig& c = layout.config();
  // Check names and shapes first: fail before touching the buffer.
  std::vector<std::string> extras;
  for (const std::string& name : ckpt.names())
    if (!layout.find(name) && !tolerated_extra(name, c) && !other_rank_expert(name, layout)) extras.push_back(name);
  if (!extras.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < extras.size() && i < 5; ++i) os << (i ? ", " : "") << "'" << extras[i] << "'";
    if (extras.size() > 5) os << " and " << extras.size() - 5 << " more";
    LS_THROW << ckpt.source() << ": unexpected tensor" << (extras.size() > 1 ? "s " : " ") << os.str()
             << ", which the config (" << architecture_name(c.architecture)
             << ") does not have: the checkpoint and config.json describe different models";
  }
  std::vector<SafetensorsCheckpoint::Located> where;
  where.reserve(layout.params().size());
  for (const ParamInfo& p : layout.params()) {
    if (!ckpt.contains(p.name)) LS_THROW << ckpt.source() << ": missing tensor '" << p.name << "'";
    auto loc = ckpt.locate(p.name);
    if (loc.entry->shape != p.shape)
      LS_THROW << loc.file->path() << ": tensor '" << p.name << "' has shape "
               << shape_string(loc.entry->shape) << ", expected " << shape_string(p.shape);
    where.push_back(loc);
  }
  const auto& params = layout.params();
  auto load = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto& loc = where[static_cast<size_t>(i)];
      loc.file->read_f32(*loc.entry, base + params[static_cast<size_t>(i)].offset);
    }
  };
  const int64_t n = static_cast<int64_t>(params.size());
  if (ctx)
    ctx->parallel_for(n, load);
  else
    load(0, n);
}

void save_pretrained(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                     const float* base, DType dtype, uint64_t max_shard_bytes) {
  if (!layout.same_as(ParamLayout(config)))
    LS_THROW << dir << ": save_pretrained: the parameter layout does not match the config";
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "a/b/" -> "a/b"
  if (target.empty()) LS_THROW << "save_pretrained: empty directory name";
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (fs::exists(target) && !fs::is_directory(target)) LS_THROW << dir << ": exists and is not a directory";

  // Hidden sibling names: ".<dir>.tmp-<pid>-<n>" (same filesystem, so renames are atomic).
  std::string hidden = ".";
  hidden += target.filename().string();
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(g_stage_counter++);
  const fs::path stage = parent / (hidden + ".tmp-" + tag);
  fs::remove_all(stage, ec);
  if (!fs::create_directory(stage, ec)) LS_THROW << stage.string() << ": cannot create: " << ec.message();
  try {
    save_hf_config((stage / "config.json").string(), config, dtype);
    save_params(stage.string(), layout, base, dtype, max_shard_bytes);
    if (fs::is_directory(target)) {
      // Keep what else lives there (tokenizer files, ...): hard links cost
      // nothing and leave the old directory untouched.
      for (const auto& e : fs::directory_iterator(target)) {
        const std::string name = e.path().filename().string();
        if (written_by_save(name)) continue;
        fs::copy(e.path(), stage / name,
                 fs::copy_options::recursive | fs::copy_options::create_hard_links |
                     fs::copy_options::copy_symlinks,
                 ec);
        if (ec) {  // e.g. a filesystem without hard links: copy the bytes
          ec.clear();
          fs::copy(e.path(), stage / name, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
        }
      }
    }
    sync_directory(stage.string());
    if (!fs::exists(target)) {
      fs::rename(stage, target);
    } else if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      // `stage` now holds the old checkpoint.
      fs::remove_all(stage, ec);
    } else {
      // No atomic exchange here: two renames leave a short window without `dir`
      // but never a half-written one.
      const fs::path old = parent / (hidden + ".old-" + tag);
      fs::rename(target, old);
      std::error_code ec2;
      fs::rename(stage, target, ec2);
      if (ec2) {
        fs::rename(old, target, ec);  // put the old checkpoint back
        LS_THROW << dir << ": save_pretrained: cannot move the new checkpoint in place: " << ec2.message();
      }
      fs::remove_all(old, ec);
    }
    sync_directory(parent.string());
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(stage, ec);
    LS_THROW << dir << ": save_pretrained failed: " << e.what();
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
}

PretrainedModel load_pretrained(const std::string& dir, const Context* ctx) {
  PretrainedModel m;
  m.config = load_hf_config((fs::path(dir) / "config.json").string());
  m.layout = ParamLayout(m.config);
  m.params = alloc_params(m.layout);
  load_params(dir, m.layout, m.params.as<float>(), ctx);
  return m;
}

}  // namespace lockstep
