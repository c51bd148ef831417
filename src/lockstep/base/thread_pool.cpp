// ThreadPool: workers sleep on a condition variable between jobs; the caller
// takes task 0 itself so a pool of T threads starts T-1 workers.
#include "lockstep/base/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

#include "lockstep/base/error.h"

namespace lockstep {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  LS_CHECK(n_threads >= 1) << "thread count must be >= 1, got " << n_threads;
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= job_tasks_) continue;
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(index);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::run_on_workers(int n_tasks, const std::function<void(int)>& fn) {
  LS_CHECK(n_tasks >= 1 && n_tasks <= n_threads_) << "n_tasks=" << n_tasks << " pool size=" << n_threads_;
  if (n_tasks == 1) {
    fn(0);
    return;
  }
  std::lock_guard<std::mutex> job_lock(job_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_tasks_ = n_tasks;
    pending_ = n_tasks - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr err;
  try {
    fn(0);
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (!err) err = error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t useful = std::max<int64_t>(1, n / grain);
  const int tasks = static_cast<int>(std::min<int64_t>(n_threads_, useful));
  if (tasks == 1) {
    fn(0, n);
    return;
  }
  run_on_workers(tasks, [&](int t) {
    const int64_t begin = n * t / tasks;
    const int64_t end = n * (t + 1) / tasks;
    if (begin < end) fn(begin, end);
  });
}

int default_thread_count() {
  if (const char* env = std::getenv("LOCKSTEP_THREADS")) {
    try {
      int n = std::stoi(env);
      if (n >= 1) return n;
    } catch (const std::exception&) {
    }
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::unique_ptr<ThreadPool> make_pool(int64_t threads) {
  return std::make_unique<ThreadPool>(threads > 0 ? int(threads) : default_thread_count());
}

}  // namespace lockstep
