// Model and tokenizer loading: a Hugging Face directory or an inline [model] section.
#include "lockstep/model/model_source.h"

#include <filesystem>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/model/config_toml.h"
#include "lockstep/model/pretrained.h"

namespace lockstep {

std::string resolve_model_dir(const std::string& path) {
  std::string dir = path;
  // checkpoints/latest is a file naming the newest step_N directory.
  if (std::filesystem::is_regular_file(dir) && std::filesystem::path(dir).filename() == "latest") {
    std::string name = read_file_text(dir);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    dir = (std::filesystem::path(dir).parent_path() / name).string();
  }
  if (!std::filesystem::is_directory(dir)) LS_THROW << path << ": not a model directory";
  return dir;
}

LoadedModel load_model_dir(const std::string& path, const Context& ctx, const std::string& chat_template) {
  const std::string dir = resolve_model_dir(path);
  LoadedModel m;
  PretrainedModel p = load_pretrained(dir, &ctx);
  m.config = p.config;
  m.params = std::move(p.params);
  m.dir = dir;
  if (std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
    tokenizer::TokenizerOptions o;
    o.chat_template = chat_template;
    m.tokenizer = tokenizer::Tokenizer::load(dir, o);
  }
  return m;
}

LoadedModel load_model_from_config(const toml::table& root, const std::string& source, const Context& ctx) {
  const toml::table* model = root["model"].as_table();
  if (!model) LS_THROW << source << ": missing [model] section";
  TomlSection s(model, source, "model");
  const std::string path = s.get_string("path", "");
  const std::string chat = s.get_string("chat_template", "auto");
  s.accept(
      {"precision", "trainer_precision", "fp8_block", "device"});  // precision_from_toml, device_from_toml
  if (!path.empty()) {
    s.finish();
    return load_model_dir(path, ctx, chat);
  }
  LoadedModel m;
  m.config = model_config_from_toml(*model, source, kModelSourceKeys);
  const int64_t seed = s.get_int("init_seed", 0);
  const double stddev = s.get_double("init_std", 0.02, 0.0, 10.0);
  ParamLayout layout(m.config);
  m.params = alloc_params(layout);
  init_params(layout, m.params.as<float>(), uint64_t(seed), float(stddev), &ctx);
  return m;
}

}  // namespace lockstep
