// Interpret mode: the GPU kernel sources run on the CPU, every block and every
// thread of a launch, each thread a fiber (Boost.Context). Built with the host
// compiler only; kernels reach it through kernels/gpu/portable.h, never
// directly.
//
// A block's threads run one at a time, in an order chosen per launch (forward,
// reverse or shuffled), each until it reaches __syncthreads() or returns. What
// an emulator can catch, it catches, and the error names the kernel, its launch
// site, the block, the thread and the source line:
//   - a barrier not reached by every thread of the block, or threads waiting
//     at different barriers;
//   - shared memory read before it is written (poisoned with NaN / 0xFF at the
//     start of every block) and uninitialised device memory (device_alloc
//     poisons it the same way): the NaN reaches the result;
//   - writes outside a device allocation: every allocation has guard zones on
//     both sides, checked after every launch; reads there return NaN;
//   - a kernel given a host pointer: every pointer argument of a launch must
//     lie inside a device allocation (Options::check_pointers);
//   - host code touching device memory: device allocations are mapped
//     PROT_NONE except while a launch or a copy runs (Options::host_access
//     off, the default), so a host read or write faults at once and the
//     SIGSEGV handler names the allocation and the host code;
//   - races inside a block: with Options::check_races every launch runs in
//     all three orders from the same device memory and the results must agree
//     byte for byte (Schedule::Rotate, the default, changes the order from one
//     launch to the next, so a race also shows as a mismatch against the CPU).
// It cannot catch memory-model or fence bugs, communication between blocks,
// resource limits other than shared memory and threads per block, or speed
// (docs/gpu.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "lockstep/base/thread_pool.h"

// CUDA's index types, for kernels compiled by the host compiler.
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace lockstep::gpu::emu {

enum class Schedule {
  Forward,   // thread 0, 1, ..., n-1 between barriers
  Reverse,   // n-1, ..., 0
  Shuffled,  // a fresh permutation at every barrier (seeded by the launch number)
  Rotate,    // launch i uses Forward, Reverse, Shuffled for i % 3 (the default)
};

// Whether LOCKSTEP_INTERPRET_HOST_ACCESS is set to 1 (the default of
// Options::host_access).
bool host_access_from_environment();

struct Options {
  Schedule schedule = Schedule::Rotate;
  // Run every launch in all three orders, restoring device memory (every live
  // device_alloc allocation) in between, and throw if the results differ.
  // Only device_alloc memory is restored: kernels under this check must not
  // write host memory.
  bool check_races = false;
  // Every pointer argument of a launch must be null or point into a live
  // device_alloc allocation (as on a device, where a host pointer faults):
  // catches engine memory that bypassed the device allocator.
  bool check_pointers = true;
  // Whether host code may touch device memory outside launches and copies.
  // Off (strict, the default): device allocations are inaccessible to the
  // host (PROT_NONE pages) except inside a DeviceWindow (launches, the
  // copies below), and a host access aborts naming the allocation and the
  // host code, as a device faults. On: device memory is plain host memory (a
  // debugging switch; the environment variable
  // LOCKSTEP_INTERPRET_HOST_ACCESS=1 turns it on for a whole process).
  bool host_access = host_access_from_environment();
  size_t stack_bytes = 64 * 1024;  // per emulated thread
  int max_threads_per_block = 1024;
  size_t max_shared_bytes = 48 * 1024;  // static shared memory per block (CUDA's default limit)
};

// Process-wide options. Change them only between launches.
Options& options();

// Applies options().host_access to the live allocations now (else it takes
// effect at the next launch or copy). Call it after changing the option.
void apply_host_access();

// Sets options for a scope (tests), restoring the previous ones at its end.
class ScopedOptions {
 public:
  explicit ScopedOptions(const Options& o) : saved_(options()) {
    options() = o;
    apply_host_access();
  }
  ~ScopedOptions() {
    options() = saved_;
    apply_host_access();
  }
  ScopedOptions(const ScopedOptions&) = delete;
  ScopedOptions& operator=(const ScopedOptions&) = delete;

 private:
  Options saved_;
};

// ---- device memory -------------------------------------------------------

// `bytes` of emulated device memory with guard zones on both sides, its
// contents poisoned (0xFF bytes: NaN as f32). `what` names it in errors.
// Its own pages (mmap), inaccessible to the host outside a DeviceWindow
// unless Options::host_access.
void* device_alloc(size_t bytes, const char* what);
void device_free(void* p);

// While one exists, every device allocation is readable and writable by the
// host: launches and the copies below hold one. Reference counted under a
// mutex, so overlapping windows (launches and copies on several host
// threads) are safe; the last one to close makes the memory inaccessible
// again. While any window is open, host code on every thread may touch
// device memory unnoticed.
class DeviceWindow {
 public:
  DeviceWindow();
  ~DeviceWindow();
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;
};

// The host's explicit ways into device memory (each inside a DeviceWindow):
// what cudaMemcpy and cudaMemset are on a device.
void copy_to_device(void* dst, const void* host_src, size_t bytes);
void copy_from_device(void* host_dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);
void fill_device(void* dst, unsigned char byte, size_t bytes);
// rows rows of row_bytes, row r from src + r * src_pitch to dst + r * dst_pitch.
void copy_on_device_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                       size_t rows);
template <typename T>
T read_device(const T* src) {
  T v;
  copy_from_device(&v, src, sizeof(T));
  return v;
}
// Throws Error naming the allocation and the offset when a guard zone was
// overwritten. Every launch calls it on return.
void check_guards(const char* after_kernel);
size_t live_allocations();
// Whether p lies inside a live allocation (its end included: an empty view).
bool is_device_memory(const void* p);

// ---- what a running kernel thread sees -----------------------------------

const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void sync_threads(const char* file, int line);
void* shared_bytes(size_t bytes, size_t align, const char* name, const char* file, int line);
template <typename T>
T* shared_array(int64_t n, const char* name, const char* file, int line) {
  return static_cast<T*>(shared_bytes(sizeof(T) * static_cast<size_t>(n), alignof(T), name, file, line));
}

// ---- launches --------------------------------------------------------------

struct LaunchSite {
  const char* kernel;
  const char* file;
  int line;
  dim3 grid, block;
};

// Runs body(thread) for every thread of every block of the launch, with the
// checks above; blocks are spread over ctx's thread pool.
void run_launch(const Context& ctx, const LaunchSite& site, const std::function<void()>& body);
// Throws naming the kernel, its launch site and the argument when p is
// neither null nor device memory.
void check_pointer_arg(const LaunchSite& site, size_t arg, const void* p);

// LS_LAUNCH(ctx, kernel, grid, block)(args...) in interpret mode.
template <typename... P>
class Launch {
 public:
  Launch(const Context& ctx, const char* name, const char* file, int line, dim3 grid, dim3 block,
         void (*kernel)(P...))
      : ctx_(ctx), site_{name, file, line, grid, block}, kernel_(kernel) {}

  template <typename... A>
  void operator()(A&&... args) const {
    std::tuple<P...> params(std::forward<A>(args)...);
    if (options().check_pointers) check_pointers(params, std::index_sequence_for<P...>{});
    auto* k = kernel_;
    run_launch(ctx_, site_, [&params, k] { std::apply(k, params); });
  }

 private:
  template <size_t... I>
  void check_pointers(const std::tuple<P...>& params, std::index_sequence<I...>) const {
    (check_one(I, std::get<I>(params)), ...);
  }
  template <typename T>
  void check_one(size_t arg, const T& value) const {
    if constexpr (std::is_pointer_v<T>) check_pointer_arg(site_, arg, static_cast<const void*>(value));
  }

  const Context& ctx_;
  LaunchSite site_;
  void (*kernel_)(P...);
};

}  // namespace lockstep::gpu::emu
