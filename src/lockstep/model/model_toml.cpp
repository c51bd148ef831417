// The [model] keys that say how a model runs rather than what it is
// (precision, device), declared in model_source.h. Apart from the loaders so
// that config readers link without them.
#include "lockstep/base/toml_section.h"
#include "lockstep/model/model_source.h"

namespace lockstep {

PrecisionConfig precision_from_toml(const toml::table& root, const std::string& source) {
  TomlSection s(root["model"].as_table(), source, "model");
  const std::vector<std::string> kChoices = {"f32", "bf16", "fp8"};
  PrecisionConfig p;
  p.precision = s.get_enum("precision", "f32", kChoices);
  p.trainer_precision = s.get_enum("trainer_precision", p.precision, kChoices);
  p.fp8_block = s.get_int("fp8_block", 128, 0, 1 << 20);
  return p;
}

std::string device_from_toml(const toml::table& root, const std::string& source) {
  TomlSection s(root["model"].as_table(), source, "model");
  return s.get_enum("device", "cpu", {"cpu", "interpret", "cuda", "hip"});
}

}  // namespace lockstep
