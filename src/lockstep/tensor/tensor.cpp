// Tensor view helpers and the aligned Buffer.
#include "lockstep/tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

namespace lockstep {

namespace {
void set_contiguous(Tensor& t, const int64_t* dims, int n) {
  LS_CHECK(n >= 0 && n <= kMaxDims) << "tensor rank " << n << " exceeds " << kMaxDims;
  t.ndim = n;
  int64_t s = 1;
  for (int i = n - 1; i >= 0; --i) {
    LS_CHECK(dims[i] >= 0) << "negative dimension " << dims[i];
    t.shape[i] = dims[i];
    t.stride[i] = s;
    s *= dims[i];
  }
}
}  // namespace

Tensor::Tensor(void* d, DType t, std::initializer_list<int64_t> s) : data(d), dtype(t) {
  set_contiguous(*this, s.begin(), static_cast<int>(s.size()));
}
Tensor::Tensor(void* d, DType t, const std::vector<int64_t>& s) : data(d), dtype(t) {
  set_contiguous(*this, s.data(), static_cast<int>(s.size()));
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim;
  LS_CHECK(i >= 0 && i < ndim) << "dim " << i << " out of range for " << shape_str();
  return shape[i];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << shape[i];
  os << (ndim == 1 ? ",)" : ")") << " " << dtype_name(dtype);
  return os.str();
}

float* Tensor::f32() const {
  LS_CHECK(dtype == DType::F32) << "expected f32, tensor is " << shape_str();
  return static_cast<float*>(data);
}
bf16_t* Tensor::bf16() const {
  LS_CHECK(dtype == DType::BF16) << "expected bf16, tensor is " << shape_str();
  return static_cast<bf16_t*>(data);
}
fp8_t* Tensor::fp8() const {
  LS_CHECK(dtype == DType::FP8E4M3) << "expected fp8_e4m3, tensor is " << shape_str();
  return static_cast<fp8_t*>(data);
}

int32_t* Tensor::i32() const {
  LS_CHECK(dtype == DType::I32) << "expected i32, tensor is " << shape_str();
  return static_cast<int32_t*>(data);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  LS_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0])
      << "rows [" << begin << ", " << end << ") out of range for " << shape_str();
  Tensor t = *this;
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * stride[0]) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::slice_cols(int64_t begin, int64_t end) const {
  LS_CHECK(ndim == 2 && begin >= 0 && begin <= end && end <= shape[1])
      << "columns [" << begin << ", " << end << ") out of range for " << shape_str();
  Tensor t = *this;
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * stride[1]) * dtype_size(dtype);
  t.shape[1] = end - begin;
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> s) const {
  LS_CHECK(is_contiguous()) << "reshape of a non-contiguous tensor " << shape_str();
  Tensor t(data, dtype, s);
  LS_CHECK(t.numel() == numel()) << "cannot reshape " << shape_str() << " to " << t.shape_str();
  return t;
}

void check_shape(const Tensor& t, std::initializer_list<int64_t> expect, const char* what) {
  bool ok = t.ndim == static_cast<int>(expect.size());
  int i = 0;
  for (int64_t e : expect) {
    if (ok && e >= 0 && t.shape[i] != e) ok = false;
    ++i;
  }
  if (!ok) {
    std::ostringstream os;
    os << "(";
    i = 0;
    for (int64_t e : expect) {
      os << (i++ ? ", " : "");
      if (e < 0) os << "*"; else os << e;
    }
    os << ")";
    LS_THROW << what << ": expected shape " << os.str() << ", got " << t.shape_str();
  }
}

void check_dtype(const Tensor& t, DType dtype, const char* what) {
  if (t.dtype != dtype) LS_THROW << what << ": expected dtype " << dtype_name(dtype) << ", got " << t.shape_str();
}

Buffer::Buffer(size_t nbytes) : Buffer(nbytes, host_allocator()) {}
Buffer::Buffer(size_t nbytes, const Allocator& memory, Fill fill, const char* what)
    : data_(memory.allocate(nbytes, fill, what)), size_(nbytes), memory_(&memory) {}
Buffer::~Buffer() { memory_->release(data_); }
Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
      memory_(std::exchange(o.memory_, &host_allocator())) {}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    memory_->release(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    memory_ = std::exchange(o.memory_, &host_allocator());
  }
  return *this;
}

Buffer in_memory(Buffer b, const Allocator& memory, const char* what) {
  if (b.size() == 0 || memory.holds(b.data())) return b;
  Buffer out(b.size(), memory, Fill::Zero, what);
  memory.copy_in(out.data(), b.data(), b.size());
  return out;
}

OwnedTensor::OwnedTensor(DType dtype, std::vector<int64_t> shape) : OwnedTensor(dtype, shape, host_allocator()) {}
OwnedTensor::OwnedTensor(DType dtype, std::vector<int64_t> shape, const Allocator& memory, Fill fill,
                         const char* what) {
  Tensor probe(nullptr, dtype, shape);
  buf_ = Buffer(probe.nbytes(), memory, fill, what);
  view_ = Tensor(buf_.data(), dtype, shape);
}

}  // namespace lockstep
