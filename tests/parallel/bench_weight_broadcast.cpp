// Weight-broadcast bandwidth (not a test): mpirun -np 2 parallel_bench_weight_broadcast [floats] [bucket_mb] [reps]
// Default: 115 M floats, the size of configs/bench/moe-small.toml.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lockstep/comm/environment.h"
#include "lockstep/parallel/weight_broadcast.h"

int main(int argc, char** argv) {
  using namespace lockstep;
  using namespace lockstep::parallel;
  comm::Environment env(&argc, &argv);
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t(115'000'000);
  const size_t bucket_mb = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  comm::Communicator world = comm::Communicator::world(600);
  world.set_bucket_bytes(bucket_mb << 20);
  std::vector<float> w(n, world.rank() == 0 ? 0.5f : 0.0f);
  for (int r = 0; r < reps; ++r) {
    world.barrier();
    const WeightSyncStats s = broadcast_weights(world, w.data(), n, uint64_t(r + 1), 0);
    const double slowest = -double(world.min(-int64_t(s.seconds * 1e6))) * 1e-6;
    if (world.rank() == 0)
      std::printf("ranks %d, %.1f MB, bucket %zu MB: %.3f s (slowest rank) = %.2f GB/s per receiver\n", world.size(),
                  double(s.bytes) * 1e-6, bucket_mb, slowest, double(s.bytes) / slowest * 1e-9);
  }
  return 0;
}
