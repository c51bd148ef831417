// BatchScorer: a pool of worker threads fed from a queue, and a coordinator
// (the calling thread) that waits for results and enforces the per-sample
// time limit.
//
// Why a timed-out sample cannot corrupt anything or hang exit:
// - every task owns a shared_ptr to its job (requests copied, results), and
//   every worker a shared_ptr to the pool state and the reward, so nothing a
//   late worker touches can be freed under it;
// - a late result is stored only if the sample is still "running" (checked
//   under the lock); a timed-out sample is already "done";
// - the stuck worker is replaced so throughput holds, and it exits once it
//   finishes (verifiers are bounded, so it does finish);
// - the destructor waits a short grace period, then detaches workers still
//   stuck: they hold no reference to the BatchScorer itself.
#include "lockstep/reward/batch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/base/timer.h"
#include "lockstep/reward/python_reward.h"

namespace lockstep::reward {

namespace {
using Clock = std::chrono::steady_clock;

enum : uint8_t { kQueued = 0, kRunning = 1, kDone = 2 };

struct Job {
  std::vector<RewardRequest> requests;  // own copy: late workers never touch the caller's vector
  std::vector<RewardResult> results;
  std::vector<uint8_t> state;
  std::vector<Clock::time_point> started;
  std::vector<size_t> running;  // indices being scored now
  size_t remaining = 0;
};

struct Task {
  std::shared_ptr<Job> job;
  size_t index = 0;
};
}  // namespace

struct BatchScorer::Core {
  std::shared_ptr<const Reward> reward;
  std::mutex mu;
  std::condition_variable work_cv;  // workers: a task or stop
  std::condition_variable done_cv;  // coordinator: a result
  std::condition_variable exit_cv;  // destructor: a worker exited
  std::deque<Task> queue;
  bool stop = false;
  int target = 1;       // workers that should be free to take tasks
  int live = 0;         // worker threads inside worker_loop
  int stuck = 0;        // workers busy with a sample that already timed out
  int max_threads = 1;  // cap on live threads (target plus replacements)
  std::map<std::thread::id, std::thread> threads;
  std::vector<std::thread::id> finished;  // exited, waiting to be joined

  // Requires mu.
  void spawn(const std::shared_ptr<Core>& self) {
    ++live;
    std::thread t([self] { worker_loop(self); });
    auto id = t.get_id();
    threads.emplace(id, std::move(t));
  }

  // Requires mu. Joins workers that have exited (they no longer need mu).
  void reap() {
    for (auto id : finished) {
      auto it = threads.find(id);
      if (it == threads.end()) continue;
      it->second.join();
      threads.erase(it);
    }
    finished.clear();
  }

  static void worker_loop(std::shared_ptr<Core> c) {
    std::unique_lock<std::mutex> lk(c->mu);
    for (;;) {
      // A replacement took this worker's place while it was stuck: leave.
      if (c->stop || c->live - c->stuck > c->target) break;
      if (c->queue.empty()) {
        c->work_cv.wait(lk);
        continue;
      }
      Task t = std::move(c->queue.front());
      c->queue.pop_front();
      Job& j = *t.job;
      j.state[t.index] = kRunning;
      j.started[t.index] = Clock::now();
      j.running.push_back(t.index);
      // All samples share one time limit, so a new deadline is never the
      // earliest: the coordinator only needs waking when it had none.
      if (j.running.size() == 1) c->done_cv.notify_all();
      lk.unlock();

      RewardResult r;
      try {
        r = c->reward->evaluate(j.requests[t.index]);
      } catch (const std::exception& e) {
        r = RewardResult::failure_result(std::string("exception: ") + e.what());
      } catch (...) {
        r = RewardResult::failure_result("exception: unknown");
      }

      lk.lock();
      if (j.state[t.index] == kRunning) {
        j.results[t.index] = std::move(r);
        j.state[t.index] = kDone;
        j.running.erase(std::find(j.running.begin(), j.running.end(), t.index));
        // The coordinator sleeps until the earliest deadline; an early
        // finish only matters when it was the last sample.
        if (--j.remaining == 0) c->done_cv.notify_all();
      } else {
        --c->stuck;  // the sample timed out meanwhile; its result is dropped
      }
    }
    --c->live;
    c->finished.push_back(std::this_thread::get_id());
    c->exit_cv.notify_all();
    c->work_cv.notify_all();  // another idle worker may now be surplus, or needed
  }
};

BatchOptions batch_options_for(const RewardOptions& options) {
  BatchOptions b;
  b.threads = options.threads;
  // A python reward's calls wait on its worker processes, not on this
  // process's cores: one scoring thread per worker keeps every worker busy.
  if (options.type == "python" && options.threads == 0)
    b.threads = options.workers > 0 ? options.workers : default_python_workers();
  // Remote and python rewards enforce timeout_s themselves (and kill a hung
  // python worker): the batch limit is only their safety net.
  b.timeout_s = options.timeout_s + (options.type == "remote" || options.type == "python" ? 0.5 : 0.0);
  return b;
}

void BatchStats::add(const RewardResult& r) {
  ++n;
  if (r.failed()) {
    ++failures;
    if (r.failure.rfind("timeout", 0) == 0) ++timeouts;
    std::string reason = r.failure.substr(0, r.failure.find(':'));
    ++failure_reasons[reason];
    return;
  }
  if (r.correct) ++correct;
  reward_sum += r.reward;
  for (const auto& [k, v] : r.extra) {
    extra_sum[k] += v;
    ++extra_n[k];
  }
}

void BatchStats::merge(const BatchStats& o) {
  n += o.n;
  correct += o.correct;
  failures += o.failures;
  timeouts += o.timeouts;
  reward_sum += o.reward_sum;
  seconds += o.seconds;
  for (const auto& [k, v] : o.failure_reasons) failure_reasons[k] += v;
  for (const auto& [k, v] : o.extra_sum) extra_sum[k] += v;
  for (const auto& [k, v] : o.extra_n) extra_n[k] += v;
}

double BatchStats::reward_mean() const {
  int64_t ok = n - failures;
  return ok > 0 ? reward_sum / static_cast<double>(ok) : 0.0;
}

std::map<std::string, double> BatchStats::metrics() const {
  std::map<std::string, double> m = {{"rollout/reward_failures", static_cast<double>(failures)},
                                     {"rollout/reward_timeouts", static_cast<double>(timeouts)},
                                     {"rollout/reward_accuracy", accuracy()},
                                     {"rollout/reward_mean", reward_mean()}};
  for (const auto& [k, v] : extra_sum) m["reward/extra/" + k] = v / static_cast<double>(extra_n.at(k));
  return m;
}

BatchScorer::BatchScorer(std::shared_ptr<const Reward> reward, BatchOptions options)
    : core_(std::make_shared<Core>()), options_(options) {
  LS_CHECK(reward != nullptr) << "BatchScorer needs a reward";
  LS_CHECK(options.timeout_s > 0) << "timeout_s must be positive, got " << options.timeout_s;
  int n = options.threads > 0 ? options.threads : default_thread_count();
  if (reward->max_parallelism() > 0) n = std::min(n, reward->max_parallelism());
  n = std::max(n, 1);
  core_->reward = std::move(reward);
  core_->target = n;
  // Replacements for stuck workers are capped: past the cap, new samples
  // wait for a stuck worker to finish (verifiers are bounded, so they do).
  core_->max_threads = 2 * n + 4;
  std::lock_guard<std::mutex> lk(core_->mu);
  for (int i = 0; i < n; ++i) core_->spawn(core_);
}

BatchScorer::~BatchScorer() {
  std::unique_lock<std::mutex> lk(core_->mu);
  core_->stop = true;
  core_->work_cv.notify_all();
  auto grace = std::chrono::duration<double>(options_.exit_grace_s);
  core_->exit_cv.wait_for(lk, grace, [&] { return core_->live == 0; });
  core_->reap();
  // Still running: workers stuck in a timed-out sample. They own shared
  // references to everything they use, so they may finish on their own.
  for (auto& [id, t] : core_->threads) t.detach();
  core_->threads.clear();
}

int BatchScorer::threads() const { return core_->target; }

std::vector<RewardResult> BatchScorer::score(const std::vector<RewardRequest>& requests, BatchStats* stats) {
  Timer timer;
  auto job = std::make_shared<Job>();
  job->requests = requests;
  job->results.resize(requests.size());
  job->state.assign(requests.size(), kQueued);
  job->started.resize(requests.size());
  job->remaining = requests.size();
  auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s));

  Core& c = *core_;
  std::unique_lock<std::mutex> lk(c.mu);
  for (size_t i = 0; i < requests.size(); ++i) c.queue.push_back(Task{job, i});
  c.work_cv.notify_all();
  while (job->remaining > 0) {
    if (job->running.empty()) {
      c.done_cv.wait(lk);
    } else {
      auto deadline = Clock::time_point::max();
      for (size_t i : job->running) deadline = std::min(deadline, job->started[i] + limit);
      c.done_cv.wait_until(lk, deadline);
    }
    auto now = Clock::now();
    for (size_t k = 0; k < job->running.size();) {
      size_t i = job->running[k];
      if (now < job->started[i] + limit) {
        ++k;
        continue;
      }
      job->results[i] = RewardResult::failure_result("timeout");
      job->state[i] = kDone;
      job->running.erase(job->running.begin() + static_cast<std::ptrdiff_t>(k));
      --job->remaining;
      ++c.stuck;
      if (c.live - c.stuck < c.target && c.live < c.max_threads) c.spawn(core_);
    }
    c.reap();
  }
  std::vector<RewardResult> results = std::move(job->results);
  lk.unlock();
  if (stats) {
    BatchStats s;
    for (const auto& r : results) s.add(r);
    s.seconds = timer.seconds();
    stats->merge(s);
  }
  return results;
}

}  // namespace lockstep::reward
