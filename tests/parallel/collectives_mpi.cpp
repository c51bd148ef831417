// comm::Communicator under mpirun (np 2, 3, 4): the bucketed all-reduce equals a
// double-precision reference to within rounding of the final sum, gives the
// same bits on every rank and on every run, whatever the bucket size;
// broadcast, all-gather, all-to-all-v, split, and MPI errors as lockstep::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "parallel/mpi_test_main.h"
#include "lockstep/base/error.h"
#include "lockstep/comm/checksum.h"
#include "lockstep/comm/communicator.h"
#include "lockstep/comm/reduce_order.h"
#include "lockstep/parallel/role_comms.h"

namespace lockstep::parallel {
namespace {

// Rank r's contribution: values of mixed sign and magnitude (1e-3..1e3), so
// the order of summation matters in f32.
std::vector<float> contribution(size_t n, int rank, uint32_t seed) {
  std::mt19937 g(seed * 7919u + uint32_t(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) * std::pow(10.0f, float(e(g)));
  return v;
}

uint64_t bits_hash(const std::vector<float>& v) { return comm::checksum64(v.data(), v.size() * sizeof(float)); }

// Every rank holds the same value.
template <typename T>
void expect_same_on_all_ranks(comm::Communicator& c, const T& v, const char* what) {
  const std::vector<T> all = c.all_gather(v);
  for (size_t q = 0; q < all.size(); ++q) ASSERT_EQ(all[q], all[0]) << what << ": rank " << q << " differs";
}

TEST(Collectives, AllReduceMatchesDoubleReferenceAndIsReproducible) {
  comm::Communicator world = comm::Communicator::world(60);
  const int P = world.size();
  ASSERT_GE(P, 2) << "run under mpirun -np >= 2";
  // Bucket sizes: tiny (many buckets, chunks of 0..2 elements), odd, large.
  for (size_t bucket_bytes : {size_t(16), size_t(4 * 37), size_t(1) << 12, comm::kDefaultBucketBytes}) {
    world.set_bucket_bytes(bucket_bytes);
    for (size_t n : {size_t(1), size_t(3), size_t(1000), size_t(100003)}) {
      if (bucket_bytes < 4096 && n > 1000) continue;  // tens of thousands of buckets: slow, adds nothing
      const std::vector<float> mine = contribution(n, world.rank(), uint32_t(n));
      std::vector<float> a = mine;
      world.all_reduce_sum(a.data(), n);
      // Reference in double from every rank's contribution (recomputed locally).
      std::vector<double> ref(n, 0.0);
      for (int q = 0; q < P; ++q) {
        const std::vector<float> c = contribution(n, q, uint32_t(n));
        for (size_t i = 0; i < n; ++i) ref[i] += double(c[i]);
      }
      // Bit for bit what comm::sum_in_rank_order gives on the P contributions, so
      // the same on every run, whatever MPI's algorithms or the bucket size.
      {
        std::vector<std::vector<float>> all;
        std::vector<const float*> parts;
        for (int q = 0; q < P; ++q) all.push_back(contribution(n, q, uint32_t(n)));
        for (auto& c : all) parts.push_back(c.data());
        std::vector<float> expect(n);
        comm::sum_in_rank_order(parts.data(), P, n, expect.data());
        ASSERT_EQ(std::memcmp(a.data(), expect.data(), n * sizeof(float)), 0) << "n=" << n << " bucket=" << bucket_bytes;
      }
      // One rounding of a (nearly exact) double sum: within one f32 ulp.
      double max_ulps = 0;
      for (size_t i = 0; i < n; ++i) {
        const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref[i]), 1e-30)) - 23);
        max_ulps = std::max(max_ulps, std::fabs(double(a[i]) - ref[i]) / ulp);
      }
      ASSERT_LE(max_ulps, 1.0) << "n=" << n << " bucket=" << bucket_bytes;
      // Identical on every rank, and on a second run.
      expect_same_on_all_ranks(world, bits_hash(a), "all_reduce_sum result");
      std::vector<float> b = mine;
      world.all_reduce_sum(b.data(), n);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << "second run differs, n=" << n;
    }
  }
  // The bucket size does not change the bits: the order is per element.
  const size_t n = 5021;
  const std::vector<float> mine = contribution(n, world.rank(), 5);
  std::vector<float> small = mine, big = mine;
  world.set_bucket_bytes(64);
  world.all_reduce_sum(small.data(), n);
  world.set_bucket_bytes(comm::kDefaultBucketBytes);
  world.all_reduce_sum(big.data(), n);
  ASSERT_EQ(std::memcmp(small.data(), big.data(), n * sizeof(float)), 0);
}

// The fixed-point all-reduce (comm/exact_sum.h) is the exact integer sum:
// the same value as one process adding every rank's terms in any order.
TEST(Collectives, AllReduceFixedIsTheExactSum) {
  comm::Communicator world = comm::Communicator::world(60);
  const int P = world.size();
  for (size_t bucket_bytes : {size_t(16), size_t(16 * 7), comm::kDefaultBucketBytes}) {
    world.set_bucket_bytes(bucket_bytes);
    const size_t n = 1001;
    std::vector<comm::Fixed> a(n, 0), expect(n, 0);
    for (int q = P - 1; q >= 0; --q) {  // the reference adds the ranks backwards
      const std::vector<float> c = contribution(n, q, 17);
      for (size_t i = 0; i < n; ++i) {
        comm::Fixed t = 0;
        ASSERT_TRUE(comm::to_fixed(c[i], &t));
        expect[i] = comm::fixed_add(expect[i], t);
        if (q == world.rank()) a[i] = t;
      }
    }
    world.all_reduce_sum(a.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(a[i] == expect[i]) << "element " << i << " bucket " << bucket_bytes;
  }
}

TEST(Collectives, AllReduceDoubleAndScalars) {
  comm::Communicator world = comm::Communicator::world(60);
  const int P = world.size();
  std::vector<double> v(777);
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(world.rank() + 1) * 0.1 + double(i);
  world.set_bucket_bytes(256);
  world.all_reduce_sum(v.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    double ref = 0;
    for (int q = 0; q < P; ++q) ref += double(q + 1) * 0.1 + double(i);  // same order: bit-equal
    ASSERT_EQ(v[i], ref) << i;
  }
  double ref = 0;
  for (int q = 0; q < P; ++q) ref += 1.0 / (q + 3);
  EXPECT_EQ(world.sum(1.0 / (world.rank() + 3)), ref);
  EXPECT_EQ(world.max(int64_t(world.rank()) * 10), int64_t(P - 1) * 10);
  EXPECT_EQ(world.min(int64_t(world.rank()) - 5), -5);
}

TEST(Collectives, BroadcastAllGatherAllToAllV) {
  comm::Communicator world = comm::Communicator::world(60);
  const int P = world.size(), r = world.rank();
  world.set_bucket_bytes(1000);  // 3 MB in 1000-byte pieces
  for (int root = 0; root < P; ++root) {
    std::vector<uint8_t> buf(3'000'001);
    if (r == root)
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t((i * 131 + size_t(root)) >> 3);
    world.broadcast(buf.data(), buf.size(), root);
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], uint8_t((i * 131 + size_t(root)) >> 3)) << i;
  }
  const std::vector<int> ranks = world.all_gather(r * r);
  for (int q = 0; q < P; ++q) EXPECT_EQ(ranks[size_t(q)], q * q);

  // Rank r sends (r + q + 1) ints to rank q, each = 1000 * r + q.
  std::vector<size_t> send_bytes(static_cast<size_t>(P));
  std::vector<int> send;
  for (int q = 0; q < P; ++q) {
    send_bytes[size_t(q)] = size_t(r + q + 1) * sizeof(int);
    for (int k = 0; k < r + q + 1; ++k) send.push_back(1000 * r + q);
  }
  const std::vector<size_t> recv_bytes = world.exchange_counts(send_bytes);
  std::vector<int> recv(std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t(0)) / sizeof(int));
  world.all_to_all_v(send.data(), send_bytes, recv.data(), recv_bytes);
  size_t k = 0;
  for (int q = 0; q < P; ++q) {
    ASSERT_EQ(recv_bytes[size_t(q)], size_t(q + r + 1) * sizeof(int));
    for (int j = 0; j < q + r + 1; ++j) ASSERT_EQ(recv[k++], 1000 * q + r);
  }
  world.barrier();
}

TEST(Collectives, SplitAndErrors) {
  comm::Communicator world = comm::Communicator::world(60);
  const int P = world.size(), r = world.rank();
  // Even and odd ranks; rank 0 also in neither when P > 2 (color -1).
  comm::Communicator half = world.split(r % 2, r, "half");
  ASSERT_TRUE(half.valid());
  EXPECT_EQ(half.size(), (P + 1 - r % 2) / 2);
  EXPECT_EQ(half.rank(), r / 2);
  float x = float(r);
  half.all_reduce_sum(&x, 1);
  float ref = 0;
  for (int q = r % 2; q < P; q += 2) ref += float(q);
  EXPECT_EQ(x, ref);
  comm::Communicator none = world.split(r == 0 ? -1 : 0, r, "no-rank-0");
  EXPECT_EQ(none.valid(), r != 0);
  // An MPI error comes back as lockstep::Error with MPI's message.
  int v = 1;
  try {
    world.send(&v, sizeof v, P + 5, 0);  // no such rank
    FAIL() << "send to a rank that does not exist did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_Send"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MPI error code"), std::string::npos) << e.what();
  }
  EXPECT_THROW(world.set_bucket_bytes(3), Error);
  world.barrier();
}

TEST(Collectives, RoleCommunicators) {
  // One rollout rank, the rest train (disaggregated), default EP = 1.
  DistConfig cfg;
  cfg.rollout_ranks = 1;
  cfg.bucket_mb = 1;
  RoleComms rc = make_role_comms(cfg);
  const Roles& r = rc.roles;
  const int W = rc.world.size();
  EXPECT_EQ(rc.world.bucket_bytes(), size_t(1) << 20);
  EXPECT_EQ(r.is_trainer, rc.world.rank() < W - 1);
  EXPECT_EQ(rc.trainers.valid(), r.is_trainer);
  EXPECT_EQ(rc.dp.valid(), r.is_trainer);
  EXPECT_EQ(rc.rollout.valid(), r.is_rollout);
  EXPECT_EQ(rc.weight_sync.valid(), r.is_rollout || rc.world.rank() == 0);
  if (r.is_trainer) {
    EXPECT_EQ(rc.dp.size(), W - 1);
    EXPECT_EQ(rc.dp.rank(), rc.world.rank());
    EXPECT_EQ(rc.ep.size(), 1);
  }
  if (rc.weight_sync.valid()) {
    EXPECT_EQ(rc.weight_sync.size(), 2);
    EXPECT_EQ(rc.weight_sync.rank() == 0, rc.world.rank() == 0);  // the trainer root is rank 0 there
  }
  // Too many rollout ranks, or EP > 1: clear errors, thrown on every rank
  // before any split (so no rank is left waiting).
  DistConfig bad;
  bad.rollout_ranks = W;
  try {
    make_role_comms(bad);
    FAIL() << "rollout_ranks = world size accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves no trainer rank"), std::string::npos) << e.what();
  }
  if (W % 2 == 0) {  // a DP x EP grid: expert-parallel neighbours are consecutive ranks
    DistConfig ep;
    ep.expert_parallel = 2;
    RoleComms g = make_role_comms(ep);
    EXPECT_EQ(g.ep.size(), 2);
    EXPECT_EQ(g.ep.rank(), rc.world.rank() % 2);
    EXPECT_EQ(g.dp.size(), W / 2);
    EXPECT_EQ(g.dp.rank(), rc.world.rank() / 2);
    EXPECT_EQ(g.trainers.size(), W);
  }
  rc.world.barrier();
}

}  // namespace
}  // namespace lockstep::parallel

LOCKSTEP_MPI_TEST_MAIN
