// Tensor: a non-owning view (data pointer, dtype, shape, strides in elements)
// and Buffer: an owning, 64-byte-aligned allocation from an Allocator (host
// memory unless told otherwise). Kernels take views and check shapes; they
// never own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/tensor/allocator.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep {

constexpr int kMaxDims = 4;
constexpr size_t kAlignment = 64;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};  // in elements

  Tensor() = default;
  // Contiguous (row-major) view.
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape);
  Tensor(void* data, DType dtype, const std::vector<int64_t>& shape);

  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  std::string shape_str() const;  // "(3, 4) f32"

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  float* f32() const;  // checks dtype
  bf16_t* bf16() const;
  fp8_t* fp8() const;
  int32_t* i32() const;

  // View of rows [begin, end) along dim 0.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // View of columns [begin, end) of a 2-D tensor (keeps the row stride).
  Tensor slice_cols(int64_t begin, int64_t end) const;
  // Same data, new contiguous shape with the same element count.
  Tensor reshape(std::initializer_list<int64_t> shape) const;
};

// Checks that t has exactly this shape (-1 matches anything) and dtype; the
// error names `what`, the expected and the actual shape.
void check_shape(const Tensor& t, std::initializer_list<int64_t> expect, const char* what);
void check_dtype(const Tensor& t, DType dtype, const char* what);

// Owning aligned memory. Movable, not copyable.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t nbytes);  // host memory, zero-filled
  // `what` names the allocation in the allocator's errors.
  Buffer(size_t nbytes, const Allocator& memory, Fill fill = Fill::Zero, const char* what = "buffer");
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The allocator that holds the memory (host_allocator() when empty).
  const Allocator& memory() const { return *memory_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  const Allocator* memory_ = &host_allocator();
};

// b itself when `memory` holds it, else a copy of it in `memory`.
Buffer in_memory(Buffer b, const Allocator& memory, const char* what);

// n elements of a trivially copyable T in an allocator's memory, copied in
// from host values: small tables the kernels read (RoPE cos/sin, ...).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const std::vector<T>& host, const Allocator& memory, const char* what)
      : buf_(host.size() * sizeof(T), memory, Fill::Undefined, what), n_(host.size()) {
    memory.copy_in(buf_.data(), host.data(), host.size() * sizeof(T));
  }
  const T* data() const { return buf_.as<const T>(); }
  size_t size() const { return n_; }
  // Host reads: only for memory the host can see (host, interpret mode).
  const T& operator[](size_t i) const { return data()[i]; }
  const Allocator& memory() const { return buf_.memory(); }

 private:
  Buffer buf_;
  size_t n_ = 0;
};

// A Buffer with a dtype and shape: the common case of "a tensor I own".
class OwnedTensor {
 public:
  OwnedTensor() = default;
  OwnedTensor(DType dtype, std::vector<int64_t> shape);  // host memory, zero-filled
  OwnedTensor(DType dtype, std::vector<int64_t> shape, const Allocator& memory, Fill fill = Fill::Zero,
              const char* what = "tensor");
  const Tensor& view() const { return view_; }
  Tensor& view() { return view_; }
  float* f32() const { return view_.f32(); }
  int64_t numel() const { return view_.numel(); }
  const Allocator& memory() const { return buf_.memory(); }

 private:
  Buffer buf_;
  Tensor view_;
};

}  // namespace lockstep
