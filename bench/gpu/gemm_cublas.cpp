// lockstep's GEMM (Y = X·Wᵀ, gemm_xwt: one fp32 FMA chain per output) through
// the CUDA backend beside cuBLAS on the projections of the Qwen3-0.6B shape:
// one table line per shape with both times (cudaEvent, warm-up, best of N),
// their ratio and TFLOP/s, lockstep with bf16 weights beside cuBLAS's tensor
// cores (TF32, bf16), lockstep's bits against the CPU kernel and max |Δ|
// against cuBLAS's f32 product. The device check (scripts/gpu-check.sh,
// step gemm-cublas) runs it; docs/gpu.md says how to read it.
//
//   bench_gemm_cublas [--quick] [--trials N]
// Exit: 0 every bit equal, 1 a bit differs or an error, 2 bad arguments,
// 77 no CUDA device (the message names the driver's error).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/kernels/gpu/device.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::kernels {
namespace gpu::cuda {
DeviceRuntime device_runtime();  // kernels/gpu/runtime.cu
cudaStream_t stream();           // kernels/gpu/launch.h: the backend's stream
}  // namespace gpu::cuda

namespace {

constexpr int kExitNoDevice = 77;
// Rows of each product checked bit for bit against the CPU (all of them up to
// this many, else this many spread over M): each output is one chain whatever
// M is, so the CPU on a subset of rows gives those rows' bits.
constexpr int64_t kCheckedRows = 64;
// A timed trial repeats the call until it lasts about this long, so that
// microsecond products are not measured at the event's resolution.
constexpr double kTrialMs = 2.0;
constexpr double kSlowCallMs = 50.0;

struct Projection {
  const char* name;
  int64_t n, k;
};
struct Shape {
  Projection p;
  int64_t m;
};

struct Options {
  bool quick = false;
  int trials = 5;
};

std::vector<Shape> shapes(const Options& opt) {
  if (opt.quick) {
    // One ragged shape: partial tiles in every dimension.
    return {{{"q", 2048, 1024}, 1},
            {{"q", 2048, 1024}, 64},
            {{"down", 1024, 3072}, 16},
            {{"ragged", 1001, 999}, 37}};
  }
  // Qwen3-0.6B: D = 1024, 16 query heads of 128, FFN 3072, V = 151936.
  const Projection projs[] = {{"q", 2048, 1024},
                              {"o", 1024, 2048},
                              {"gate/up", 3072, 1024},
                              {"down", 1024, 3072},
                              {"lm_head", 151936, 1024}};
  std::vector<Shape> out;
  for (const Projection& p : projs)
    for (int64_t m : {1, 16, 64, 4096}) out.push_back({p, m});
  return out;
}

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS) LS_THROW << call << " failed: " << cublasGetStatusString(s);
}
void check_cuda(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    LS_THROW << call << " failed: " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
}

// Uniform values in [-scale, scale) from a counter hash (splitmix64): the same
// data for any thread count, and fast enough for lm_head's 155 M weights.
void fill_uniform(const Context& ctx, std::vector<float>& v, uint64_t seed, float scale) {
  ctx.parallel_for(
      static_cast<int64_t>(v.size()),
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
          z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
          z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
          z ^= z >> 31;
          const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
          v[static_cast<size_t>(i)] = (2.0f * u - 1.0f) * scale;
        }
      },
      1 << 16);
}

std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> out(v.size());
  convert_f32_to_bf16(v.data(), out.data(), v.size());
  return out;
}

// A device copy of bytes in the backend's memory.
Buffer on_device(const GpuBackend& b, const void* host, size_t bytes, const char* what) {
  Buffer d(bytes, *b.memory, Fill::Undefined, what);
  b.memory->copy_in(d.data(), host, bytes);
  return d;
}

// The packed weight with its buffers in device memory (the layout is the same).
PackedWeight packed_on_device(const GpuBackend& b, const PackedWeight& w) {
  PackedWeight d;
  d.storage = w.storage;
  d.n = w.n;
  d.k = w.k;
  d.block_n = w.block_n;
  d.block_k = w.block_k;
  d.mxfp4 = w.mxfp4;
  d.row_segments = w.row_segments;
  d.data = on_device(b, w.data.data(), w.data.size(), "packed weight");
  if (w.panel_scales.size() > 0)
    d.panel_scales = on_device(b, w.panel_scales.data(), w.panel_scales.size(), "panel scales");
  if (w.block_scales.size() > 0)
    d.block_scales = on_device(b, w.block_scales.data(), w.block_scales.size(), "block scales");
  return d;
}

// Milliseconds per call, timed by cudaEvents on the backend's stream (cuBLAS
// is given it too): two warm-up calls, then `trials` trials (two for a slow
// call) of enough calls to last kTrialMs each; the best trial's mean.
double time_ms(const std::function<void()>& call, int trials) {
  const cudaStream_t s = gpu::cuda::stream();
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
  check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
  auto trial = [&](int reps) {
    check_cuda(cudaEventRecord(e0, s), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) call();
    check_cuda(cudaEventRecord(e1, s), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    return static_cast<double>(ms) / reps;
  };
  call();
  const double first = trial(1);
  const int reps = static_cast<int>(std::clamp(std::ceil(kTrialMs / std::max(first, 1e-4)), 1.0, 1000.0));
  // A call past kSlowCallMs (lm_head at M = 4096) varies little between
  // trials: fewer of them keep the whole run within the check's minute.
  const int n = first > kSlowCallMs ? std::min(trials, 2) : trials;
  double best = first;
  for (int t = 0; t < n; ++t) best = std::min(best, trial(reps));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

std::vector<float> copy_out(const GpuBackend& b, const OwnedTensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  b.memory->copy_out(h.data(), t.view().data, h.size() * sizeof(float));
  return h;
}

std::vector<int64_t> checked_rows(int64_t m) {
  std::vector<int64_t> rows;
  const int64_t n = std::min(m, kCheckedRows);
  for (int64_t i = 0; i < n; ++i) rows.push_back(n == m ? i : i * (m - 1) / (n - 1));
  return rows;
}

// Outputs of the checked rows whose bits differ from the CPU kernel's on the
// same rows of X (with the same packed weight).
int64_t bits_differing(const Context& cpu, const std::vector<float>& y_dev, const std::vector<float>& x,
                       const PackedWeight& w_host, int64_t k) {
  const int64_t n = w_host.n, m = static_cast<int64_t>(x.size()) / k;
  const std::vector<int64_t> rows = checked_rows(m);
  const int64_t r = static_cast<int64_t>(rows.size());
  std::vector<float> xs(static_cast<size_t>(r * k)), ys(static_cast<size_t>(r * n));  // (r, K), (r, N)
  for (int64_t i = 0; i < r; ++i)
    std::memcpy(&xs[static_cast<size_t>(i * k)], &x[static_cast<size_t>(rows[i] * k)], k * sizeof(float));
  gemm_xwt(cpu, Tensor(ys.data(), DType::F32, {r, n}), Tensor(xs.data(), DType::F32, {r, k}), w_host);
  int64_t differ = 0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < n; ++j)
      differ += f32_bits(ys[static_cast<size_t>(i * n + j)]) !=
                f32_bits(y_dev[static_cast<size_t>(rows[i] * n + j)]);
  return differ;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(e)) return e;  // shown as nan, not skipped by max
    d = std::max(d, e);
  }
  return d;
}

// The table: cells separated by two spaces or more (scripts/gpu-throughput.py
// reads it by that rule), a line of dashes under the header.
const std::vector<std::string> kColumns = {"shape",
                                           "M",
                                           "N",
                                           "K",
                                           "lockstep ms",
                                           "cuBLAS ms",
                                           "lockstep/cuBLAS",
                                           "lockstep TFLOP/s",
                                           "cuBLAS TFLOP/s",
                                           "lockstep bf16 ms",
                                           "cuBLAS TF32 ms",
                                           "cuBLAS bf16 ms",
                                           "bits vs CPU",
                                           "max|Δ| vs cuBLAS"};

void print_row(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    const size_t w = std::max<size_t>(kColumns[i].size(), 7);
    std::string c = cells[i];
    if (c.size() < w) c = (i == 0 ? c + std::string(w - c.size(), ' ') : std::string(w - c.size(), ' ') + c);
    line += (i ? "  " : "") + c;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

struct Weights {
  std::vector<float> w;  // (N, K)
  PackedWeight host_f32, host_bf16, dev_f32, dev_bf16;
  Buffer plain_f32, plain_bf16;  // (N, K) on the device, for cuBLAS
};

Weights make_weights(const Context& cpu, const GpuBackend& b, const Projection& p) {
  Weights W;
  W.w.resize(static_cast<size_t>(p.n * p.k));
  fill_uniform(cpu, W.w, 2, 1.0f / std::sqrt(static_cast<float>(p.k)));
  const Tensor wt(W.w.data(), DType::F32, {p.n, p.k});
  W.host_f32 = pack_weight(cpu, wt, DType::F32);
  W.host_bf16 = pack_weight(cpu, wt, DType::BF16);
  W.dev_f32 = packed_on_device(b, W.host_f32);
  W.dev_bf16 = packed_on_device(b, W.host_bf16);
  W.plain_f32 = on_device(b, W.w.data(), W.w.size() * sizeof(float), "W f32");
  const std::vector<bf16_t> wb = to_bf16(W.w);
  W.plain_bf16 = on_device(b, wb.data(), wb.size() * sizeof(bf16_t), "W bf16");
  return W;
}

// One shape: times, ratio, bits and max |Δ|, printed as one table line.
// Returns whether every checked bit equals the CPU's.
bool bench_shape(const Context& cpu, const GpuBackend& b, cublasHandle_t h, const Weights& W, const Shape& s,
                 int trials) {
  const int64_t M = s.m, N = s.p.n, K = s.p.k;
  std::vector<float> x(static_cast<size_t>(M * K));  // (M, K)
  fill_uniform(cpu, x, 1000 + static_cast<uint64_t>(M), 1.0f);
  const std::vector<bf16_t> xb = to_bf16(x);
  const Buffer dx = on_device(b, x.data(), x.size() * sizeof(float), "X");
  const Buffer dxb = on_device(b, xb.data(), xb.size() * sizeof(bf16_t), "X bf16");
  OwnedTensor y_ls(DType::F32, {M, N}, *b.memory, Fill::Undefined, "Y lockstep");  // (M, N)
  OwnedTensor y_cb(DType::F32, {M, N}, *b.memory, Fill::Undefined, "Y cuBLAS");
  Context dev;
  dev.gpu = &b;
  const Tensor xt(dx.data(), DType::F32, {M, K});
  const float one = 1.0f, zero = 0.0f;
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  // Row-major Y (M, N) is column-major Yᵀ (N, M) = op_T(W) · X, with the row-major W (N, K) and X
  // (M, K) read as column-major (K, N) and (K, M).
  auto cublas = [&](const void* w, const void* xp, cudaDataType_t type, cublasComputeType_t compute) {
    check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, type, k, xp, type, k, &zero,
                              y_cb.view().data, CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  };

  const double ls_bf16_ms = time_ms([&] { gemm_xwt(dev, y_ls.view(), xt, W.dev_bf16); }, trials);
  const int64_t bf16_differ = bits_differing(cpu, copy_out(b, y_ls), x, W.host_bf16, K);
  const double tf32_ms = time_ms(
      [&] { cublas(W.plain_f32.data(), dx.data(), CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32); }, trials);
  const double cb_bf16_ms =
      time_ms([&] { cublas(W.plain_bf16.data(), dxb.data(), CUDA_R_16BF, CUBLAS_COMPUTE_32F); }, trials);
  const double ls_ms = time_ms([&] { gemm_xwt(dev, y_ls.view(), xt, W.dev_f32); }, trials);
  const double cb_ms = time_ms(
      [&] { cublas(W.plain_f32.data(), dx.data(), CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC); }, trials);
  const std::vector<float> ls = copy_out(b, y_ls), cb = copy_out(b, y_cb);
  const int64_t f32_differ = bits_differing(cpu, ls, x, W.host_f32, K);

  const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const std::string bits =
      f32_differ == 0 && bf16_differ == 0
          ? "ok"
          : "DIFFER(f32:" + std::to_string(f32_differ) + ",bf16:" + std::to_string(bf16_differ) + ")";
  print_row({s.p.name, std::to_string(M), std::to_string(N), std::to_string(K), fmt("%.4f", ls_ms),
             fmt("%.4f", cb_ms), fmt("%.2f", ls_ms / cb_ms), fmt("%.2f", flop / (ls_ms * 1e9)),
             fmt("%.2f", flop / (cb_ms * 1e9)), fmt("%.4f", ls_bf16_ms), fmt("%.4f", tf32_ms),
             fmt("%.4f", cb_bf16_ms), bits, fmt("%.3g", max_abs_diff(ls, cb))});
  return f32_differ == 0 && bf16_differ == 0;
}

void print_header(cublasHandle_t h, const Options& opt) {
  int dev = 0, version = 0, driver = 0;
  cudaDeviceProp prop{};
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  check_cublas(cublasGetVersion(h, &version), "cublasGetVersion");
  cudaDriverGetVersion(&driver);
  std::printf("GEMM Y = X·Wᵀ on %s (sm_%d%d, driver %d), cuBLAS %d; best of %d trials, ms per call\n",
              prop.name, prop.major, prop.minor, driver, version, opt.trials);
  std::printf(
      "lockstep: gemm_xwt on the CUDA backend, packed f32 (bf16) weights, one FMA chain per output\n");
  std::printf(
      "cuBLAS: cublasGemmEx f32, CUBLAS_COMPUTE_32F_PEDANTIC; TF32 and bf16 tensor cores as the fast ones\n");
  std::printf(
      "lockstep/cuBLAS: time ratio against cuBLAS f32; bits vs CPU: the CPU kernel on up to %lld rows\n",
      static_cast<long long>(kCheckedRows));
  std::printf("(f32 and bf16 weights); max|Δ|: lockstep f32 against cuBLAS f32, every output\n\n");
  print_row(kColumns);
  std::printf("%s\n", std::string(150, '-').c_str());
}

int run(const Options& opt) {
  register_device_runtime(gpu::cuda::device_runtime());
  const GpuBackend* b = nullptr;
  try {
    b = device_backend(Device::Cuda, "bench_gemm_cublas:");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\nno device: nothing measured (exit %d)\n", e.what(), kExitNoDevice);
    return kExitNoDevice;
  }
  const auto t0 = std::chrono::steady_clock::now();
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  check_cublas(cublasSetStream(h, gpu::cuda::stream()), "cublasSetStream");
  print_header(h, opt);
  ThreadPool pool(default_thread_count());
  const Context cpu{&pool};
  const std::vector<Shape> all = shapes(opt);
  bool ok = true;
  for (size_t i = 0; i < all.size();) {
    const Weights W = make_weights(cpu, *b, all[i].p);
    // The shapes of one projection share its weights (lm_head's are 622 MB).
    for (; i < all.size() && all[i].p.n == W.host_f32.n && all[i].p.k == W.host_f32.k; ++i)
      ok = bench_shape(cpu, *b, h, W, all[i], opt.trials) && ok;
  }
  cublasDestroy(h);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%zu shapes in %.1f s; %s\n", all.size(), secs,
              ok ? "lockstep's bits equal the CPU kernel's on every checked row"
                 : "FAIL: lockstep's bits differ from the CPU kernel's (bits vs CPU column)");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace lockstep::kernels

int main(int argc, char** argv) {
  lockstep::kernels::Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--trials" && i + 1 < argc) {
      opt.trials = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--trials N]\n", argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    return lockstep::kernels::run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_cublas: %s\n", e.what());
    return 1;
  }
}
