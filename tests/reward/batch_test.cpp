// Tests for BatchScorer: order of results, statistics, exceptions, the
// per-sample time limit (stuck samples time out, workers are replaced, a
// scorer with stuck workers is destroyed without hanging).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
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
  auto finished = std::make_shared<std::atomic<int>>(0);
  auto reward = std::make_shared<FnReward>([finished](const RewardRequest& r) {
    if (r.response == "slow") sleep_s(1.0);
    ++*finished;
    RewardResult out;
    out.reward = 1;
    return out;
  });
  std::vector<std::string> texts = {"slow"};
  for (int i = 0; i < 30; ++i) texts.push_back("fast");
  {
    // One thread: a replacement worker takes the queue while the stuck one sleeps.
    // (Limits are generous against scheduling delays on a loaded machine.)
    BatchScorer scorer(reward, BatchOptions{1, 0.4, 5.0});
    BatchStats stats;
    auto results = scorer.score(requests(texts), &stats);
    EXPECT_EQ(results[0].failure, "timeout");
    for (size_t i = 1; i < results.size(); ++i) EXPECT_FALSE(results[i].failed()) << i;
    EXPECT_EQ(stats.timeouts, 1);
    EXPECT_EQ(stats.failures, 1);
    // The destructor waits (grace 5 s) for the stuck worker, which finishes in 1 s.
  }
  EXPECT_EQ(finished->load(), 31);  // the late result was computed, and dropped
}

TEST(Batch, DestroyingWithStuckWorkerDoesNotHang) {
  auto reward = std::make_shared<FnReward>([](const RewardRequest&) {
    sleep_s(0.5);
    return RewardResult{};
  });
  auto t0 = std::chrono::steady_clock::now();
  {
    BatchScorer scorer(reward, BatchOptions{2, 0.05, 0.05});
    auto results = scorer.score(requests({"a", "b", "c"}));
    for (const auto& r : results) EXPECT_EQ(r.failure, "timeout");
  }  // detaches the stuck workers after the 0.05 s grace
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("scored 3 stuck samples and destroyed the scorer in %.3f s\n", s);
  // Let the detached workers finish before the process exits (tidier under ASan).
  sleep_s(0.6);
}

TEST(Batch, ReplacesStuckWorkersUpToTheCap) {
  auto reward = std::make_shared<FnReward>([](const RewardRequest& r) {
    if (r.response == "slow") sleep_s(1.0);
    return RewardResult{};
  });
  std::vector<std::string> texts;
  for (int i = 0; i < 4; ++i) texts.push_back("slow");
  for (int i = 0; i < 40; ++i) texts.push_back("fast");
  BatchScorer scorer(reward, BatchOptions{2, 0.4, 3.0});
  BatchStats stats;
  auto results = scorer.score(requests(texts), &stats);
  EXPECT_EQ(stats.timeouts, 4);
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
