// Strict interpret mode: device memory is inaccessible to host code outside
// launches and the allocator's copies, as on a device. A planted host read
// dies naming the allocation; the debugging switch (Options::host_access,
// LOCKSTEP_INTERPRET_HOST_ACCESS=1) lets the same read pass; launches and
// copies keep working.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/cpu/moe.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/model/forward_util.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {
namespace {

namespace emu = ::lockstep::gpu::emu;

const Allocator& device() {
  return *interpret_backend().memory;
}

emu::Options with_host_access(bool on) {
  emu::Options o = emu::options();
  o.host_access = on;
  return o;
}

LS_GLOBAL void add_one_kernel(const float* x, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = gpu::ls_add(x[i], 1.0f);
}

// A host read of element 3 of a device buffer named `what`.
float planted_host_read(const char* what) {
  Buffer b(64 * sizeof(float), device(), Fill::Zero, what);
  const volatile float* p = b.as<float>();
  return p[3];
}

TEST(GpuHostAccessDeathTest, HostReadOfDeviceMemoryDiesNamingTheAllocation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const emu::ScopedOptions strict(with_host_access(false));
  EXPECT_FALSE(device().host_visible());
  EXPECT_DEATH(planted_host_read("planted logits"),
               "host code touched device memory: allocation 'planted logits' \\(\\+offset 12 of 256 bytes\\)"
               "(.|\n)*innermost first");
}

TEST(GpuHostAccessDeathTest, HostWriteAndGuardZoneTouchDieToo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const emu::ScopedOptions strict(with_host_access(false));
  EXPECT_DEATH(
      {
        Buffer b(100, device(), Fill::Undefined, "planted kv block");
        static_cast<volatile unsigned char*>(b.data())[99] = 1;
      },
      "allocation 'planted kv block' \\(\\+offset 99 of 100 bytes\\)");
  EXPECT_DEATH(
      {
        Buffer b(100, device(), Fill::Undefined, "planted scratch");
        (void)static_cast<const volatile unsigned char*>(b.data())[-4];  // the lower guard zone
      },
      "allocation 'planted scratch' \\(\\+offset -4 of 100 bytes\\)");
}

TEST(GpuHostAccessDeathTest, TheSwitchLetsTheSameReadPass) {
  {
    const emu::ScopedOptions open(with_host_access(true));
    EXPECT_TRUE(device().host_visible());
    EXPECT_EQ(planted_host_read("planted logits"), 0.0f);
  }
  // The environment variable sets the option's default.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("LOCKSTEP_INTERPRET_HOST_ACCESS", "1", 1);
        emu::options() = emu::Options{};
        emu::apply_host_access();
        std::exit(planted_host_read("planted logits") == 0.0f && device().host_visible() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  // Turned off again, memory made while it was on closes too.
  const emu::ScopedOptions strict(with_host_access(false));
  EXPECT_DEATH(
      {
        emu::Options on = with_host_access(true);
        emu::options() = on;
        Buffer b(64, device(), Fill::Zero, "made while open");
        emu::options().host_access = false;
        emu::apply_host_access();
        (void)static_cast<const volatile unsigned char*>(b.data())[0];
      },
      "allocation 'made while open'");
}

TEST(GpuHostAccess, LaunchesAndCopiesWorkInStrictMode) {
  const emu::ScopedOptions strict(with_host_access(false));
  const int n = 300;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[size_t(i)] = 0.25f * float(i) - 3.0f;
  Buffer x(n * sizeof(float), device(), Fill::Undefined, "x");
  Buffer y(n * sizeof(float), device(), Fill::Zero, "y");
  Buffer z(n * sizeof(float), device(), Fill::Undefined, "z");
  device().copy_in(x.data(), host.data(), n * sizeof(float));
  Context ctx;
  {
    const emu::DeviceWindow nested;  // windows nest: the launch's own closes only its reference
    LS_LAUNCH(ctx, add_one_kernel, dim3((n + 63) / 64), dim3(64))(x.as<float>(), y.as<float>(), n);
  }
  device().copy(z.data(), y.data(), n * sizeof(float));
  std::vector<float> got(n);
  device().copy_out(got.data(), z.data(), n * sizeof(float));
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[size_t(i)], host[size_t(i)] + 1.0f) << i;
  // A launch from several pool threads, and copies from several host threads
  // at once (the windows overlap).
  auto pool = make_pool(2);
  Context two;
  two.pool = pool.get();
  LS_LAUNCH(two, add_one_kernel, dim3((n + 31) / 32), dim3(32))(y.as<float>(), x.as<float>(), n);
  std::vector<float> parts(n);
  two.parallel_for(n, [&](int64_t a, int64_t b) {
    device().copy_out(parts.data() + a, x.as<float>() + a, size_t(b - a) * sizeof(float));
  });
  for (int i = 0; i < n; ++i) EXPECT_EQ(parts[size_t(i)], host[size_t(i)] + 2.0f) << i;
  EXPECT_FALSE(device().host_visible());
}

// Host bytes of device (or host) memory.
std::vector<unsigned char> bytes_of(const Buffer& b) {
  std::vector<unsigned char> v(b.size());
  b.memory().copy_out(v.data(), b.data(), b.size());
  return v;
}

Context device_context() {
  Context c;
  c.gpu = &interpret_backend();
  return c;
}

// Host code that used to read device memory directly and now copies: on
// strict device memory it gives what it gives on the host.
TEST(GpuHostAccess, WeightPackingReadsAndWritesDeviceMemoryThroughCopies) {
  const emu::ScopedOptions strict(with_host_access(false));
  const Context dev = device_context();
  const int64_t N = 37, K = 64;
  std::vector<float> w(size_t(N * K));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * float(int(i * 7919 % 201) - 100);
  Buffer dw(w.size() * sizeof(float), device(), Fill::Undefined, "weight on the device");
  device().copy_in(dw.data(), w.data(), dw.size());
  const Tensor host_w(w.data(), DType::F32, {N, K}), dev_w(dw.data(), DType::F32, {N, K});
  for (DType storage : {DType::F32, DType::BF16, DType::FP8E4M3}) {
    const PackedWeight want = pack_weight(Context{}, host_w, storage, 16);
    PackedWeight got = pack_weight(dev, dev_w, storage, 16);
    EXPECT_TRUE(device().holds(got.data.data()));
    EXPECT_EQ(bytes_of(got.data), bytes_of(want.data)) << dtype_name(storage);
    EXPECT_EQ(bytes_of(got.block_scales), bytes_of(want.block_scales)) << dtype_name(storage);
    EXPECT_EQ(bytes_of(got.panel_scales), bytes_of(want.panel_scales)) << dtype_name(storage);
    repack_weight(dev, got, dev_w);  // a weight sync: packed on the host, copied over
    EXPECT_EQ(bytes_of(got.data), bytes_of(want.data)) << dtype_name(storage);
  }
  const PackedWeight want4 = pack_weight_mxfp4(Context{}, host_w);
  const PackedWeight got4 = pack_weight_mxfp4(dev, dev_w);
  EXPECT_EQ(bytes_of(got4.data), bytes_of(want4.data));
  EXPECT_EQ(bytes_of(got4.panel_scales), bytes_of(want4.panel_scales));
}

TEST(GpuHostAccess, DispatchPlanAndQkvCopiesWorkOnStrictDeviceMemory) {
  const emu::ScopedOptions strict(with_host_access(false));
  const Context dev = device_context();
  // The MoE dispatch plan from expert indices in device memory.
  const std::vector<int32_t> idx = {2, 0, 1, 2, 0, 3, 3, 1, 2, 1};
  Buffer didx(idx.size() * 4, device(), Fill::Undefined, "topk_idx");
  device().copy_in(didx.data(), idx.data(), didx.size());
  const MoeDispatch want = moe_plan(Tensor(const_cast<int32_t*>(idx.data()), DType::I32, {5, 2}), 4);
  const MoeDispatch got = moe_plan(Tensor(didx.data(), DType::I32, {5, 2}), 4);
  EXPECT_EQ(got.offsets, want.offsets);
  EXPECT_EQ(got.row_of, want.row_of);
  // An index out of range is still named (the check reads a copy).
  const int32_t bad = 9;
  device().copy_in(didx.as<int32_t>() + 3, &bad, 4);
  EXPECT_THROW(moe_plan(Tensor(didx.data(), DType::I32, {5, 2}), 4), Error);
  // split_qkv then join_qkv on the device: strided copies, the same rows back.
  const int64_t T = 3, nq = 8, nk = 4, W = nq + 2 * nk;
  std::vector<float> qkv(size_t(T * W));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(i);
  Buffer dqkv(qkv.size() * 4, device(), Fill::Undefined, "qkv"),
      back(qkv.size() * 4, device(), Fill::Zero, "back");
  Buffer q(size_t(T * nq) * 4, device(), Fill::Undefined, "q"),
      k(size_t(T * nk) * 4, device(), Fill::Undefined, "k"),
      v(size_t(T * nk) * 4, device(), Fill::Undefined, "v");
  device().copy_in(dqkv.data(), qkv.data(), dqkv.size());
  const Tensor tq(q.data(), DType::F32, {T, nq}), tk(k.data(), DType::F32, {T, nk}),
      tv(v.data(), DType::F32, {T, nk});
  model::split_qkv(dev, tq, tk, tv, Tensor(dqkv.data(), DType::F32, {T, W}));
  std::vector<float> kk(size_t(T * nk));
  device().copy_out(kk.data(), k.data(), k.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < nk; ++j) EXPECT_EQ(kk[size_t(t * nk + j)], qkv[size_t(t * W + nq + j)]);
  model::join_qkv(dev, Tensor(back.data(), DType::F32, {T, W}), tq, tk, tv);
  EXPECT_EQ(bytes_of(back), bytes_of(dqkv));
  // gather_rows: a device copy per row.
  Buffer rows(size_t(2 * W) * 4, device(), Fill::Undefined, "gathered");
  model::gather_rows(dev, Tensor(rows.data(), DType::F32, {2, W}), Tensor(dqkv.data(), DType::F32, {T, W}),
                     {2, 0});
  std::vector<float> g(size_t(2 * W));
  device().copy_out(g.data(), rows.data(), rows.size());
  for (int64_t j = 0; j < W; ++j) {
    EXPECT_EQ(g[size_t(j)], qkv[size_t(2 * W + j)]);
    EXPECT_EQ(g[size_t(W + j)], qkv[size_t(j)]);
  }
}

// The trainer's scatter of the logit rows' gradients and the routing tables
// (record and replay) on device memory: copies, the host's values.
TEST(GpuHostAccess, ScatterRowsAndRoutingTablesWorkOnStrictDeviceMemory) {
  const emu::ScopedOptions strict(with_host_access(false));
  const Context dev = device_context();
  // scatter_rows: rows 1 and 3 of a (5, W) strided output from src (2, W); the rest 0.
  const int64_t T = 5, W = 6, ld = 8;
  std::vector<float> src(size_t(2 * W)), out_host(size_t(T * ld), 7.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i) + 0.5f;
  Buffer dsrc(src.size() * 4, device(), Fill::Undefined, "src"),
      dout(out_host.size() * 4, device(), Fill::Undefined, "out");
  device().copy_in(dsrc.data(), src.data(), dsrc.size());
  device().copy_in(dout.data(), out_host.data(), dout.size());
  Tensor out(dout.data(), DType::F32, {T, W});
  out.stride[0] = ld;
  model::scatter_rows(dev, out, Tensor(dsrc.data(), DType::F32, {2, W}), {1, 3});
  device().copy_out(out_host.data(), dout.data(), dout.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < ld; ++j) {
      const float want = j >= W ? 7.0f : t == 1 ? src[size_t(j)] : t == 3 ? src[size_t(W + j)] : 0.0f;
      EXPECT_EQ(out_host[size_t(t * ld + j)], want) << "t=" << t << " j=" << j;
    }
  // Routing tables (T, L_moe, K) <-> one layer's (T, K) in device memory.
  const int64_t Tr = 3, n_moe = 2, K = 2;
  std::vector<int32_t> all(size_t(Tr * n_moe * K));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
  Buffer layer(size_t(Tr * K) * 4, device(), Fill::Undefined, "layer experts");
  const Tensor lt(layer.data(), DType::I32, {Tr, K});
  model::gather_layer_experts(dev, lt, all, 1, n_moe, K);
  std::vector<int32_t> got(size_t(Tr * K));
  device().copy_out(got.data(), layer.data(), layer.size());
  for (int64_t t = 0; t < Tr; ++t)
    for (int64_t s = 0; s < K; ++s) EXPECT_EQ(got[size_t(t * K + s)], all[size_t((t * n_moe + 1) * K + s)]);
  std::vector<int32_t> back(all.size(), -1);
  model::scatter_layer_experts(back, lt, 1, n_moe, K);
  for (int64_t t = 0; t < Tr; ++t)
    for (int64_t s = 0; s < K; ++s) EXPECT_EQ(back[size_t((t * n_moe + 1) * K + s)], got[size_t(t * K + s)]);
}

}  // namespace
}  // namespace lockstep::kernels
