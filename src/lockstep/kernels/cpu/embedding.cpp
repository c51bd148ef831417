// Embedding lookup (row copies) and scatter-add backward, threads over columns
// in the backward so that repeated ids accumulate in token order.
#include "lockstep/kernels/cpu/embedding.h"

#include <cstring>

#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

namespace {

// A 2-D operand must be row-major with unit column stride; rows may be padded.
void check_rows(const Tensor& t, const char* what) {
  if (t.stride[1] != 1 || (t.shape[0] > 1 && t.stride[0] < t.shape[1]))
    LS_THROW << what << ": rows must have unit column stride and stride[0] >= width, got " << t.shape_str()
             << " with strides (" << t.stride[0] << ", " << t.stride[1] << ")";
}

void check_ids(const Tensor& ids, int64_t T, int64_t V, const char* fn) {
  check_dtype(ids, DType::I32, fn);
  check_shape(ids, {T}, fn);
  if (T > 1 && ids.stride[0] != 1) LS_THROW << fn << ": ids must be contiguous, got " << ids.shape_str();
  std::vector<unsigned char> keep;
  const int32_t* id = host_readable(ids, keep).i32();
  for (int64_t t = 0; t < T; ++t)
    if (id[t] < 0 || id[t] >= V)
      LS_THROW << fn << ": token id " << id[t] << " at position " << t << " is outside [0, " << V << ")";
}

// Columns per task in the backward: enough contiguous floats to amortize the
// walk over all T ids, few enough that two threads get work at D >= 512.
constexpr int64_t kColumnGrain = 256;

}  // namespace

void check_embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  check_dtype(table, DType::F32, "embedding_forward: table");
  check_shape(table, {-1, -1}, "embedding_forward: table");
  check_dtype(out, DType::F32, "embedding_forward: out");
  check_shape(out, {-1, table.shape[1]}, "embedding_forward: out (T, D)");
  check_rows(table, "embedding_forward: table");
  check_rows(out, "embedding_forward: out");
  const int64_t T = out.shape[0], V = table.shape[0];
  check_ids(ids, T, V, "embedding_forward: ids (T,)");
}

void embedding_forward(const Context& ctx, Tensor out, const Tensor& table, const Tensor& ids) {
  LS_GPU_DISPATCH(ctx, embedding_forward, out, table, ids);
  check_embedding_forward(out, table, ids);
  const int64_t T = out.shape[0], D = table.shape[1];
  const int32_t* id = ids.i32();
  const float* tab = table.f32();
  float* o = out.f32();
  ctx.parallel_for(
      T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          std::memcpy(o + t * out.stride[0], tab + int64_t(id[t]) * table.stride[0],
                      size_t(D) * sizeof(float));
      },
      16);
}

void check_embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  check_dtype(dtable, DType::F32, "embedding_backward: dtable");
  check_shape(dtable, {-1, -1}, "embedding_backward: dtable");
  check_dtype(dout, DType::F32, "embedding_backward: dout");
  check_shape(dout, {-1, dtable.shape[1]}, "embedding_backward: dout (T, D)");
  check_rows(dtable, "embedding_backward: dtable");
  check_rows(dout, "embedding_backward: dout");
  const int64_t T = dout.shape[0], V = dtable.shape[0];
  check_ids(ids, T, V, "embedding_backward: ids (T,)");
}

void embedding_backward(const Context& ctx, Tensor dtable, const Tensor& dout, const Tensor& ids) {
  LS_GPU_DISPATCH(ctx, embedding_backward, dtable, dout, ids);
  check_embedding_backward(dtable, dout, ids);
  const int64_t T = dout.shape[0], D = dtable.shape[1];
  const int32_t* id = ids.i32();
  const float* g = dout.f32();
  float* dt = dtable.f32();
  ctx.parallel_for(
      D,
      [&](int64_t c0, int64_t c1) {
        for (int64_t t = 0; t < T; ++t) {  // token order: the accumulation order of each element
          float* row = dt + int64_t(id[t]) * dtable.stride[0];
          const float* src = g + t * dout.stride[0];
          for (int64_t c = c0; c < c1; ++c) row[c] = row[c] + src[c];
        }
      },
      kColumnGrain);
}

}  // namespace lockstep::kernels
