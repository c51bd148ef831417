// A fixed pool of worker threads with a static parallel-for, and the Context
// passed to every kernel. Threads only ever split independent outputs, and the
// partition is a pure function of (n, number of threads), so results never
// depend on the thread count (docs/architecture.md section 4).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep {

namespace kernels {
struct GpuBackend;
}

class ThreadPool {
 public:
  // n_threads >= 1 counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) on contiguous ranges covering [0, n); range t of T
  // is [n*t/T, n*(t+1)/T). `grain` is the smallest range worth a thread:
  // fewer threads are used when n is small. Blocks until all ranges are done.
  // The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // Not re-entrant: fn must not call back into the same pool.
  // Calls fn(t) once on each of `n_tasks` workers (t = 0..n_tasks-1), n_tasks <= size().
  void run_on_workers(int n_tasks, const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex job_mu_;  // one job at a time when several threads share the pool
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  // Written under mu_; generation_ and pending_ are also read without it by
  // threads that spin before they sleep (see thread_pool.cpp).
  const std::function<void(int)>* job_ = nullptr;
  int job_tasks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::exception_ptr error_;
  int64_t spin_ns_;  // how long a thread polls for work (or completion) before it sleeps
};

// Everything a computation needs from its surroundings; no globals.
struct Context {
  ThreadPool* pool = nullptr;  // may be null: run on the calling thread
  uint64_t seed = 0;
  // The GPU backend the kernels forward to (kernels/gpu/backend.h); null: the CPU.
  const kernels::GpuBackend* gpu = nullptr;

  int threads() const { return pool ? pool->size() : 1; }
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1) const {
    if (pool) {
      pool->parallel_for(n, fn, grain);
    } else if (n > 0) {
      fn(0, n);
    }
  }
};

// Default thread count: LOCKSTEP_THREADS if set, else the hardware concurrency.
// LOCKSTEP_SPIN_US is how long a pool's threads poll for the next job, and a
// caller for its job's end, before they sleep (0: never poll). Default: 50,
// or 0 when the job's ranks on this node (an MPI launcher's local size) times
// the pool's threads exceed the cores.
int default_thread_count();
// A pool of `threads` workers, or default_thread_count() when threads <= 0
// (the --threads flag of every command).
std::unique_ptr<ThreadPool> make_pool(int64_t threads);

}  // namespace lockstep
