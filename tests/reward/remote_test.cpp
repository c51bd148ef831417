// Tests for RemoteReward against a real HTTP server (cpp-httplib) that the
// test starts on 127.0.0.1 with an ephemeral port: replies as an object or a
// bare number, slow endpoint -> timeout, 500 -> retries then failure, bad
// JSON, 4xx without retry, refused connection, the concurrency limit.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/reward/batch.h"
#include "lockstep/reward/remote.h"

namespace lockstep::reward {
namespace {

class TestServer {
 public:
  TestServer() {
    svr_.Post("/grade", [](const httplib::Request& req, httplib::Response& res) {
      auto j = nlohmann::json::parse(req.body, nullptr, false);
      if (j.is_discarded() || !j.contains("prompt") || !j.contains("response") || !j.contains("label") ||
          !j.contains("metadata")) {
        res.status = 400;
        res.set_content("missing fields", "text/plain");
        return;
      }
      bool ok = j["response"] == j["label"];
      nlohmann::json out = {{"reward", ok ? 1.0 : 0.0}, {"correct", ok}, {"extracted", j["response"]}};
      res.set_content(out.dump(), "application/json");
    });
    svr_.Post("/bare", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("0.75", "application/json");
    });
    // Answers only when the server stops (60 s at most): slower than any
    // time limit, however loaded the machine.
    svr_.Post("/slow", [this](const httplib::Request&, httplib::Response& res) {
      std::unique_lock<std::mutex> lk(slow_mu_);
      slow_cv_.wait_for(lk, std::chrono::seconds(60), [this] { return stopping_; });
      res.set_content("1", "application/json");
    });
    svr_.Post("/fail500", [this](const httplib::Request&, httplib::Response& res) {
      ++hits_500;
      res.status = 500;
      res.set_content("oops", "text/plain");
    });
    svr_.Post("/flaky", [this](const httplib::Request&, httplib::Response& res) {
      if (++hits_flaky <= 2) {
        res.status = 503;
        return;
      }
      res.set_content("{\"reward\": 1}", "application/json");
    });
    svr_.Post("/badjson", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{not json", "application/json");
    });
    svr_.Post("/wrongshape", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"score\": 1}", "application/json");
    });
    svr_.Post("/forbidden", [this](const httplib::Request&, httplib::Response& res) {
      ++hits_403;
      res.status = 403;
      res.set_content("no", "text/plain");
    });
    svr_.Post("/busy", [this](const httplib::Request&, httplib::Response& res) {
      int now = ++in_flight;
      int seen = max_in_flight.load();
      while (now > seen && !max_in_flight.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      --in_flight;
      res.set_content("1", "application/json");
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    for (int i = 0; i < 500 && !svr_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~TestServer() {
    {
      std::lock_guard<std::mutex> lk(slow_mu_);
      stopping_ = true;
    }
    slow_cv_.notify_all();
    svr_.stop();
    thread_.join();
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

  std::atomic<int> hits_500{0}, hits_flaky{0}, hits_403{0}, in_flight{0}, max_in_flight{0};

 private:
  httplib::Server svr_;
  std::mutex slow_mu_;
  std::condition_variable slow_cv_;
  bool stopping_ = false;
  std::thread thread_;
  int port_ = 0;
};

RewardOptions remote(const std::string& url) {
  RewardOptions o;
  o.type = "remote";
  o.url = url;
  o.timeout_s = 5;
  o.retries = 2;
  o.backoff_s = 0.01;
  return o;
}

TEST(Remote, ObjectReplyAndRequestFields) {
  TestServer s;
  RemoteReward r(remote(s.url("/grade")));
  auto ok = r.score("42", "42", nlohmann::json{{"id", 7}}, "What is 6*7?");
  EXPECT_FALSE(ok.failed()) << ok.failure;
  EXPECT_DOUBLE_EQ(ok.reward, 1.0);
  EXPECT_TRUE(ok.correct);
  EXPECT_EQ(ok.extracted, "42");
  auto wrong = r.score("41", "42");
  EXPECT_FALSE(wrong.failed());
  EXPECT_DOUBLE_EQ(wrong.reward, 0.0);
  EXPECT_FALSE(wrong.correct);
}

TEST(Remote, BareNumberReply) {
  TestServer s;
  auto res = RemoteReward(remote(s.url("/bare"))).score("x", "y");
  EXPECT_FALSE(res.failed()) << res.failure;
  EXPECT_DOUBLE_EQ(res.reward, 0.75);
  EXPECT_TRUE(res.correct);  // no "correct" field: reward > 0
}

TEST(Remote, SlowEndpointTimesOut) {
  TestServer s;
  RewardOptions o = remote(s.url("/slow"));
  o.timeout_s = 0.25;
  o.retries = 0;
  auto res = RemoteReward(o).score("x", "y");
  ASSERT_TRUE(res.failed());
  EXPECT_EQ(res.failure.rfind("timeout", 0), 0u) << res.failure;
  EXPECT_TRUE(std::isnan(res.reward));
}

TEST(Remote, ServerErrorRetriesThenFails) {
  TestServer s;
  auto res = RemoteReward(remote(s.url("/fail500"))).score("x", "y");
  ASSERT_TRUE(res.failed());
  EXPECT_EQ(res.failure.rfind("http 500", 0), 0u) << res.failure;
  EXPECT_NE(res.failure.find("3 attempts"), std::string::npos) << res.failure;
  EXPECT_EQ(s.hits_500.load(), 3);  // the first try and 2 retries
}

TEST(Remote, RetriesRecoverFromTransientErrors) {
  TestServer s;
  auto res = RemoteReward(remote(s.url("/flaky"))).score("x", "y");
  EXPECT_FALSE(res.failed()) << res.failure;
  EXPECT_DOUBLE_EQ(res.reward, 1.0);
  EXPECT_EQ(s.hits_flaky.load(), 3);
}

TEST(Remote, BadRepliesAreFailures) {
  TestServer s;
  auto bad = RemoteReward(remote(s.url("/badjson"))).score("x", "y");
  ASSERT_TRUE(bad.failed());
  EXPECT_EQ(bad.failure.rfind("bad_reply", 0), 0u) << bad.failure;
  auto shape = RemoteReward(remote(s.url("/wrongshape"))).score("x", "y");
  ASSERT_TRUE(shape.failed());
  EXPECT_EQ(shape.failure.rfind("bad_reply", 0), 0u) << shape.failure;
  auto forbidden = RemoteReward(remote(s.url("/forbidden"))).score("x", "y");
  ASSERT_TRUE(forbidden.failed());
  EXPECT_EQ(forbidden.failure.rfind("http 403", 0), 0u) << forbidden.failure;
  EXPECT_EQ(s.hits_403.load(), 1);  // client errors are not retried
  auto missing = RemoteReward(remote(s.url("/nope"))).score("x", "y");
  EXPECT_EQ(missing.failure.rfind("http 404", 0), 0u) << missing.failure;
}

TEST(Remote, RefusedConnectionIsAFailure) {
  int port;
  {
    TestServer s;  // take a free port, then close it
    port = std::stoi(s.url("").substr(std::string("http://127.0.0.1:").size()));
  }
  RewardOptions o = remote("http://127.0.0.1:" + std::to_string(port) + "/x");
  o.retries = 1;
  auto res = RemoteReward(o).score("x", "y");
  ASSERT_TRUE(res.failed());
  EXPECT_NE(res.failure.find("2 attempts"), std::string::npos) << res.failure;
}

TEST(Remote, ConcurrencyLimitHolds) {
  TestServer s;
  RewardOptions o = remote(s.url("/busy"));
  o.max_concurrency = 2;
  auto r = std::make_shared<RemoteReward>(o);
  // Callers beyond the limit wait for a slot: 8 threads, at most 2 requests in flight.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      if (!r->score("x", "y").failed()) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_LE(s.max_in_flight.load(), 2);
  EXPECT_GE(s.max_in_flight.load(), 1);
  // Through a BatchScorer the thread count is capped by the limit too.
  BatchScorer scorer(r, batch_options_for(o));
  EXPECT_EQ(scorer.threads(), 2);
  std::vector<RewardRequest> reqs(6);
  BatchStats stats;
  scorer.score(reqs, &stats);
  EXPECT_EQ(stats.failures, 0);
}

TEST(Remote, UrlParsing) {
  auto u = parse_http_url("http://127.0.0.1:8080/a/b");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 8080);
  EXPECT_EQ(u.path, "/a/b");
  EXPECT_EQ(parse_http_url("http://localhost").path, "/");
  EXPECT_EQ(parse_http_url("http://localhost").port, 80);
  EXPECT_THROW(parse_http_url("ftp://x"), Error);
  EXPECT_THROW(parse_http_url("http://host:99999/"), Error);
  EXPECT_THROW(parse_http_url("http://:80/"), Error);
}

}  // namespace
}  // namespace lockstep::reward
