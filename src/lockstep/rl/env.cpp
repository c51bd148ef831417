// [rollout]'s environment keys and the protocol's reply parsers (the factory
// is env_factory.cpp).
#include "lockstep/rl/env.h"

#include <cmath>

#include "lockstep/base/error.h"

namespace lockstep::rl {

EnvConfig env_config_from_toml(TomlSection& s) {
  EnvConfig c;
  c.env = s.get_string("env", c.env);
  c.python = s.get_string("env_python", c.python);
  c.workers = int(s.get_int("env_workers", c.workers, 1, 1024));
  c.timeout_s = s.get_double("env_timeout_s", c.timeout_s, 0.001, 86400);
  // Single-turn: the multi-turn keys are refused, and not read; a saved
  // config holds no environment keys the user did not write.
  if (c.env.empty()) {
    for (const char* key : {"env_path", "env_class", "max_turns", "max_total_tokens", "env_role"})
      if (s.has(key)) s.fail(key, "only used with [rollout] env (multi-turn rollouts)");
    for (const char* key : {"env", "env_python", "env_workers", "env_timeout_s"}) s.not_saved(key);
    return c;
  }
  c.path = s.get_string("env_path", c.path);
  c.class_name = s.get_string("env_class", c.class_name);
  c.max_turns = s.get_int("max_turns", c.max_turns, 1, 1024);
  c.max_total_tokens = s.get_int("max_total_tokens", c.max_total_tokens, 0);
  c.role = s.get_string("env_role", c.role);
  if (c.env != "python" && c.env.rfind("http://", 0) != 0 && c.env.rfind("https://", 0) != 0)
    s.fail("env", "must be \"python\" or an http(s):// URL, got '" + c.env + "'");
  if (c.env == "python" && c.path.empty())
    s.fail("env_path", "env = \"python\" needs env_path (the .py file)");
  return c;
}

nlohmann::json messages_to_json(const std::vector<tokenizer::ChatMessage>& messages) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& m : messages) a.push_back({{"role", m.role}, {"content", m.content}});
  return a;
}

EnvReset parse_env_reset(const nlohmann::json& j, const std::string& where) {
  EnvReset r;
  if (j.is_null()) return r;
  if (j.is_string()) {
    r.prompt = j.get<std::string>();
    return r;
  }
  if (!j.is_array())
    throw EnvFailure(where +
                     ": reset must return a list of {\"role\", \"content\"} messages, a prompt string or "
                     "None, got " +
                     j.dump().substr(0, 100));
  std::vector<tokenizer::ChatMessage> msgs;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw EnvFailure(where + ": reset: every message needs string \"role\" and \"content\", got " +
                       m.dump().substr(0, 100));
    msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  if (msgs.empty()) throw EnvFailure(where + ": reset returned no messages");
  r.messages = std::move(msgs);
  return r;
}

EnvStep parse_env_step(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    throw EnvFailure(where +
                     ": step must return {\"observation\": str|None, \"reward\": float|None, \"done\": "
                     "bool}, got " +
                     j.dump().substr(0, 100));
  EnvStep s;
  for (const auto& [key, v] : j.items())
    if (key != "observation" && key != "reward" && key != "done")
      throw EnvFailure(where + ": step returned an unknown key '" + key + "' (observation, reward, done)");
  if (auto o = j.find("observation"); o != j.end() && !o->is_null()) {
    if (!o->is_string()) throw EnvFailure(where + ": step: \"observation\" must be a string or None");
    s.observation = o->get<std::string>();
  }
  if (auto r = j.find("reward"); r != j.end() && !r->is_null()) {
    if (!r->is_number() || !std::isfinite(r->get<double>()))
      throw EnvFailure(where + ": step: \"reward\" must be a finite number or None");
    s.reward = r->get<double>();
  }
  if (auto d = j.find("done"); d != j.end()) {
    if (!d->is_boolean()) throw EnvFailure(where + ": step: \"done\" must be a bool");
    s.done = d->get<bool>();
  }
  return s;
}

}  // namespace lockstep::rl
