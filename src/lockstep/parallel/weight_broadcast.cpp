// broadcast_weights: header agreement, bucketed broadcast with checksums,
// a final agreement on success.
#include "lockstep/parallel/weight_broadcast.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/timer.h"
#include "lockstep/comm/checksum.h"

namespace lockstep::parallel {

namespace {

// Every rank must hold a buffer of the root's size: agree before sending.
// Then the root's version and bucket size (its bucketing decides).
uint64_t agree_header(comm::Communicator& comm, size_t n, uint64_t& version, int root, const WeightBroadcastOptions& opt) {
  LS_CHECK(comm.valid()) << "broadcast_weights on a null communicator";
  LS_CHECK(root >= 0 && root < comm.size()) << "broadcast_weights root " << root << " outside [0, " << comm.size()
                                            << ")";
  const std::vector<uint64_t> sizes = comm.all_gather(uint64_t(n));
  for (size_t q = 0; q < sizes.size(); ++q) {
    if (sizes[q] != sizes[size_t(root)])
      LS_THROW << "broadcast_weights on '" << comm.name() << "': rank " << q << " has a buffer of " << sizes[q]
               << " floats, root " << root << " sends " << sizes[size_t(root)]
               << " (different model configurations?)";
  }
  comm.broadcast_value(version, root);
  uint64_t bucket = opt.bucket_bytes ? opt.bucket_bytes : comm.bucket_bytes();
  comm.broadcast_value(bucket, root);
  LS_CHECK(bucket >= 16) << "weight broadcast bucket of " << bucket << " bytes";
  return bucket;
}

// Everyone learns whether anyone received corrupt data, and throws together.
WeightSyncStats agree_footer(comm::Communicator& comm, int64_t first_bad, uint64_t version, uint64_t bucket, size_t bytes,
                             size_t n_buckets, const Timer& timer) {
  const std::vector<int64_t> bad = comm.all_gather(first_bad);
  std::ostringstream msg;
  for (size_t q = 0; q < bad.size(); ++q) {
    if (bad[q] < 0) continue;
    const size_t b0 = size_t(bad[q]) * bucket;
    if (msg.tellp() > 0) msg << "; ";
    msg << "rank " << q << " bucket " << bad[q] << " (bytes [" << b0 << ", " << std::min<size_t>(b0 + bucket, bytes)
        << "))";
  }
  if (msg.tellp() > 0)
    LS_THROW << "broadcast_weights on '" << comm.name() << "', version " << version
             << ": checksum mismatch, received weights are corrupt: " << msg.str();
  WeightSyncStats s;
  s.version = version;
  s.bytes = bytes;
  s.buckets = n_buckets;
  s.seconds = timer.seconds();
  return s;
}

}  // namespace

WeightSyncStats broadcast_weights(comm::Communicator& comm, float* params, size_t n, uint64_t version, int root,
                                  const WeightBroadcastOptions& opt) {
  if (comm.valid() && comm.rank() == root) {
    WeightBroadcaster b(comm, n, version, root, opt);
    b.push(params, n);
    return b.finish();
  }
  Timer timer;
  const uint64_t bucket = agree_header(comm, n, version, root, opt);
  const size_t bytes = n * sizeof(float);
  char* p = reinterpret_cast<char*>(params);
  int64_t first_bad = -1;
  size_t n_buckets = 0;
  for (size_t b0 = 0; b0 < bytes; b0 += bucket, ++n_buckets) {
    const size_t m = std::min<size_t>(bucket, bytes - b0);
    uint64_t sum = 0;
    comm.broadcast(p + b0, m, root);  // cut further if above the communicator's bucket
    comm.broadcast_value(sum, root);
    if (opt.after_receive) opt.after_receive(n_buckets, p + b0, m);
    if (first_bad < 0 && comm::checksum64(p + b0, m) != sum) first_bad = int64_t(n_buckets);
  }
  return agree_footer(comm, first_bad, version, bucket, bytes, n_buckets, timer);
}

WeightBroadcaster::WeightBroadcaster(comm::Communicator& comm, size_t n, uint64_t version, int root,
                                     const WeightBroadcastOptions& opt)
    : comm_(comm), n_(n), version_(version), root_(root) {
  LS_CHECK(comm.valid() && comm.rank() == root) << "WeightBroadcaster: only the root sends";
  bucket_ = agree_header(comm, n, version_, root, opt);
  buf_.reserve(size_t(std::min<uint64_t>(bucket_, n * sizeof(float))));
}

void WeightBroadcaster::send_bucket() {
  uint64_t sum = comm::checksum64(buf_.data(), buf_.size());
  comm_.broadcast(buf_.data(), buf_.size(), root_);
  comm_.broadcast_value(sum, root_);
  buf_.clear();
  ++buckets_;
}

void WeightBroadcaster::push(const float* data, size_t count) {
  LS_CHECK(pushed_ + count <= n_) << "WeightBroadcaster: " << pushed_ + count << " floats pushed, " << n_ << " announced";
  pushed_ += count;
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = count * sizeof(float);
  while (left > 0) {
    const size_t take = std::min<size_t>(left, size_t(bucket_) - buf_.size());
    buf_.insert(buf_.end(), p, p + take);
    p += take;
    left -= take;
    if (buf_.size() == bucket_) send_bucket();
  }
}

WeightSyncStats WeightBroadcaster::finish() {
  LS_CHECK(pushed_ == n_) << "WeightBroadcaster: " << pushed_ << " of " << n_ << " floats pushed";
  if (!buf_.empty()) send_bucket();
  return agree_footer(comm_, -1, version_, bucket_, n_ * sizeof(float), buckets_, timer_);
}

}  // namespace lockstep::parallel
