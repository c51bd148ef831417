// HttpEnvironment: one cpp-httplib client per call, bounded by env_timeout_s.
#include "lockstep/rl/env_http.h"

#include <httplib.h>

#include <chrono>

#include "lockstep/base/error.h"

namespace lockstep::rl {

HttpEnvironment::HttpEnvironment(const EnvConfig& cfg) : cfg_(cfg) {
  try {
    url_ = reward::parse_http_url(cfg.env);
  } catch (const Error& e) {
    LS_THROW << "[rollout] env: " << e.what();
  }
}

nlohmann::json HttpEnvironment::post(const nlohmann::json& body) const {
  const std::string op = body.value("op", "");
  const std::string where = cfg_.env + " (" + op + ")";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(cfg_.timeout_s));
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return in_flight_ < cfg_.workers; }))
      throw EnvFailure(where + ": no request slot within env_timeout_s (env_workers = " + std::to_string(cfg_.workers) +
                       " calls in flight)");
    ++in_flight_;
  }
  struct Release {
    const HttpEnvironment* self;
    ~Release() {
      std::lock_guard<std::mutex> lk(self->mu_);
      --self->in_flight_;
      self->cv_.notify_one();
    }
  } release{this};
  httplib::Client cli(url_.scheme + "://" + url_.host + ":" + std::to_string(url_.port));
  const auto sec = time_t(cfg_.timeout_s);
  const auto usec = time_t((cfg_.timeout_s - double(sec)) * 1e6);
  cli.set_connection_timeout(sec, usec);
  cli.set_read_timeout(sec, usec);
  cli.set_write_timeout(sec, usec);
  // Model output may hold invalid UTF-8: replace it rather than fail.
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  auto res = cli.Post(url_.path, text, "application/json");
  if (!res)
    throw EnvFailure(where + ": no reply within env_timeout_s = " + std::to_string(cfg_.timeout_s) + " s (" +
                     httplib::to_string(res.error()) + ")");
  if (res->status != 200)
    throw EnvFailure(where + ": HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200));
  auto j = nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw EnvFailure(where + ": the reply is not JSON: " + res->body.substr(0, 100));
  return j;
}

EnvReset HttpEnvironment::reset(int64_t session, const nlohmann::json& sample) {
  return parse_env_reset(post({{"op", "reset"}, {"session", session}, {"sample", sample}}), cfg_.env + " (reset)");
}

EnvStep HttpEnvironment::step(int64_t session, const std::vector<tokenizer::ChatMessage>& messages,
                              const std::string& completion) {
  return parse_env_step(post({{"op", "step"},
                              {"session", session},
                              {"messages", messages_to_json(messages)},
                              {"completion", completion}}),
                        cfg_.env + " (step)");
}

void HttpEnvironment::close(int64_t session) {
  try {
    post({{"op", "close"}, {"session", session}});
  } catch (const EnvFailure&) {
    // the episode is over either way
  }
}

}  // namespace lockstep::rl
