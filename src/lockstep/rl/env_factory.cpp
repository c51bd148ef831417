// make_environment: the factory over the environment kinds. Apart from env.cpp
// so that code reading [rollout] links without the environments themselves.
#include "lockstep/base/error.h"
#include "lockstep/rl/env.h"
#include "lockstep/rl/env_http.h"
#include "lockstep/rl/env_python.h"

namespace lockstep::rl {

std::unique_ptr<Environment> make_environment(const EnvConfig& cfg) {
  if (cfg.env == "python") return std::make_unique<PythonEnvironment>(cfg);
  if (cfg.env.rfind("http", 0) == 0) return std::make_unique<HttpEnvironment>(cfg);
  LS_THROW << "[rollout] env: no environment configured";
}

}  // namespace lockstep::rl
