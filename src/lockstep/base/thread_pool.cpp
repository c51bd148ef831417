// ThreadPool: the caller takes task 0 itself, so a pool of T threads starts
// T-1 workers. Between jobs a worker first polls the job counter for a while
// (LOCKSTEP_SPIN_US), then sleeps on a condition variable; the caller likewise
// polls for its job's end before it sleeps. A decode step runs dozens of small
// parallel regions a few microseconds apart, and a futex wake-up on each of
// them cost more than the regions (a quarter of a batch-1 decode step in a
// profile). Only scheduling changes: which thread runs which range is the same.
#include "lockstep/base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

#include "lockstep/base/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lockstep {

namespace {

// Processes of this job on this node: the local size an MPI launcher
// exports (Open MPI, MPICH, Slurm), else 1.
int64_t local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* env = std::getenv(name)) {
      try {
        const long n = std::stol(env);
        if (n >= 1) return n;
      } catch (const std::exception&) {
      }
    }
  }
  return 1;
}

// LOCKSTEP_SPIN_US when set. Otherwise 250 us when every thread of this job
// on the node has a core of its own (a batch-1 decode step of a small MoE
// model leaves gaps of more than 50 us between its regions: polling 50 us ran
// it about 12% slower), and 0 when they do not: a polling thread would hold
// the core that the thread it waits for needs (4 ranks of 2 threads on 2
// cores ran a collectives test 15x slower).
int64_t spin_ns_for(int n_threads) {
  if (const char* env = std::getenv("LOCKSTEP_SPIN_US")) {
    try {
      const long us = std::stol(env);
      if (us >= 0) return int64_t(us) * 1000;
    } catch (const std::exception&) {
    }
  }
  const int64_t cores = std::thread::hardware_concurrency();
  return cores > 0 && local_ranks() * n_threads <= cores ? 250'000 : 0;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Polls done() for up to spin_ns; true as soon as it holds. Yields the core
// now and then, so a spinning thread does not starve one that shares it.
template <typename Done>
bool spin_until(int64_t spin_ns, Done&& done) {
  if (spin_ns <= 0) return done();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(spin_ns)) return done();
      std::this_thread::yield();
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads), spin_ns_(spin_ns_for(n_threads)) {
  LS_CHECK(n_threads >= 1) << "thread count must be >= 1, got " << n_threads;
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);  // ends the workers' polling
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    spin_until(spin_ns_, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    const std::function<void(int)>* job = nullptr;
    {
      // The job's fields are read under the lock, with the generation they
      // belong to: a worker with no task in this job must not pick up the
      // fields of the next one.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
      if (index >= job_tasks_) continue;
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(index);
    } catch (...) {
      err = std::current_exception();
    }
    if (err) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = err;
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The last one: a caller that stopped polling sleeps on done_ (the lock
      // orders this notify after its check of pending_).
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_one();
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
    pending_.store(n_tasks - 1, std::memory_order_relaxed);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();  // no system call when every worker is still polling
  std::exception_ptr err;
  try {
    fn(0);
  } catch (...) {
    err = std::current_exception();
  }
  spin_until(spin_ns_, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
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
