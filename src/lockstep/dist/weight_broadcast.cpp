// broadcast_weights: header agreement, bucketed broadcast with checksums,
// a final agreement on success.
#include "lockstep/dist/weight_broadcast.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/timer.h"
#include "lockstep/dist/checksum.h"

namespace lockstep::dist {

WeightSyncStats broadcast_weights(Communicator& comm, float* params, size_t n, uint64_t version, int root,
                                  const WeightBroadcastOptions& opt) {
  Timer timer;
  LS_CHECK(comm.valid()) << "broadcast_weights on a null communicator";
  LS_CHECK(root >= 0 && root < comm.size()) << "broadcast_weights root " << root << " outside [0, " << comm.size()
                                            << ")";
  const bool is_root = comm.rank() == root;
  // Every rank must hold a buffer of the root's size: agree before sending.
  const std::vector<uint64_t> sizes = comm.all_gather(uint64_t(n));
  for (size_t q = 0; q < sizes.size(); ++q) {
    if (sizes[q] != sizes[size_t(root)])
      LS_THROW << "broadcast_weights on '" << comm.name() << "': rank " << q << " has a buffer of " << sizes[q]
               << " floats, root " << root << " sends " << sizes[size_t(root)]
               << " (different model configurations?)";
  }
  comm.broadcast_value(version, root);
  uint64_t bucket = opt.bucket_bytes ? opt.bucket_bytes : comm.bucket_bytes();
  comm.broadcast_value(bucket, root);  // the root's bucketing decides
  LS_CHECK(bucket >= 16) << "weight broadcast bucket of " << bucket << " bytes";

  const size_t bytes = n * sizeof(float);
  char* p = reinterpret_cast<char*>(params);
  int64_t first_bad = -1;
  size_t n_buckets = 0;
  for (size_t b0 = 0; b0 < bytes; b0 += bucket, ++n_buckets) {
    const size_t m = std::min<size_t>(bucket, bytes - b0);
    uint64_t sum = is_root ? checksum64(p + b0, m) : 0;
    comm.broadcast(p + b0, m, root);  // cut further if above the communicator's bucket
    comm.broadcast_value(sum, root);
    if (!is_root) {
      if (opt.after_receive) opt.after_receive(n_buckets, p + b0, m);
      if (first_bad < 0 && checksum64(p + b0, m) != sum) first_bad = int64_t(n_buckets);
    }
  }
  // Everyone learns whether anyone received corrupt data, and throws together.
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

}  // namespace lockstep::dist
