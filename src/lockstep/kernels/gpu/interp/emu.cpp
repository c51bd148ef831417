// The interpret-mode emulator: fibers per thread, per-block shared memory,
// barriers with divergence checks, guarded device memory, race checks by
// re-running a launch in other thread orders (emu.h).
#include "lockstep/kernels/gpu/interp/emu.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <vector>

#include "lockstep/base/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define LS_EMU_ASAN 1
#else
#define LS_EMU_ASAN 0
#endif

namespace lockstep::gpu::emu {

namespace ctx_ns = boost::context;

Options& options() {
  static Options o;
  return o;
}

// ---- device memory -------------------------------------------------------

namespace {

constexpr size_t kGuardBytes = 256;
constexpr uint32_t kGuardWord = 0x7FC0DEADu;  // a quiet NaN as f32
constexpr unsigned char kPoisonByte = 0xFF;   // 0xFFFFFFFF: NaN as f32

size_t page_bytes() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// One allocation's own mapping: the lower guard zone at its start, then the
// user bytes, the tail padding and the upper guard zone; the rest of the
// last page is unused. The whole mapping is PROT_NONE while closed.
struct Allocation {
  unsigned char* base = nullptr;  // the mapping; the lower guard zone starts here
  size_t map_bytes = 0;
  size_t bytes = 0;
  std::string what;
  bool closed = false;  // PROT_NONE now
  unsigned char* user() const { return base + kGuardBytes; }
};

struct Registry {
  std::mutex mu;
  std::map<const void*, Allocation> live;  // keyed by the user pointer
  int open = 0;                            // DeviceWindows now open
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: buffers are freed at exit in any order
  return *r;
}

void fill_guard(unsigned char* p) {
  for (size_t i = 0; i < kGuardBytes; i += 4) std::memcpy(p + i, &kGuardWord, 4);
}

// First byte of a guard zone that no longer holds the pattern, or -1.
int64_t guard_damage(const unsigned char* p) {
  for (size_t i = 0; i < kGuardBytes; i += 4)
    if (std::memcmp(p + i, &kGuardWord, 4) != 0) {
      uint32_t w;
      std::memcpy(&w, p + i, 4);
      for (int b = 0; b < 4; ++b)
        if (((w >> (8 * b)) & 0xFF) != ((kGuardWord >> (8 * b)) & 0xFF)) return static_cast<int64_t>(i) + b;
    }
  return -1;
}

size_t padded(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Opens (read and write) or closes (PROT_NONE) one allocation; r.mu held.
void set_closed(Allocation& a, bool closed) {
  if (a.closed == closed) return;
  const int rc = mprotect(a.base, a.map_bytes, closed ? PROT_NONE : PROT_READ | PROT_WRITE);
  LS_CHECK(rc == 0) << "interpret mode: mprotect of device buffer '" << a.what << "' failed";
  a.closed = closed;
}

// Opens or closes every live allocation; r.mu held. Allocations whose
// mappings touch (mmap places new mappings next to each other) change in one
// mprotect per run: thousands of allocations cost a few calls per window.
void set_all_closed(Registry& r, bool closed) {
  unsigned char* start = nullptr;
  unsigned char* end = nullptr;
  std::vector<Allocation*> run;
  const auto flush = [&] {
    if (run.empty()) return;
    const int rc =
        mprotect(start, static_cast<size_t>(end - start), closed ? PROT_NONE : PROT_READ | PROT_WRITE);
    LS_CHECK(rc == 0) << "interpret mode: mprotect of device buffer '" << run.front()->what << "' and "
                      << run.size() - 1 << " more failed";
    for (Allocation* a : run) a->closed = closed;
    run.clear();
  };
  for (auto& [p, a] : r.live) {
    if (a.closed == closed) continue;
    if (run.empty() || a.base != end) {
      flush();
      start = a.base;
    }
    run.push_back(&a);
    end = a.base + a.map_bytes;
  }
  flush();
}

// Every allocation as it must be with no window open; r.mu held.
void settle(Registry& r) {
  if (r.open > 0) return;
  set_all_closed(r, !options().host_access);
}

// ---- the fault handler ------------------------------------------------------

struct sigaction g_previous_segv;

// The live allocation whose mapping holds addr, or null; r.mu held. Runs in
// the signal handler (a host access faults outside the emulator's own code,
// which never faults holding the mutex).
const Allocation* mapping_of(Registry& r, const void* addr) {
  const auto* q = static_cast<const unsigned char*>(addr);
  const auto inside = [q](const Allocation& a) { return q >= a.base && q < a.base + a.map_bytes; };
  auto it = r.live.upper_bound(addr);  // its lower guard zone may hold addr
  if (it != r.live.end() && inside(it->second)) return &it->second;
  if (it == r.live.begin()) return nullptr;
  --it;
  return inside(it->second) ? &it->second : nullptr;
}

void write_all(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// The functions of the first frames, by addr2line (static functions have
// no dynamic symbol for backtrace_symbols_fd to print): one child per frame,
// as the process aborts anyway.
void name_frames(void* const* frames, int n, int first = 0, int count = 16) {
  for (int i = first; i < n && i < first + count; ++i) {
    Dl_info info{};
    if (dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) continue;
    char offset[32];
    std::snprintf(offset, sizeof offset, "%#lx",
                  static_cast<unsigned long>(static_cast<const char*>(frames[i]) -
                                             static_cast<const char*>(info.dli_fbase) - 1));
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(STDERR_FILENO, STDOUT_FILENO);
      execlp("addr2line", "addr2line", "-C", "-f", "-p", "-e", info.dli_fname, offset,
             static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
}

// LOCKSTEP_INTERPRET_HOST_ACCESS=log: each host access site is reported once
// (its function and two callers) and the allocation is opened so the
// program goes on: a survey of the host reads left, for debugging.
bool g_log_only = [] {
  const char* v = std::getenv("LOCKSTEP_INTERPRET_HOST_ACCESS");
  return v != nullptr && std::strcmp(v, "log") == 0;
}();

void log_and_open(Allocation& a, const void* addr) {
  void* frames[8];
  const int n = backtrace(frames, 8);
  static void* seen[4096];
  static int n_seen = 0;
  void* key = n > 3 ? frames[3] : nullptr;
  bool known = false;
  for (int i = 0; i < n_seen; ++i) known = known || seen[i] == key;
  if (!known && n_seen < 4096) seen[n_seen++] = key;
  if (!known) {
    std::ostringstream msg;
    msg << "interpret mode: host access to device memory: allocation '" << a.what << "' (+offset "
        << static_cast<const unsigned char*>(addr) - a.user() << "), from:\n";
    const std::string m = msg.str();
    write_all(m.data(), m.size());
    name_frames(frames, n, 2, 4);
  }
  mprotect(a.base, a.map_bytes, PROT_READ | PROT_WRITE);
  a.closed = false;
}

void on_segv(int sig, siginfo_t* info, void* uctx) {
  Registry& r = registry();
  // Another thread may hold the registry briefly (a window opening, or this
  // handler in log mode, which runs addr2line): wait up to about 10 s.
  bool locked = r.mu.try_lock();
  for (int spin = 0; !locked && spin < 10000; ++spin) {
    const timespec ms{0, 1000000};
    nanosleep(&ms, nullptr);
    locked = r.mu.try_lock();
  }
  if (locked && g_log_only) {
    Allocation* a = const_cast<Allocation*>(mapping_of(r, info->si_addr));
    if (a != nullptr) {
      log_and_open(*a, info->si_addr);
      r.mu.unlock();
      return;
    }
  }
  const Allocation* a = locked ? mapping_of(r, info->si_addr) : nullptr;
  if (a == nullptr) {
    // Not device memory (a fiber stack's guard page, a plain bug): the
    // previous handler, or the default action, takes it.
    if (locked) r.mu.unlock();
    if (g_previous_segv.sa_flags & SA_SIGINFO) {
      if (g_previous_segv.sa_sigaction != nullptr) return g_previous_segv.sa_sigaction(sig, info, uctx);
    } else if (g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
      return g_previous_segv.sa_handler(sig);
    }
    signal(SIGSEGV, SIG_DFL);
    return;  // the access faults again, now with the default action
  }
  const auto off = static_cast<const unsigned char*>(info->si_addr) - a->user();
  std::ostringstream msg;
  msg << "interpret mode: host code touched device memory: allocation '" << a->what << "' (+offset " << off
      << " of " << a->bytes
      << " bytes) outside a launch or a copy (a device faults here: copy what the host needs with "
      << "copy_out / copy_in, docs/gpu.md; LOCKSTEP_INTERPRET_HOST_ACCESS=1 allows it for debugging). "
      << "The host code, innermost first:\n";
  const std::string m = msg.str();
  write_all(m.data(), m.size());
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  write_all("with their functions (addr2line):\n", 35);
  name_frames(frames, n);
  std::abort();
}

void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[1];
    backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
  });
}

}  // namespace

bool host_access_from_environment() {
  const char* v = std::getenv("LOCKSTEP_INTERPRET_HOST_ACCESS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

void apply_host_access() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  settle(r);
}

DeviceWindow::DeviceWindow() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.open++ == 0) set_all_closed(r, false);
}

DeviceWindow::~DeviceWindow() {
  // A destructor cannot throw: a failed mprotect here (out of memory for the
  // kernel's mapping tables) leaves device memory in an unknown state, so the
  // process stops with the reason.
  try {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    --r.open;
    settle(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::abort();
  }
}

void* device_alloc(size_t bytes, const char* what) {
  install_segv_handler();
  const size_t total = kGuardBytes + padded(bytes) + kGuardBytes;
  const size_t map_bytes = (total + page_bytes() - 1) / page_bytes() * page_bytes();
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  LS_CHECK(m != MAP_FAILED) << "interpret mode: out of memory allocating " << bytes << " bytes for " << what;
  auto* base = static_cast<unsigned char*>(m);
#if LS_EMU_ASAN
  // The range may have held a fiber's stack (also mmap'd): AddressSanitizer's
  // shadow still marks that stack's redzones, which munmap does not clear.
  ASAN_UNPOISON_MEMORY_REGION(base, map_bytes);
#endif
  fill_guard(base);
  std::memset(base + kGuardBytes, kPoisonByte, padded(bytes));
  // The tail padding between the end and the upper guard is part of the guard.
  unsigned char* tail = base + kGuardBytes + bytes;
  for (size_t i = 0; i < padded(bytes) - bytes; ++i) tail[i] = reinterpret_cast<const unsigned char*>(&kGuardWord)[i % 4];
  fill_guard(base + kGuardBytes + padded(bytes));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Allocation a{base, map_bytes, bytes, what ? what : "?"};
  Allocation& placed = r.live[a.user()] = a;
  if (r.open == 0 && !options().host_access) set_closed(placed, true);
  return a.user();
}

void device_free(void* p) {
  if (p == nullptr) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(p);
  LS_CHECK(it != r.live.end()) << "interpret mode: device_free of a pointer that is not a live device allocation";
  munmap(it->second.base, it->second.map_bytes);
  r.live.erase(it);
}

void copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  DeviceWindow w;
  std::memcpy(dst, host_src, bytes);
}

void copy_from_device(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceWindow w;
  std::memcpy(host_dst, src, bytes);
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceWindow w;
  std::memmove(dst, src, bytes);
}

void copy_on_device_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                       size_t rows) {
  if (rows == 0 || row_bytes == 0) return;
  DeviceWindow w;
  for (size_t r = 0; r < rows; ++r)
    std::memmove(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                 row_bytes);
}

void fill_device(void* dst, unsigned char byte, size_t bytes) {
  if (bytes == 0) return;
  DeviceWindow w;
  std::memset(dst, byte, bytes);
}

size_t live_allocations() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.live.size();
}

bool is_device_memory(const void* p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.upper_bound(p);
  if (it == r.live.begin()) return false;
  --it;
  const auto* user = static_cast<const unsigned char*>(it->first);
  const auto* q = static_cast<const unsigned char*>(p);
  return q >= user && q <= user + it->second.bytes;
}

void check_pointer_arg(const LaunchSite& site, size_t arg, const void* p) {
  if (p == nullptr || is_device_memory(p)) return;
  LS_THROW << "interpret mode: kernel " << site.kernel << " launched at " << site.file << ":" << site.line
           << " was given a host pointer as argument " << arg
           << " (a device faults on it: allocate the memory through kernels::device_memory(ctx), docs/gpu.md)";
}

namespace {

// The tail padding [bytes, padded(bytes)) holds the guard pattern from its
// own start, so its damage is checked byte by byte.
int64_t tail_damage(const Allocation& a) {
  const unsigned char* tail = a.user() + a.bytes;
  const auto* pat = reinterpret_cast<const unsigned char*>(&kGuardWord);
  for (size_t i = 0; i < padded(a.bytes) - a.bytes; ++i)
    if (tail[i] != pat[i % 4]) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace

void check_guards(const char* after_kernel) {
  const DeviceWindow window;  // the emulator reads the guard zones (also when a test calls it directly)
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [ptr, a] : r.live) {
    const int64_t below = guard_damage(a.base);
    if (below >= 0)
      LS_THROW << "interpret mode: kernel " << after_kernel << " wrote before the start of device buffer '" << a.what
               << "' (" << a.bytes << " bytes), at offset " << below - static_cast<int64_t>(kGuardBytes);
    int64_t above = tail_damage(a);
    if (above < 0) {
      const int64_t g = guard_damage(a.user() + padded(a.bytes));
      if (g >= 0) above = static_cast<int64_t>(padded(a.bytes) - a.bytes) + g;
    }
    if (above >= 0)
      LS_THROW << "interpret mode: kernel " << after_kernel << " wrote past the end of device buffer '" << a.what
               << "' (" << a.bytes << " bytes), at offset " << static_cast<int64_t>(a.bytes) + above;
  }
}

// ---- fiber stacks ----------------------------------------------------------

namespace {

// Stacks reused across blocks and launches by one worker thread; each has an
// inaccessible page below it, so an overflowing kernel thread faults instead
// of corrupting a neighbour.
class StackPool {
 public:
  ~StackPool() {
    for (void* s : free_) unmap(s, size_ + page());
  }
  ctx_ns::stack_context allocate() {
    const size_t want = options().stack_bytes;
    if (want != size_) {
      for (void* s : free_) unmap(s, size_ + page());
      free_.clear();
      size_ = (want + page() - 1) / page() * page();
    }
    void* base;
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    } else {
      base = mmap(nullptr, size_ + page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      LS_CHECK(base != MAP_FAILED) << "interpret mode: cannot map a " << size_ << "-byte fiber stack";
      mprotect(base, page(), PROT_NONE);
    }
    ctx_ns::stack_context sc;
    sc.size = size_;
    sc.sp = static_cast<char*>(base) + page() + size_;
    return sc;
  }
  void deallocate(ctx_ns::stack_context& sc) {
    void* base = static_cast<char*>(sc.sp) - sc.size - page();
    if (sc.size == size_) {
      free_.push_back(base);
    } else {
      unmap(base, sc.size + page());
    }
  }

 private:
  // A stack's frames leave AddressSanitizer's redzone marks in its shadow,
  // which munmap keeps: a later mapping of the range (a device allocation)
  // would read as a stack. They are cleared first.
  static void unmap(void* base, size_t bytes) {
#if LS_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(base) + page(), bytes - page());
#endif
    munmap(base, bytes);
  }
  static size_t page() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
  }
  size_t size_ = 0;
  std::vector<void*> free_;
};

thread_local StackPool tl_stacks;

// The allocator object boost::context copies into each fiber.
struct PooledStack {
  ctx_ns::stack_context allocate() { return tl_stacks.allocate(); }
  void deallocate(ctx_ns::stack_context& sc) noexcept { tl_stacks.deallocate(sc); }
};

// ---- blocks ---------------------------------------------------------------

struct ThreadState {
  uint3 idx;
  bool done = false;
  bool waiting = false;
  const char* wait_file = nullptr;
  int wait_line = 0;
  int shared_decl = 0;  // shared arrays this thread declared so far
  ctx_ns::fiber self;    // suspended fiber (held by the scheduler)
  ctx_ns::fiber caller;  // the scheduler, while this thread runs
};

struct SharedDecl {
  size_t offset = 0, bytes = 0;
  const char* name = nullptr;
};

struct BlockState {
  const LaunchSite* site = nullptr;
  uint3 block;
  dim3 block_dim, grid_dim;
  std::vector<ThreadState> threads;
  std::vector<SharedDecl> decls;
  size_t shared_used = 0;
  unsigned char* shared = nullptr;  // the worker's arena (max_shared_bytes)
  std::exception_ptr error;
};

thread_local BlockState* tl_block = nullptr;
thread_local int tl_thread = -1;

struct Arena {
  std::unique_ptr<unsigned char[]> mem;
  size_t size = 0;
  unsigned char* get(size_t bytes) {
    if (bytes + 64 > size) {
      size = bytes + 64;
      mem.reset(new unsigned char[size]);
    }
    auto p = reinterpret_cast<uintptr_t>(mem.get());
    return reinterpret_cast<unsigned char*>((p + 63) / 64 * 64);
  }
};
thread_local Arena tl_arena;

std::string fmt3(const uint3& v) {
  std::ostringstream s;
  s << "(" << v.x << "," << v.y << "," << v.z << ")";
  return s.str();
}

std::string where(const BlockState& b) {
  std::ostringstream s;
  s << "kernel " << b.site->kernel << " (launched at " << b.site->file << ":" << b.site->line << "), block "
    << fmt3(b.block);
  return s.str();
}

BlockState& running_block() {
  LS_CHECK(tl_block != nullptr && tl_thread >= 0)
      << "interpret mode: a kernel-side function (threadIdx, __syncthreads, LS_SHARED) ran outside a launch";
  return *tl_block;
}

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void order_threads(std::vector<int>& order, Schedule s, uint64_t seed) {
  std::iota(order.begin(), order.end(), 0);
  if (s == Schedule::Reverse) {
    std::reverse(order.begin(), order.end());
  } else if (s == Schedule::Shuffled) {
    for (size_t i = order.size(); i > 1; --i) {
      seed = splitmix(seed);
      std::swap(order[i - 1], order[seed % i]);
    }
  }
}

// After a round every thread has returned or waits at a barrier; a round that
// leaves some waiting must leave all of them waiting at the same one.
void check_barrier_round(const BlockState& b) {
  const ThreadState* first_wait = nullptr;
  const ThreadState* first_done = nullptr;
  int n_wait = 0;
  for (const ThreadState& t : b.threads) {
    if (t.waiting) {
      ++n_wait;
      if (!first_wait) first_wait = &t;
    } else if (t.done && !first_done) {
      first_done = &t;
    }
  }
  if (n_wait == 0) return;
  const int n = static_cast<int>(b.threads.size());
  if (n_wait != n) {
    LS_THROW << "interpret mode: " << where(b) << ": __syncthreads at " << first_wait->wait_file << ":"
             << first_wait->wait_line << " reached by " << n_wait << " of " << n << " threads; thread "
             << fmt3(first_done->idx) << " returned without reaching it";
  }
  for (const ThreadState& t : b.threads)
    if (t.wait_line != first_wait->wait_line || std::strcmp(t.wait_file, first_wait->wait_file) != 0)
      LS_THROW << "interpret mode: " << where(b) << ": threads wait at different barriers: thread "
               << fmt3(first_wait->idx) << " at " << first_wait->wait_file << ":" << first_wait->wait_line
               << ", thread " << fmt3(t.idx) << " at " << t.wait_file << ":" << t.wait_line;
}

void start_threads(BlockState& b, const std::function<void()>& body) {
  const dim3 d = b.block_dim;
  b.threads.clear();
  b.threads.resize(static_cast<size_t>(d.x) * d.y * d.z);
  int i = 0;
  for (unsigned z = 0; z < d.z; ++z)
    for (unsigned y = 0; y < d.y; ++y)
      for (unsigned x = 0; x < d.x; ++x) {
        ThreadState& t = b.threads[static_cast<size_t>(i)];
        t.idx = uint3{x, y, z};
        const int me = i++;
        t.self = ctx_ns::fiber(std::allocator_arg, PooledStack{}, [&b, me, &body](ctx_ns::fiber&& caller) {
          ThreadState& ts = b.threads[static_cast<size_t>(me)];
          ts.caller = std::move(caller);
          try {
            body();
          } catch (const ctx_ns::detail::forced_unwind&) {
            throw;
          } catch (...) {
            if (!b.error) b.error = std::current_exception();
          }
          ts.done = true;
          return std::move(ts.caller);
        });
      }
}

void run_block(const LaunchSite& site, uint3 block, Schedule sched, uint64_t seed, const std::function<void()>& body) {
  BlockState b;
  b.site = &site;
  b.block = block;
  b.block_dim = site.block;
  b.grid_dim = site.grid;
  b.shared = tl_arena.get(options().max_shared_bytes);
  start_threads(b, body);
  std::vector<int> order(b.threads.size());
  BlockState* const saved_block = tl_block;
  const int saved_thread = tl_thread;
  tl_block = &b;
  for (uint64_t round = 0;; ++round) {
    order_threads(order, sched, splitmix(seed ^ (round * 0x2545F4914F6CDD1Dull)));
    for (int t : order) {
      ThreadState& ts = b.threads[static_cast<size_t>(t)];
      if (ts.done) continue;
      ts.waiting = false;
      tl_thread = t;
      ts.self = std::move(ts.self).resume();
      if (b.error) break;
    }
    if (b.error) break;
    bool all_done = true;
    for (const ThreadState& t : b.threads) all_done = all_done && t.done;
    if (all_done) break;
    try {
      check_barrier_round(b);
    } catch (...) {
      b.error = std::current_exception();
      break;
    }
  }
  tl_block = saved_block;
  tl_thread = saved_thread;
  // Suspended fibers unwind their stacks as they are destroyed here.
  b.threads.clear();
  if (b.error) std::rethrow_exception(b.error);
}

void check_config(const LaunchSite& s) {
  const Options& o = options();
  LS_CHECK(s.grid.x > 0 && s.grid.y > 0 && s.grid.z > 0)
      << "interpret mode: kernel " << s.kernel << " launched at " << s.file << ":" << s.line << " with an empty grid ("
      << s.grid.x << "," << s.grid.y << "," << s.grid.z << ")";
  const uint64_t n = uint64_t(s.block.x) * s.block.y * s.block.z;
  LS_CHECK(n > 0 && n <= static_cast<uint64_t>(o.max_threads_per_block))
      << "interpret mode: kernel " << s.kernel << " launched at " << s.file << ":" << s.line << " with a block of " << n
      << " threads (" << s.block.x << "," << s.block.y << "," << s.block.z << "); the limit is "
      << o.max_threads_per_block;
}

std::atomic<uint64_t> g_launches{0};

Schedule schedule_for(uint64_t launch) {
  const Schedule s = options().schedule;
  if (s != Schedule::Rotate) return s;
  static constexpr Schedule kCycle[3] = {Schedule::Forward, Schedule::Reverse, Schedule::Shuffled};
  return kCycle[launch % 3];
}

void run_blocks(const Context& ctx, const LaunchSite& site, Schedule sched, uint64_t seed,
                const std::function<void()>& body) {
  const dim3 g = site.grid;
  const int64_t n_blocks = int64_t(g.x) * g.y * g.z;
  ctx.parallel_for(n_blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint3 idx{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                      static_cast<unsigned>(b / (int64_t(g.x) * g.y))};
      run_block(site, idx, sched, splitmix(seed + static_cast<uint64_t>(b)), body);
    }
  });
}

// Device memory as bytes, for the race check.
std::vector<std::vector<unsigned char>> snapshot() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::vector<unsigned char>> s;
  for (auto& [p, a] : r.live) s.emplace_back(a.user(), a.user() + a.bytes);
  return s;
}

void restore(const std::vector<std::vector<unsigned char>>& s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t i = 0;
  for (auto& [p, a] : r.live) std::memcpy(a.user(), s[i++].data(), a.bytes);
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Forward: return "forward";
    case Schedule::Reverse: return "reverse";
    case Schedule::Shuffled: return "shuffled";
    case Schedule::Rotate: return "rotating";
  }
  return "?";
}

void compare_runs(const LaunchSite& site, const std::vector<std::vector<unsigned char>>& want,
                  const std::vector<std::vector<unsigned char>>& got, Schedule s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t i = 0;
  for (auto& [p, a] : r.live) {
    const auto& w = want[i];
    const auto& g = got[i];
    ++i;
    if (w == g) continue;
    size_t off = 0;
    while (w[off] == g[off]) ++off;
    LS_THROW << "interpret mode: kernel " << site.kernel << " (launched at " << site.file << ":" << site.line
             << ") gives different results when each block's threads run in " << schedule_name(s)
             << " order: device buffer '" << a.what << "' differs first at byte " << off
             << " (a race inside a block, e.g. a missing __syncthreads)";
  }
}

}  // namespace

// ---- what a kernel thread sees ----------------------------------------------

const uint3& thread_idx() {
  BlockState& b = running_block();
  return b.threads[static_cast<size_t>(tl_thread)].idx;
}
const uint3& block_idx() { return running_block().block; }
const dim3& block_dim() { return running_block().block_dim; }
const dim3& grid_dim() { return running_block().grid_dim; }

void sync_threads(const char* file, int line) {
  BlockState& b = running_block();
  ThreadState& ts = b.threads[static_cast<size_t>(tl_thread)];
  ts.waiting = true;
  ts.wait_file = file;
  ts.wait_line = line;
  ts.caller = std::move(ts.caller).resume();
}

void* shared_bytes(size_t bytes, size_t align, const char* name, const char* file, int line) {
  BlockState& b = running_block();
  ThreadState& ts = b.threads[static_cast<size_t>(tl_thread)];
  const size_t k = static_cast<size_t>(ts.shared_decl++);
  if (k < b.decls.size()) {
    const SharedDecl& d = b.decls[k];
    LS_CHECK(d.bytes == bytes && std::strcmp(d.name, name) == 0)
        << "interpret mode: " << where(b) << ", thread " << fmt3(ts.idx) << ": shared array '" << name << "' at "
        << file << ":" << line << " is this thread's declaration " << k << ", but thread's declaration " << k
        << " elsewhere is '" << d.name << "' (" << d.bytes << " bytes): declare shared arrays in the same order in "
        << "every thread";
    return b.shared + d.offset;
  }
  const size_t off = (b.shared_used + align - 1) / align * align;
  LS_CHECK(off + bytes <= options().max_shared_bytes)
      << "interpret mode: " << where(b) << ": shared array '" << name << "' at " << file << ":" << line
      << " brings the block's shared memory to " << off + bytes << " bytes, above the limit of "
      << options().max_shared_bytes;
  std::memset(b.shared + off, kPoisonByte, bytes);
  b.decls.push_back(SharedDecl{off, bytes, name});
  b.shared_used = off + bytes;
  return b.shared + off;
}

void run_launch(const Context& ctx, const LaunchSite& site, const std::function<void()>& body) {
  check_config(site);
  const DeviceWindow window;  // the kernel, the guard checks and the race check's copies touch device memory
  const uint64_t launch = g_launches.fetch_add(1);
  const uint64_t seed = splitmix(launch);
  if (!options().check_races) {
    run_blocks(ctx, site, schedule_for(launch), seed, body);
    check_guards(site.kernel);
    return;
  }
  const auto before = snapshot();
  run_blocks(ctx, site, Schedule::Forward, seed, body);
  check_guards(site.kernel);
  const auto want = snapshot();
  for (Schedule s : {Schedule::Reverse, Schedule::Shuffled}) {
    restore(before);
    run_blocks(ctx, site, s, seed, body);
    check_guards(site.kernel);
    compare_runs(site, want, snapshot(), s);
  }
}

}  // namespace lockstep::gpu::emu
