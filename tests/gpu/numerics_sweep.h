// Bit-pattern sweeps for the numerics tests: runs a CPU reference and a scalar
// candidate over f32 bit patterns on a 2-thread pool, in chunks of 4096, and
// collects mismatches (NaN-vs-NaN payload differences counted apart).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/numerics.h"

namespace lockstep::num::test {

constexpr int64_t kChunk = 4096;

struct SweepResult {
  uint64_t checked = 0;
  uint64_t mismatches = 0;        // different bits, not both NaN
  uint64_t nan_payload_only = 0;  // both NaN, different bits
  std::vector<std::string> examples;
};

// CPU: y[0..n) = f(x[0..n)) (a vector kernel). Scalar: the candidate per element.
using VectorFn = std::function<void(const float*, float*, int64_t)>;
using ScalarFn = float (*)(float);

// Patterns first + k * step for k = 0.. while below 2^32.
inline SweepResult sweep_f32(const VectorFn& cpu, ScalarFn scalar, uint64_t step = 1, uint64_t first = 0) {
  const uint64_t count = ((uint64_t{1} << 32) - first + step - 1) / step;
  const int64_t chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
  auto pool = make_pool(2);
  Context ctx;
  ctx.pool = pool.get();
  SweepResult total;
  std::mutex mu;
  ctx.parallel_for(chunks, [&](int64_t c0, int64_t c1) {
    SweepResult part;
    std::vector<float> x(kChunk), y(kChunk);
    for (int64_t c = c0; c < c1; ++c) {
      const uint64_t k0 = static_cast<uint64_t>(c) * kChunk;
      const int64_t n = static_cast<int64_t>(std::min<uint64_t>(kChunk, count - k0));
      for (int64_t i = 0; i < n; ++i) x[i] = from_bits(static_cast<uint32_t>(first + (k0 + i) * step));
      cpu(x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t want = bits(y[i]);
        const uint32_t got = bits(scalar(x[i]));
        if (want == got) continue;
        if (is_nan(y[i]) && is_nan(from_bits(got))) {
          ++part.nan_payload_only;
          continue;
        }
        if (++part.mismatches <= 8) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "x=0x%08x (%.9g): cpu 0x%08x (%.9g), numerics 0x%08x (%.9g)", bits(x[i]),
                        x[i], want, y[i], got, from_bits(got));
          part.examples.emplace_back(buf);
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    total.mismatches += part.mismatches;
    total.nan_payload_only += part.nan_payload_only;
    for (auto& e : part.examples)
      if (total.examples.size() < 8) total.examples.push_back(e);
  });
  total.checked = count;
  return total;
}

inline void expect_exact(const SweepResult& r, const char* what) {
  std::string ex;
  for (const auto& e : r.examples) ex += "\n  " + e;
  EXPECT_EQ(r.mismatches, 0u) << what << ": " << r.mismatches << " of " << r.checked << " differ" << ex;
  EXPECT_EQ(r.nan_payload_only, 0u) << what << ": " << r.nan_payload_only << " NaN payloads differ";
}

// The special inputs every sweep must include, whatever its step.
inline std::vector<float> special_inputs() {
  std::vector<uint32_t> b = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                             0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x00000001u, 0x80000001u,
                             0x007fffffu, 0x807fffffu, 0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu,
                             0x3f800000u, 0xbf800000u};
  std::vector<float> v;
  for (uint32_t u : b) v.push_back(from_bits(u));
  for (float f : {88.0f, 88.7228394f, 88.7228470f, 89.0f, 89.0000076f, 104.0f, -87.3365479f, -88.0f, -103.9999924f,
                  -104.0f, -104.0000076f, -150.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 0.3465736f, -0.3465736f})
    v.push_back(f);
  return v;
}

}  // namespace lockstep::num::test
