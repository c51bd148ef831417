// The switch for the kernels' 16-wide (AVX-512) forms. The kernels are
// compiled for AVX2; where the CPU also has AVX-512F, the f32 GEMM tiles and
// attention's score and accumulation loops run on 16-wide registers, with the
// same bits (each output is the same chain of operations; docs/kernels.md,
// "Wide vectors").
#pragma once

namespace lockstep::kernels {

// True where the CPU has AVX-512F, unless the environment sets
// LOCKSTEP_WIDE_VECTORS=0 or set_wide_vectors(false) was called.
bool wide_vectors();

// Turns the wide forms off (false) or back on where the CPU has them (true),
// for tests of both forms on one machine and for benchmarks; not thread-safe
// against kernels running meanwhile.
void set_wide_vectors(bool enabled);

}  // namespace lockstep::kernels
