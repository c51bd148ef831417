// PythonReward: start-up checks on the function the driver described, the
// verl keyword arguments, and the mapping of what came back (a value or a
// failure) onto RewardResult.
#include "lockstep/reward/python_reward.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"

namespace lockstep::reward {
namespace {

// Distinct tracebacks logged in full; later new ones are only counted.
constexpr size_t kMaxLoggedTracebacks = 50;
// The per-call limit of the pool is the sample's timeout_s; workers are
// restarted at most this long after a kill (the grace before SIGKILL).
constexpr double kKillGrace_s = 0.2;

// The Python name of a JSON value's type, for messages.
std::string python_type(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "None";
    case nlohmann::json::value_t::string: return "str";
    case nlohmann::json::value_t::array: return "list";
    case nlohmann::json::value_t::object: return "dict";
    case nlohmann::json::value_t::boolean: return "bool";
    default: return v.is_number_integer() ? "int" : "float";
  }
}

std::string fmt_seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

}  // namespace

nlohmann::json verl_kwargs(const RewardRequest& request) {
  const nlohmann::json& meta = request.metadata;
  nlohmann::json data_source = nullptr;
  nlohmann::json extra_info = meta;
  if (meta.is_object()) {
    if (auto d = meta.find("data_source"); d != meta.end()) data_source = *d;
    if (auto e = meta.find("extra_info"); e != meta.end()) extra_info = *e;
  }
  return {{"data_source", data_source},
          {"solution_str", request.response},
          {"ground_truth", request.label},
          {"extra_info", extra_info}};
}

int default_python_workers() {
  int hw = int(std::thread::hardware_concurrency());
  return std::clamp(hw, 1, 4);
}

PythonReward::PythonReward(const RewardOptions& options) : function_(options.function), timeout_s_(options.timeout_s) {
  PythonPoolOptions po;
  po.python = options.python;
  po.file = options.path;
  po.functions = {options.function};
  po.workers = options.workers > 0 ? options.workers : default_python_workers();
  po.kill_grace_s = kKillGrace_s;
  try {
    pool_ = std::make_unique<PythonPool>(po);
  } catch (const Error& e) {
    LS_THROW << "reward (type python, " << options.path << "): " << e.what();
  }
  const PythonFunctionInfo& f = pool_->function(function_);
  where_ = function_ + " (" + f.where() + ")";
  if (f.return_kinds) {
    const auto& k = *f.return_kinds;
    bool ok = std::find(k.begin(), k.end(), "number") != k.end() || std::find(k.begin(), k.end(), "dict") != k.end();
    if (!ok)
      LS_THROW << f.where() << ": " << function_ << " is annotated to return "
               << (k.empty() ? std::string("nothing") : k.front())
               << "; a reward function must return a number or a dict with 'score'";
  }
}

RewardResult PythonReward::from_return(const nlohmann::json& v) const {
  RewardResult r;
  auto bad = [&](const std::string& what) {
    return RewardResult::failure_result("bad_return: " + where_ + " returned " + what +
                                        ", expected a number or a dict with 'score'");
  };
  if (v.is_number() || v.is_boolean()) {
    r.reward = v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
    r.correct = r.reward > 0;
    return r;
  }
  if (!v.is_object()) return bad(python_type(v));
  auto s = v.find("score");
  if (s == v.end()) return bad("a dict without 'score'");
  if (!s->is_number() && !s->is_boolean()) return bad("a dict whose 'score' is " + python_type(*s));
  r.reward = s->is_boolean() ? (s->get<bool>() ? 1.0 : 0.0) : s->get<double>();
  r.correct = r.reward > 0;
  for (const auto& [key, x] : v.items()) {
    if (key == "score") continue;
    if (x.is_number()) r.extra[key] = x.get<double>();
    if (x.is_boolean()) r.extra[key] = x.get<bool>() ? 1.0 : 0.0;
  }
  // verl's conventions: "acc" says whether the answer is right, "pred" what it was.
  for (const char* key : {"acc", "correct"}) {
    auto c = v.find(key);
    if (c != v.end() && (c->is_boolean() || c->is_number()))
      r.correct = c->is_boolean() ? c->get<bool>() : c->get<double>() > 0;
  }
  for (const char* key : {"pred", "extracted"}) {
    auto p = v.find(key);
    if (p != v.end() && p->is_string()) r.extracted = p->get<std::string>();
  }
  return r;
}

RewardResult PythonReward::from_failure(const PythonCallResult& c) const {
  using S = PythonCallResult::Status;
  switch (c.status) {
    case S::Error:
      log_traceback(c.traceback.empty() ? c.message : c.traceback);
      return RewardResult::failure_result("python: " + c.message);
    case S::Unconvertible:
      return RewardResult::failure_result("bad_return: " + where_ + " returned " + c.message +
                                          ", expected a number or a dict with 'score'");
    case S::Timeout:
      return RewardResult::failure_result("timeout: " + where_ + " ran past " + fmt_seconds(timeout_s_) +
                                          " s; its worker was killed and is restarted");
    case S::Crashed:
      return RewardResult::failure_result("crashed: the python worker died while scoring (" + c.message +
                                          "); it is restarted");
    case S::NoWorker:
    default:
      return RewardResult::failure_result("timeout: " + c.message);
  }
}

void PythonReward::log_traceback(const std::string& traceback) const {
  const size_t h = std::hash<std::string>{}(traceback);
  std::lock_guard<std::mutex> lk(log_mu_);
  if (logged_.count(h)) return;
  if (logged_.size() >= kMaxLoggedTracebacks) {
    if (!log_capped_) {
      LS_LOG(Warn) << "python reward: " << kMaxLoggedTracebacks << " distinct tracebacks logged; further ones are not";
    }
    log_capped_ = true;
    return;
  }
  logged_.insert(h);
  LS_LOG(Warn) << "python reward " << where_ << " raised (logged once per distinct traceback):\n" << traceback;
}

RewardResult PythonReward::evaluate(const RewardRequest& request) const {
  PythonCallResult c = pool_->call(function_, verl_kwargs(request), timeout_s_);
  if (!c.ok()) return from_failure(c);
  RewardResult r = from_return(c.value);
  if (!r.failed() && !std::isfinite(r.reward))
    return RewardResult::failure_result("bad_return: " + where_ + " returned a non-finite score");
  return r;
}

}  // namespace lockstep::reward
