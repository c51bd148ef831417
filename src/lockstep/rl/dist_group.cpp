// make_trainer_group: split_even shards and the rank-order sum.
#include "lockstep/rl/dist_group.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/parallel/data_parallel.h"

namespace lockstep::rl {
namespace {

class CommGroup final : public TrainerGroup {
 public:
  CommGroup(comm::Communicator& trainers, bool writer) : comm_(trainers), writer_(writer) {}
  int ranks() const override { return comm_.size(); }
  int rank() const override { return comm_.rank(); }
  bool writer() const override { return writer_; }
  std::pair<size_t, size_t> shard(size_t n) const override {
    const parallel::Range s = parallel::split_even(n, comm_.size())[size_t(comm_.rank())];
    return {s.begin, s.end};
  }
  void sum(double* v, size_t n) override { comm_.all_reduce_sum(v, n); }
  double max(double x) override {
    double m = x;
    for (double y : comm_.all_gather(x)) m = std::max(m, y);
    return m;
  }
  // Lengths first, then every rank's text padded to the longest.
  std::vector<std::string> gather_strings(const std::string& mine) override {
    const std::vector<uint64_t> sizes = comm_.all_gather(uint64_t(mine.size()));
    uint64_t longest = 0;
    for (uint64_t s : sizes) longest = std::max(longest, s);
    std::string padded = mine;
    padded.resize(size_t(longest), '\0');
    std::string all(size_t(longest) * sizes.size(), '\0');
    if (longest > 0) comm_.all_gather_bytes(padded.data(), size_t(longest), all.data());
    std::vector<std::string> out;
    for (size_t r = 0; r < sizes.size(); ++r) out.push_back(all.substr(r * size_t(longest), size_t(sizes[r])));
    return out;
  }

 private:
  comm::Communicator& comm_;
  bool writer_;
};

}  // namespace

std::shared_ptr<TrainerGroup> make_trainer_group(comm::Communicator& trainers, bool writer) {
  LS_CHECK(trainers.valid()) << "make_trainer_group on a rank outside the trainer group";
  if (trainers.size() == 1) return std::make_shared<OneRank>(writer);
  return std::make_shared<CommGroup>(trainers, writer);
}

}  // namespace lockstep::rl
