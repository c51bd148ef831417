// Canonical reductions and elementwise math shared by every CPU kernel.
// docs/architecture.md section 4: a vector reduction uses 16 partial accumulators
// (element i goes to lane i mod 16, in index order) combined by a fixed tree
// (lane j += lane j+8, then +4, +2, +1), whatever the SIMD width. exp, log,
// sigmoid and silu are the project's own (Highway polynomial) implementations;
// the scalar forms (exp1, ...) return the same bits as the array forms.
#pragma once

#include <cstdint>

namespace lockstep::kernels {

constexpr int kReduceLanes = 16;

// sum of x[0..n) with plain adds per lane.
float canonical_sum(const float* x, int64_t n);
// sum of a[i] * b[i], one fused multiply-add per element per lane.
float canonical_dot(const float* a, const float* b, int64_t n);
// sum of x[i]^2, one fused multiply-add per element per lane.
float canonical_sum_sq(const float* x, int64_t n);
// max of x[0..n); n >= 1. (max is order-independent; NaN propagates.)
float max_reduce(const float* x, int64_t n);

// Elementwise, y may alias x. Bits do not depend on n or on the position.
void vexp(const float* x, float* y, int64_t n);
void vlog(const float* x, float* y, int64_t n);
void vsigmoid(const float* x, float* y, int64_t n);  // 1 / (1 + exp(-x))
void vsilu(const float* x, float* y, int64_t n);     // x * sigmoid(x)

float exp1(float x);
float log1(float x);
float sigmoid1(float x);
float silu1(float x);

}  // namespace lockstep::kernels

namespace lockstep::kernels {
// Name of the Highway target the kernels were compiled for ("AVX2", ...).
const char* simd_target_name();
}  // namespace lockstep::kernels
