// export_pretrained: a checkpoint directory loaded and saved again in another
// storage, staged in a sibling temporary directory and renamed into place.
#include "lockstep/model/export.h"

#include <unistd.h>

#include <filesystem>
#include <functional>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/peft.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

const char* const kSideFiles[] = {"tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
                                  "added_tokens.json", "chat_template.jinja",   "generation_config.json"};

// Error unless `out` is absent or an empty directory.
void check_target(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec) || !fs::is_empty(out, ec))
    LS_THROW << out.string() << ": exists and is not an empty directory; export writes a new directory";
}

fs::path target_path(const std::string& out) {
  fs::path target = fs::path(out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "a/b/" -> "a/b"
  if (target.empty()) LS_THROW << "export: empty output directory name";
  return target;
}

// export_pretrained, with `edit` (may be empty) applied to the loaded model
// before it is written.
void export_edited(const std::string& from_path, const std::string& out, SaveFormat format,
                   const Context* ctx, const std::function<void(PretrainedModel&)>& edit) {
  const fs::path target = target_path(out);
  check_target(target);
  const std::string from = resolve_model_dir(from_path);
  PretrainedModel m = load_pretrained(from, ctx);
  if (edit) edit(m);
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent);
  const fs::path stage =
      parent / ("." + target.filename().string() + ".export-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(stage, ec);
  try {
    fs::create_directory(stage);
    for (const char* f : kSideFiles)
      if (fs::exists(fs::path(from) / f)) fs::copy_file(fs::path(from) / f, stage / f);
    save_pretrained(stage.string(), m.config, m.layout, m.params.as<float>(), format);
    check_target(target);       // again: another writer may have come meanwhile
    fs::rename(stage, target);  // replaces an empty directory
    sync_directory(parent.string());
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(stage, ec);
    LS_THROW << out << ": export failed: " << e.what();
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
}

}  // namespace

void export_pretrained(const std::string& from, const std::string& out, SaveFormat format,
                       const Context* ctx) {
  export_edited(from, out, format, ctx, nullptr);
}

void export_merged_lora(const std::string& from, const std::string& adapter_dir, const std::string& out,
                        SaveFormat format, const Context* ctx) {
  export_edited(from, out, format, ctx, [&](PretrainedModel& m) {
    const LoraAdapter adapter = load_adapter(adapter_dir, m.layout);
    merge_lora(adapter.layout, adapter.params.data(), m.layout, m.params.as<float>(), ctx);
  });
}

}  // namespace lockstep
