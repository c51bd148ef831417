// Fuzz target: a `lockstep rl` TOML config, read as the command reads it:
// TOML syntax and --set overrides (the lines after a NUL byte, one per line),
// every section's typed keys and unknown-key checks ([rollout] [train] [algo]
// [eval] [reward] [log] [rl] [dist] [data]) and the inline [model] section.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/data/dataset.h"
#include "lockstep/model/config.h"
#include "lockstep/model/config_toml.h"
#include "lockstep/model/model_source.h"
#include "lockstep/parallel/dist_config.h"
#include "lockstep/rl/rl_config.h"

using namespace lockstep;

namespace {

const std::string kSource = "fuzz/rl.toml";

std::vector<std::string> split_lines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find('\n', start), s.size());
    if (end > start) out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

void read_config(const toml::table& root) {
  fuzz::run_expecting_error([&] { rl::rl_config_from_toml(root, kSource); });
  fuzz::run_expecting_error([&] {
    TomlSection s(root["dist"].as_table(), kSource, "dist");
    parallel::dist_config_from_toml(s);
    s.finish();
  });
  fuzz::run_expecting_error([&] {
    TomlSection s(root["data"].as_table(), kSource, "data");
    data::data_config_from_toml(s);
    s.finish();
  });
  fuzz::run_expecting_error([&] {
    // An inline model: [model] without `path` (model_source.cpp).
    const toml::table* model = root["model"].as_table();
    if (!model) return;
    TomlSection s(model, kSource, "model");
    if (!s.get_string("path", "").empty()) return;
    s.get_string("chat_template", "auto");
    s.get_int("init_seed", 0);
    s.get_double("init_std", 0.02, 0.0, 10.0);
    precision_from_toml(root, kSource);
    device_from_toml(root, kSource);
    const ModelConfig c = model_config_from_toml(*model, kSource, kModelSourceKeys);
    // The TOML lockstep writes for an accepted config reads back as it.
    const std::string written = model_config_to_toml(c);
    LS_FUZZ_EXPECT(model_config_from_toml_string(written, "written.toml") == c, written);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string text(in.substr(0, nul));
  const std::vector<std::string> sets =
      nul == std::string_view::npos ? std::vector<std::string>{} : split_lines(in.substr(nul + 1));
  toml::table root;
  if (!fuzz::run_expecting_error([&] { root = parse_toml_with_overrides(text, kSource, sets); })) return 0;
  read_config(root);
  return 0;
}
