// The CUDA backend's kernels on the device, bit for bit against the CPU
// kernels (label gpu; built where the CUDA backend is, run by the device check,
// scripts/gpu-check.sh). Each test calls the CPU entry point with Context::gpu
// set to the CUDA backend (LS_GPU_DISPATCH forwards the call), on inputs and
// outputs in the backend's device memory, copies the results back and compares
// every bit with the same call on the CPU. Without a CUDA device every test is
// skipped (GTEST_SKIP, naming the driver's error).
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/rmsnorm.h"
#include "lockstep/kernels/cpu/rows.h"
#include "lockstep/kernels/cpu/softmax.h"
#include "lockstep/kernels/cpu/swiglu.h"
#include "lockstep/kernels/gpu/device.h"

namespace lockstep::kernels {
namespace gpu::cuda {
DeviceRuntime device_runtime();  // kernels/gpu/runtime.cu
}  // namespace gpu::cuda

namespace {

// The CUDA backend, or null with `why` set when there is no device.
const GpuBackend* cuda_backend(std::string* why) {
  static std::string reason;
  static const GpuBackend* b = []() -> const GpuBackend* {
    register_device_runtime(gpu::cuda::device_runtime());
    try {
      return device_backend(Device::Cuda, "test");
    } catch (const Error& e) {
      reason = e.what();
      return nullptr;
    }
  }();
  *why = reason;
  return b;
}

#define LS_NEED_CUDA(b)                      \
  std::string why_;                          \
  const GpuBackend* b = cuda_backend(&why_); \
  if (b == nullptr) GTEST_SKIP() << why_

// A device tensor holding `host` (f32 or i32 bits).
template <typename T>
OwnedTensor on_device(const GpuBackend& b, const std::vector<T>& host, DType dtype,
                      std::vector<int64_t> shape) {
  OwnedTensor t(dtype, std::move(shape), *b.memory, Fill::Undefined, "test input");
  b.memory->copy_in(t.view().data, host.data(), host.size() * sizeof(T));
  return t;
}
OwnedTensor undefined(const GpuBackend& b, std::vector<int64_t> shape) {
  return OwnedTensor(DType::F32, std::move(shape), *b.memory, Fill::Undefined, "test output");
}
std::vector<uint32_t> bits_of(const GpuBackend& b, const OwnedTensor& t) {
  std::vector<uint32_t> out(static_cast<size_t>(t.numel()));
  b.memory->copy_out(out.data(), t.view().data, out.size() * sizeof(uint32_t));
  return out;
}
std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

TEST(CudaKernels, GemmXwtMatchesTheCpu) {
  LS_NEED_CUDA(b);
  for (const auto [M, N, K] :
       {std::array<int64_t, 3>{1, 7, 5}, {17, 33, 65}, {64, 96, 128}, {3, 1000, 257}}) {
    const std::vector<float> x = test::randn(M * K, 1), w = test::randn(N * K, 2);
    std::vector<float> y(static_cast<size_t>(M * N));
    Context cpu;
    gemm_xwt(cpu, Tensor(y.data(), DType::F32, {M, N}),
             Tensor(const_cast<float*>(x.data()), DType::F32, {M, K}),
             Tensor(const_cast<float*>(w.data()), DType::F32, {N, K}));
    Context dev;
    dev.gpu = b;
    OwnedTensor dx = on_device(*b, x, DType::F32, {M, K}), dw = on_device(*b, w, DType::F32, {N, K});
    OwnedTensor dy = undefined(*b, {M, N});
    gemm_xwt(dev, dy.view(), dx.view(), dw.view());
    EXPECT_EQ(bits_of(*b, dy), bits_of(y)) << "M=" << M << " N=" << N << " K=" << K;
  }
}

TEST(CudaKernels, RmsnormAndSwigluMatchTheCpu) {
  LS_NEED_CUDA(b);
  const int64_t T = 19, D = 77;
  const std::vector<float> x = test::randn(T * D, 3), w = test::randn(D, 4), g = test::randn(T * D, 5, 6.0f);
  std::vector<float> y(static_cast<size_t>(T * D)), rstd(static_cast<size_t>(T)),
      s(static_cast<size_t>(T * D));
  Context cpu;
  auto host = [](const std::vector<float>& v, std::vector<int64_t> shape) {
    return Tensor(const_cast<float*>(v.data()), DType::F32, shape);
  };
  rmsnorm_forward(cpu, host(y, {T, D}), host(rstd, {T}), host(x, {T, D}), host(w, {D}), 1e-6f);
  swiglu_forward(cpu, host(s, {T, D}), host(g, {T, D}), host(x, {T, D}));
  Context dev;
  dev.gpu = b;
  OwnedTensor dx = on_device(*b, x, DType::F32, {T, D}), dw = on_device(*b, w, DType::F32, {D});
  OwnedTensor dg = on_device(*b, g, DType::F32, {T, D});
  OwnedTensor dy = undefined(*b, {T, D}), dr = undefined(*b, {T}), ds = undefined(*b, {T, D});
  rmsnorm_forward(dev, dy.view(), dr.view(), dx.view(), dw.view(), 1e-6f);
  swiglu_forward(dev, ds.view(), dg.view(), dx.view());
  EXPECT_EQ(bits_of(*b, dy), bits_of(y));
  EXPECT_EQ(bits_of(*b, dr), bits_of(rstd));
  EXPECT_EQ(bits_of(*b, ds), bits_of(s));
}

// The row-wise adds, the sigmoid and the fp8 activation quantizer of the
// rollout forward (kernels/cpu/rows.h, fp8_quant.h), in the forward's order.
TEST(CudaKernels, RowAddsSigmoidAndFp8QuantizeMatchTheCpu) {
  LS_NEED_CUDA(b);
  const int64_t T = 21, N = 300;
  const std::vector<float> y0 = test::randn(T * N, 6, 3.0f), x = test::randn(T * N, 7), s = test::randn(T, 8),
                           bias = test::randn(N, 9);
  std::vector<float> y = y0, sg(static_cast<size_t>(T));
  Context cpu;
  auto host = [](const std::vector<float>& v, std::vector<int64_t> shape) {
    return Tensor(const_cast<float*>(v.data()), DType::F32, shape);
  };
  add_row_bias(cpu, host(y, {T, N}), host(bias, {N}));
  add_rows(cpu, host(y, {T, N}), host(y, {T, N}), host(x, {T, N}));
  sigmoid_forward(cpu, host(sg, {T}), host(s, {T}));
  add_scaled_rows(cpu, host(y, {T, N}), host(x, {T, N}), host(sg, {T}));
  fp8_quantize_rows(cpu, host(y, {T, N}), 128);
  Context dev;
  dev.gpu = b;
  OwnedTensor dy = on_device(*b, y0, DType::F32, {T, N}), dx = on_device(*b, x, DType::F32, {T, N});
  OwnedTensor ds = on_device(*b, s, DType::F32, {T}), db = on_device(*b, bias, DType::F32, {N});
  OwnedTensor dsg = undefined(*b, {T});
  add_row_bias(dev, dy.view(), db.view());
  add_rows(dev, dy.view(), dy.view(), dx.view());
  sigmoid_forward(dev, dsg.view(), ds.view());
  add_scaled_rows(dev, dy.view(), dx.view(), dsg.view());
  fp8_quantize_rows(dev, dy.view(), 128);
  EXPECT_EQ(bits_of(*b, dsg), bits_of(sg));
  EXPECT_EQ(bits_of(*b, dy), bits_of(y));
}

TEST(CudaKernels, TokenLogprobMatchesTheCpu) {
  LS_NEED_CUDA(b);
  const int64_t T = 9, V = 1531;
  const std::vector<float> logits = test::randn(T * V, 6, 4.0f);
  std::vector<int32_t> targets(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) targets[static_cast<size_t>(t)] = static_cast<int32_t>((t * 613) % V);
  std::vector<float> lp(static_cast<size_t>(T)), ent(lp.size()), lse(lp.size());
  Context cpu;
  token_logprob_forward(cpu, Tensor(lp.data(), DType::F32, {T}), Tensor(ent.data(), DType::F32, {T}),
                        Tensor(lse.data(), DType::F32, {T}),
                        Tensor(const_cast<float*>(logits.data()), DType::F32, {T, V}),
                        Tensor(targets.data(), DType::I32, {T}), 0.9f);
  Context dev;
  dev.gpu = b;
  OwnedTensor dl = on_device(*b, logits, DType::F32, {T, V}), dt = on_device(*b, targets, DType::I32, {T});
  OwnedTensor dlp = undefined(*b, {T}), dent = undefined(*b, {T}), dlse = undefined(*b, {T});
  token_logprob_forward(dev, dlp.view(), dent.view(), dlse.view(), dl.view(), dt.view(), 0.9f);
  EXPECT_EQ(bits_of(*b, dlp), bits_of(lp));
  EXPECT_EQ(bits_of(*b, dent), bits_of(ent));
  EXPECT_EQ(bits_of(*b, dlse), bits_of(lse));
}

TEST(CudaKernels, AdamwMatchesTheCpu) {
  LS_NEED_CUDA(b);
  const int64_t n = 10007;
  std::vector<float> p = test::randn(n, 7), g = test::randn(n, 8), m = test::randn(n, 9, 0.1f);
  std::vector<float> v = test::randn(n, 10, 0.1f);
  for (auto& x : v) x = x * x;
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  hp.step = 3;
  Context dev;
  dev.gpu = b;
  OwnedTensor dp = on_device(*b, p, DType::F32, {n}), dg = on_device(*b, g, DType::F32, {n});
  OwnedTensor dm = on_device(*b, m, DType::F32, {n}), dv = on_device(*b, v, DType::F32, {n});
  adamw_step(dev, dp.f32(), dg.f32(), dm.f32(), dv.f32(), n, hp);
  Context cpu;
  adamw_step(cpu, p.data(), g.data(), m.data(), v.data(), n, hp);
  EXPECT_EQ(bits_of(*b, dp), bits_of(p));
  EXPECT_EQ(bits_of(*b, dm), bits_of(m));
  EXPECT_EQ(bits_of(*b, dv), bits_of(v));
}

// The table is complete (device selection refuses it otherwise), and its
// memory is device memory, poisoned when Undefined.
TEST(CudaKernels, TheDeviceBackendIsCompleteAndItsMemoryIsNotHostVisible) {
  LS_NEED_CUDA(b);
  EXPECT_TRUE(b->missing().empty());
  EXPECT_STREQ(b->name, "cuda");
  ASSERT_NE(b->memory, nullptr);
  EXPECT_FALSE(b->memory->host_visible());
  OwnedTensor t = undefined(*b, {4});
  EXPECT_TRUE(b->memory->holds(t.view().data));
  std::vector<float> h(4);
  EXPECT_FALSE(b->memory->holds(h.data()));
  // Undefined memory reads as 0xFF bytes, as in interpret mode.
  for (uint32_t x : bits_of(*b, t)) EXPECT_EQ(x, 0xFFFFFFFFu);
}

}  // namespace
}  // namespace lockstep::kernels
