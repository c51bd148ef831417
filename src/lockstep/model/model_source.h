// Where a command's model comes from: a Hugging Face directory (--model DIR or
// [model] path = "DIR") or an inline [model] architecture initialised
// randomly (init_seed, init_std). Also loads the tokenizer next to it.
#pragma once

#include <optional>
#include <string>

#include <toml++/toml.h>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/config.h"
#include "lockstep/model/params.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep {

struct LoadedModel {
  ModelConfig config;
  Buffer params;         // f32, ParamLayout(config)
  std::string dir;       // source directory ("" for an inline model)
  std::optional<tokenizer::Tokenizer> tokenizer;
};

// [model] keys besides the architecture fields.
inline const std::vector<std::string> kModelSourceKeys = {"path", "init_seed", "init_std", "chat_template"};

// `dir` may also be a checkpoints/latest file (the step_N directory it names).
LoadedModel load_model_dir(const std::string& dir, const Context& ctx, const std::string& chat_template = "auto");
// From a config's [model] section.
LoadedModel load_model_from_config(const toml::table& root, const std::string& source, const Context& ctx);

}  // namespace lockstep
