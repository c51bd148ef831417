// make_trainer_group: split_even shards and the rank-order sum.
#include "lockstep/rl/dist_group.h"

#include <algorithm>

#include "lockstep/base/error.h"
#include "lockstep/parallel/data_parallel.h"

namespace lockstep::rl {

TrainerGroup make_trainer_group(comm::Communicator& trainers, bool writer) {
  LS_CHECK(trainers.valid()) << "make_trainer_group on a rank outside the trainer group";
  TrainerGroup g;
  g.writer = writer;
  if (trainers.size() == 1) return g;
  const int P = trainers.size(), r = trainers.rank();
  g.shard = [P, r](size_t n) {
    const parallel::Range s = parallel::split_even(n, P)[size_t(r)];
    return std::pair<size_t, size_t>(s.begin, s.end);
  };
  comm::Communicator* c = &trainers;
  g.sum = [c](std::vector<double>& v) { c->all_reduce_sum(v.data(), v.size()); };
  g.max = [c](double x) {
    double m = x;
    for (double y : c->all_gather(x)) m = std::max(m, y);
    return m;
  };
  return g;
}

}  // namespace lockstep::rl
