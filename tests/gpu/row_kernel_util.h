// Helpers of the GPU row and elementwise kernel tests (rmsnorm, rope, swiglu,
// softmax): arrays in emulated device memory, strided views of them, a bitwise
// comparison that names the first difference, and the error text of a call.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/gpu/interp/emu.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::gpu_test {

namespace emu = lockstep::gpu::emu;

// n elements of T in emulated device memory (guarded, poisoned with 0xFF bytes
// until written), freed at scope end.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(int64_t n, const char* what)
      : n_(n),
        p_(static_cast<T*>(
            emu::device_alloc(sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1)), what))) {}
  explicit DeviceArray(const std::vector<T>& v, const char* what)
      : DeviceArray(static_cast<int64_t>(v.size()), what) {
    upload(v);
  }
  ~DeviceArray() { emu::device_free(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return p_; }
  int64_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    ASSERT_EQ(static_cast<int64_t>(v.size()), n_);
    emu::copy_to_device(p_, v.data(), sizeof(T) * v.size());
  }
  std::vector<T> host() const {
    std::vector<T> v(static_cast<size_t>(n_));
    emu::copy_from_device(v.data(), p_, sizeof(T) * v.size());
    return v;
  }

 private:
  int64_t n_;
  T* p_;
};

// (rows, cols) f32 view of p with row stride ld (>= cols).
inline Tensor rows_view(float* p, int64_t rows, int64_t cols, int64_t ld) {
  Tensor t(p, DType::F32, {rows, cols});
  t.stride[0] = ld;
  return t;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Equal bit patterns element for element (NaN payloads included).
inline void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) != bits_of(want[i])) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.9g (0x%08x) vs CPU %.9g (0x%08x)", got[i], bits_of(got[i]), want[i],
                    bits_of(want[i]));
      ADD_FAILURE() << what << ": first differing element " << i << " of " << got.size() << ": " << buf;
      return;
    }
  }
}

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A Context with a pool of `threads` (the pool lives as long as the object).
struct PoolContext {
  explicit PoolContext(int threads) : pool(make_pool(threads)) { ctx.pool = pool.get(); }
  std::unique_ptr<ThreadPool> pool;
  Context ctx;
};

}  // namespace lockstep::gpu_test
