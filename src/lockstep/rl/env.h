// Environments of multi-turn rollouts (docs/agents.md): a sample's episode
// starts with reset(sample), which may replace the prompt, and after every
// model turn step(messages, completion) answers with an observation (a new
// user/tool message), a reward and whether the episode is done. Two kinds:
// a Python class instantiated once per sample in a pool of worker processes
// ([rollout] env = "python"), and an HTTP service speaking the same protocol
// as JSON POSTs ([rollout] env = "http://host:port/path").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/base/toml_section.h"
#include "lockstep/tokenizer/chat_template.h"

namespace lockstep::rl {

// [rollout]'s environment keys.
struct EnvConfig {
  std::string env;              // "" (single-turn), "python", or an http(s):// URL
  std::string path;             // env = "python": the file defining the class
  std::string class_name = "Env";
  std::string python = "python3";
  int workers = 4;              // python worker processes (instances are spread over them)
  double timeout_s = 30;        // one reset or step call; past it the sample fails
  int64_t max_turns = 4;        // model turns per episode
  // Tokens after the prompt, model turns and observations together (0: no
  // budget; max_turns and the model's context bound the episode).
  int64_t max_total_tokens = 0;
  std::string role = "user";    // the role of observation messages ("user", "tool")
  bool enabled() const { return !env.empty(); }
};

// Reads env, env_path, env_class, env_python, env_workers, env_timeout_s,
// max_turns, max_total_tokens and env_role from [rollout].
EnvConfig env_config_from_toml(TomlSection& s);

// What reset gave: the conversation to start from (messages), a prompt text
// used as is (prompt), or neither (the dataset's prompt stays).
struct EnvReset {
  std::optional<std::vector<tokenizer::ChatMessage>> messages;
  std::optional<std::string> prompt;
};

struct EnvStep {
  std::optional<std::string> observation;  // null: no new message (the episode ends)
  std::optional<double> reward;
  bool done = false;
};

// An environment call that failed (the user's exception, a crashed or hung
// worker, an HTTP error, a malformed reply): the sample fails, counted as an
// env failure, never scored 0 silently.
struct EnvFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Environment {
 public:
  virtual ~Environment() = default;
  // One episode per session id (unique within the process). Thread-safe:
  // different sessions are called from several threads at once. Throw
  // EnvFailure.
  virtual EnvReset reset(int64_t session, const nlohmann::json& sample) = 0;
  virtual EnvStep step(int64_t session, const std::vector<tokenizer::ChatMessage>& messages,
                       const std::string& completion) = 0;
  // The episode is over: its state may go (never throws).
  virtual void close(int64_t session) = 0;
};

// The environment `cfg` names; throws Error naming the key for a bad one.
std::unique_ptr<Environment> make_environment(const EnvConfig& cfg);

// The protocol's reply parsers (shared by both kinds); throw EnvFailure
// naming what is wrong. `where` prefixes the message.
EnvReset parse_env_reset(const nlohmann::json& j, const std::string& where);
EnvStep parse_env_step(const nlohmann::json& j, const std::string& where);
nlohmann::json messages_to_json(const std::vector<tokenizer::ChatMessage>& messages);

}  // namespace lockstep::rl
