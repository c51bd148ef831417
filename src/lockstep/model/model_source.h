// Where a command's model comes from: a Hugging Face directory (--model DIR or
// [model] path = "DIR") or an inline [model] architecture initialised
// randomly (init_seed, init_std). Also loads the tokenizer next to it.
#pragma once

#include <toml++/toml.h>

#include <optional>
#include <string>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/config.h"
#include "lockstep/model/params.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep {

struct LoadedModel {
  ModelConfig config;
  Buffer params;    // f32, ParamLayout(config)
  std::string dir;  // source directory ("" for an inline model)
  std::optional<tokenizer::Tokenizer> tokenizer;
};

// [model] keys besides the architecture fields.
inline const std::vector<std::string> kModelSourceKeys = {"path",          "init_seed", "init_std",
                                                          "chat_template", "precision", "trainer_precision",
                                                          "fp8_block",     "device"};

// The policy's precision (docs/alignment.md): [model] precision = "f32" |
// "bf16" | "fp8" is used by both engines (aligned: a gap of exactly 0);
// [model] trainer_precision, when it differs, is fast mode (the rollout in
// `precision`, the trainer in `trainer_precision`; the gap is measured).
// fp8_block: the square block of one fp8 weight scale (0: one per tensor).
struct PrecisionConfig {
  std::string precision = "f32";
  std::string trainer_precision = "f32";  // defaults to precision
  int64_t fp8_block = 128;
  bool aligned() const { return precision == trainer_precision; }
};
// Reads the [model] precision keys only (the section's other keys are left to
// load_model_from_config).
PrecisionConfig precision_from_toml(const toml::table& root, const std::string& source);

// [model] device = "cpu" (default) | "interpret" | "cuda" | "hip": which backend
// runs the model's kernels (kernels/gpu/device.h; --device overrides it).
std::string device_from_toml(const toml::table& root, const std::string& source);

// `path` itself, or the step_N directory a checkpoints/latest file names;
// Error unless that is a directory.
std::string resolve_model_dir(const std::string& path);
// `dir` may also be a checkpoints/latest file (the step_N directory it names).
LoadedModel load_model_dir(const std::string& dir, const Context& ctx,
                           const std::string& chat_template = "auto");
// From a config's [model] section.
LoadedModel load_model_from_config(const toml::table& root, const std::string& source, const Context& ctx);

}  // namespace lockstep
