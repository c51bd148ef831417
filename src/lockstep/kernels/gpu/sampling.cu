// GPU token sampling (kernels/cpu/sampling.h): one block per draw. The block
// scans the row for its maximum (or greedy's winner), sorts the row's (value,
// id) keys by bitonic sort in global scratch when the draw truncates, sums the
// 256-candidate chunks in parallel (thread c owns chunk c, a sequential double
// chain as on the CPU), and thread 0 adds the chunk sums in order and scans
// one chunk for top-p's cut and one for the target. Every step is exact or
// computed in the CPU's order, so the token is the CPU's.
//
// Speed: the sort is the cost (log2(N)^2 / 2 passes over N = next power of two
// >= V keys, ~170 passes for V = 150K); a top-k selection for small k would
// avoid most of it. Thread 0's work is ~V / 256 double adds and two chunk scans.
#include "lockstep/kernels/gpu/sampling.h"

#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/registry.h"
#include "lockstep/kernels/sampling_rules.h"

namespace lockstep::kernels::gpu::LS_GPU_NS {

namespace {

using namespace ::lockstep::kernels::sampling;

constexpr int kMaxThreads = 1024;

// One draw as the kernel reads it: its spec and where its scratch starts.
struct RowPlan {
  SampleSpec spec;
  int64_t keys = 0;    // offset of its (n_sort) sort keys in the key scratch
  int64_t n_sort = 0;  // power of two >= V for a sorted draw, else 0
  int64_t chunks = 0;  // offset of its (ceil(V / 256)) chunk sums in the chunk scratch
  int32_t given_u = 0;  // tests: use u instead of the Philox draw
  double u = 0;
};

// The candidates of one draw and their weights (sampling_rules.h).
struct Row {
  const float* z;        // (V) logits
  const uint64_t* key;   // (>= K) sorted order keys, or null: the ids in order
  float temperature;
  float m;               // the row's largest v / T
  LS_DEVICE int64_t id(int64_t j) const { return key != nullptr ? order_id(key[j]) : j; }
  LS_DEVICE float w(int64_t j) const { return weight_of(scaled(rank_value(z[id(j)]), temperature), m); }
};

LS_DEVICE inline int tid() { return static_cast<int>(threadIdx.x); }
LS_DEVICE inline int nthreads() { return static_cast<int>(blockDim.x); }

// The row's largest x = v / T. A max is exact, so the tree gives the CPU's value
// (up to the sign of a zero maximum, which no weight depends on).
LS_DEVICE float block_max(const float* z, int64_t V, float temperature, float* sf) {
  float m = num::from_bits(0xff800000u);
  for (int64_t i = tid(); i < V; i += nthreads()) {
    const float x = scaled(rank_value(z[i]), temperature);
    m = x > m ? x : m;
  }
  sf[tid()] = m;
  __syncthreads();
  for (int s = nthreads() / 2; s > 0; s >>= 1) {
    if (tid() < s && sf[tid() + s] > sf[tid()]) sf[tid()] = sf[tid() + s];
    __syncthreads();
  }
  const float r = sf[0];
  __syncthreads();
  return r;
}

// Greedy's token: the winner under `beats`, a strict total order, so any tree
// gives the CPU's scan's result.
LS_DEVICE int64_t block_argmax(const float* z, int64_t V, float* sf, int64_t* si) {
  float bv = num::from_bits(0xff800000u);
  int64_t bi = INT64_MAX;
  for (int64_t i = tid(); i < V; i += nthreads()) {
    const float v = rank_value(z[i]);
    if (beats(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  sf[tid()] = bv;
  si[tid()] = bi;
  __syncthreads();
  for (int s = nthreads() / 2; s > 0; s >>= 1) {
    if (tid() < s && beats(sf[tid() + s], si[tid() + s], sf[tid()], si[tid()])) {
      sf[tid()] = sf[tid() + s];
      si[tid()] = si[tid() + s];
    }
    __syncthreads();
  }
  const int64_t r = si[0];
  __syncthreads();
  return r;
}

// key (n) = the row's order keys, then padding that sorts last, sorted
// ascending by a bitonic network. The keys are distinct, so the result is the
// CPU's order whatever the schedule.
LS_DEVICE void block_sort(const float* z, int64_t V, uint64_t* key, int64_t n) {
  for (int64_t i = tid(); i < n; i += nthreads())
    key[i] = i < V ? order_key(rank_value(z[i]), static_cast<uint32_t>(i)) : ~static_cast<uint64_t>(0);
  __syncthreads();
  for (int64_t k = 2; k <= n; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t t = tid(); t < n / 2; t += nthreads()) {
        const int64_t lo = ((t & ~(j - 1)) << 1) | (t & (j - 1));
        const int64_t hi = lo | j;
        const uint64_t a = key[lo], b = key[hi];
        if ((a > b) == ((lo & k) == 0)) {
          key[lo] = b;
          key[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// min-p's cut: the first j < K with w_j < min_p (K if none); each thread's
// first failure is its smallest, the tree takes the minimum.
LS_DEVICE int64_t block_first_below(const Row& row, int64_t K, float min_p, int64_t* si) {
  int64_t f = K;
  for (int64_t j = tid(); j < K; j += nthreads()) {
    if (row.w(j) < min_p) {
      f = j;
      break;
    }
  }
  si[tid()] = f;
  __syncthreads();
  for (int s = nthreads() / 2; s > 0; s >>= 1) {
    if (tid() < s && si[tid() + s] < si[tid()]) si[tid()] = si[tid() + s];
    __syncthreads();
  }
  const int64_t r = si[0];
  __syncthreads();
  return r;
}

// cs[c] = the sequential double sum of w over chunk c of the first n candidates.
LS_DEVICE void block_chunk_sums(const Row& row, int64_t n, double* cs) {
  const int64_t nc = (n + kChunk - 1) / kChunk;
  for (int64_t c = tid(); c < nc; c += nthreads()) {
    const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
    double q = 0;
    for (int64_t j = c * kChunk; j < end; ++j) q = dadd(q, static_cast<double>(row.w(j)));
    cs[c] = q;
  }
  __syncthreads();
}

struct Hit {
  int64_t j;   // the candidate
  double cum;  // cum_j
};

LS_DEVICE inline bool reaches(double cum, double x, bool strict) { return strict ? x < cum : cum >= x; }

// The first j < n whose cum_j is >= x (strict: > x), given ends[c] = the cum at
// the end of chunk c (monotone; the last chunk's end passes the test).
LS_DEVICE Hit first_reaching(const Row& row, const double* ends, int64_t n, double x, bool strict) {
  const int64_t nc = (n + kChunk - 1) / kChunk;
  int64_t c = 0;
  while (c < nc - 1 && !reaches(ends[c], x, strict)) ++c;
  const double pc = c > 0 ? ends[c - 1] : 0.0;
  const int64_t end = (c + 1) * kChunk < n ? (c + 1) * kChunk : n;
  double q = 0;
  for (int64_t j = c * kChunk; j < end - 1; ++j) {
    q = dadd(q, static_cast<double>(row.w(j)));
    const double cum = dadd(pc, q);
    if (reaches(cum, x, strict)) return {j, cum};
  }
  return {end - 1, ends[c]};  // the chunk's last cum is its end
}

// Thread 0's part: the chunk prefix in order (cs becomes the chunk ends), then
// top-p's cut and the target.
LS_DEVICE int64_t choose(const Row& row, int64_t n, double* cs, const SampleSpec& s, double u) {
  const int64_t nc = (n + kChunk - 1) / kChunk;
  double P = 0;
  for (int64_t c = 0; c < nc; ++c) {
    P = dadd(P, cs[c]);
    cs[c] = P;
  }
  double S = P;
  if (s.top_p < 1.0f) S = first_reaching(row, cs, n, dmul(static_cast<double>(s.top_p), P), false).cum;
  return row.id(first_reaching(row, cs, n, target_of(u, S), true).j);
}

// Grid (R): block r draws rows[r]. Block (threads): any power of two <= 1024.
LS_GLOBAL void sample_rows_kernel(int32_t* tokens, const float* logits, int64_t ld, int64_t V,
                                  const RowPlan* plans, uint64_t* keys, double* chunks) {
  LS_SHARED(float, sf, kMaxThreads);    // (threads) partial maxima
  LS_SHARED(int64_t, si, kMaxThreads);  // (threads) partial ids / cuts
  const int64_t r = static_cast<int64_t>(blockIdx.x);
  const RowPlan p = plans[r];
  const SampleSpec& s = p.spec;
  const float* z = logits + s.logit_row * ld;
  const int mode = mode_of(s, V);
  if (mode == kGreedy) {
    const int64_t best = block_argmax(z, V, sf, si);
    if (tid() == 0) tokens[r] = static_cast<int32_t>(best);
    return;
  }
  Row row{z, nullptr, s.temperature, block_max(z, V, s.temperature, sf)};
  int64_t K = V;
  if (mode == kSorted) {
    uint64_t* key = keys + p.keys;
    block_sort(z, V, key, p.n_sort);
    row.key = key;
    K = kept_by_k(s, V);
  }
  int64_t n = K;
  if (s.min_p > 0.0f) {
    const int64_t cut = block_first_below(row, K, s.min_p, si);
    n = cut > 1 ? cut : 1;  // w_0 = 1 >= min_p: the CPU keeps it unchecked
  }
  double* cs = chunks + p.chunks;
  block_chunk_sums(row, n, cs);
  if (tid() == 0) tokens[r] = static_cast<int32_t>(choose(row, n, cs, s, p.given_u != 0 ? p.u : draw(s)));
}

// n elements of device memory for one entry call, freed at scope end (the free
// waits for the launch); copied from a host vector or left as scratch.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(int64_t n, const char* what) : bytes_(static_cast<size_t>(n > 0 ? n : 1) * sizeof(T)) {
#if defined(LOCKSTEP_GPU_INTERP)
    p_ = static_cast<T*>(::lockstep::gpu::emu::device_alloc(bytes_, what));
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes_) == cudaSuccess) << what;
#else
    LS_CHECK(hipMalloc(reinterpret_cast<void**>(&p_), bytes_) == hipSuccess) << what;
#endif
  }
  DeviceArray(const std::vector<T>& host, const char* what) : DeviceArray(static_cast<int64_t>(host.size()), what) {
    const size_t b = host.size() * sizeof(T);
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::copy_to_device(p_, host.data(), b);
#elif defined(LOCKSTEP_GPU_CUDA)
    LS_CHECK(cudaMemcpy(p_, host.data(), b, cudaMemcpyHostToDevice) == cudaSuccess) << what;
#else
    LS_CHECK(hipMemcpy(p_, host.data(), b, hipMemcpyHostToDevice) == hipSuccess) << what;
#endif
  }
  ~DeviceArray() {
#if defined(LOCKSTEP_GPU_INTERP)
    ::lockstep::gpu::emu::device_free(p_);
#elif defined(LOCKSTEP_GPU_CUDA)
    cudaFree(p_);
#else
    (void)hipFree(p_);
#endif
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }

 private:
  size_t bytes_;
  T* p_ = nullptr;
};

// Each draw's spec and scratch offsets: sort keys for the sorted draws only.
std::vector<RowPlan> plan_rows(const std::vector<SampleSpec>& rows, const std::vector<double>& draws, int64_t V,
                               int64_t* n_keys, int64_t* n_chunks) {
  int64_t n_pow2 = 1;
  while (n_pow2 < V) n_pow2 <<= 1;
  const int64_t per_row = (V + kChunk - 1) / kChunk;
  std::vector<RowPlan> plan(rows.size());
  *n_keys = 0;
  *n_chunks = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    plan[r].spec = rows[r];
    if (!draws.empty()) {
      plan[r].given_u = 1;
      plan[r].u = draws[r];
    }
    plan[r].chunks = *n_chunks;
    *n_chunks += per_row;
    if (mode_of(rows[r], V) == kSorted) {
      plan[r].keys = *n_keys;
      plan[r].n_sort = n_pow2;
      *n_keys += n_pow2;
    }
  }
  return plan;
}

}  // namespace

void sample_rows(const Context& ctx, Tensor tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows,
                 const SampleLaunch& cfg) {
  const int64_t V = kernels::detail::check_sample_rows(tokens_out, logits, rows);
  LS_CHECK(cfg.threads >= 1 && cfg.threads <= kMaxThreads && (cfg.threads & (cfg.threads - 1)) == 0)
      << "SampleLaunch: threads must be a power of two in [1, " << kMaxThreads << "], got " << cfg.threads;
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return;
  int64_t n_keys = 0, n_chunks = 0;
  LS_CHECK(cfg.draws.empty() || cfg.draws.size() == rows.size())
      << "SampleLaunch: " << cfg.draws.size() << " draws for " << rows.size() << " rows";
  const std::vector<RowPlan> plan = plan_rows(rows, cfg.draws, V, &n_keys, &n_chunks);
  DeviceArray<RowPlan> dplan(plan, "sampling plan");
  DeviceArray<uint64_t> keys(n_keys, "sampling sort keys");
  DeviceArray<double> chunks(n_chunks, "sampling chunk sums");
  LS_LAUNCH(ctx, sample_rows_kernel, dim3(static_cast<unsigned>(R)), dim3(static_cast<unsigned>(cfg.threads)))
  (tokens_out.i32(), logits.f32(), logits.stride[0], V, dplan.get(), keys.get(), chunks.get());
}

void sample_rows(const Context& ctx, Tensor tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows) {
  sample_rows(ctx, tokens_out, logits, rows, SampleLaunch{});
}

void register_sampling(GpuBackend& b) {
  b.sample_rows = sample_rows;
}

}  // namespace lockstep::kernels::gpu::LS_GPU_NS
