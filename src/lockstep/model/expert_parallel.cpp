// Expert-parallel routes, dispatch and return (expert_parallel.h).
#include "lockstep/model/expert_parallel.h"

#include <cstring>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::model {

ExpertShard ExpertShard::of_rank(int64_t num_experts, int size, int rank) {
  LS_CHECK(size >= 1 && rank >= 0 && rank < size) << "expert shard " << rank << " of " << size;
  if (num_experts % size != 0)
    LS_THROW << "expert parallelism: " << size << " ranks do not divide the model's " << num_experts
             << " experts (num_experts must be a multiple of expert_parallel)";
  const int64_t per = num_experts / size;
  return ExpertShard{per * rank, per};
}

namespace {

// Copies rows src[from[i]] to dst[i] (both (n, D) f32, contiguous rows of D).
void copy_rows(const Context& ctx, float* dst, const float* src, const std::vector<int64_t>& from, int64_t D,
               bool scatter) {
  const int64_t n = static_cast<int64_t>(from.size());
  const size_t bytes = size_t(D) * sizeof(float);
  ctx.parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t j = from[size_t(i)];
      if (scatter)
        std::memcpy(dst + j * D, src + i * D, bytes);
      else
        std::memcpy(dst + i * D, src + j * D, bytes);
    }
  }, 64);
}

void check_rows(const Tensor& t, int64_t rows, int64_t D, const char* what) {
  LS_CHECK(t.dtype == DType::F32 && t.ndim == 2 && t.dim(0) == rows && t.dim(1) == D && t.is_contiguous())
      << "expert parallelism: " << what << " must be a contiguous (" << rows << ", " << D << ") f32 tensor";
}

std::vector<size_t> row_bytes(const std::vector<size_t>& rows, int64_t D) {
  std::vector<size_t> out(rows.size());
  for (size_t q = 0; q < rows.size(); ++q) out[q] = rows[q] * size_t(D) * sizeof(float);
  return out;
}

}  // namespace

ExpertRoute expert_route(ExpertComm& comm, const kernels::MoeDispatch& plan, const ExpertShard& shard) {
  const int P = comm.size();
  const int64_t E = plan.num_experts, per = E / P;
  LS_CHECK(shard == ExpertShard::of_rank(E, P, comm.rank()))
      << "expert parallelism: rank " << comm.rank() << " holds experts [" << shard.first << ", "
      << shard.first + shard.count << "), not its shard of " << E << " experts over " << P << " ranks";
  // Counts of plan rows per expert, in rank blocks of `per` experts.
  std::vector<int64_t> send_counts(static_cast<size_t>(E)), recv_counts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) send_counts[size_t(e)] = plan.expert_rows(int(e));
  const std::vector<size_t> block(size_t(P), size_t(per) * sizeof(int64_t));
  comm.all_to_all_v(send_counts.data(), block, recv_counts.data(), block);

  ExpertRoute r;
  r.send_rows.assign(size_t(P), 0);
  r.recv_rows.assign(size_t(P), 0);
  for (int q = 0; q < P; ++q)
    for (int64_t j = 0; j < per; ++j) {
      r.send_rows[size_t(q)] += size_t(send_counts[size_t(q * per + j)]);
      r.recv_rows[size_t(q)] += size_t(recv_counts[size_t(q * per + j)]);  // block q: rank q's counts of my experts
    }
  // Received rows are source-major: rank q's block holds its rows of my
  // experts j = 0..per-1 in turn. Expert-major order visits, for each expert,
  // every source's rows for it.
  std::vector<int64_t> src_first(size_t(P) * size_t(per));  // received row of (q, j)'s first row
  int64_t at = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t j = 0; j < per; ++j) {
      src_first[size_t(q * per + j)] = at;
      at += recv_counts[size_t(q * per + j)];
    }
  r.local.num_experts = int(E);
  r.local.top_k = 1;
  r.local.num_tokens = at;
  r.local.offsets.assign(size_t(E) + 1, 0);
  r.order.reserve(size_t(at));
  r.by_source.assign(size_t(E) * size_t(P), 0);
  for (int64_t e = 0; e < E; ++e) {
    r.local.offsets[size_t(e)] = int64_t(r.order.size());
    if (!shard.contains(e)) continue;
    const int64_t j = e - shard.first;
    for (int q = 0; q < P; ++q) {
      const int64_t first = src_first[size_t(q * per + j)], n = recv_counts[size_t(q * per + j)];
      r.by_source[size_t(e * P + q)] = n;
      for (int64_t i = 0; i < n; ++i) r.order.push_back(first + i);
    }
  }
  r.local.offsets[size_t(E)] = int64_t(r.order.size());
  // A plan over the received rows as tokens of one slot each, so that
  // per-row kernels (moe_scale_rows) take it.
  r.local.token.resize(size_t(at));
  r.local.slot.assign(size_t(at), 0);
  r.local.row_of.resize(size_t(at));
  r.local.expert.resize(size_t(at));
  for (int64_t i = 0; i < at; ++i) {
    r.local.token[size_t(i)] = int32_t(i);
    r.local.row_of[size_t(i)] = int32_t(i);
  }
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = r.local.offsets[size_t(e)]; i < r.local.offsets[size_t(e) + 1]; ++i)
      r.local.expert[size_t(i)] = int32_t(e);
  return r;
}

void expert_dispatch(const Context& ctx, ExpertComm& comm, const ExpertRoute& route, const Tensor& rows, Tensor out,
                     Tensor staging) {
  int64_t n_send = 0;
  for (size_t s : route.send_rows) n_send += int64_t(s);
  const int64_t D = out.ndim == 2 ? out.dim(1) : rows.dim(1), n_in = route.num_in();
  check_rows(rows, n_send, D, "dispatched rows");
  check_rows(out, n_in, D, "received rows");
  check_rows(staging, n_in, D, "staging");
  const Allocator& memory = kernels::device_memory(ctx);
  if (memory.host_visible()) {
    comm.all_to_all_v(rows.data, row_bytes(route.send_rows, D), staging.data, row_bytes(route.recv_rows, D));
    copy_rows(ctx, out.f32(), staging.f32(), route.order, D, false);
    return;
  }
  // Device memory: the exchange and the reordering on host copies, the
  // result copied in (plain copies of f32 rows: the same bits).
  std::vector<float> send(size_t(n_send * D)), recv(size_t(n_in * D)), ordered(size_t(n_in * D));
  memory.copy_out(send.data(), rows.data, send.size() * sizeof(float));
  comm.all_to_all_v(send.data(), row_bytes(route.send_rows, D), recv.data(), row_bytes(route.recv_rows, D));
  copy_rows(ctx, ordered.data(), recv.data(), route.order, D, false);
  memory.copy_in(out.data, ordered.data(), ordered.size() * sizeof(float));
}

void expert_return(const Context& ctx, ExpertComm& comm, const ExpertRoute& route, const Tensor& in, Tensor out,
                   Tensor staging) {
  int64_t n_back = 0;
  for (size_t s : route.send_rows) n_back += int64_t(s);
  const int64_t D = in.ndim == 2 ? in.dim(1) : out.dim(1), n_in = route.num_in();
  check_rows(in, n_in, D, "expert outputs");
  check_rows(out, n_back, D, "returned rows");
  check_rows(staging, n_in, D, "staging");
  const Allocator& memory = kernels::device_memory(ctx);
  if (memory.host_visible()) {
    copy_rows(ctx, staging.f32(), in.f32(), route.order, D, true);
    comm.all_to_all_v(staging.data, row_bytes(route.recv_rows, D), out.data, row_bytes(route.send_rows, D));
    return;
  }
  std::vector<float> rows(size_t(n_in * D)), scattered(size_t(n_in * D)), back(size_t(n_back * D));
  memory.copy_out(rows.data(), in.data, rows.size() * sizeof(float));
  copy_rows(ctx, scattered.data(), rows.data(), route.order, D, true);
  comm.all_to_all_v(scattered.data(), row_bytes(route.recv_rows, D), back.data(),
                    row_bytes(route.send_rows, D));
  memory.copy_in(out.data, back.data(), back.size() * sizeof(float));
}

}  // namespace lockstep::model
