// Fuzz target: a Hugging Face config.json read into a ModelConfig (every
// supported architecture, DeepSeek-V4's keys included). A config that loads
// must also survive lockstep's own writers: config.json and the TOML [model]
// section it writes read back as the same ModelConfig.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_common.h"
#include "lockstep/model/config.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file("config.json");
  file.set(data, size);
  ModelConfig c;
  if (!fuzz::run_expecting_error([&] { c = load_hf_config(file.path()); })) return 0;
  // What lockstep writes from a config it accepted must read back unchanged.
  const nlohmann::json written = model_config_to_hf_json(c, DType::BF16);
  const ModelConfig again =
      model_config_from_hf_json(nlohmann::json::parse(written.dump()), "written config.json");
  LS_FUZZ_EXPECT(again == c, "config.json round trip changed the config: " + written.dump());
  const std::string toml = model_config_to_toml(c);
  const ModelConfig from_toml = model_config_from_toml_string(toml, "written model.toml");
  LS_FUZZ_EXPECT(from_toml == c, "TOML round trip changed the config: " + toml);
  return 0;
}
