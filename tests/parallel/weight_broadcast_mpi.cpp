// broadcast_weights under mpirun: every rank receives the root's bytes and
// version; a bucket corrupted in flight is detected by its checksum and
// every rank throws; a rank with a buffer of another size is refused before
// anything is sent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "parallel/mpi_test_main.h"
#include "lockstep/base/error.h"
#include "lockstep/parallel/weight_broadcast.h"

namespace lockstep::parallel {
namespace {

std::vector<float> weights(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(WeightBroadcast, EveryRankReceivesTheRootsWeightsAndVersion) {
  comm::Communicator world = comm::Communicator::world(60);
  const size_t n = 1'000'003;  // 4 MB: 16 buckets of 256 KiB and a partial one
  for (int root : {0, world.size() - 1}) {
    const std::vector<float> expect = weights(n, 42 + uint32_t(root));
    std::vector<float> w = world.rank() == root ? expect : std::vector<float>(n, -1.0f);
    WeightBroadcastOptions opt;
    opt.bucket_bytes = 256 << 10;
    const WeightSyncStats s = broadcast_weights(world, w.data(), n, world.rank() == root ? 17 : 0, root, opt);
    EXPECT_EQ(s.version, 17u);
    EXPECT_EQ(s.bytes, n * 4);
    EXPECT_EQ(s.buckets, (n * 4 + (256 << 10) - 1) / (256 << 10));
    EXPECT_GT(s.seconds, 0.0);
    ASSERT_EQ(std::memcmp(w.data(), expect.data(), n * 4), 0) << "rank " << world.rank() << " root " << root;
  }
}

// The root streams its weights in pieces of every size (smaller than a
// bucket, across bucket edges, several buckets at once, empty); receivers
// run the usual broadcast_weights and get the same bits and bucket count.
TEST(WeightBroadcast, StreamedPiecesArriveAsOneBuffer) {
  comm::Communicator world = comm::Communicator::world(60);
  const size_t n = 300'007;
  const std::vector<float> expect = weights(n, 99);
  WeightBroadcastOptions opt;
  opt.bucket_bytes = 64 << 10;
  WeightSyncStats s;
  std::vector<float> w(n, -1.0f);
  if (world.rank() == 0) {
    WeightBroadcaster out(world, n, 23, 0, opt);
    std::mt19937 g(5);
    size_t at = 0;
    while (at < n) {
      const size_t piece = std::min<size_t>(n - at, g() % 3 == 0 ? g() % 70'000 : g() % 5'000);
      out.push(expect.data() + at, piece);
      at += piece;
    }
    s = out.finish();
    w = expect;
  } else {
    s = broadcast_weights(world, w.data(), n, 0, 0, opt);
  }
  EXPECT_EQ(s.version, 23u);
  EXPECT_EQ(s.buckets, (n * 4 + (64 << 10) - 1) / (64 << 10));
  ASSERT_EQ(std::memcmp(w.data(), expect.data(), n * 4), 0) << "rank " << world.rank();
}

TEST(WeightBroadcast, CorruptBucketIsAnErrorOnEveryRank) {
  comm::Communicator world = comm::Communicator::world(60);
  const size_t n = 100'000;
  std::vector<float> w = weights(n, 7);
  WeightBroadcastOptions opt;
  opt.bucket_bytes = 64 << 10;
  // The last rank flips one bit of bucket 2 after it arrives, as a faulty link would.
  const int victim = world.size() - 1;
  opt.after_receive = [&](size_t bucket, char* data, size_t bytes) {
    if (world.rank() == victim && bucket == 2) data[bytes / 3] ^= 0x10;
  };
  try {
    broadcast_weights(world, w.data(), n, 3, 0, opt);
    FAIL() << "corrupt bucket not detected on rank " << world.rank();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find("rank " + std::to_string(victim) + " bucket 2"), std::string::npos) << m;
    EXPECT_NE(m.find("version 3"), std::string::npos) << m;
  }
  // Without the fault the same call succeeds (the communicator is still usable).
  opt.after_receive = nullptr;
  std::vector<float> w2 = world.rank() == 0 ? weights(n, 7) : std::vector<float>(n, 0.0f);
  broadcast_weights(world, w2.data(), n, 4, 0, opt);
  ASSERT_EQ(std::memcmp(w2.data(), weights(n, 7).data(), n * 4), 0);
}

TEST(WeightBroadcast, SizeMismatchIsRefusedBeforeSending) {
  comm::Communicator world = comm::Communicator::world(60);
  const size_t n = world.rank() == 1 ? 999 : 1000;
  std::vector<float> w(1000, 1.0f);
  try {
    broadcast_weights(world, w.data(), n, 1, 0);
    FAIL() << "size mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 has a buffer of 999 floats, root 0 sends 1000"), std::string::npos)
        << e.what();
  }
  world.barrier();
}

}  // namespace
}  // namespace lockstep::parallel

LOCKSTEP_MPI_TEST_MAIN
