// The device memory of each build, behind lockstep's Allocator interface
// (tensor/allocator.h): emulated device memory with guard zones in interpret
// mode, stream-ordered cudaMallocAsync / hipMallocAsync on a device. The engines allocate weights, KV
// blocks, activations and scratch through it (kernels::device_memory).
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/registry.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

#if defined(LOCKSTEP_GPU_INTERP)

// Host memory that the emulator knows as device memory: guard zones on both
// sides (checked after every launch), Undefined contents NaN-poisoned, every
// kernel pointer argument checked to lie inside one, and, unless
// emu::Options::host_access, inaccessible to host code outside launches and
// these copies (emu.h): a host read faults as it would on a device.
class DeviceMemory final : public Allocator {
 public:
  const char* name() const override { return "interpret"; }
  void* allocate(size_t bytes, Fill fill, const char* what) const override {
    if (bytes == 0) return nullptr;
    void* p = ::lockstep::gpu::emu::device_alloc(bytes, what);
    if (fill == Fill::Zero) ::lockstep::gpu::emu::fill_device(p, 0, bytes);
    return p;
  }
  // device_free throws only for a pointer it never gave out: a bug, which
  // terminates here.
  void release(void* p) const noexcept override { ::lockstep::gpu::emu::device_free(p); }
  // Whether host code may read it directly: only with the debugging switch.
  bool host_visible() const override { return ::lockstep::gpu::emu::options().host_access; }
  bool holds(const void* p) const override { return ::lockstep::gpu::emu::is_device_memory(p); }
  void copy_in(void* dst, const void* src, size_t bytes) const override {
    ::lockstep::gpu::emu::copy_to_device(dst, src, bytes);
  }
  void copy_out(void* dst, const void* src, size_t bytes) const override {
    ::lockstep::gpu::emu::copy_from_device(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    ::lockstep::gpu::emu::copy_on_device(dst, src, bytes);
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
               size_t rows) const override {
    ::lockstep::gpu::emu::copy_on_device_2d(dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }
  void fill(void* dst, unsigned char byte, size_t bytes) const override {
    if (bytes) ::lockstep::gpu::emu::fill_device(dst, byte, bytes);
  }
};

#else

#if defined(LOCKSTEP_GPU_HIP)
#define LS_RT(x) hip##x
#else
#define LS_RT(x) cuda##x
#endif

// The runtime's device memory, stream-ordered on the backend's stream
// (launch.h): allocations, fills, frees and copies queue behind the kernels
// launched before them. Host code never touches it: copies to and from the
// host go through copy_in / copy_out, which wait for their copy (the host
// buffer may change or go as soon as they return).
class DeviceMemory final : public Allocator {
 public:
#if defined(LOCKSTEP_GPU_HIP)
  const char* name() const override { return "hip"; }
#else
  const char* name() const override { return "cuda"; }
#endif
  void* allocate(size_t bytes, Fill fill, const char* what) const override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    // The runtime aligns allocations to at least 256 bytes.
    const auto rc = LS_RT(MallocAsync)(&p, bytes, stream());
    if (rc != LS_RT(Success)) {
      LS_THROW << name() << ": out of device memory allocating " << bytes << " bytes for " << what << " ("
               << LS_RT(GetErrorString)(rc) << ")";
    }
    // Undefined memory is set to 0xFF bytes (NaN as f32), as in interpret
    // mode, so a read of an unwritten element shows the same way.
    check(LS_RT(MemsetAsync)(p, fill == Fill::Zero ? 0 : 0xFF, bytes, stream()), "memset");
    return p;
  }
  // After the kernels queued before that use p. noexcept: an error (the
  // runtime already shut down at exit) is dropped, and cleared so that the next
  // launch's check does not report it as its own.
  void release(void* p) const noexcept override {
    if (p && LS_RT(FreeAsync)(p, stream()) != LS_RT(Success)) (void)LS_RT(GetLastError)();
  }
  bool host_visible() const override { return false; }
  bool holds(const void* p) const override {
    if (p == nullptr) return false;
#if defined(LOCKSTEP_GPU_HIP)
    hipPointerAttribute_t a{};  // ROCm 5: memoryType
    const bool device = hipPointerGetAttributes(&a, p) == hipSuccess && a.memoryType == hipMemoryTypeDevice;
#else
    cudaPointerAttributes a{};
    const bool device = cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice;
#endif
    (void)LS_RT(GetLastError)();  // a host pointer is an answer, not an error for the next launch
    return device;
  }
  void copy_in(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    check(LS_RT(MemcpyAsync)(dst, src, bytes, LS_RT(MemcpyHostToDevice), stream()), "copy to the device");
    check(LS_RT(StreamSynchronize)(stream()), "copy to the device (wait)");
  }
  void copy_out(void* dst, const void* src, size_t bytes) const override {
    if (bytes == 0) return;
    check(LS_RT(MemcpyAsync)(dst, src, bytes, LS_RT(MemcpyDeviceToHost), stream()), "copy from the device");
    check(LS_RT(StreamSynchronize)(stream()), "copy from the device (wait)");
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    if (bytes)
      check(LS_RT(MemcpyAsync)(dst, src, bytes, LS_RT(MemcpyDeviceToDevice), stream()), "copy on the device");
  }
  void fill(void* dst, unsigned char byte, size_t bytes) const override {
    if (bytes) check(LS_RT(MemsetAsync)(dst, byte, bytes, stream()), "memset");
  }

 private:
  template <typename E>
  void check(E rc, const char* what) const {
    if (rc != LS_RT(Success)) {
      LS_THROW << name() << ": " << what << " failed: " << LS_RT(GetErrorName)(rc) << " ("
               << LS_RT(GetErrorString)(rc) << ")";
    }
  }
};

#undef LS_RT
#endif

}  // namespace

void register_memory(GpuBackend& b) {
  static const DeviceMemory* memory = new DeviceMemory;  // never destroyed: buffers release through it at exit
  b.memory = memory;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
