// Host code of the trainer on device memory, through the allocator's copies
// (host_copies.h). Every path gives the bits of the direct one.
#include "lockstep/train/host_copies.h"

#include <algorithm>
#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/pretrained.h"

namespace lockstep::train {

namespace {

// Floats a host copy of a gradient buffer holds (16 MiB): bounded whatever
// the model's size, and a whole number of norm chunks.
constexpr int64_t kGradChunk = kernels::kNormChunk * 1024;

}  // namespace

void HostTokenRows::read(const Allocator& memory, const Tensor& logp_rows, const Tensor& ent_rows) {
  const int64_t R = logp_rows.data ? int64_t(logp_rows.numel()) : 0;
  logp.resize(size_t(R));
  memory.copy_out(logp.data(), logp_rows.data, size_t(R) * sizeof(float));
  ent.clear();
  if (ent_rows.data != nullptr) {
    LS_CHECK(int64_t(ent_rows.numel()) == R)
        << "entropy rows " << ent_rows.numel() << " != logprob rows " << R;
    ent.resize(size_t(R));
    memory.copy_out(ent.data(), ent_rows.data, size_t(R) * sizeof(float));
  }
  dlogp.assign(size_t(R), 0.0f);
  dent.assign(size_t(R), 0.0f);
}

void HostTokenRows::write_grads(const Allocator& memory, Tensor dlogp_rows, Tensor dent_rows) const {
  LS_CHECK(int64_t(dlogp_rows.numel()) == int64_t(dlogp.size()) &&
           int64_t(dent_rows.numel()) == int64_t(dent.size()))
      << "gradient rows " << dlogp_rows.numel() << ", " << dent_rows.numel() << " for " << dlogp.size()
      << " tokens";
  memory.copy_in(dlogp_rows.data, dlogp.data(), dlogp.size() * sizeof(float));
  memory.copy_in(dent_rows.data, dent.data(), dent.size() * sizeof(float));
}

void for_each_host_chunk(const Allocator& memory, const float* data, int64_t n, int64_t chunk,
                         const std::function<void(const float*, int64_t)>& emit) {
  LS_CHECK(chunk > 0 && n >= 0) << "chunk " << chunk << ", n " << n;
  if (memory.host_visible()) {
    for (int64_t at = 0; at < n; at += chunk) emit(data + at, std::min(chunk, n - at));
    return;
  }
  std::vector<float> host(size_t(std::min(chunk, n)));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m = std::min(chunk, n - at);
    memory.copy_out(host.data(), data + at, size_t(m) * sizeof(float));
    emit(host.data(), m);
  }
}

void fill_from_host(const Allocator& memory, float* data, int64_t n, int64_t chunk,
                    const std::function<void(float*, int64_t)>& read) {
  LS_CHECK(chunk > 0 && n >= 0) << "chunk " << chunk << ", n " << n;
  if (memory.host_visible()) {
    for (int64_t at = 0; at < n; at += chunk) read(data + at, std::min(chunk, n - at));
    return;
  }
  std::vector<float> host(size_t(std::min(chunk, n)));
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m = std::min(chunk, n - at);
    read(host.data(), m);
    memory.copy_in(data + at, host.data(), size_t(m) * sizeof(float));
  }
}

void zero_memory(const Context& ctx, const Allocator& memory, void* data, size_t bytes) {
  if (!memory.host_visible()) {
    memory.fill(data, 0, bytes);
    return;
  }
  char* p = static_cast<char*>(data);
  ctx.parallel_for(
      int64_t(bytes), [&](int64_t b0, int64_t b1) { std::memset(p + b0, 0, size_t(b1 - b0)); },
      int64_t{1} << 20);
}

std::vector<double> norm_chunk_sums(const Context& ctx, const Allocator& memory,
                                    const std::vector<kernels::FloatSegment>& segments) {
  if (memory.host_visible()) return kernels::norm_chunk_sums(ctx, segments);
  // Each host chunk starts on a norm-chunk boundary of its segment, so its
  // chunk sums are the segment's at the same places.
  std::vector<double> sums;
  const Context host = kernels::cpu_context(ctx);
  for (const kernels::FloatSegment& s : segments)
    for_each_host_chunk(memory, s.data, s.n, kGradChunk, [&](const float* g, int64_t m) {
      const std::vector<double> part =
          kernels::norm_chunk_sums(host, {kernels::FloatSegment{const_cast<float*>(g), m}});
      sums.insert(sums.end(), part.begin(), part.end());
    });
  return sums;
}

double grad_norm(const Context& ctx, const Allocator& memory, const float* grads, int64_t n) {
  if (memory.host_visible()) return kernels::global_grad_norm(ctx, grads, n);
  return kernels::norm_of_chunk_sums(
      norm_chunk_sums(ctx, memory, {kernels::FloatSegment{const_cast<float*>(grads), n}}));
}

void reduce_through_host(const Allocator& memory, float* grads, int64_t n,
                         const std::function<void(float*, size_t)>& reduce) {
  if (memory.host_visible()) {
    reduce(grads, size_t(n));
    return;
  }
  std::vector<float> chunk(size_t(std::min(kGradChunk, n)));
  for (int64_t at = 0; at < n; at += kGradChunk) {
    const int64_t m = std::min(kGradChunk, n - at);
    memory.copy_out(chunk.data(), grads + at, size_t(m) * sizeof(float));
    reduce(chunk.data(), size_t(m));
    memory.copy_in(grads + at, chunk.data(), size_t(m) * sizeof(float));
  }
}

void scale_gradients(const Context& ctx, const Allocator& memory, float* grads, int64_t n, float factor) {
  if (memory.host_visible()) {
    kernels::scale_grads(ctx, {kernels::FloatSegment{grads, n}}, factor);
    return;
  }
  const Context host = kernels::cpu_context(ctx);
  std::vector<float> chunk(size_t(std::min(kGradChunk, n)));
  for (int64_t at = 0; at < n; at += kGradChunk) {
    const int64_t m = std::min(kGradChunk, n - at);
    memory.copy_out(chunk.data(), grads + at, size_t(m) * sizeof(float));
    kernels::scale_grads(host, {kernels::FloatSegment{chunk.data(), m}}, factor);
    memory.copy_in(grads + at, chunk.data(), size_t(m) * sizeof(float));
  }
}

void load_params_into(const Context& ctx, const Allocator& memory, const std::string& dir,
                      const ParamLayout& layout, float* params) {
  if (memory.host_visible()) {
    load_params(dir, layout, params, &ctx);
    return;
  }
  Buffer host(layout.nbytes());
  const Context on_host = kernels::cpu_context(ctx);
  load_params(dir, layout, host.as<float>(), &on_host);
  memory.copy_in(params, host.data(), host.size());
}

}  // namespace lockstep::train
