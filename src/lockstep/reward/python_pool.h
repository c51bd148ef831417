// A pool of Python worker processes running lockstep's driver
// (reward/python/driver.py, embedded in the binary): each worker imports one
// user file once, then calls its functions by name with JSON keyword
// arguments and sends back JSON. Generic: rewards use it for verl-style
// compute_score functions, and anything else that calls user Python can.
//
// A call has a deadline. A worker that runs past it is killed (SIGTERM, a
// short grace, SIGKILL) and a worker that dies (os._exit, a segfault) is
// reaped; either is restarted in the background and the call reports
// Timeout or Crashed. The destructor stops and reaps every worker.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/base/subprocess.h"

namespace lockstep::reward {

struct PythonPoolOptions {
  std::string python = "python3";       // the interpreter (PATH is searched)
  std::string file;                     // the user's module, imported once per worker
  std::vector<std::string> functions;   // must exist and be callable: checked at start-up
  int workers = 1;
  double start_timeout_s = 120;         // import of the user's file (torch can take seconds)
  double kill_grace_s = 0.2;            // SIGTERM to SIGKILL
};

// What the driver found out about one function at start-up.
struct PythonFunctionInfo {
  std::string file;  // basename of the file it is defined in
  int line = 0;      // its first line
  bool is_async = false;
  // The kinds its return annotation allows ("number", "dict", "none",
  // "other"); nullopt without an annotation.
  std::optional<std::vector<std::string>> return_kinds;
  std::string where() const { return file + ":" + std::to_string(line); }
};

struct PythonCallResult {
  enum class Status { Ok, Error, Unconvertible, Timeout, Crashed, NoWorker };
  Status status = Status::Ok;
  nlohmann::json value;   // Ok: what the function returned
  std::string message;    // Error: "ValueError: ..."; Unconvertible: the type or repr;
                          // Crashed: "exit code 1" / "killed by signal 11 (SIGSEGV)"; NoWorker: why
  std::string traceback;  // Error: the Python traceback
  bool ok() const { return status == Status::Ok; }
};

// An object one worker holds for its caller (PythonPool::create): calls on it
// go to that worker. A worker that died or was restarted since holds it no
// more: calls then report Crashed.
struct PythonObject {
  size_t slot = 0;
  int64_t generation = -1;  // the slot's process when the object was made
  int64_t handle = -1;      // the driver's key for it
};

class PythonPool {
 public:
  // Starts every worker and waits until each has imported the file. Throws
  // Error with the file and line for a missing interpreter or file, a syntax
  // error, an import error, a missing or non-callable function.
  explicit PythonPool(PythonPoolOptions options);
  ~PythonPool();
  PythonPool(const PythonPool&) = delete;
  PythonPool& operator=(const PythonPool&) = delete;

  // Calls `function(**kwargs)` on a free worker; waits for one up to the
  // deadline. Thread-safe: up to workers() calls run at once.
  PythonCallResult call(const std::string& function, const nlohmann::json& kwargs, double timeout_s);

  // Instances: `function(**kwargs)` (a class, typically) on a free worker,
  // its result kept there; *object names it (Ok only). call_method runs
  // `object.method(**kwargs)` on that worker, waiting for it if busy; drop
  // forgets the object (best effort: a dead worker already has).
  PythonCallResult create(const std::string& function, const nlohmann::json& kwargs, double timeout_s,
                          PythonObject* object);
  PythonCallResult call_method(const PythonObject& object, const std::string& method, const nlohmann::json& kwargs,
                               double timeout_s);
  void drop(const PythonObject& object, double timeout_s);

  const PythonFunctionInfo& function(const std::string& name) const;  // one of options.functions
  const std::string& python_version() const { return python_version_; }
  int workers() const { return int(slots_.size()); }
  int64_t restarts() const { return restarts_.load(); }
  std::vector<pid_t> pids() const;  // live workers' process ids (tests: no zombies after the pool)

 private:
  enum class State { Idle, Busy, Dead };
  struct Slot {
    std::unique_ptr<Subprocess> proc;
    State state = State::Dead;
    int64_t generation = 0;  // += 1 at every restart: objects of the old process are gone
  };

  std::unique_ptr<Subprocess> spawn() const;
  nlohmann::json await_ready(Subprocess& proc) const;  // the "ready" object; throws Error
  void keeper_loop();
  void release(size_t slot, bool dead);
  // Takes an Idle slot (any, or `only` when >= 0; generation must then match)
  // until the deadline; NoWorker / Crashed result otherwise.
  std::optional<PythonCallResult> acquire(Subprocess::Clock::time_point deadline, long only, int64_t generation,
                                          size_t* slot, Subprocess** proc);
  // One request out on the slot taken, its reply back; releases the slot.
  PythonCallResult exchange(size_t slot, Subprocess* proc, nlohmann::json req, Subprocess::Clock::time_point deadline);

  PythonPoolOptions options_;
  std::map<std::string, PythonFunctionInfo> functions_;
  std::string python_version_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;    // a slot became Idle
  std::condition_variable keeper_cv_;  // a slot died, or stop
  std::vector<Slot> slots_;
  std::string restart_error_;          // the last failed restart ("" when none)
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> next_id_{0}, restarts_{0};
  std::thread keeper_;
};

}  // namespace lockstep::reward
