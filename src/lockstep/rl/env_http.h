// [rollout] env = "http://host:port/path": the environment protocol as JSON
// POSTs to one URL, {"op": "reset", "session": id, "sample": {...}} ->
// the reset reply, {"op": "step", "session": id, "messages": [...],
// "completion": "..."} -> the step reply, {"op": "close", "session": id}
// (its reply is ignored). One connection per call, env_timeout_s each, at
// most env_workers calls in flight (a call waiting for a slot waits within
// its own deadline).
#pragma once

#include <condition_variable>
#include <mutex>

#include "lockstep/reward/remote.h"
#include "lockstep/rl/env.h"

namespace lockstep::rl {

class HttpEnvironment : public Environment {
 public:
  explicit HttpEnvironment(const EnvConfig& cfg);  // throws Error for a bad URL
  EnvReset reset(int64_t session, const nlohmann::json& sample) override;
  EnvStep step(int64_t session, const std::vector<tokenizer::ChatMessage>& messages,
               const std::string& completion) override;
  void close(int64_t session) override;

 private:
  nlohmann::json post(const nlohmann::json& body) const;  // throws EnvFailure
  EnvConfig cfg_;
  reward::ParsedUrl url_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable int in_flight_ = 0;
};

}  // namespace lockstep::rl
