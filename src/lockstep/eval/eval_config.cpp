// Parsing of the [eval] and [reward] config sections, and EvalConfig::validate.
#include "lockstep/eval/eval_config.h"

#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"

namespace lockstep::eval {

void EvalConfig::validate() const {
  if (name.empty()) LS_THROW << "eval.name must not be empty";
  if (name.find_first_of("/ \t\n") != std::string::npos)
    LS_THROW << "eval.name '" << excerpt(name)
             << "' must not contain '/' or whitespace (it is part of metric keys)";
  if (n < 1 || n > 1024) LS_THROW << "eval.n must be in [1, 1024], got " << n;
  rollout::SamplingParams p = sampling;
  p.n = n;
  p.validate();
  if (!p.stop.empty()) LS_THROW << "eval: stop strings are not supported; use stop token ids";
  reward.validate();
}

EvalSection eval_section_from_toml(TomlSection& s) {
  EvalSection e;
  EvalConfig& c = e.config;
  c.name = s.get_string("name", c.name);
  c.n = s.get_int("n", c.n, 1, 1024);
  c.sampling.temperature = float(s.get_double("temperature", c.sampling.temperature, 0.0, 1e6));
  c.sampling.top_p = float(s.get_double("top_p", c.sampling.top_p, 1e-9, 1.0));
  c.sampling.top_k = s.get_int("top_k", c.sampling.top_k);
  c.sampling.min_p = float(s.get_double("min_p", c.sampling.min_p, 0.0, 1.0));
  c.sampling.max_new_tokens = s.get_int("max_new_tokens", c.sampling.max_new_tokens, 1);
  c.seed = uint64_t(s.get_int("seed", int64_t(c.seed), 0));
  for (int64_t id : s.get_int_list("stop_token_ids", {})) {
    if (id < 0 || id > INT32_MAX)
      s.fail("stop_token_ids", "token id " + std::to_string(id) + " out of range");
    c.sampling.stop_token_ids.push_back(int32_t(id));
  }
  c.stop_at_end_of_turn = s.get_bool("stop_at_end_of_turn", c.stop_at_end_of_turn);
  e.interval = s.get_int("interval", e.interval, 0);
  e.output = s.get_string("output", e.output);
  e.summary = s.get_string("summary", e.summary);
  try {
    c.validate();
  } catch (const Error& err) {
    LS_THROW << s.source() << ": [eval] " << err.what();
  }
  return e;
}

nlohmann::json toml_to_json(const toml::node& node) {
  if (const auto* t = node.as_table()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : *t) j[std::string(k.str())] = toml_to_json(v);
    return j;
  }
  if (const auto* a = node.as_array()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : *a) j.push_back(toml_to_json(v));
    return j;
  }
  if (node.is_string()) return *node.value<std::string>();
  if (node.is_integer()) return *node.value<int64_t>();
  if (node.is_floating_point()) return *node.value<double>();
  if (node.is_boolean()) return *node.value<bool>();
  std::ostringstream os;  // date, time, date-time
  node.visit([&](const auto& v) { os << v; });
  return os.str();
}

reward::RewardOptions reward_options_from_toml(const toml::table* reward, const std::string& source) {
  if (!reward) return reward::RewardOptions::from_json(nlohmann::json::object());
  try {
    // A python reward's path was made absolute with the config's other paths
    // (the path rule, base/toml_section.h).
    return reward::RewardOptions::from_json(toml_to_json(*reward));
  } catch (const Error& err) {
    LS_THROW << source << ": [reward] " << err.what();
  }
}

data::PromptNeeds prompt_needs(const reward::RewardOptions& reward) {
  data::PromptNeeds needs;
  if (reward.type == "math" || reward.type == "exact") {
    needs.label = true;
    needs.why = "the " + reward.type + " reward needs a label";
  } else if (reward.type == "countdown") {
    needs.label = true;
    needs.metadata_for_label = true;
    needs.why = "the countdown reward needs a label, or the puzzle in data.metadata_key";
  }
  return needs;
}

}  // namespace lockstep::eval
