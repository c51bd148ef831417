// Rotary position embedding, rotate-half convention (Llama/Qwen/Hugging Face),
// applied in place to (T, H, Dh) query or key tensors, and its backward.
// The cos/sin of every (position, pair) is a pure function defined here, so
// both engines (and any later backend) rotate by the same float values.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// The rotation of pair i (0 <= i < Dh/2) at position pos, the one definition:
//   inv_freq = std::pow(theta, -double(2 * i) / double(Dh))   (double)
//   angle    = double(pos) * inv_freq                         (double)
//   cos, sin = float(std::cos(angle)), float(std::sin(angle))  (double, rounded once to float)
// Computing in double and rounding once makes the float result an (almost
// always) correctly rounded value that any backend reproduces. This differs
// from Hugging Face, which forms inv_freq and the angle in f32, by about
// 1 ulp of the angle times pos (e.g. 2e-3 rad at pos 32768), a deliberate
// choice: a float angle at large positions is itself off by that much.
void rope_cos_sin(int64_t pos, int64_t i, int64_t head_dim, double theta, float* cos_out, float* sin_out);

// A precomputed (max_positions, Dh/2) table of rope_cos_sin values; the
// table-driven overloads below give the same bits as the on-the-fly ones.
struct RopeTable {
  int64_t head_dim = 0;
  double theta = 0;
  int64_t max_positions = 0;
  DeviceArray<float> cos;  // (max_positions, head_dim / 2), in the device memory of the building context
  DeviceArray<float> sin;  // (max_positions, head_dim / 2)
};
RopeTable make_rope_table(const Context& ctx, int64_t head_dim, double theta, int64_t max_positions);

// For every token t, head h and pair i < Dh/2, with (c, s) = rope_cos_sin(positions[t], i, Dh, theta),
// a = x[t, h, i], b = x[t, h, i + Dh/2]:
//   x[t, h, i]        = a * c - b * s
//   x[t, h, i + Dh/2] = b * c + a * s      (f32, no FMA)
// x (T, H, Dh) f32 with unit last stride (heads and tokens may be strided, e.g.
// a view into a fused qkv buffer); Dh even; positions (T,) i32, contiguous,
// each >= 0. theta > 0.
void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, double theta);

// The transposed (= inverse) rotation, by -angle, applied in place to the
// gradient: dx[i] = a * c + b * s, dx[i + Dh/2] = b * c - a * s.
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, double theta);

// The on-the-fly forms above evaluate Dh/2 double cos/sin pairs per token
// (microseconds per token); hot paths should build a RopeTable once and use
// the overloads below. Same as above with cos/sin read from a table (positions must be < table.max_positions,
// and x's Dh must equal table.head_dim).
void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table);
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, const RopeTable& table);

namespace detail {
// The argument checks of the table forms (x, positions and the table's
// coverage), shared with the GPU backend so both raise the same errors; fn
// names the entry in them.
struct RopeShape {
  int64_t T, H, Dh, half;
};
RopeShape check_rope_table(const Tensor& x, const Tensor& positions, const RopeTable& table, const char* fn);
}  // namespace detail

// ---- Interleaved RoPE with YaRN (DeepSeek-V3/V4) ----------------------------
// DeepSeek rotates consecutive pairs (x[2j], x[2j+1]) of a rope_dim-wide tail
// (a complex multiply), not the (i, i + Dh/2) halves above, and may scale the
// frequencies with YaRN.

// YaRN frequency scaling. Off when factor == 1 (or original_max_positions == 0).
// With omega_j = theta^(-2j / rope_dim) (double):
//   lo = max(0, floor(d(beta_fast))), hi = min(rope_dim - 1, ceil(d(beta_slow))),
//   d(beta) = rope_dim * ln(original_max_positions / (beta * 2 pi)) / (2 ln theta);
//   hi += 0.001 when hi == lo; gamma_j = clamp((j - lo) / (hi - lo), 0, 1);
//   omega_j <- omega_j * (1 - gamma_j * (1 - 1 / factor))   (all double).
// (hi is clamped at rope_dim - 1, not at the last pair, as DeepSeek's and Hugging
// Face's find_correction_range do: a ramp may end past the last pair.)
// No attention-scale (mscale) factor is applied.
struct YarnConfig {
  double factor = 1.0;
  int64_t original_max_positions = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool enabled() const { return factor != 1.0 && original_max_positions > 0; }
};

// The inverse frequency of pair j (double), YaRN applied when enabled.
double rope_inv_freq(int64_t j, int64_t rope_dim, double theta, const YarnConfig& yarn);

// A (max_positions, rope_dim/2) table: angle = double(pos) * rope_inv_freq(j),
// cos/sin in double, rounded once to float.
RopeTable make_rope_table(const Context& ctx, int64_t rope_dim, double theta, int64_t max_positions,
                          const YarnConfig& yarn);

// In place on x (T, H, rope_dim) (unit last stride; heads and tokens may be
// strided, e.g. the tail of every head of a (T, H, Dh) tensor): for pair j,
// with (c, s) from the table at positions[t], a = x[2j], b = x[2j+1]:
//   x[2j] = a * c - b * s;  x[2j+1] = b * c + a * s   (f32, no FMA)
void rope_interleaved_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table);
// The inverse rotation (by -angle): x[2j] = a * c + b * s;  x[2j+1] = b * c - a * s.
// It is both the backward of the forward and DeepSeek-V4's de-rotation of the
// attention output.
void rope_interleaved_inverse(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table);

}  // namespace lockstep::kernels
