// Weight broadcast for disaggregated rollout: the trainer root sends the flat
// f32 parameter buffer to every rank of a communicator (trainer root +
// rollout ranks), bucket by bucket, each bucket followed by its comm::checksum64,
// verified on receipt. The call is collective; it throws Error on every rank
// when any rank's size disagrees or any bucket arrived corrupt, so no rank
// runs on half-received weights without the others knowing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "lockstep/base/timer.h"
#include "lockstep/comm/communicator.h"

namespace lockstep::parallel {

struct WeightSyncStats {
  uint64_t version = 0;  // the root's version, now every rank's
  size_t bytes = 0;      // payload per receiving rank
  size_t buckets = 0;
  double seconds = 0;    // wall time of the whole call on this rank: perf/weight_sync_s
  double gb_per_s() const { return seconds > 0 ? double(bytes) / seconds * 1e-9 : 0; }
};

struct WeightBroadcastOptions {
  // Bytes per bucket; 0: the communicator's bucket_bytes().
  size_t bucket_bytes = 0;
  // Called on receiving ranks after each bucket arrives and before it is
  // verified (tests use it to corrupt data in flight).
  std::function<void(size_t bucket, char* data, size_t bytes)> after_receive;
};

// root's params[0, n) to every rank of comm; `version` is read on the root.
WeightSyncStats broadcast_weights(comm::Communicator& comm, float* params, size_t n, uint64_t version, int root,
                                  const WeightBroadcastOptions& opt = {});

// The root's side of broadcast_weights fed piece by piece, for weights the
// root does not hold in one buffer (expert parallelism assembles them layer
// by layer): the receivers call broadcast_weights as usual. push() the n
// floats in order (full buckets go out as they fill), then finish(). The
// constructor and finish() are collective with the receivers.
class WeightBroadcaster {
 public:
  WeightBroadcaster(comm::Communicator& comm, size_t n, uint64_t version, int root, const WeightBroadcastOptions& opt = {});
  void push(const float* data, size_t count);
  WeightSyncStats finish();

 private:
  void send_bucket();

  comm::Communicator& comm_;
  size_t n_, pushed_ = 0;
  uint64_t version_;
  int root_;
  uint64_t bucket_ = 0;
  std::vector<char> buf_;  // the bucket being filled
  size_t buckets_ = 0;
  Timer timer_;
};

}  // namespace lockstep::parallel
