// Communicator: bucketed deterministic all-reduce, broadcast, all-to-all(v).
#include "lockstep/comm/communicator.h"

#if LOCKSTEP_HAVE_MPI  // else comm/no_mpi.cpp

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "lockstep/base/error.h"
#include "lockstep/comm/mpi_error.h"
#include "lockstep/comm/reduce_order.h"

namespace lockstep::comm {

namespace {
int to_int(size_t v, const char* what) {
  if (v > size_t(INT_MAX)) LS_THROW << what << ": " << v << " exceeds MPI's int count limit";
  return int(v);
}
}  // namespace

Communicator::~Communicator() { reset(); }

void Communicator::reset() {
  // MPI_Comm_free after MPI_Finalize is an error: a Communicator that
  // outlives the Environment just forgets its handle.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

Communicator::Communicator(Communicator&& o) noexcept { *this = std::move(o); }

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    reset();
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    rank_ = std::exchange(o.rank_, 0);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    bucket_bytes_ = o.bucket_bytes_;
    watchdog_ = std::move(o.watchdog_);
    scratch_ = std::move(o.scratch_);
  }
  return *this;
}

Communicator Communicator::world(double timeout_s) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) LS_THROW << "Communicator::world: MPI is not initialised (create a comm::Environment first)";
  Communicator c;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c.comm_), "MPI_Comm_dup(MPI_COMM_WORLD)");
  check_mpi(MPI_Comm_set_errhandler(c.comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(c.comm_, &c.rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(c.comm_, &c.size_), "MPI_Comm_size");
  c.name_ = "world";
  if (timeout_s > 0) c.watchdog_ = std::make_shared<Watchdog>(timeout_s, c.rank_);
  return c;
}

Communicator Communicator::split(int color, int key, const std::string& name) const {
  LS_CHECK(valid()) << "split on a null communicator";
  Communicator c;
  {
    WatchdogScope w(watchdog_.get(), "split", name_);
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &c.comm_),
              ("MPI_Comm_split of '" + name_ + "' into '" + name + "'").c_str());
  }
  c.name_ = name;
  c.bucket_bytes_ = bucket_bytes_;
  if (c.comm_ == MPI_COMM_NULL) return c;
  check_mpi(MPI_Comm_set_errhandler(c.comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(c.comm_, &c.rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(c.comm_, &c.size_), "MPI_Comm_size");
  c.watchdog_ = watchdog_;
  return c;
}

void Communicator::set_bucket_bytes(size_t bytes) {
  // 16 bytes at least: a bucket holds one double; at most 1 GiB so every
  // count, in bytes or elements, fits MPI's int.
  if (bytes < 16 || bytes > (size_t(1) << 30))
    LS_THROW << "communicator bucket of " << bytes << " bytes: must be in [16 B, 1 GiB]";
  bucket_bytes_ = bytes;
}

template <typename T>
void Communicator::all_reduce_impl(T* data, size_t n, MPI_Datatype type) {
  LS_CHECK(valid()) << "all_reduce_sum on a null communicator";
  if (size_ == 1 || n == 0) return;  // T(double(x)) == x: the sum of one part
  WatchdogScope w(watchdog_.get(), "all_reduce_sum", name_);
  const size_t P = size_t(size_), r = size_t(rank_);
  const size_t B = std::max<size_t>(bucket_bytes_ / sizeof(T), 1);
  // Chunk q of a bucket of m elements: [m*q/P, m*(q+1)/P); rank q reduces it.
  std::vector<int> lens(P), starts(P), rcounts(P), rdispls(P);
  std::vector<const T*> parts(P);
  for (size_t b0 = 0; b0 < n; b0 += B) {
    const size_t m = std::min(B, n - b0);
    for (size_t q = 0; q < P; ++q) {
      starts[q] = int(m * q / P);
      lens[q] = int(m * (q + 1) / P) - starts[q];
    }
    const size_t mine = size_t(lens[r]);
    if (scratch_.size() < P * mine * sizeof(T)) scratch_.resize(P * mine * sizeof(T));
    T* recv = reinterpret_cast<T*>(scratch_.data());
    for (size_t q = 0; q < P; ++q) {
      rcounts[q] = int(mine);
      rdispls[q] = int(q * mine);
      parts[q] = recv + q * mine;
    }
    // Every rank's copy of my chunk, in rank order: pure data movement.
    check_mpi(MPI_Alltoallv(data + b0, lens.data(), starts.data(), type, recv, rcounts.data(), rdispls.data(), type,
                            comm_),
              "MPI_Alltoallv (all_reduce_sum)");
    sum_in_rank_order(parts.data(), size_, mine, data + b0 + size_t(starts[r]));
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, type, data + b0, lens.data(), starts.data(), type, comm_),
              "MPI_Allgatherv (all_reduce_sum)");
  }
}

void Communicator::all_reduce_sum(float* data, size_t n) { all_reduce_impl(data, n, MPI_FLOAT); }
void Communicator::all_reduce_sum(double* data, size_t n) { all_reduce_impl(data, n, MPI_DOUBLE); }

void Communicator::all_reduce_sum(Fixed* data, size_t n) {
  static_assert(sizeof(Fixed) == 2 * sizeof(uint64_t));
  MPI_Datatype type;  // MPI has no 128-bit integer: two 64-bit words, moved, never reduced by MPI
  check_mpi(MPI_Type_contiguous(2, MPI_UINT64_T, &type), "MPI_Type_contiguous");
  check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
  try {
    all_reduce_impl(data, n, type);
  } catch (...) {
    MPI_Type_free(&type);
    throw;
  }
  MPI_Type_free(&type);
}

double Communicator::sum(double x) {
  std::vector<double> all = all_gather(x);
  std::vector<const double*> parts(all.size());
  for (size_t q = 0; q < all.size(); ++q) parts[q] = &all[q];
  double out = 0;
  sum_in_rank_order(parts.data(), size_, 1, &out);
  return out;
}

int64_t Communicator::max(int64_t x) {
  std::vector<int64_t> all = all_gather(x);
  return *std::max_element(all.begin(), all.end());
}

int64_t Communicator::min(int64_t x) {
  std::vector<int64_t> all = all_gather(x);
  return *std::min_element(all.begin(), all.end());
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  LS_CHECK(valid()) << "broadcast on a null communicator";
  LS_CHECK(root >= 0 && root < size_) << "broadcast root " << root << " outside [0, " << size_ << ")";
  if (size_ == 1) return;
  WatchdogScope w(watchdog_.get(), "broadcast", name_);
  char* p = static_cast<char*>(data);
  for (size_t b0 = 0; b0 < bytes; b0 += bucket_bytes_) {
    const size_t m = std::min(bucket_bytes_, bytes - b0);
    check_mpi(MPI_Bcast(p + b0, int(m), MPI_BYTE, root, comm_), "MPI_Bcast");
  }
}

void Communicator::all_gather_bytes(const void* in, size_t bytes, void* out) {
  LS_CHECK(valid()) << "all_gather on a null communicator";
  WatchdogScope w(watchdog_.get(), "all_gather", name_);
  const int count = to_int(bytes, "all_gather");
  check_mpi(MPI_Allgather(in, count, MPI_BYTE, out, count, MPI_BYTE, comm_), "MPI_Allgather");
}

void Communicator::gather_bytes(const void* in, size_t bytes, void* out, int root) {
  LS_CHECK(valid()) << "gather on a null communicator";
  WatchdogScope w(watchdog_.get(), "gather", name_);
  const int count = to_int(bytes, "gather");
  check_mpi(MPI_Gather(in, count, MPI_BYTE, rank_ == root ? out : nullptr, count, MPI_BYTE, root, comm_),
            "MPI_Gather");
}

std::vector<size_t> Communicator::exchange_counts(const std::vector<size_t>& send_bytes) {
  LS_CHECK(valid()) << "exchange_counts on a null communicator";
  if (send_bytes.size() != size_t(size_))
    LS_THROW << "exchange_counts: " << send_bytes.size() << " counts for " << size_ << " ranks";
  WatchdogScope w(watchdog_.get(), "exchange_counts", name_);
  std::vector<uint64_t> in(send_bytes.begin(), send_bytes.end()), out(static_cast<size_t>(size_));
  check_mpi(MPI_Alltoall(in.data(), 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, comm_), "MPI_Alltoall");
  return std::vector<size_t>(out.begin(), out.end());
}

void Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                const std::vector<size_t>& recv_bytes) {
  LS_CHECK(valid()) << "all_to_all_v on a null communicator";
  if (send_bytes.size() != size_t(size_) || recv_bytes.size() != size_t(size_))
    LS_THROW << "all_to_all_v: " << send_bytes.size() << " send and " << recv_bytes.size() << " receive counts for "
             << size_ << " ranks";
  WatchdogScope w(watchdog_.get(), "all_to_all_v", name_);
  std::vector<int> sc(static_cast<size_t>(size_)), sd(static_cast<size_t>(size_)), rc(static_cast<size_t>(size_)), rd(static_cast<size_t>(size_));
  size_t so = 0, ro = 0;
  for (size_t q = 0; q < size_t(size_); ++q) {
    sc[q] = to_int(send_bytes[q], "all_to_all_v send count");
    rc[q] = to_int(recv_bytes[q], "all_to_all_v receive count");
    sd[q] = to_int(so, "all_to_all_v send offset");
    rd[q] = to_int(ro, "all_to_all_v receive offset");
    so += send_bytes[q];
    ro += recv_bytes[q];
  }
  check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_),
            "MPI_Alltoallv");
}

void Communicator::send(const void* data, size_t bytes, int dest, int tag) {
  LS_CHECK(valid()) << "send on a null communicator";
  WatchdogScope w(watchdog_.get(), "send", name_);
  const char* p = static_cast<const char*>(data);
  for (size_t b0 = 0; b0 < bytes || b0 == 0; b0 += bucket_bytes_) {
    const size_t m = std::min(bucket_bytes_, bytes - b0);
    check_mpi(MPI_Send(p + b0, int(m), MPI_BYTE, dest, tag, comm_), "MPI_Send");
    if (bytes == 0) break;
  }
}

void Communicator::recv(void* data, size_t bytes, int src, int tag) {
  LS_CHECK(valid()) << "recv on a null communicator";
  WatchdogScope w(watchdog_.get(), "recv", name_);
  char* p = static_cast<char*>(data);
  for (size_t b0 = 0; b0 < bytes || b0 == 0; b0 += bucket_bytes_) {
    const size_t m = std::min(bucket_bytes_, bytes - b0);
    MPI_Status st;
    check_mpi(MPI_Recv(p + b0, int(m), MPI_BYTE, src, tag, comm_, &st), "MPI_Recv");
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (size_t(got) != m) LS_THROW << "recv from rank " << src << ": expected " << m << " bytes, got " << got;
    if (bytes == 0) break;
  }
}

void Communicator::barrier() {
  LS_CHECK(valid()) << "barrier on a null communicator";
  WatchdogScope w(watchdog_.get(), "barrier", name_);
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace lockstep::comm

#endif  // LOCKSTEP_HAVE_MPI
