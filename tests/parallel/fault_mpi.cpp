// A job in which one rank fails while the others are in collectives;
// tests/parallel/fault_test.sh checks that mpirun ends the job, non-zero, quickly.
//   fault_mpi exit    rank 1 calls _exit(9) after a few all-reduces
//   fault_mpi kill    rank 1 is killed by SIGKILL
//   fault_mpi hang    rank 1 stays alive but never joins (the watchdog,
//                     [dist] timeout_s = 3, ends the job)
//   fault_mpi ok      nobody fails (the script's control case)
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "lockstep/comm/communicator.h"
#include "lockstep/comm/environment.h"

int main(int argc, char** argv) {
  using namespace lockstep;
  comm::Environment env(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "ok";
  comm::Communicator world = comm::Communicator::world(mode == "hang" ? 3.0 : 0.0);
  std::vector<float> g(1 << 16, 1.0f);
  for (int it = 0; it < 200; ++it) {
    if (world.rank() == 1 && it == 5) {
      if (mode == "exit") _exit(9);
      if (mode == "kill") raise(SIGKILL);
      if (mode == "hang") sleep(600);
    }
    world.all_reduce_sum(g.data(), g.size());
    for (auto& x : g) x = 1.0f;
  }
  world.barrier();
  if (world.rank() == 0) std::printf("fault_mpi %s: all ranks finished\n", mode.c_str());
  return 0;
}
