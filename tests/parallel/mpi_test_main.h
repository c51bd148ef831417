// main() of the MPI test programs (tests/parallel/*_mpi.cpp, run by ctest under
// mpirun): one comm::Environment for the process, gtest output from rank 0
// only, and any failed assertion on any rank aborts the whole job at once,
// so a rank that fails cannot leave the others waiting in a collective.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "lockstep/comm/environment.h"

namespace lockstep::test {

class AbortOnFailure : public ::testing::EmptyTestEventListener {
 public:
  explicit AbortOnFailure(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  int rank_;
};

inline int run_mpi_tests(int argc, char** argv) {
  comm::Environment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (env.world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new AbortOnFailure(env.world_rank()));
  return RUN_ALL_TESTS();
}

}  // namespace lockstep::test

#define LOCKSTEP_MPI_TEST_MAIN \
  int main(int argc, char** argv) { return ::lockstep::test::run_mpi_tests(argc, argv); }
