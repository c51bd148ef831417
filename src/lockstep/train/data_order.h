// The order in which SFT examples and RL prompts are visited: epochs of a
// permutation of [0, n), each drawn with Fisher-Yates from Philox keyed by
// (seed, epoch), so any position of the stream can be recomputed on resume.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep::train {

// The permutation of [0, n) for `epoch` (the identity when !shuffle).
std::vector<size_t> epoch_permutation(size_t n, uint64_t seed, int64_t epoch, bool shuffle);

}  // namespace lockstep::train
