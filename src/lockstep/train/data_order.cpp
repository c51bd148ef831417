// Seeded epoch permutations.
#include "lockstep/train/data_order.h"

#include <numeric>
#include <utility>

#include "lockstep/base/rng.h"

namespace lockstep::train {

std::vector<size_t> epoch_permutation(size_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t(0));
  if (shuffle && n > 1) {
    Philox rng(mix_seed(seed, uint64_t(epoch)));
    for (size_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.u64(0, i) % (i + 1)]);
  }
  return perm;
}

}  // namespace lockstep::train
