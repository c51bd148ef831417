// PythonPool: start-up (all workers spawned at once, then each awaited), the
// call path (take an Idle slot, one JSON line out, one back), and the keeper
// thread that kills, reaps and restarts Dead slots with a backoff when the
// restart itself fails.
#include "lockstep/reward/python_pool.h"

#include <algorithm>
#include <chrono>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/reward/python_driver_source.h"  // generated from reward/python/driver.py

namespace lockstep::reward {
namespace {

using Clock = Subprocess::Clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// How long a crashed worker gets to finish exiting, so that its own exit
// status (a signal, an exit code) is reported rather than our SIGKILL.
constexpr double kExitWait_s = 0.5;
// Restart attempts after a failed restart wait 1 s, 2 s, ... up to this.
constexpr double kMaxRestartBackoff_s = 30;
// The keeper checks for stop this often while a worker starts.
constexpr double kStopPoll_s = 0.1;

PythonFunctionInfo info_from_json(const nlohmann::json& j) {
  PythonFunctionInfo f;
  f.file = j.value("file", "");
  f.line = j.value("line", 0);
  f.is_async = j.value("async", false);
  if (auto k = j.find("return_kinds"); k != j.end() && k->is_array()) f.return_kinds = k->get<std::vector<std::string>>();
  return f;
}

}  // namespace

std::unique_ptr<Subprocess> PythonPool::spawn() const {
  SpawnOptions so;
  so.argv = {options_.python, "-c", std::string(kPythonDriverSource), options_.file};
  for (const auto& f : options_.functions) so.argv.push_back(f);
  so.channel_fd = 3;
  so.stdout_to_stderr = true;
  so.env = {"PYTHONUNBUFFERED=1"};
  return std::make_unique<Subprocess>(so);
}

// Reads the worker's first message. A stop request (destructor) ends the
// wait early with an Error.
nlohmann::json PythonPool::await_ready(Subprocess& proc) const {
  const auto deadline = after(options_.start_timeout_s);
  std::string line;
  for (;;) {
    if (stop_) LS_THROW << "python pool stopping";
    auto r = proc.read_line(&line, std::min(deadline, after(kStopPoll_s)));
    if (r == Subprocess::Read::Line) break;
    if (r == Subprocess::Read::Closed) {
      proc.wait_exit(kExitWait_s);
      LS_THROW << options_.file << ": the python worker (" << options_.python << ") exited during start-up ("
               << (proc.exit_status().empty() ? "no status" : proc.exit_status()) << "); see its stderr above";
    }
    if (Clock::now() >= deadline)
      LS_THROW << options_.file << ": the python worker did not finish importing the file within "
               << options_.start_timeout_s << " s";
  }
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("fatal")) {
    std::string msg = j["fatal"].get<std::string>();
    if (auto tb = j.find("traceback"); tb != j.end() && tb->is_string() && !tb->get<std::string>().empty()) {
      LS_LOG(Warn) << "python worker start-up failed:\n" << tb->get<std::string>();
    }
    LS_THROW << msg;
  }
  if (!j.is_object() || !j.contains("ready") || !j["ready"].is_object())
    LS_THROW << options_.file << ": the python worker sent an unexpected first message: " << line.substr(0, 200);
  return j["ready"];
}

PythonPool::PythonPool(PythonPoolOptions options) : options_(std::move(options)) {
  LS_CHECK(options_.workers >= 1) << "PythonPool needs at least one worker";
  if (find_program(options_.python).empty())
    LS_THROW << "python interpreter '" << options_.python << "' not found (reward.python; PATH is searched)";
  slots_.resize(size_t(options_.workers));
  for (auto& s : slots_) s.proc = spawn();  // all import at once
  for (size_t i = 0; i < slots_.size(); ++i) {
    nlohmann::json ready;
    try {
      ready = await_ready(*slots_[i].proc);
    } catch (...) {
      for (auto& s : slots_) s.proc.reset();  // kills and reaps
      throw;
    }
    slots_[i].state = State::Idle;
    if (i > 0) continue;
    python_version_ = ready.value("python", "");
    for (const auto& [name, info] : ready["functions"].items()) functions_[name] = info_from_json(info);
  }
  keeper_ = std::thread([this] { keeper_loop(); });
}

PythonPool::~PythonPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  keeper_cv_.notify_all();
  idle_cv_.notify_all();
  if (keeper_.joinable()) keeper_.join();
  // Closing every channel first lets all workers exit at once (EOF ends
  // the driver's loop); then each gets the grace before SIGKILL.
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& s : slots_)
    if (s.proc) s.proc->close_channel();
  for (auto& s : slots_)
    if (s.proc && !s.proc->wait_exit(kExitWait_s)) s.proc->terminate(options_.kill_grace_s);
}

const PythonFunctionInfo& PythonPool::function(const std::string& name) const {
  auto it = functions_.find(name);
  LS_CHECK(it != functions_.end()) << "python pool: function '" << name << "' was not described at start-up";
  return it->second;
}

std::vector<pid_t> PythonPool::pids() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<pid_t> out;
  for (const auto& s : slots_)
    if (s.proc && s.proc->running()) out.push_back(s.proc->pid());
  return out;
}

void PythonPool::release(size_t slot, bool dead) {
  std::lock_guard<std::mutex> lk(mu_);
  slots_[slot].state = dead ? State::Dead : State::Idle;
  if (dead) {
    ++slots_[slot].generation;  // its objects die with it
    keeper_cv_.notify_all();
    idle_cv_.notify_all();      // callers waiting on its objects learn it
  } else {
    idle_cv_.notify_one();
  }
}

std::optional<PythonCallResult> PythonPool::acquire(Clock::time_point deadline, long only, int64_t generation,
                                                    size_t* slot, Subprocess** proc) {
  std::unique_lock<std::mutex> lk(mu_);
  PythonCallResult res;
  auto gone = [&] { return only >= 0 && slots_[size_t(only)].generation != generation; };
  auto idle = [&] {
    if (only >= 0) {
      *slot = size_t(only);
      return slots_[*slot].state == State::Idle;
    }
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].state == State::Idle) {
        *slot = i;
        return true;
      }
    return false;
  };
  const bool got = idle_cv_.wait_until(lk, deadline, [&] { return stop_ || gone() || idle(); });
  if (gone()) {
    res.status = PythonCallResult::Status::Crashed;
    res.message = "the worker holding the object died or was restarted (its objects are lost)";
    return res;
  }
  if (!got || stop_) {
    res.status = PythonCallResult::Status::NoWorker;
    res.message = stop_ ? "the pool is stopping" : "no python worker free within the time limit";
    if (!restart_error_.empty()) res.message += " (restart failed: " + restart_error_ + ")";
    return res;
  }
  slots_[*slot].state = State::Busy;
  *proc = slots_[*slot].proc.get();
  return std::nullopt;
}

PythonCallResult PythonPool::exchange(size_t slot, Subprocess* proc, nlohmann::json req, Clock::time_point deadline) {
  PythonCallResult res;
  const int64_t id = ++next_id_;
  req["id"] = id;
  // Model output may hold invalid UTF-8: replace it rather than fail.
  std::string line = req.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  bool sent = proc->write_all(line, deadline);
  std::string reply;
  auto r = sent ? proc->read_line(&reply, deadline) : Subprocess::Read::Closed;
  if (r == Subprocess::Read::Timeout || (!sent && Clock::now() >= deadline)) {
    res.status = PythonCallResult::Status::Timeout;
    release(slot, /*dead=*/true);  // the keeper kills and restarts it
    return res;
  }
  if (r == Subprocess::Read::Closed) {
    proc->wait_exit(kExitWait_s);
    res.status = PythonCallResult::Status::Crashed;
    res.message = proc->exit_status().empty() ? "the worker closed its channel" : proc->exit_status();
    release(slot, /*dead=*/true);
    return res;
  }
  release(slot, /*dead=*/false);
  auto j = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("id", int64_t(-1)) != id) {
    res.status = PythonCallResult::Status::Error;
    res.message = "protocol: unexpected reply from the worker: " + reply.substr(0, 200);
  } else if (auto v = j.find("result"); v != j.end()) {
    res.value = std::move(*v);
  } else if (auto e = j.find("error"); e != j.end()) {
    res.status = PythonCallResult::Status::Error;
    res.message = e->get<std::string>();
    res.traceback = j.value("traceback", "");
  } else {
    res.status = PythonCallResult::Status::Unconvertible;
    res.message = j.value("unconvertible", "an unknown value");
  }
  return res;
}

PythonCallResult PythonPool::call(const std::string& function, const nlohmann::json& kwargs, double timeout_s) {
  const auto deadline = after(timeout_s);
  size_t slot = 0;
  Subprocess* proc = nullptr;
  if (auto fail = acquire(deadline, -1, 0, &slot, &proc)) return *fail;
  return exchange(slot, proc, {{"fn", function}, {"kwargs", kwargs}}, deadline);
}

PythonCallResult PythonPool::create(const std::string& function, const nlohmann::json& kwargs, double timeout_s,
                                    PythonObject* object) {
  const auto deadline = after(timeout_s);
  size_t slot = 0;
  Subprocess* proc = nullptr;
  if (auto fail = acquire(deadline, -1, 0, &slot, &proc)) return *fail;
  int64_t generation = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation = slots_[slot].generation;
  }
  PythonCallResult r = exchange(slot, proc, {{"fn", function}, {"kwargs", kwargs}, {"keep", true}}, deadline);
  if (r.ok()) {
    object->slot = slot;
    object->generation = generation;
    object->handle = r.value.get<int64_t>();
    r.value = nullptr;
  }
  return r;
}

PythonCallResult PythonPool::call_method(const PythonObject& object, const std::string& method,
                                         const nlohmann::json& kwargs, double timeout_s) {
  LS_CHECK(object.slot < slots_.size() && object.handle >= 0) << "python pool: call on an object never created";
  const auto deadline = after(timeout_s);
  size_t slot = 0;
  Subprocess* proc = nullptr;
  if (auto fail = acquire(deadline, long(object.slot), object.generation, &slot, &proc)) return *fail;
  return exchange(slot, proc, {{"obj", object.handle}, {"fn", method}, {"kwargs", kwargs}}, deadline);
}

void PythonPool::drop(const PythonObject& object, double timeout_s) {
  if (object.handle < 0) return;
  const auto deadline = after(timeout_s);
  size_t slot = 0;
  Subprocess* proc = nullptr;
  if (acquire(deadline, long(object.slot), object.generation, &slot, &proc)) return;  // gone already
  exchange(slot, proc, {{"obj", object.handle}, {"drop", true}}, deadline);
}

// Kills and restarts Dead slots, one at a time, outside the lock.
void PythonPool::keeper_loop() {
  double backoff = 0;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    auto dead = std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.state == State::Dead; });
    if (dead == slots_.end()) {
      keeper_cv_.wait(lk);
      continue;
    }
    if (backoff > 0 && keeper_cv_.wait_for(lk, std::chrono::duration<double>(backoff), [&] { return stop_.load(); }))
      break;
    std::unique_ptr<Subprocess> old = std::move(dead->proc);
    lk.unlock();
    std::unique_ptr<Subprocess> fresh;
    std::string error;
    try {
      if (old) old->terminate(options_.kill_grace_s);
      old.reset();
      fresh = spawn();
      await_ready(*fresh);
    } catch (const std::exception& e) {
      error = e.what();
      fresh.reset();
    }
    lk.lock();
    if (fresh) {
      dead->proc = std::move(fresh);
      dead->state = State::Idle;
      restart_error_.clear();
      backoff = 0;
      ++restarts_;
      idle_cv_.notify_one();
    } else if (!stop_) {
      restart_error_ = error;
      backoff = std::clamp(backoff * 2, 1.0, kMaxRestartBackoff_s);
      LS_LOG(Warn) << "python worker restart failed (next try in " << backoff << " s): " << error;
    }
  }
}

}  // namespace lockstep::reward
