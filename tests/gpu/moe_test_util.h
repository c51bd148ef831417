// Helpers shared by the GPU MoE tests (moe_test.cpp, moe_backward_test.cpp):
// host vectors copied into emulated device memory, a bytewise comparison,
// strided 2-D views, and the router launch geometries both sweep.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/kernels/gpu/interp/emu.h"
#include "lockstep/kernels/gpu/moe.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels::moe_test {

namespace emu = ::lockstep::gpu::emu;
namespace dev = ::lockstep::kernels::gpu::interp;

// A copy of a host vector in emulated device memory (guard zones, poisoned
// until written); freed at scope end.
template <typename T>
class DeviceVec {
 public:
  DeviceVec(const std::vector<T>& host, const char* what)
      : n_(std::max<size_t>(host.size(), 1)), p_(static_cast<T*>(emu::device_alloc(n_ * sizeof(T), what))) {
    emu::copy_to_device(p_, host.data(), host.size() * sizeof(T));
  }
  ~DeviceVec() { emu::device_free(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* data() const { return p_; }
  std::vector<T> host(size_t n) const {
    std::vector<T> v(n);
    emu::copy_from_device(v.data(), p_, n * sizeof(T));
    return v;
  }

 private:
  size_t n_;
  T* p_;
};

template <typename T>
void expect_same_bytes(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      FAIL() << what << ": first differing element " << i << " (gpu " << got[i] << ", cpu " << want[i] << ")";
    }
  }
}

// (rows, cols) view with row stride `stride` (>= cols).
inline Tensor view2(void* p, DType dt, int64_t rows, int64_t cols, int64_t stride) {
  Tensor t(p, dt, {rows, cols});
  t.stride[0] = stride;
  return t;
}

// The launch geometries the router runs under: tiny blocks (fewer threads
// than the 16 lanes or the experts), the default, the largest, and a grid
// smaller than the token count (blocks loop over tokens).
inline constexpr dev::MoeRouteLaunch kRouteLaunches[] = {{64, 0}, {1, 0}, {5, 3}, {16, 1}, {256, 0}, {33, 2}};

}  // namespace lockstep::kernels::moe_test
