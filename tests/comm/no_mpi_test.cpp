// The communicator of a build without MPI (-DLOCKSTEP_MPI=OFF): a world of one
// rank whose collectives are local copies, and the refusal of a process that a
// launcher started as one of several ranks. In the MPI build these are skipped
// (tests/parallel/*_mpi.cpp test the communicator under mpirun).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/comm/communicator.h"
#include "lockstep/comm/environment.h"

namespace lockstep::comm {
namespace {

#if LOCKSTEP_HAVE_MPI
TEST(NoMpi, SkippedInTheMpiBuild) { GTEST_SKIP() << "built with MPI: see tests/parallel/*_mpi.cpp"; }
#else

// Sets an environment variable for one scope, as a launcher would.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NoMpi, WorldOfOneRank) {
  Environment env;
  EXPECT_FALSE(kBuiltWithMpi);
  EXPECT_EQ(env.world_size(), 1);
  EXPECT_EQ(env.world_rank(), 0);
  Communicator w = Communicator::world(30);
  ASSERT_TRUE(w.valid());
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(w.rank(), 0);
  EXPECT_EQ(w.name(), "world");
  EXPECT_FALSE(w.split(-1, 0, "none").valid());
  Communicator t = w.split(0, 0, "trainers");
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.size(), 1);
  EXPECT_EQ(t.name(), "trainers");
  Communicator moved = std::move(t);
  EXPECT_TRUE(moved.valid());
  EXPECT_FALSE(t.valid());  // NOLINT(bugprone-use-after-move): a moved-from one is null
}

TEST(NoMpi, CollectivesAreLocalCopies) {
  Communicator w = Communicator::world();
  std::vector<float> x = {1.5f, -0.0f, 3e-38f};  // (3)
  const std::vector<float> x0 = x;
  w.all_reduce_sum(x.data(), x.size());
  EXPECT_EQ(std::memcmp(x.data(), x0.data(), x.size() * sizeof(float)), 0);
  EXPECT_EQ(w.sum(2.25), 2.25);
  EXPECT_EQ(w.max(int64_t(-7)), -7);
  EXPECT_EQ(w.min(int64_t(9)), 9);
  int v = 42;
  w.broadcast_value(v, 0);
  EXPECT_EQ(v, 42);
  EXPECT_EQ(w.all_gather(v), std::vector<int>{42});
  const std::vector<size_t> counts = {3};
  EXPECT_EQ(w.exchange_counts(counts), counts);
  const char send[3] = {'a', 'b', 'c'};
  char recv[3] = {};
  w.all_to_all_v(send, counts, recv, counts);
  EXPECT_EQ(std::memcmp(send, recv, 3), 0);
  w.barrier();
  EXPECT_THROW(w.broadcast(&v, sizeof v, 1), Error);
  EXPECT_THROW(w.exchange_counts({1, 2}), Error);
  EXPECT_THROW(w.set_bucket_bytes(8), Error);
}

TEST(NoMpi, PointToPointIsRefused) {
  const std::string e = error_of([] {
    Communicator w = Communicator::world();
    int v = 0;
    w.send(&v, sizeof v, 0, 1);
  });
  EXPECT_NE(e.find("built without MPI (-DLOCKSTEP_MPI=OFF)"), std::string::npos) << e;
}

TEST(NoMpi, RefusesOneRankOfSeveral) {
  {
    ScopedEnv s("OMPI_COMM_WORLD_SIZE", "4");
    const std::string e = error_of([] { Environment env; });
    EXPECT_NE(e.find("built without MPI (-DLOCKSTEP_MPI=OFF)"), std::string::npos) << e;
    EXPECT_NE(e.find("one of 4 ranks"), std::string::npos) << e;
  }
  {
    ScopedEnv s("PMI_RANK", "2");
    const std::string e = error_of([] { (void)Communicator::world(); });
    EXPECT_NE(e.find("built without MPI (-DLOCKSTEP_MPI=OFF)"), std::string::npos) << e;
  }
  ScopedEnv s("OMPI_COMM_WORLD_SIZE", "1");  // a launcher's job of one rank is fine
  Environment env;
  EXPECT_EQ(env.world_size(), 1);
}

#endif  // LOCKSTEP_HAVE_MPI

}  // namespace
}  // namespace lockstep::comm
