// Tests for BatchScorer: order of results, statistics, exceptions, the
// per-sample time limit (stuck samples time out, workers are replaced, a
// scorer with stuck workers is destroyed without hanging).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "lockstep/reward/batch.h"

namespace lockstep::reward {
namespace {

// A reward defined by a function; the function must only touch state it
// owns (captured by value or shared_ptr), since a timed-out call may
// outlive the test body.
class FnReward final : public Reward {
 public:
  explicit FnReward(std::function<RewardResult(const RewardRequest&)> fn, int max_par = 0)
      : fn_(std::move(fn)), max_par_(max_par) {}
  RewardResult evaluate(const RewardRequest& r) const override { return fn_(r); }
  std::string type() const override { return "test"; }
  int max_parallelism() const override { return max_par_; }

 private:
  std::function<RewardResult(const RewardRequest&)> fn_;
  int max_par_;
};

std::vector<RewardRequest> requests(const std::vector<std::string>& responses) {
  std::vector<RewardRequest> out;
  for (const auto& r : responses) {
    RewardRequest q;
    q.response = r;
    q.label = "x";
    out.push_back(q);
  }
  return out;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Holds stuck samples until the test opens it, so that a sample is stuck
// however slow the machine is (and the limits can be generous). Capped at
// 60 s so that a failing test cannot block forever.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, std::chrono::seconds(60), [&] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
    cv.notify_all();
  }
};

// Waits (60 s at most) until `n` calls have finished.
bool wait_for_count(const std::atomic<int>& count, int n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count.load() < n && std::chrono::steady_clock::now() < deadline) sleep_s(0.01);
  return count.load() >= n;
}

TEST(Batch, ResultsInOrderWithStats) {
  auto reward = std::make_shared<FnReward>([](const RewardRequest& r) {
    RewardResult out;
    out.reward = std::stod(r.response);
    out.correct = static_cast<int>(out.reward) % 2 == 0;
    return out;
  });
  BatchScorer scorer(reward, BatchOptions{4, 10.0, 1.0});
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(std::to_string(i));
  BatchStats stats;
  auto results = scorer.score(requests(texts), &stats);
  ASSERT_EQ(results.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(results[static_cast<size_t>(i)].reward, i);
  EXPECT_EQ(stats.n, 200);
  EXPECT_EQ(stats.correct, 100);
  EXPECT_EQ(stats.failures, 0);
  EXPECT_DOUBLE_EQ(stats.reward_mean(), 99.5);
  // The scorer is reusable; stats accumulate.
  scorer.score(requests({"1", "2"}), &stats);
  EXPECT_EQ(stats.n, 202);
  EXPECT_TRUE(scorer.score({}).empty());
}

TEST(Batch, ExceptionsAndFailuresAreCountedNotScoredWrong) {
  auto reward = std::make_shared<FnReward>([](const RewardRequest& r) -> RewardResult {
    if (r.response == "boom") throw std::runtime_error("kaput");
    if (r.response == "bad") return RewardResult::failure_result("bad_label: nope");
    RewardResult ok;
    ok.reward = 1;
    ok.correct = true;
    return ok;
  });
  BatchScorer scorer(reward, BatchOptions{2, 10.0, 1.0});
  BatchStats stats;
  auto results = scorer.score(requests({"ok", "boom", "bad", "ok"}), &stats);
  EXPECT_FALSE(results[0].failed());
  EXPECT_EQ(results[1].failure, "exception: kaput");
  EXPECT_TRUE(std::isnan(results[1].reward));
  EXPECT_EQ(results[2].failure, "bad_label: nope");
  EXPECT_EQ(stats.failures, 2);
  EXPECT_EQ(stats.failure_reasons["exception"], 1);
  EXPECT_EQ(stats.failure_reasons["bad_label"], 1);
  EXPECT_DOUBLE_EQ(stats.reward_mean(), 1.0);  // failures are not averaged in
  auto m = stats.metrics();
  EXPECT_EQ(m.at("rollout/reward_failures"), 2.0);
  EXPECT_EQ(m.count("rollout/reward_timeouts"), 1u);
}

TEST(Batch, SlowSampleTimesOutOthersFinish) {
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<int>>(0);
  auto reward = std::make_shared<FnReward>([gate, finished](const RewardRequest& r) {
    if (r.response == "slow") gate->wait();
    ++*finished;
    RewardResult out;
    out.reward = 1;
    return out;
  });
  std::vector<std::string> texts = {"slow"};
  for (int i = 0; i < 30; ++i) texts.push_back("fast");
  {
    // One thread: a replacement worker takes the queue while the stuck one
    // waits. A fast sample takes microseconds, its limit is 2 s; the slow one
    // is held until score() returns, so it times out on any machine.
    BatchScorer scorer(reward, BatchOptions{1, 2.0, 60.0});
    BatchStats stats;
    auto results = scorer.score(requests(texts), &stats);
    ASSERT_EQ(results.size(), texts.size());
    EXPECT_EQ(results[0].failure, "timeout");
    for (size_t i = 1; i < results.size(); ++i) EXPECT_FALSE(results[i].failed()) << i;
    EXPECT_EQ(stats.timeouts, 1);
    EXPECT_EQ(stats.failures, 1);
    EXPECT_EQ(finished->load(), 30);  // the slow one is still held
    gate->release();
    // The destructor waits (grace 60 s) for the stuck worker, now free.
  }
  EXPECT_EQ(finished->load(), 31);  // the late result was computed, and dropped
}

// The destructor must not wait for workers stuck in timed-out samples: they
// are held until after it returns, so a destructor that joined them would
// only return when the gate's 60 s cap ran out, with their calls finished.
TEST(Batch, DestroyingWithStuckWorkerDoesNotHang) {
  auto gate = std::make_shared<Gate>();
  auto started = std::make_shared<std::atomic<int>>(0), finished = std::make_shared<std::atomic<int>>(0);
  auto reward = std::make_shared<FnReward>([gate, started, finished](const RewardRequest&) {
    ++*started;
    gate->wait();
    ++*finished;
    return RewardResult{};
  });
  {
    BatchScorer scorer(reward, BatchOptions{2, 0.05, 0.05});
    BatchStats stats;
    auto results = scorer.score(requests({"a", "b", "c"}), &stats);
    ASSERT_EQ(results.size(), 3u);
    for (const auto& r : results) EXPECT_EQ(r.failure, "timeout");
    EXPECT_EQ(stats.timeouts, 3);
    EXPECT_EQ(started->load(), 3);  // each sample ran, on a worker of its own
  }  // detaches the stuck workers after the 0.05 s grace
  EXPECT_EQ(finished->load(), 0) << "the destructor waited for the stuck workers";
  // Let the detached workers finish before the process exits (tidier under ASan).
  gate->release();
  EXPECT_TRUE(wait_for_count(*finished, 3));
}

TEST(Batch, ReplacesStuckWorkersUpToTheCap) {
  auto gate = std::make_shared<Gate>();
  auto reward = std::make_shared<FnReward>([gate](const RewardRequest& r) {
    if (r.response == "slow") gate->wait();
    return RewardResult{};
  });
  std::vector<std::string> texts;
  for (int i = 0; i < 4; ++i) texts.push_back("slow");
  for (int i = 0; i < 40; ++i) texts.push_back("fast");
  // Two threads, four samples stuck until score() returns: the fast ones
  // finish only because replacements take them (limit 1 s, for microseconds).
  BatchScorer scorer(reward, BatchOptions{2, 1.0, 60.0});
  BatchStats stats;
  auto results = scorer.score(requests(texts), &stats);
  gate->release();
  ASSERT_EQ(results.size(), texts.size());
  EXPECT_EQ(stats.timeouts, 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(results[i].failure, "timeout") << i;
  for (size_t i = 4; i < results.size(); ++i) EXPECT_FALSE(results[i].failed()) << i;
}

TEST(Batch, RemoteParallelismCapsThreads) {
  auto reward = std::make_shared<FnReward>([](const RewardRequest&) { return RewardResult{}; }, 2);
  BatchScorer scorer(reward, BatchOptions{8, 1.0, 1.0});
  EXPECT_EQ(scorer.threads(), 2);
  RewardOptions o;
  o.type = "remote";
  o.timeout_s = 3;
  EXPECT_GT(batch_options_for(o).timeout_s, 3.0);  // the remote reports its own timeout first
}

}  // namespace
}  // namespace lockstep::reward
