// The config.toml that `rl`, `sft` and `demo` save in their run directory:
// every key with the value the run used (defaults included) and every path
// absolute, so `--resume` reads it back to the same run from any folder.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/base/toml_section.h"

namespace lockstep::cli {

// `root` completed with what `rec` saw read ([dist] only if `root` has it),
// [train] out_dir set to `out_dir` made absolute, and the [reward] keys of
// `reward` (RewardOptions::to_json; null: none) that `root` lacks; as TOML
// text with floats at their shortest exact form.
std::string saved_config_text(const toml::table& root, const TomlRecorder& rec, const std::string& out_dir,
                              const nlohmann::json* reward);

}  // namespace lockstep::cli
