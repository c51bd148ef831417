// PythonEnvironment: one instance of the user's class per session, made on
// reset; failures of any kind become EnvFailure naming the class and method.
#include "lockstep/rl/env_python.h"

#include "lockstep/base/error.h"

namespace lockstep::rl {

namespace {

std::string describe(const reward::PythonCallResult& r) {
  using S = reward::PythonCallResult::Status;
  switch (r.status) {
    case S::Ok: return "ok";
    case S::Error: return r.message;
    case S::Unconvertible: return "returned a value JSON cannot hold (" + r.message + ")";
    case S::Timeout: return "timed out (the worker was killed and restarts)";
    case S::Crashed: return "the worker crashed: " + r.message;
    case S::NoWorker: return r.message;
  }
  return "?";
}

}  // namespace

PythonEnvironment::PythonEnvironment(const EnvConfig& cfg) : cfg_(cfg) {
  reward::PythonPoolOptions o;
  o.python = cfg.python;
  o.file = cfg.path;
  o.functions = {cfg.class_name};
  o.workers = cfg.workers;
  pool_ = std::make_unique<reward::PythonPool>(o);
}

std::string PythonEnvironment::where(const std::string& method) const {
  const reward::PythonFunctionInfo& f = pool_->function(cfg_.class_name);
  return (f.line > 0 ? f.where() : f.file) + " " + cfg_.class_name + "." + method;
}

nlohmann::json PythonEnvironment::call(int64_t session, const std::string& method, const nlohmann::json& kwargs) {
  reward::PythonObject obj;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = objects_.find(session);
    LS_CHECK(it != objects_.end()) << "env: session " << session << " was never reset";
    obj = it->second;
  }
  reward::PythonCallResult r = pool_->call_method(obj, method, kwargs, cfg_.timeout_s);
  if (!r.ok()) {
    if (r.status == reward::PythonCallResult::Status::Timeout)
      throw EnvFailure(where(method) + ": no answer within env_timeout_s = " + std::to_string(cfg_.timeout_s) +
                       " s (the worker was killed)");
    if (r.status == reward::PythonCallResult::Status::NoWorker)
      throw EnvFailure(where(method) + ": no answer within env_timeout_s = " + std::to_string(cfg_.timeout_s) +
                       " s (the worker holding the instance stayed busy with another call: " + r.message + ")");
    throw EnvFailure(where(method) + ": " + describe(r));
  }
  return r.value;
}

EnvReset PythonEnvironment::reset(int64_t session, const nlohmann::json& sample) {
  reward::PythonObject obj;
  reward::PythonCallResult r = pool_->create(cfg_.class_name, nlohmann::json::object(), cfg_.timeout_s, &obj);
  if (!r.ok()) throw EnvFailure(where("__init__") + ": " + describe(r));
  {
    std::lock_guard<std::mutex> lk(mu_);
    objects_[session] = obj;
  }
  return parse_env_reset(call(session, "reset", {{"sample", sample}}), where("reset"));
}

EnvStep PythonEnvironment::step(int64_t session, const std::vector<tokenizer::ChatMessage>& messages,
                                const std::string& completion) {
  return parse_env_step(call(session, "step", {{"messages", messages_to_json(messages)}, {"completion", completion}}),
                        where("step"));
}

void PythonEnvironment::close(int64_t session) {
  reward::PythonObject obj;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = objects_.find(session);
    if (it == objects_.end()) return;
    obj = it->second;
    objects_.erase(it);
  }
  pool_->drop(obj, cfg_.timeout_s);
}

}  // namespace lockstep::rl
