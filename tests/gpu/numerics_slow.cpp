// Exhaustive checks of lockstep::num (kernels/numerics.h) against the CPU: every
// one of the 2^32 f32 bit patterns through exp, log, sigmoid, silu and the
// f32 -> bf16 / fp8 e4m3 encoders (label slow: each sweep takes seconds on 2 threads).
#include <gtest/gtest.h>

#include "gpu/numerics_sweep.h"
#include "lockstep/kernels/cpu/simd.h"
#include "lockstep/kernels/numerics.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::num::test {
namespace {

TEST(NumericsExhaustive, Exp) { expect_exact(sweep_f32(kernels::vexp, [](float x) { return num::exp(x); }), "exp"); }
TEST(NumericsExhaustive, Log) { expect_exact(sweep_f32(kernels::vlog, [](float x) { return num::log(x); }), "log"); }
TEST(NumericsExhaustive, Sigmoid) {
  expect_exact(sweep_f32(kernels::vsigmoid, [](float x) { return num::sigmoid(x); }), "sigmoid");
}
TEST(NumericsExhaustive, Silu) { expect_exact(sweep_f32(kernels::vsilu, [](float x) { return num::silu(x); }), "silu"); }

// The encoders are compared through the same harness: the result code widened to
// a float's bits (bf16 in the low 16 bits; fp8 and saturated fp8 in bytes 0 and 1).
TEST(NumericsExhaustive, Bf16Encode) {
  const VectorFn cpu = [](const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = from_bits(lockstep::f32_to_bf16(x[i]));
  };
  expect_exact(sweep_f32(cpu, [](float x) { return from_bits(num::f32_to_bf16(x)); }), "f32_to_bf16");
}
TEST(NumericsExhaustive, Fp8Encode) {
  const VectorFn cpu = [](const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = from_bits(lockstep::f32_to_fp8(x[i]) | uint32_t{lockstep::f32_to_fp8(x[i], true)} << 8);
  };
  expect_exact(sweep_f32(cpu,
                         [](float x) {
                           return from_bits(num::f32_to_fp8_e4m3(x) | uint32_t{num::f32_to_fp8_e4m3(x, true)} << 8);
                         }),
               "f32_to_fp8");
}

}  // namespace
}  // namespace lockstep::num::test
