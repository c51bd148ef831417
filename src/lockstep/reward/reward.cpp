// RewardOptions parsing and validation, RewardResult and Reward::score (the
// factory, which needs every reward, is make_reward.cpp).
#include "lockstep/reward/reward.h"

#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/reward/math_text.h"

namespace lockstep::reward {
namespace {

double get_number(const std::string& key, const nlohmann::json& v) {
  if (!v.is_number()) LS_THROW << "reward." << key << ": expected a number, got " << excerpt(v.dump());
  return v.get<double>();
}

int get_int(const std::string& key, const nlohmann::json& v) {
  if (!v.is_number_integer())
    LS_THROW << "reward." << key << ": expected an integer, got " << excerpt(v.dump());
  return v.get<int>();
}

bool get_bool(const std::string& key, const nlohmann::json& v) {
  if (!v.is_boolean()) LS_THROW << "reward." << key << ": expected true or false, got " << excerpt(v.dump());
  return v.get<bool>();
}

std::string get_string(const std::string& key, const nlohmann::json& v) {
  if (!v.is_string()) LS_THROW << "reward." << key << ": expected a string, got " << excerpt(v.dump());
  return v.get<std::string>();
}

}  // namespace

RewardResult RewardResult::failure_result(std::string reason) {
  RewardResult r;
  r.reward = std::nan("");
  r.failure = std::move(reason);
  return r;
}

RewardResult Reward::score(std::string_view response, const nlohmann::json& label,
                           const nlohmann::json& metadata, std::string_view prompt) const {
  RewardRequest req;
  req.prompt = std::string(prompt);
  req.response = std::string(response);
  req.label = label;
  req.metadata = metadata;
  try {
    return evaluate(req);
  } catch (const std::exception& e) {
    return RewardResult::failure_result(std::string("exception: ") + e.what());
  }
}

RewardOptions RewardOptions::from_json(const nlohmann::json& j) {
  if (!j.is_object()) LS_THROW << "reward options: expected a JSON object, got " << excerpt(j.dump());
  RewardOptions o;
  for (const auto& [key, v] : j.items()) {
    if (key == "type") {
      o.type = get_string(key, v);
    } else if (key == "extractors") {
      o.extractors.clear();
      if (v.is_string()) {  // "boxed,answer_is"
        std::string s = v.get<std::string>(), cur;
        for (char c : s + ",") {
          if (c == ',') {
            if (!cur.empty()) o.extractors.push_back(cur);
            cur.clear();
          } else if (c != ' ') {
            cur.push_back(c);
          }
        }
      } else if (v.is_array()) {
        for (const auto& e : v) o.extractors.push_back(get_string(key, e));
      } else {
        LS_THROW << "reward.extractors: expected a list of names, got " << excerpt(v.dump());
      }
    } else if (key == "tolerance") {
      o.tolerance = get_number(key, v);
    } else if (key == "correct_reward") {
      o.correct_reward = get_number(key, v);
    } else if (key == "incorrect_reward") {
      o.incorrect_reward = get_number(key, v);
    } else if (key == "format_reward") {
      if (v.is_null()) {
        o.format_reward.reset();
      } else {
        o.format_reward = get_number(key, v);
      }
    } else if (key == "strip") {
      o.strip = get_bool(key, v);
    } else if (key == "casefold") {
      o.casefold = get_bool(key, v);
    } else if (key == "url") {
      o.url = get_string(key, v);
    } else if (key == "timeout_s") {
      o.timeout_s = get_number(key, v);
    } else if (key == "request_timeout_s") {
      o.request_timeout_s = get_number(key, v);
    } else if (key == "retries") {
      o.retries = get_int(key, v);
    } else if (key == "backoff_s") {
      o.backoff_s = get_number(key, v);
    } else if (key == "max_concurrency") {
      o.max_concurrency = get_int(key, v);
    } else if (key == "threads") {
      o.threads = get_int(key, v);
    } else if (key == "path") {
      o.path = get_string(key, v);
    } else if (key == "function") {
      o.function = get_string(key, v);
    } else if (key == "workers") {
      o.workers = get_int(key, v);
    } else if (key == "python") {
      o.python = get_string(key, v);
    } else if (key == "max_failure_rate") {
      o.max_failure_rate = get_number(key, v);
    } else {
      LS_THROW
          << "reward: unknown option '" << excerpt(key)
          << "' (known: type, extractors, tolerance, correct_reward, incorrect_reward, format_reward, strip, "
             "casefold, url, timeout_s, request_timeout_s, retries, backoff_s, max_concurrency, threads, "
             "path, function, workers, python, max_failure_rate)";
    }
  }
  o.validate();
  return o;
}

nlohmann::json RewardOptions::to_json() const {
  nlohmann::json j;
  j["type"] = type;
  j["extractors"] = extractors;
  j["tolerance"] = tolerance;
  j["correct_reward"] = correct_reward;
  j["incorrect_reward"] = incorrect_reward;
  j["format_reward"] = format_reward ? nlohmann::json(*format_reward) : nlohmann::json(nullptr);
  j["strip"] = strip;
  j["casefold"] = casefold;
  j["url"] = url;
  j["timeout_s"] = timeout_s;
  j["request_timeout_s"] = request_timeout_s;
  j["retries"] = retries;
  j["backoff_s"] = backoff_s;
  j["max_concurrency"] = max_concurrency;
  j["threads"] = threads;
  j["path"] = path;
  j["function"] = function;
  j["workers"] = workers;
  j["python"] = python;
  j["max_failure_rate"] = max_failure_rate;
  return j;
}

void RewardOptions::validate() const {
  if (type != "math" && type != "countdown" && type != "exact" && type != "remote" && type != "python")
    LS_THROW << "reward.type: unknown reward type '" << excerpt(type)
             << "' (math, countdown, exact, remote, python)";
  for (const auto& e : extractors) {
    if (!extractor_from_name(e))
      LS_THROW << "reward.extractors: unknown extractor '" << excerpt(e)
               << "' (boxed, answer_tag, answer_is, answer_colon, last_math, last_number, whole)";
  }
  if (!(tolerance >= 0 && tolerance < 1)) LS_THROW << "reward.tolerance: must be in [0, 1), got " << tolerance;
  for (double r : {correct_reward, incorrect_reward})
    if (!std::isfinite(r)) LS_THROW << "reward.correct_reward/incorrect_reward: must be finite";
  if (format_reward && !std::isfinite(*format_reward)) LS_THROW << "reward.format_reward: must be finite";
  if (!(timeout_s > 0 && timeout_s <= 86400)) LS_THROW << "reward.timeout_s: must be in (0, 86400], got " << timeout_s;
  if (!(request_timeout_s >= 0 && request_timeout_s <= 86400))
    LS_THROW << "reward.request_timeout_s: must be in [0, 86400], got " << request_timeout_s;
  if (retries < 0 || retries > 20) LS_THROW << "reward.retries: must be in [0, 20], got " << retries;
  if (!(backoff_s >= 0 && backoff_s <= 60)) LS_THROW << "reward.backoff_s: must be in [0, 60], got " << backoff_s;
  if (max_concurrency < 1 || max_concurrency > 4096)
    LS_THROW << "reward.max_concurrency: must be in [1, 4096], got " << max_concurrency;
  if (threads < 0 || threads > 4096) LS_THROW << "reward.threads: must be in [0, 4096], got " << threads;
  if (!(max_failure_rate >= 0 && max_failure_rate <= 1))
    LS_THROW << "reward.max_failure_rate: must be in [0, 1], got " << max_failure_rate;
  if (workers < 0 || workers > 256) LS_THROW << "reward.workers: must be in [0, 256], got " << workers;
  if (type == "python") {
    if (path.empty()) LS_THROW << "reward.path: required for type 'python' (a .py file with " << excerpt(function) << ")";
    if (function.empty()) LS_THROW << "reward.function: must not be empty";
    if (python.empty()) LS_THROW << "reward.python: must not be empty";
  }
  if (type == "remote") {
    if (url.empty()) LS_THROW << "reward.url: required for type 'remote'";
    if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
      LS_THROW << "reward.url: expected an http:// or https:// URL, got '" << excerpt(url) << "'";
  }
}

double RewardOptions::effective_format_reward() const {
  if (format_reward) return *format_reward;
  return type == "countdown" ? 0.1 : incorrect_reward;
}

}  // namespace lockstep::reward
