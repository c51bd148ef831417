// Paged-cache attention throughput: decode (one query per sequence over a
// cached context; memory-bound, reported as GB/s of K/V read) and prefill
// (a whole prompt new; compute-bound, reported as tokens/s) and the trainer's
// backward over a whole prompt.
// Shapes are the benchmark models': moe-tiny (H=8, Hkv=2, Dh=32) and
// moe-small (H=8, Hkv=4, Dh=64). Args: context or prompt, batch, threads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/cpu/attention.h"

namespace lockstep::kernels {
namespace {

constexpr int kBlockSize = 16;  // the rollout engine's default page size

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// B sequences, each with `ctx` cached positions and `n_new` new ones, blocks
// scattered over the cache as a running engine leaves them.
struct Setup {
  int64_t H, Hkv, Dh, B, T;
  OwnedTensor k_cache, v_cache;
  std::vector<int32_t> n_ctx, n_new, table;
  std::vector<float> q, out;
  AttentionBatch batch;

  Setup(int64_t h, int64_t hkv, int64_t dh, int64_t b, int64_t ctx, int64_t nn)
      : H(h), Hkv(hkv), Dh(dh), B(b), T(b * nn) {
    const int64_t per_seq = (ctx + nn + kBlockSize - 1) / kBlockSize, nb = per_seq * b;
    k_cache = OwnedTensor(DType::F32, {nb, kBlockSize, Hkv, Dh});
    v_cache = OwnedTensor(DType::F32, {nb, kBlockSize, Hkv, Dh});
    const std::vector<float> noise = random_vec(1 << 16, 1);
    for (OwnedTensor* c : {&k_cache, &v_cache})
      for (int64_t i = 0; i < c->numel(); ++i) c->f32()[i] = noise[static_cast<size_t>(i) & 0xffff];
    table.resize(static_cast<size_t>(nb));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(2));
    n_ctx.assign(static_cast<size_t>(b), static_cast<int32_t>(ctx));
    n_new.assign(static_cast<size_t>(b), static_cast<int32_t>(nn));
    q = random_vec(T * H * Dh, 3);
    out.resize(q.size());
    batch.n_ctx = Tensor(n_ctx.data(), DType::I32, {b});
    batch.n_new = Tensor(n_new.data(), DType::I32, {b});
    batch.block_table = Tensor(table.data(), DType::I32, {b, per_seq});
    batch.block_size = kBlockSize;
  }
  void run(const Context& ctx) {
    attention_forward(ctx, Tensor(out.data(), DType::F32, {T, H, Dh}), Tensor(),
                      Tensor(q.data(), DType::F32, {T, H, Dh}), k_cache.view(), v_cache.view(), batch,
                      1.0f / std::sqrt(static_cast<float>(Dh)));
  }
};

// Args: context, batch, threads.
template <int kH, int kHkv, int kDh>
void BM_Decode(benchmark::State& state) {
  const int64_t ctx_len = state.range(0), b = state.range(1);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Setup s(kH, kHkv, kDh, b, ctx_len, 1);
  const Context ctx{&pool};
  for (auto _ : state) {
    s.run(ctx);
    benchmark::DoNotOptimize(s.out.data());
  }
  // Each step reads every sequence's K and V rows for positions 0..ctx.
  const double kv_bytes = double(b) * double(ctx_len + 1) * kHkv * kDh * 2 * sizeof(float);
  state.counters["kv_GBps"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok_per_s"] = benchmark::Counter(double(b), benchmark::Counter::kIsIterationInvariantRate);
}

// Args: prompt length, batch, threads.
template <int kH, int kHkv, int kDh>
void BM_Prefill(benchmark::State& state) {
  const int64_t n = state.range(0), b = state.range(1);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Setup s(kH, kHkv, kDh, b, 0, n);
  const Context ctx{&pool};
  for (auto _ : state) {
    s.run(ctx);
    benchmark::DoNotOptimize(s.out.data());
  }
  // Logical K/V traffic: the query at position p reads rows 0..p once per kv group.
  const double kv_bytes = double(b) * double(n) * double(n + 1) / 2 * kHkv * kDh * 2 * sizeof(float);
  state.counters["kv_GBps"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok_per_s"] =
      benchmark::Counter(double(b * n), benchmark::Counter::kIsIterationInvariantRate);
  // FMAs done: q.k and P.v over the causal triangle, 2 flops each.
  const double flops = 4.0 * double(b) * double(n) * double(n + 1) / 2 * kH * kDh;
  state.counters["GFLOPps"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The trainer's backward over a whole prompt. Args: prompt length, batch, threads.
template <int kH, int kHkv, int kDh>
void BM_Backward(benchmark::State& state) {
  const int64_t n = state.range(0), b = state.range(1);
  ThreadPool pool(static_cast<int>(state.range(2)));
  Setup s(kH, kHkv, kDh, b, 0, n);
  const Context ctx{&pool};
  const int64_t T = s.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDh));
  std::vector<float> lse(static_cast<size_t>(T * kH)), dout = random_vec(T * kH * kDh, 4);
  std::vector<float> dq(dout.size()), dk(static_cast<size_t>(T * kHkv * kDh)), dv(dk.size());
  attention_forward(ctx, Tensor(s.out.data(), DType::F32, {T, kH, kDh}),
                    Tensor(lse.data(), DType::F32, {T, kH}), Tensor(s.q.data(), DType::F32, {T, kH, kDh}),
                    s.k_cache.view(), s.v_cache.view(), s.batch, scale);
  for (auto _ : state) {
    attention_backward(
        ctx, Tensor(dq.data(), DType::F32, {T, kH, kDh}), Tensor(dk.data(), DType::F32, {T, kHkv, kDh}),
        Tensor(dv.data(), DType::F32, {T, kHkv, kDh}), Tensor(dout.data(), DType::F32, {T, kH, kDh}),
        Tensor(s.out.data(), DType::F32, {T, kH, kDh}), Tensor(lse.data(), DType::F32, {T, kH}),
        Tensor(s.q.data(), DType::F32, {T, kH, kDh}), s.k_cache.view(), s.v_cache.view(), s.batch, scale);
    benchmark::DoNotOptimize(dq.data());
  }
  state.counters["tok_per_s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
  // FMAs done: s = q.k again, dP = dout.v, dq, dk and dv over the causal triangle.
  const double flops = 10.0 * double(b) * double(n) * double(n + 1) / 2 * kH * kDh;
  state.counters["GFLOPps"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void decode_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ctx", "batch", "threads"});
  for (int threads : {1, 2})
    for (int ctx : {128, 512, 2048})
      for (int batch : {1, 8, 64}) b->Args({ctx, batch, threads});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void prefill_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"prompt", "batch", "threads"});
  for (int threads : {1, 2})
    for (int n : {256, 1024}) b->Args({n, 1, threads});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The training shape (micro-batches of 16 sequences of 256 tokens, the fused
// schedule) and one long sequence (too few items: the two-pass schedule at 2 threads).
void backward_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"prompt", "batch", "threads"});
  for (int threads : {1, 2}) {
    b->Args({256, 16, threads});
    b->Args({1024, 1, threads});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Decode<8, 2, 32>)->Name("decode/moe_tiny_H8_Hkv2_Dh32")->Apply(decode_args);
BENCHMARK(BM_Decode<8, 4, 64>)->Name("decode/moe_small_H8_Hkv4_Dh64")->Apply(decode_args);
BENCHMARK(BM_Prefill<8, 2, 32>)->Name("prefill/moe_tiny_H8_Hkv2_Dh32")->Apply(prefill_args);
BENCHMARK(BM_Prefill<8, 4, 64>)->Name("prefill/moe_small_H8_Hkv4_Dh64")->Apply(prefill_args);
BENCHMARK(BM_Backward<8, 2, 32>)->Name("backward/moe_tiny_H8_Hkv2_Dh32")->Apply(backward_args);
BENCHMARK(BM_Backward<8, 4, 64>)->Name("backward/moe_small_H8_Hkv4_Dh64")->Apply(backward_args);

// The Qwen3 shape (H=16, Hkv=8, Dh=128: Qwen3-0.6B to 4B) at a long prompt.
void long_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"prompt", "batch", "threads"});
  b->Args({2048, 1, 1});
  b->Args({4096, 1, 2});  // the 0.6B training step's sequence on both threads
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Prefill<16, 8, 128>)->Name("prefill/qwen3_H16_Hkv8_Dh128")->Apply(long_args);
BENCHMARK(BM_Backward<16, 8, 128>)->Name("backward/qwen3_H16_Hkv8_Dh128")->Apply(long_args);

}  // namespace
}  // namespace lockstep::kernels

BENCHMARK_MAIN();
