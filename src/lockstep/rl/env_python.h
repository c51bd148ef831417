// [rollout] env = "python": the user's class (env_class in env_path),
// instantiated once per sample in a pool of Python worker processes
// (reward::PythonPool); reset and step are its methods, called on the
// worker that holds the instance.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "lockstep/reward/python_pool.h"
#include "lockstep/rl/env.h"

namespace lockstep::rl {

class PythonEnvironment : public Environment {
 public:
  explicit PythonEnvironment(const EnvConfig& cfg);  // starts the workers; throws Error for a bad file or class
  EnvReset reset(int64_t session, const nlohmann::json& sample) override;
  EnvStep step(int64_t session, const std::vector<tokenizer::ChatMessage>& messages,
               const std::string& completion) override;
  void close(int64_t session) override;
  reward::PythonPool& pool() { return *pool_; }

 private:
  nlohmann::json call(int64_t session, const std::string& method, const nlohmann::json& kwargs);
  std::string where(const std::string& method) const;
  EnvConfig cfg_;
  std::unique_ptr<reward::PythonPool> pool_;
  std::mutex mu_;
  std::map<int64_t, reward::PythonObject> objects_;  // session -> its instance
};

}  // namespace lockstep::rl
