// Communicator: an MPI communicator with the collectives lockstep needs.
// Every floating-point reduction has one fixed order, whatever algorithm the
// MPI library would pick: MPI only moves bytes (all-to-all, all-gather), and
// the sums are done here by sum_in_rank_order (rank 0, 1, ..., P-1, in
// double). Large buffers are cut into buckets of bucket_bytes() so scratch
// memory stays bounded and counts fit MPI's int. Errors are returned by MPI
// (MPI_ERRORS_RETURN) and thrown as lockstep::Error with MPI's message.
// Only the thread that created the Environment may call these (FUNNELED).
// Built without MPI (-DLOCKSTEP_MPI=OFF), the world has one rank and the
// collectives are local copies (comm/no_mpi.cpp).
#pragma once

#if LOCKSTEP_HAVE_MPI
#include <mpi.h>
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "lockstep/comm/exact_sum.h"
#include "lockstep/comm/watchdog.h"

namespace lockstep::comm {

inline constexpr size_t kDefaultBucketBytes = size_t(16) << 20;  // 4 Mi floats

class Communicator {
 public:
  Communicator() = default;  // null: this rank is not a member (see split)
  ~Communicator();
  Communicator(Communicator&& o) noexcept;
  Communicator& operator=(Communicator&& o) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // A duplicate of MPI_COMM_WORLD. timeout_s > 0 starts a Watchdog that ends
  // the process when one collective takes longer (shared by split children).
  static Communicator world(double timeout_s = 0);

  bool valid() const { return size_ > 0; }  // a member has at least itself
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
#if LOCKSTEP_HAVE_MPI
  MPI_Comm native() const { return comm_; }
#endif

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). color < 0: this rank joins none and
  // gets a null Communicator.
  Communicator split(int color, int key, const std::string& name) const;

  size_t bucket_bytes() const { return bucket_bytes_; }
  void set_bucket_bytes(size_t bytes);

  // In-place sum over ranks; every rank gets the same bits (sum_in_rank_order).
  void all_reduce_sum(float* data, size_t n);
  void all_reduce_sum(double* data, size_t n);
  // The exact integer sum of fixed-point values (comm/exact_sum.h): the same
  // result for any number of ranks and any grouping of the terms.
  void all_reduce_sum(Fixed* data, size_t n);
  // Scalar sum, same order.
  double sum(double x);
  int64_t max(int64_t x);
  int64_t min(int64_t x);

  // root's bytes to every rank, bucket by bucket.
  void broadcast(void* data, size_t bytes, int root);
  template <typename T>
  void broadcast_value(T& v, int root) {
    static_assert(std::is_trivially_copyable_v<T>);
    broadcast(&v, sizeof(T), root);
  }

  // out (size() * bytes) = every rank's `bytes` in rank order.
  void all_gather_bytes(const void* in, size_t bytes, void* out);
  template <typename T>
  std::vector<T> all_gather(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T> out(static_cast<size_t>(size_));
    all_gather_bytes(&v, sizeof(T), out.data());
    return out;
  }

  // The same, received by `root` only (out may be null on other ranks).
  void gather_bytes(const void* in, size_t bytes, void* out, int root);

  // send_bytes[q]: bytes this rank sends to rank q (blocks laid out in rank
  // order in `send`); returns recv_bytes[q], the bytes rank q sends here.
  std::vector<size_t> exchange_counts(const std::vector<size_t>& send_bytes);
  // Variable all-to-all; blocks are contiguous, in rank order, on both sides.
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes);

  void send(const void* data, size_t bytes, int dest, int tag);
  void recv(void* data, size_t bytes, int src, int tag);
  void barrier();

 private:
#if LOCKSTEP_HAVE_MPI
  template <typename T>
  void all_reduce_impl(T* data, size_t n, MPI_Datatype type);
  MPI_Comm comm_ = MPI_COMM_NULL;
#endif
  void reset();

  int rank_ = 0, size_ = 0;
  std::string name_;
  size_t bucket_bytes_ = kDefaultBucketBytes;
  std::shared_ptr<Watchdog> watchdog_;
  std::vector<char> scratch_;  // one bucket: the chunks this rank reduces
};

}  // namespace lockstep::comm
