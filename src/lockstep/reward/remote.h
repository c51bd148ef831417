// Remote reward: POSTs {"prompt", "response", "label", "metadata"} as JSON
// to a configured http:// (or https://) URL and reads back {"reward": x} or a bare number.
// Each sample has a time budget; failed attempts (connection errors, 5xx,
// 408, 429, timeouts) are retried with exponential backoff; at most
// max_concurrency requests are in flight. Failures are reported, never
// turned into a zero reward.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

#include "lockstep/reward/reward.h"

namespace lockstep::reward {

struct ParsedUrl {
  std::string scheme = "http";  // http or https
  std::string host;
  int port = 80;
  std::string path = "/";
};
// http(s)://host[:port][/path]; throws Error for anything else.
ParsedUrl parse_http_url(const std::string& url);

class RemoteReward final : public Reward {
 public:
  explicit RemoteReward(const RewardOptions& options);
  RewardResult evaluate(const RewardRequest& request) const override;
  std::string type() const override { return "remote"; }
  int max_parallelism() const override { return max_concurrency_; }

 private:
  ParsedUrl url_;
  double timeout_s_, request_timeout_s_, backoff_s_;
  int retries_, max_concurrency_;
  // Concurrency limit: a counting semaphore shared by all callers.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable int in_flight_ = 0;
};

}  // namespace lockstep::reward
