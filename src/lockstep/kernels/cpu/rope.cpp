// RoPE: cos/sin from a double-precision pure function (or a table of its
// values), then an f32 rotation in place: of each (i, i + Dh/2) pair
// (rotate-half), or of each (2j, 2j + 1) pair (interleaved, with YaRN).
#include "lockstep/kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

using detail::RopeShape;

RopeShape check_rope(const Tensor& x, const Tensor& positions, const char* fn) {
  std::string what = std::string(fn) + ": x (T, H, Dh)";
  check_dtype(x, DType::F32, what.c_str());
  check_shape(x, {-1, -1, -1}, what.c_str());
  const RopeShape s{x.shape[0], x.shape[1], x.shape[2], x.shape[2] / 2};
  if (s.Dh % 2 != 0) LS_THROW << what << ": head width Dh must be even, got " << x.shape_str();
  if (s.Dh > 1 && x.stride[2] != 1)
    LS_THROW << what << ": last dimension must be contiguous, got " << x.shape_str();
  std::string pw = std::string(fn) + ": positions (T,)";
  check_dtype(positions, DType::I32, pw.c_str());
  check_shape(positions, {s.T}, pw.c_str());
  if (s.T > 1 && positions.stride[0] != 1)
    LS_THROW << pw << ": must be contiguous, got " << positions.shape_str();
  std::vector<unsigned char> keep;
  const int32_t* p = host_readable(positions, keep).i32();
  for (int64_t t = 0; t < s.T; ++t)
    if (p[t] < 0) LS_THROW << pw << ": negative position " << p[t] << " at token " << t;
  return s;
}

void check_theta(double theta, const char* fn) {
  if (!(theta > 0) || !std::isfinite(theta))
    LS_THROW << fn << ": theta must be positive and finite, got " << theta;
}

double inv_freq(int64_t i, int64_t head_dim, double theta) {
  return std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(head_dim));
}

// Rotates every head of token t by (c, s) (both (half)); kInverse rotates by -angle.
template <bool kInverse>
void rotate_token(const Tensor& x, const RopeShape& sh, int64_t t, const float* c, const float* s) {
  float* base = x.f32() + t * x.stride[0];
  for (int64_t h = 0; h < sh.H; ++h) {
    float* lo = base + h * x.stride[1];
    float* hi = lo + sh.half;
    for (int64_t i = 0; i < sh.half; ++i) {
      const float a = lo[i], b = hi[i];
      if constexpr (kInverse) {
        lo[i] = a * c[i] + b * s[i];
        hi[i] = b * c[i] - a * s[i];
      } else {
        lo[i] = a * c[i] - b * s[i];
        hi[i] = b * c[i] + a * s[i];
      }
    }
  }
}

// Rotates the consecutive pairs (2j, 2j + 1) of every head of token t by (c, s) (both (Dh/2)).
template <bool kInverse>
void rotate_token_interleaved(const Tensor& x, const RopeShape& sh, int64_t t, const float* c,
                              const float* s) {
  float* base = x.f32() + t * x.stride[0];
  for (int64_t h = 0; h < sh.H; ++h) {
    float* v = base + h * x.stride[1];
    for (int64_t j = 0; j < sh.half; ++j) {
      const float a = v[2 * j], b = v[2 * j + 1];
      if constexpr (kInverse) {
        v[2 * j] = a * c[j] + b * s[j];
        v[2 * j + 1] = b * c[j] - a * s[j];
      } else {
        v[2 * j] = a * c[j] - b * s[j];
        v[2 * j + 1] = b * c[j] + a * s[j];
      }
    }
  }
}

int64_t token_grain(const RopeShape& s) {
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(1, s.H * s.Dh));
}

template <bool kInverse>
void rope_on_the_fly(const Context& ctx, Tensor x, const Tensor& positions, double theta, const char* fn) {
  check_theta(theta, fn);
  const RopeShape sh = check_rope(x, positions, fn);
  std::vector<double> freq(static_cast<size_t>(sh.half));  // (Dh/2) inverse frequencies
  for (int64_t i = 0; i < sh.half; ++i) freq[size_t(i)] = inv_freq(i, sh.Dh, theta);
  const int32_t* pos = positions.i32();
  ctx.parallel_for(
      sh.T,
      [&](int64_t t0, int64_t t1) {
        std::vector<float> c(static_cast<size_t>(sh.half)), s(static_cast<size_t>(sh.half));  // (Dh/2)
        for (int64_t t = t0; t < t1; ++t) {
          for (int64_t i = 0; i < sh.half; ++i) {
            // Same expression as rope_cos_sin (freq[i] is inv_freq(i, ...)), so the same bits.
            const double angle = static_cast<double>(pos[t]) * freq[size_t(i)];
            c[size_t(i)] = static_cast<float>(std::cos(angle));
            s[size_t(i)] = static_cast<float>(std::sin(angle));
          }
          rotate_token<kInverse>(x, sh, t, c.data(), s.data());
        }
      },
      token_grain(sh));
}

template <bool kInverse, bool kInterleaved = false>
void rope_from_table(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table,
                     const char* fn) {
  const RopeShape sh = detail::check_rope_table(x, positions, table, fn);
  const int32_t* pos = positions.i32();
  ctx.parallel_for(
      sh.T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const size_t off = static_cast<size_t>(pos[t]) * static_cast<size_t>(sh.half);
          if constexpr (kInterleaved) {
            rotate_token_interleaved<kInverse>(x, sh, t, table.cos.data() + off, table.sin.data() + off);
          } else {
            rotate_token<kInverse>(x, sh, t, table.cos.data() + off, table.sin.data() + off);
          }
        }
      },
      token_grain(sh));
}

}  // namespace

namespace detail {

RopeShape check_rope_table(const Tensor& x, const Tensor& positions, const RopeTable& table, const char* fn) {
  const RopeShape sh = check_rope(x, positions, fn);
  if (table.head_dim != sh.Dh)
    LS_THROW << fn << ": table built for Dh=" << table.head_dim << ", x is " << x.shape_str();
  std::vector<unsigned char> keep;
  const int32_t* pos = host_readable(positions, keep).i32();
  for (int64_t t = 0; t < sh.T; ++t)
    if (pos[t] >= table.max_positions)
      LS_THROW << fn << ": position " << pos[t] << " at token " << t << " is beyond the table's "
               << table.max_positions << " positions";
  return sh;
}

}  // namespace detail

void rope_cos_sin(int64_t pos, int64_t i, int64_t head_dim, double theta, float* cos_out, float* sin_out) {
  const double angle = static_cast<double>(pos) * inv_freq(i, head_dim, theta);
  *cos_out = static_cast<float>(std::cos(angle));
  *sin_out = static_cast<float>(std::sin(angle));
}

namespace {

// A (max_positions, head_dim/2) table of angle = double(pos) * freq[i], cos and
// sin in double, each rounded once to float.
RopeTable build_table(const Context& ctx, int64_t head_dim, double theta, int64_t max_positions,
                      const std::vector<double>& freq) {
  RopeTable tab;
  tab.head_dim = head_dim;
  tab.theta = theta;
  tab.max_positions = max_positions;
  const int64_t half = head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(max_positions * half)), sin(cos.size());
  ctx.parallel_for(
      max_positions,
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(p) * freq[size_t(i)];
            cos[size_t(p * half + i)] = static_cast<float>(std::cos(angle));
            sin[size_t(p * half + i)] = static_cast<float>(std::sin(angle));
          }
      },
      64);
  const Allocator& memory = device_memory(ctx);
  tab.cos = DeviceArray<float>(cos, memory, "rope cos table");
  tab.sin = DeviceArray<float>(sin, memory, "rope sin table");
  return tab;
}

void check_table_args(int64_t head_dim, double theta, int64_t max_positions, const char* dim_name) {
  check_theta(theta, "make_rope_table");
  if (head_dim <= 0 || head_dim % 2 != 0)
    LS_THROW << "make_rope_table: " << dim_name << " must be positive and even, got " << head_dim;
  if (max_positions < 0) LS_THROW << "make_rope_table: max_positions must be >= 0, got " << max_positions;
}

void check_yarn(const YarnConfig& yarn, const char* fn) {
  if (!yarn.enabled()) return;
  if (!(yarn.factor > 0) || !std::isfinite(yarn.factor))
    LS_THROW << fn << ": yarn.factor must be positive and finite, got " << yarn.factor;
  if (!(yarn.beta_fast > 0) || !(yarn.beta_slow > 0) || !std::isfinite(yarn.beta_fast) ||
      !std::isfinite(yarn.beta_slow))
    LS_THROW << fn << ": yarn.beta_fast and yarn.beta_slow must be positive and finite, got "
             << yarn.beta_fast << " and " << yarn.beta_slow;
}

// The pair index at which a frequency completes `beta` turns over the original
// context, as a real number (YaRN's correction dimension).
double yarn_correction_dim(double beta, int64_t rope_dim, double theta, int64_t original_max_positions) {
  return static_cast<double>(rope_dim) *
         std::log(static_cast<double>(original_max_positions) / (beta * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

}  // namespace

RopeTable make_rope_table(const Context& ctx, int64_t head_dim, double theta, int64_t max_positions) {
  check_table_args(head_dim, theta, max_positions, "head_dim");
  std::vector<double> freq(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) freq[size_t(i)] = inv_freq(i, head_dim, theta);
  return build_table(ctx, head_dim, theta, max_positions, freq);
}

double rope_inv_freq(int64_t j, int64_t rope_dim, double theta, const YarnConfig& yarn) {
  constexpr const char* fn = "rope_inv_freq";
  check_theta(theta, fn);
  if (rope_dim <= 0 || rope_dim % 2 != 0)
    LS_THROW << fn << ": rope_dim must be positive and even, got " << rope_dim;
  if (j < 0 || j >= rope_dim / 2)
    LS_THROW << fn << ": pair " << j << " is outside [0, " << rope_dim / 2 << ")";
  check_yarn(yarn, fn);
  const double omega = inv_freq(j, rope_dim, theta);
  if (!yarn.enabled()) return omega;
  const double lo = std::max(
      0.0, std::floor(yarn_correction_dim(yarn.beta_fast, rope_dim, theta, yarn.original_max_positions)));
  double hi =
      std::min(static_cast<double>(rope_dim - 1),
               std::ceil(yarn_correction_dim(yarn.beta_slow, rope_dim, theta, yarn.original_max_positions)));
  if (hi == lo) hi += 0.001;  // keeps the ramp a division, as the reference does
  const double gamma = std::clamp((static_cast<double>(j) - lo) / (hi - lo), 0.0, 1.0);
  return omega * (1.0 - gamma * (1.0 - 1.0 / yarn.factor));
}

RopeTable make_rope_table(const Context& ctx, int64_t rope_dim, double theta, int64_t max_positions,
                          const YarnConfig& yarn) {
  check_table_args(rope_dim, theta, max_positions, "rope_dim");
  check_yarn(yarn, "make_rope_table");
  std::vector<double> freq(static_cast<size_t>(rope_dim / 2));
  for (int64_t j = 0; j < rope_dim / 2; ++j) freq[size_t(j)] = rope_inv_freq(j, rope_dim, theta, yarn);
  return build_table(ctx, rope_dim, theta, max_positions, freq);
}

void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, double theta) {
  rope_on_the_fly<false>(ctx, x, positions, theta, "rope_forward");
}
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, double theta) {
  rope_on_the_fly<true>(ctx, dx, positions, theta, "rope_backward");
}
void rope_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table) {
  LS_GPU_DISPATCH(ctx, rope_forward, x, positions, table);
  rope_from_table<false>(ctx, x, positions, table, "rope_forward");
}
void rope_backward(const Context& ctx, Tensor dx, const Tensor& positions, const RopeTable& table) {
  LS_GPU_DISPATCH(ctx, rope_backward, dx, positions, table);
  rope_from_table<true>(ctx, dx, positions, table, "rope_backward");
}

void rope_interleaved_forward(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table) {
  LS_GPU_DISPATCH(ctx, rope_interleaved_forward, x, positions, table);
  rope_from_table<false, true>(ctx, x, positions, table, "rope_interleaved_forward");
}
void rope_interleaved_inverse(const Context& ctx, Tensor x, const Tensor& positions, const RopeTable& table) {
  LS_GPU_DISPATCH(ctx, rope_interleaved_inverse, x, positions, table);
  rope_from_table<true, true>(ctx, x, positions, table, "rope_interleaved_inverse");
}

}  // namespace lockstep::kernels
