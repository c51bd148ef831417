// Environment and Communicator in a build without MPI (-DLOCKSTEP_MPI=OFF):
// the world is this process alone, so every collective is a local copy with
// the same results as the MPI build gives a world of one rank. A process that
// a launcher started as one of several ranks is refused with a clear error.
#include "lockstep/comm/communicator.h"
#include "lockstep/comm/environment.h"

#if !LOCKSTEP_HAVE_MPI  // else communicator.cpp, environment.cpp

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "lockstep/base/error.h"
#include "lockstep/comm/reduce_order.h"

namespace lockstep::comm {

namespace {

constexpr const char* kNoMpi = "built without MPI (-DLOCKSTEP_MPI=OFF): ";

// Throws when the launcher's variables (the ones cli/mpi_launch.h looks for)
// say this process is one rank of several: run alone, each would think it
// is rank 0 of 1 and they would all write the same outputs.
void refuse_multi_rank(const char* what) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* s = std::getenv(v);
    if (s && std::atol(s) > 1)
      LS_THROW << kNoMpi << what << ": this process was started by an MPI launcher as one of " << s << " ranks (" << v
               << "=" << s << "); rebuild with -DLOCKSTEP_MPI=ON to run a job of several ranks";
  }
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    const char* s = std::getenv(v);
    if (s && std::atol(s) > 0)
      LS_THROW << kNoMpi << what << ": this process was started by an MPI launcher as rank " << s << " (" << v << "="
               << s << "); rebuild with -DLOCKSTEP_MPI=ON to run a job of several ranks";
  }
}

}  // namespace

// ---- Environment: nothing to initialise; rank 0 of 1.

Environment::Environment(int*, char***) { refuse_multi_rank("comm::Environment"); }
Environment::~Environment() = default;
std::string Environment::library_version() { return "none (built with -DLOCKSTEP_MPI=OFF)"; }
bool Environment::initialized() { return false; }
void Environment::abort_job(int code) { std::_Exit(code); }

// ---- Communicator: size 1 (a member) or 0 (null, see split).

Communicator::~Communicator() { reset(); }
void Communicator::reset() {}  // no library handle to free

Communicator::Communicator(Communicator&& o) noexcept { *this = std::move(o); }

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  if (this != &o) {
    rank_ = std::exchange(o.rank_, 0);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    bucket_bytes_ = o.bucket_bytes_;
    watchdog_ = std::move(o.watchdog_);
    scratch_ = std::move(o.scratch_);
  }
  return *this;
}

Communicator Communicator::world(double) {
  // No watchdog: with one rank no operation waits for a peer.
  refuse_multi_rank("Communicator::world");
  Communicator c;
  c.size_ = 1;
  c.name_ = "world";
  return c;
}

Communicator Communicator::split(int color, int, const std::string& name) const {
  LS_CHECK(valid()) << "split on a null communicator";
  Communicator c;
  c.name_ = name;
  c.bucket_bytes_ = bucket_bytes_;
  if (color >= 0) c.size_ = 1;
  return c;
}

void Communicator::set_bucket_bytes(size_t bytes) {
  // The same bounds as the MPI build, so a config valid here is valid there.
  if (bytes < 16 || bytes > (size_t(1) << 30))
    LS_THROW << "communicator bucket of " << bytes << " bytes: must be in [16 B, 1 GiB]";
  bucket_bytes_ = bytes;
}

// The sum of one part is the part: T(double(x)) == x.
void Communicator::all_reduce_sum(float*, size_t) { LS_CHECK(valid()) << "all_reduce_sum on a null communicator"; }
void Communicator::all_reduce_sum(double*, size_t) { LS_CHECK(valid()) << "all_reduce_sum on a null communicator"; }
void Communicator::all_reduce_sum(Fixed*, size_t) { LS_CHECK(valid()) << "all_reduce_sum on a null communicator"; }

double Communicator::sum(double x) {
  std::vector<double> all = all_gather(x);
  std::vector<const double*> parts(all.size());
  for (size_t q = 0; q < all.size(); ++q) parts[q] = &all[q];
  double out = 0;
  sum_in_rank_order(parts.data(), size_, 1, &out);
  return out;
}

int64_t Communicator::max(int64_t x) { return all_gather(x).at(0); }
int64_t Communicator::min(int64_t x) { return all_gather(x).at(0); }

void Communicator::broadcast(void*, size_t, int root) {
  LS_CHECK(valid()) << "broadcast on a null communicator";
  LS_CHECK(root >= 0 && root < size_) << "broadcast root " << root << " outside [0, " << size_ << ")";
}

void Communicator::all_gather_bytes(const void* in, size_t bytes, void* out) {
  LS_CHECK(valid()) << "all_gather on a null communicator";
  if (bytes > 0) std::memmove(out, in, bytes);
}

void Communicator::gather_bytes(const void* in, size_t bytes, void* out, int root) {
  LS_CHECK(valid()) << "gather on a null communicator";
  if (rank_ == root && bytes > 0) std::memmove(out, in, bytes);
}

std::vector<size_t> Communicator::exchange_counts(const std::vector<size_t>& send_bytes) {
  LS_CHECK(valid()) << "exchange_counts on a null communicator";
  if (send_bytes.size() != size_t(size_))
    LS_THROW << "exchange_counts: " << send_bytes.size() << " counts for " << size_ << " ranks";
  return send_bytes;  // what this rank sends to itself is what it receives
}

void Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                const std::vector<size_t>& recv_bytes) {
  LS_CHECK(valid()) << "all_to_all_v on a null communicator";
  if (send_bytes.size() != size_t(size_) || recv_bytes.size() != size_t(size_))
    LS_THROW << "all_to_all_v: " << send_bytes.size() << " send and " << recv_bytes.size() << " receive counts for "
             << size_ << " ranks";
  LS_CHECK(send_bytes[0] == recv_bytes[0])
      << "all_to_all_v: rank 0 sends itself " << send_bytes[0] << " bytes but expects " << recv_bytes[0];
  if (send_bytes[0] > 0) std::memmove(recv, send, send_bytes[0]);
}

// Point-to-point needs a peer; a world of one rank has none.
void Communicator::send(const void*, size_t, int dest, int) {
  LS_CHECK(valid()) << "send on a null communicator";
  LS_THROW << kNoMpi << "send to rank " << dest << " of '" << name_ << "', a world of one rank";
}

void Communicator::recv(void*, size_t, int src, int) {
  LS_CHECK(valid()) << "recv on a null communicator";
  LS_THROW << kNoMpi << "receive from rank " << src << " of '" << name_ << "', a world of one rank";
}

void Communicator::barrier() { LS_CHECK(valid()) << "barrier on a null communicator"; }

}  // namespace lockstep::comm

#endif  // !LOCKSTEP_HAVE_MPI
