// RemoteReward: one HTTP client per attempt (cpp-httplib), a deadline per
// sample that bounds every attempt, backoff sleep and slot wait.
#include "lockstep/reward/remote.h"

#include <httplib.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "lockstep/base/error.h"

namespace lockstep::reward {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_until(Clock::time_point t) { return std::chrono::duration<double>(t - Clock::now()).count(); }

void split_seconds(double s, time_t* sec, time_t* usec) {
  s = std::max(s, 0.001);
  *sec = static_cast<time_t>(s);
  *usec = static_cast<time_t>((s - static_cast<double>(*sec)) * 1e6);
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", s);
  return buf;
}

RewardResult parse_reply(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return RewardResult::failure_result("bad_reply: not JSON: " + body.substr(0, 100));
  RewardResult r;
  if (j.is_number()) {
    r.reward = j.get<double>();
    r.correct = r.reward > 0;
  } else if (j.is_object() && j.contains("reward") && j["reward"].is_number()) {
    r.reward = j["reward"].get<double>();
    auto c = j.find("correct");
    r.correct = (c != j.end() && c->is_boolean()) ? c->get<bool>() : r.reward > 0;
    auto e = j.find("extracted");
    if (e != j.end() && e->is_string()) r.extracted = e->get<std::string>();
  } else {
    return RewardResult::failure_result("bad_reply: expected {\"reward\": number} or a number, got " +
                                        j.dump().substr(0, 100));
  }
  if (!std::isfinite(r.reward)) return RewardResult::failure_result("bad_reply: reward is not finite");
  return r;
}

}  // namespace

ParsedUrl parse_http_url(const std::string& url) {
  ParsedUrl u;
  size_t sep = url.find("://");
  u.scheme = sep == std::string::npos ? "" : url.substr(0, sep);
  if (u.scheme != "http" && u.scheme != "https")
    LS_THROW << "reward.url: expected http://host:port/path or https://..., got '" << url << "'";
  u.port = u.scheme == "https" ? 443 : 80;
  std::string rest = url.substr(sep + 3);
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  u.path = slash == std::string::npos ? "/" : rest.substr(slash);
  size_t colon = hostport.rfind(':');
  u.host = hostport.substr(0, colon);
  if (colon != std::string::npos) {
    std::string port = hostport.substr(colon + 1);
    bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
    int p = digits ? std::stoi(port) : 0;
    if (p < 1 || p > 65535) LS_THROW << "reward.url: bad port '" << port << "' in '" << url << "'";
    u.port = p;
  }
  if (u.host.empty()) LS_THROW << "reward.url: missing host in '" << url << "'";
  return u;
}

RemoteReward::RemoteReward(const RewardOptions& options)
    : url_(parse_http_url(options.url)),
      timeout_s_(options.timeout_s),
      request_timeout_s_(options.request_timeout_s),
      backoff_s_(options.backoff_s),
      retries_(options.retries),
      max_concurrency_(options.max_concurrency) {}

RewardResult RemoteReward::evaluate(const RewardRequest& request) const {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s_));
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return in_flight_ < max_concurrency_; }))
      return RewardResult::failure_result("timeout: no request slot within " + fmt_seconds(timeout_s_) + " s");
    ++in_flight_;
  }
  struct Release {
    const RemoteReward* self;
    ~Release() {
      std::lock_guard<std::mutex> lk(self->mu_);
      --self->in_flight_;
      self->cv_.notify_one();
    }
  } release{this};

  nlohmann::json payload = {{"prompt", request.prompt},
                            {"response", request.response},
                            {"label", request.label},
                            {"metadata", request.metadata}};
  // Model output may hold invalid UTF-8: replace it rather than fail.
  std::string body = payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

  std::string last_error = "no attempt";
  bool last_timed_out = false;
  int attempts = 0;
  for (int attempt = 0; attempt <= retries_; ++attempt) {
    double left = seconds_until(deadline);
    if (left <= 0.001) {
      last_timed_out = true;
      break;
    }
    double per = request_timeout_s_ > 0 ? std::min(request_timeout_s_, left) : left;
    time_t sec, usec;
    split_seconds(per, &sec, &usec);
    httplib::Client cli(url_.scheme + "://" + url_.host + ":" + std::to_string(url_.port));
    cli.set_connection_timeout(sec, usec);
    cli.set_read_timeout(sec, usec);
    cli.set_write_timeout(sec, usec);
    ++attempts;
    auto t0 = Clock::now();
    auto res = cli.Post(url_.path, body, "application/json");
    double took = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!res) {
      // httplib reports a read timeout as a read error: tell them apart by time.
      last_timed_out = took >= 0.9 * per;
      last_error = last_timed_out ? "no reply within " + fmt_seconds(per) + " s"
                                  : "connection: " + httplib::to_string(res.error());
    } else if (res->status >= 200 && res->status < 300) {
      return parse_reply(res->body);
    } else if (res->status >= 500 || res->status == 429 || res->status == 408) {
      last_timed_out = false;
      last_error = "http " + std::to_string(res->status);
    } else {
      return RewardResult::failure_result("http " + std::to_string(res->status) + ": " + res->body.substr(0, 200));
    }
    if (attempt == retries_) break;
    double wait = backoff_s_ * std::pow(2.0, attempt);
    left = seconds_until(deadline);
    if (wait >= left) break;  // no time for another attempt: report the last error
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  std::string tail = " (" + std::to_string(attempts) + (attempts == 1 ? " attempt)" : " attempts)");
  if (last_timed_out)
    return RewardResult::failure_result("timeout: " + last_error + ", budget " + fmt_seconds(timeout_s_) + " s" + tail);
  if (last_error.rfind("http ", 0) == 0) return RewardResult::failure_result(last_error + ": retries exhausted" + tail);
  return RewardResult::failure_result(last_error + tail);
}

}  // namespace lockstep::reward
